"""`graphflow train`: its options, the combinations refused as usage errors, and the run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from graphflow.argtypes import (
    UsageError,
    count,
    directory,
    learning_rate,
    microbatch_count,
    non_negative,
    output_file,
    seconds,
)
from graphflow.replicas.options import REPLICA_TIMEOUT
from graphflow.runtime.clusterfile import CONNECT_TIMEOUT, TRAIN_TIMEOUT
from graphflow.runtime.pipeline import SCHEDULES

if TYPE_CHECKING:
    from graphflow.models import Model
    from graphflow.optim import Optimizer
    from graphflow.replicas.manager import ReplicaOptions
    from graphflow.train import Trainer

MODEL_HELP = ("a reference workload (digits-lc, lc-large, speech-mlp), or your own: "
              "file.py:function, module:function, or file.py alone for its build_model()")


def configure(sub: Any) -> None:
    """Add the `train` command to argparse's subparsers `sub`."""
    from graphflow.optim import OPTIMIZERS

    t = sub.add_parser("train", help="train a model: a reference workload or your own",
                       description="Train a model; digits-lc uses the digits data set and "
                                   "reports held-out accuracy, the others use synthetic data "
                                   "(random inputs and labels: for timing and for checking "
                                   "that a model trains).",
                       epilog="example: graphflow train digits-lc --steps 1500")
    t.add_argument("workload", nargs="?", default="digits-lc", metavar="MODEL",
                   help=f"{MODEL_HELP} (default digits-lc)")
    t.add_argument("--steps", type=count, default=None,
                   help="training steps (default: per workload; 20 for your own)")
    t.add_argument("--batch", type=count, default=None,
                   help="mini-batch size (default: per workload; your model's own, else 64)")
    t.add_argument("--optimizer", default="adagrad", choices=sorted(OPTIMIZERS))
    t.add_argument("--lr", type=learning_rate, default=None,
                   help="learning rate (default: per workload; 0.01 for your own)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--check-numerics", action="store_true",
                   help="stop at the first node that produces NaN or inf")
    t.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--trace", metavar="FILE", type=output_file, default=None,
                   help="write the run's timeline (Chrome trace-event JSON: every worker's "
                        "kernels, sends, receives, PS calls) here; draw it with `graphflow "
                        "timeline FILE`")
    _model_parallel_options(t.add_argument_group("model parallelism"))
    _data_parallel_options(t.add_argument_group("data parallelism (parameter server)"))


def _model_parallel_options(m: Any) -> None:
    from graphflow.partitioners import STRATEGIES

    m.add_argument("--parts", type=count, default=1, help="workers to split the model across")
    m.add_argument("--strategy", default="spatial", choices=STRATEGIES,
                   help="placement strategy (default spatial)")
    m.add_argument("--mode", default="threads", choices=["threads", "processes"],
                   help="workers as threads of this process or as local processes")
    m.add_argument("--cluster", metavar="FILE",
                   help="TOML file listing remote workers (`graphflow worker --listen`): "
                        "workers = [\"tcp://HOST:PORT\", ...]; with --replicas R it lists "
                        "R x parts workers and ps_host = \"ADDRESS\" of this machine, where "
                        "the shards listen")
    m.add_argument("--microbatches", type=microbatch_count, default=1,
                   help="pipeline each batch in this many micro-batches (layerwise plans), "
                        "or auto: the count of 1 (none), 2, 3, 4, 8 with the shortest "
                        "predicted step")
    m.add_argument("--schedule", default="eager", choices=list(SCHEDULES),
                   help="pipeline schedule: gpipe, 1f1b, or eager (1F1B with twice the "
                        "warm-up forwards; the default)")
    m.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                   help="a worker silent this long fails the step, naming it (default "
                        f"{TRAIN_TIMEOUT:g}; with --replicas {REPLICA_TIMEOUT:g}, and the bsp "
                        "barrier drops a replica after a third of it, 10 s at most)")
    m.add_argument("--connect-timeout", type=seconds, default=None, metavar="SECONDS",
                   help="--cluster: how long a worker has to answer first "
                        f"(default {CONNECT_TIMEOUT:g})")


def _data_parallel_options(d: Any) -> None:
    d.add_argument("--replicas", type=count, default=1,
                   help="model replicas sharing a sharded parameter server (default 1: none)")
    d.add_argument("--ps-shards", type=count, default=2, help="parameter-server shards (2)")
    d.add_argument("--sync", default="downpour",
                   choices=["downpour", "bsp", "ssp", "allreduce", "sandblaster"],
                   help="downpour (async), bsp (barrier each step), ssp (bounded staleness), "
                        "allreduce (synchronous, no PS) or sandblaster (L-BFGS, one iteration "
                        "per batch)")
    d.add_argument("--allreduce", default="ring", choices=["ring", "tree"],
                   help="the allreduce algorithm of --sync allreduce (ring)")
    d.add_argument("--n-fetch", type=count, default=1, help="downpour: fetch every N steps")
    d.add_argument("--n-push", type=count, default=1, help="downpour: push every N steps")
    d.add_argument("--staleness", type=non_negative, default=2,
                   help="ssp: clocks ahead allowed (2)")
    d.add_argument("--warm-start", type=non_negative, default=0,
                   help="steps replica 0 runs alone before the others join (fewer than "
                        "--steps; ssp: at most --staleness + 1)")
    d.add_argument("--compress", type=codec, default=None, metavar="CODEC",
                   help="gradient compression on push: float16, or topk:FRACTION, the "
                        "largest FRACTION of each gradient (topk:0.01 sends 1%%; topk:1 "
                        "sends all), the rest kept for later pushes")
    d.add_argument("--checkpoint-dir", type=directory, default=None,
                   help="shards checkpoint here (and run as processes that are restarted); "
                        "a directory holding another run's checkpoints resumes them, or is "
                        "refused before anything starts if they are not this run's")


DEFAULTS = {  # workload -> (steps, batch, lr); a user's model: 20, its own batch or 64, 0.01
    "digits-lc": (1500, 32, 0.03),
    "lc-large": (20, 64, 0.002),
    # (Adagrad's first step moves every weight by lr: at 0.01 the 2560-wide sigmoid layers
    # saturate and the loss climbs from 9 to 30 before it falls)
    "speech-mlp": (20, 64, 0.001),
}


def run(args: argparse.Namespace) -> int:
    from graphflow import datasets
    from graphflow.modelspec import load_trainable
    from graphflow.optim import OPTIMIZERS
    from graphflow.train import DataParallelTrainer, PartitionedTrainer

    placement = _placement(args)  # (UsageError: before the model and data load)
    model = load_trainable(args.workload, seed=args.seed)
    steps, batch, lr = DEFAULTS.get(args.workload, (20, model.x.shape[0] or 64, 0.01))
    steps, batch, lr = (args.steps or steps, args.batch or batch,
                        lr if args.lr is None else args.lr)
    if args.checkpoint_dir is not None:  # before any shard starts and writes there
        _check_resume(args, model, placement.parts)
    if args.workload == "digits-lc":
        data, shift = datasets.digits(seed=args.seed), 2
    else:
        data, shift = datasets.synthetic_for(model, n=4 * batch, seed=args.seed), 0
    trainer = _trainer(args, model, OPTIMIZERS[args.optimizer](lr), batch, placement)
    manager = trainer.manager if isinstance(trainer, DataParallelTrainer) else None
    told = _note(manager.record.notes if manager else [])  # shards resumed from checkpoints
    start = time.perf_counter()
    try:
        history = trainer.fit(datasets.batches(data.x_train, data.y_train, batch,
                                               seed=args.seed, shift=shift), steps,
                              progress=not args.no_progress, trace=args.trace)
        took = time.perf_counter() - start
        accuracy = (trainer.accuracy(data.x_test, data.y_test)
                    if args.workload == "digits-lc" else None)
        record = trainer.manager.record if isinstance(trainer, DataParallelTrainer) else None
    finally:
        if isinstance(trainer, (PartitionedTrainer, DataParallelTrainer)):
            trainer.close()
    result = {"workload": args.workload, "steps": steps, "batch": batch, "seconds": took,
              "final_loss": history.losses[-1] if history.losses else None}
    if record is not None:
        _note(record.notes[told:])  # steps rounded up to whole lockstep rounds, failures
        steps = result["steps"] = record.steps_run
        result["replica_steps"] = {str(r): n for r, n in sorted(record.steps_done.items())}
        result["failures"], result["notes"] = record.failures, record.notes
        result["shard_restarts"] = record.shard_restarts  # (shards died and restarted)
    if accuracy is not None:
        result["test_accuracy"] = accuracy
        result["test_examples"] = len(data.y_test)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.workload}: {steps} steps of batch {batch} in {took:.1f} s, "
              f"final loss {result['final_loss']:.4f}")
        if "test_accuracy" in result:
            print(f"test accuracy {100 * result['test_accuracy']:.2f}% on "
                  f"{result['test_examples']} held-out digits")
    return 0


def _note(notes: list[str]) -> int:
    for note in notes:
        print(f"graphflow train: note: {note}", file=sys.stderr)
    return len(notes)


class Placement(NamedTuple):
    """Where a run's workers go, settled from the options and --cluster before any work."""

    parts: int
    hosts: list[str] | None = None  # a split model's remote workers
    replicas: ReplicaOptions | None = None  # with --replicas R > 1


def _placement(args: argparse.Namespace) -> Placement:
    """The parts, hosts and replica options of a run: --cluster read, and its workers
    counted against --replicas and --parts (UsageError), before the model loads."""
    from graphflow.runtime.clusterfile import read_cluster_file

    if args.replicas > 1:
        options = _replica_options(args)
        if not args.cluster:
            return Placement(args.parts, None, options)
        options = options.with_cluster_file(args.cluster)  # replicas x parts remote workers
        assert options.hosts is not None
        listed = len(options.hosts)
        parts, extra = divmod(listed, args.replicas)
        if extra or not parts:
            raise UsageError(f"{args.cluster} lists {listed} worker(s): not a multiple of "
                             f"--replicas {args.replicas} (each replica takes the same number, "
                             "one a part)")
        if args.parts > 1 and args.parts != parts:
            raise UsageError(f"--parts {args.parts}, but {args.cluster} lists {listed} "
                             f"workers: {parts} for each of --replicas {args.replicas} "
                             "(leave --parts out to use them all)")
        return Placement(parts, None, options)
    hosts = read_cluster_file(args.cluster) if args.cluster else None
    if hosts and args.parts > 1 and args.parts != len(hosts):
        raise UsageError(f"--parts {args.parts}, but {args.cluster} lists {len(hosts)} "
                         "workers, one a part (leave --parts out to use them all)")
    return Placement(len(hosts) if hosts else args.parts, hosts)


def _trainer(args: argparse.Namespace, model: Model, optimizer: Optimizer,
             batch: int, placement: Placement) -> Trainer:
    """One process, a split model (--parts, --cluster) or replicas of it (--replicas)."""
    from graphflow.train import DataParallelTrainer, PartitionedTrainer, Trainer

    parts, hosts = placement.parts, placement.hosts
    if placement.replicas is not None:
        return DataParallelTrainer(model, optimizer, args.replicas, args.ps_shards, parts,
                                   args.strategy, placement.replicas)
    if not (parts > 1 or hosts):
        return Trainer(model, optimizer, check_numerics=args.check_numerics)
    timeouts = {k: v for k, v in (("timeout", args.timeout),
                                  ("connect_timeout", args.connect_timeout)) if v is not None}
    trainer = PartitionedTrainer(  # (the timeouts not given keep the trainer's defaults)
        model, optimizer, parts, args.strategy, args.mode, hosts, args.microbatches,
        args.schedule, batch=batch, check_numerics=args.check_numerics, **timeouts)
    if idle := trainer.plan.idle_workers():
        print(f"graphflow train: note: worker(s) {', '.join(map(str, idle))} got no nodes "
              f"from the {args.strategy} strategy"
              + (" (no device() scope of the model names them)"
                 if args.strategy == "manual" else ""), file=sys.stderr)
    if args.microbatches == "auto":
        print(f"micro-batches: {trainer.microbatches} (auto)", file=sys.stderr)
    return trainer


def _replica_options(args: argparse.Namespace) -> ReplicaOptions:
    from graphflow.replicas.manager import ReplicaOptions

    return ReplicaOptions(
        mode=args.sync, n_fetch=args.n_fetch, n_push=args.n_push, staleness=args.staleness,
        warm_start=args.warm_start, compress=args.compress, placement=args.mode,
        algorithm=args.allreduce,
        shard_placement="processes" if args.checkpoint_dir else "threads",
        checkpoint_dir=None if args.checkpoint_dir is None else str(args.checkpoint_dir),
        **({"connect_timeout": args.connect_timeout} if args.connect_timeout else {}),
        **({"timeout": args.timeout} if args.timeout else {}))


def _check_resume(args: argparse.Namespace, model: Model, parts: int) -> None:
    """UsageError if the shards would refuse the checkpoints in --checkpoint-dir (another
    shard count's, model's or split's): said before any shard starts and writes there."""
    from math import prod

    from graphflow.partitioners import partition
    from graphflow.ps.checkpoint import newest_slices
    from graphflow.ps.layout import slices_differ

    held = newest_slices(args.checkpoint_dir)
    if not held:  # (a fresh run)
        return
    where, fix = f"--checkpoint-dir {args.checkpoint_dir}", "use another directory, or empty it"
    if sorted(held) != list(range(args.ps_shards)):
        if sorted(held) == list(range(len(held))):
            raise UsageError(f"{where} holds the checkpoints of {len(held)} shards, not of "
                             f"--ps-shards {args.ps_shards}: --ps-shards {len(held)} resumes "
                             f"them; or {fix}")
        raise UsageError(f"{where} holds checkpoints of shard(s) "
                         f"{', '.join(map(str, sorted(held)))} only, not of --ps-shards "
                         f"{args.ps_shards} (the others' are missing or unreadable): {fix}")
    plan = partition(model.graph, parts, args.strategy, loss=model.loss)
    asked = {n.name: prod(n.shape) for w in plan.workers for n in w.graph.nodes
             if n.op == "parameter"}  # what the shards will be asked for, by parameter
    found: dict[str, int] = {}
    for _, slices in held.values():
        for key, size in slices.items():
            name = key.rpartition("[")[0]
            found[name] = found.get(name, 0) + size
    whole = lambda sizes: {f"{n}[0:{v}]": v for n, v in sizes.items()}  # noqa: E731
    if wrong := slices_differ(whole(found), whole(asked)):
        raise UsageError(f"{where} holds the checkpoints of another model, or of another "
                         f"--parts / --strategy split of it ({wrong}): {fix}")


def codec(text: str) -> str:
    """An argparse type: a gradient codec `make_codec` knows (a usage error now, not a
    worker's failure once the replicas have started)."""
    from graphflow.replicas.compress import make_codec

    try:
        make_codec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# data-parallel options and their defaults: set without --replicas, they would do nothing
REPLICA_DEFAULTS = {"sync": "downpour", "allreduce": "ring", "n_fetch": 1, "n_push": 1,
                    "staleness": 2, "warm_start": 0, "compress": None, "checkpoint_dir": None,
                    "ps_shards": 2}

# the replica options each --sync mode reads; another one given is refused (it would do nothing)
SYNC_READS = {"downpour": {"ps_shards", "n_fetch", "n_push", "warm_start", "compress",
                           "checkpoint_dir"},
              "bsp": {"ps_shards", "warm_start", "compress", "checkpoint_dir"},
              "ssp": {"ps_shards", "staleness", "warm_start", "compress", "checkpoint_dir"},
              "allreduce": {"allreduce", "warm_start"},  # (no parameter server)
              "sandblaster": {"ps_shards", "checkpoint_dir"}}


def _ignored_by_sync(args: argparse.Namespace) -> str | None:
    """The first option given that --sync's mode would not read, said as an error."""
    mode = args.sync
    for key, default in REPLICA_DEFAULTS.items():
        if key != "sync" and key not in SYNC_READS[mode] and getattr(args, key) != default:
            readers = [m for m, keys in SYNC_READS.items() if key in keys]
            return (f"--{key.replace('_', '-')} does nothing with --sync {mode}: it is for "
                    f"--sync {' or '.join(readers)}")
    if mode == "sandblaster" and (args.optimizer != "adagrad" or args.lr is not None):
        return ("--optimizer and --lr do nothing with --sync sandblaster: its L-BFGS chooses "
                "each step by a line search")
    return None


def conflict(args: argparse.Namespace) -> str | None:
    """`train` options that would be ignored together: an error, not a silent no-op."""
    split = (args.parts > 1 or args.cluster) and args.replicas == 1  # one model, split
    if args.replicas == 1 and (given := [k for k, v in REPLICA_DEFAULTS.items()
                                         if getattr(args, k) != v]):
        option = "--" + given[0].replace("_", "-")
        return f"{option} is for data parallelism: it needs --replicas R (R > 1)"
    if args.strategy != "spatial" and not (args.parts > 1 or args.cluster):
        return "--strategy places a split model: it needs --parts N (N > 1) or --cluster FILE"
    if args.microbatches != 1 and not split:
        return ("--microbatches pipelines one model split across workers: it needs --parts N "
                "(N > 1) or --cluster FILE, and no --replicas")
    if args.microbatches not in (1, "auto") and args.strategy == "spatial":  # (auto: 1 here)
        return ("--microbatches pipelines a chain of stages: it needs --strategy layerwise (or "
                "a manual or mincut plan whose workers form a chain); spatial workers trade "
                "halos both ways in every layer")
    if args.schedule != "eager" and args.microbatches == 1:
        return "--schedule orders micro-batches: it needs --microbatches N (N > 1) or auto"
    if args.check_numerics and args.replicas > 1:
        return "--check-numerics checks one process or one split model, not --replicas"
    if args.timeout is not None and not split and args.replicas == 1:
        return ("--timeout is for workers: it needs --parts N (N > 1), --cluster FILE or "
                "--replicas R (R > 1)")
    if args.warm_start and args.sync in ("bsp", "allreduce"):
        return (f"--warm-start: replica 0 cannot run alone with --sync {args.sync}, whose "
                "every step waits for every replica")
    if args.connect_timeout is not None and not args.cluster:
        return "--connect-timeout is for remote workers: it needs --cluster FILE"
    if args.mode != "threads" and args.cluster:
        return f"--mode {args.mode} places local workers: --cluster FILE's are remote"
    if args.mode != "threads" and args.parts == 1 and args.replicas == 1:
        return (f"--mode {args.mode} places the workers of a split model or of replicas: it "
                "needs --parts N (N > 1) or --replicas R (R > 1)")
    if args.replicas > 1 and (ignored := _ignored_by_sync(args)):
        return ignored
    return _warm_start_problem(args) if args.warm_start else None


def _warm_start_problem(args: argparse.Namespace) -> str | None:
    """--warm-start longer than the run, or than ssp lets replica 0 run ahead."""
    steps = args.steps or DEFAULTS.get(args.workload, (20,))[0]
    if args.warm_start >= steps:
        default = "" if args.steps else f" (the default for {args.workload})"
        return (f"--warm-start {args.warm_start} is not less than --steps {steps}{default}: "
                "replica 0 would run every step alone, and the others none")
    if args.sync == "ssp" and args.warm_start > args.staleness + 1:
        return (f"--warm-start {args.warm_start}: with --sync ssp replica 0 runs at most "
                f"--staleness {args.staleness} + 1 steps ahead of the others, so it cannot "
                f"run {args.warm_start} alone (raise --staleness, or lower --warm-start)")
    return None
