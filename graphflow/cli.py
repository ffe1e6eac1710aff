"""The `graphflow` command.

    graphflow train digits-lc              train on the bundled digits, print test accuracy
    graphflow train lc-large --steps 5     a few steps of a reference workload on synthetic data
    graphflow train my_model.py --parts 2  your own model (its build_model()), split in two
    graphflow show speech-mlp              the graph, one node a line, and its parameter count
    graphflow visualize lc-large --parts 4 -o plan.html   how a model is split, drawn
    graphflow train lc-large --parts 2 --steps 6 --trace run.json   record a run's timeline
    graphflow timeline run.json -o run.png                          ... and draw it
    graphflow ops                          the op table
    graphflow train digits-lc --replicas 2 --sync downpour   data parallelism through a PS
    graphflow bench speedup                speedup against workers, measured and predicted
    graphflow bench convergence            accuracy against time for Downpour, BSP, SSP, ...
    graphflow bench ps                     parameter-server pushes per second
    graphflow worker --listen tcp://HOST:PORT   serve a worker for a driver elsewhere
    graphflow ps --listen tcp://HOST:PORT ...   serve a parameter-server shard
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from math import prod

from graphflow.argtypes import count, microbatch_count, non_negative
from graphflow.errors import GraphflowError
from graphflow.runtime.heap import keep_freed_memory
from graphflow.runtime.pipeline import SCHEDULES


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graphflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


MODEL_HELP = ("a reference workload (digits-lc, lc-large, speech-mlp), or your own: "
              "file.py:function, module:function, or file.py alone for its build_model()")


def _parser() -> argparse.ArgumentParser:
    from graphflow.optim import OPTIMIZERS
    from graphflow.partitioners import STRATEGIES
    from graphflow.prediction import add_estimate_option

    p = argparse.ArgumentParser(prog="graphflow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"graphflow {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

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
    t.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: per workload; 0.01 for your own)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--check-numerics", action="store_true",
                   help="stop at the first node that produces NaN or inf")
    t.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--trace", metavar="FILE", default=None,
                   help="write the run's timeline (Chrome trace-event JSON: every worker's "
                        "kernels, sends, receives, PS calls) here; draw it with `graphflow "
                        "timeline FILE`")
    m = t.add_argument_group("model parallelism")
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
                        "or auto: the count of 2, 3, 4, 8 with the shortest predicted step")
    m.add_argument("--schedule", default="eager", choices=list(SCHEDULES),
                   help="pipeline schedule: gpipe, 1f1b, or eager (1F1B with twice the "
                        "warm-up forwards; the default)")
    d = t.add_argument_group("data parallelism (parameter server)")
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
                   help="steps replica 0 runs alone before the others join")
    d.add_argument("--compress", default=None, metavar="CODEC",
                   help="gradient compression on push: float16 or topk:FRACTION")
    d.add_argument("--checkpoint-dir", default=None,
                   help="shards checkpoint here (and run as processes that are restarted)")

    s = sub.add_parser("show", help="print a model's graph, or its partition plan",
                       epilog="example: graphflow show lc-large --parts 2 --strategy spatial")
    s.add_argument("workload", metavar="MODEL", help=MODEL_HELP)
    s.add_argument("--backward", action="store_true", help="include the gradient nodes")
    s.add_argument("--parts", type=count, default=1,
                   help="partition it for this many workers and print the plan's report")
    s.add_argument("--strategy", default="spatial", choices=[*STRATEGIES, "all"],
                   help="placement strategy; `all` compares their cuts and predicted steps")
    s.add_argument("--batch", type=count, default=64, help="batch size for the plan's figures")
    add_estimate_option(s)

    sub.add_parser("ops", help="list the registered ops", epilog="example: graphflow ops")

    from graphflow.trace import command as timeline
    from graphflow.viz import command as visualize

    visualize.configure(sub.add_parser(
        "visualize", help="draw how a model is split (.svg, .png, .dot, .html)",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=visualize.__doc__))
    timeline.configure(sub.add_parser(
        "timeline", help="draw a run's trace (--trace FILE) as a PNG Gantt chart"))

    b = sub.add_parser("bench", help="benchmarks: `graphflow bench SUITE --help`",
                       epilog="example: graphflow bench speedup --workers 1,2")
    b.add_argument("suite", choices=["speedup", "convergence", "ps", "sync"],
                   help="speedup: DistBelief's Fig. 3 here; convergence: its Fig. 4; "
                        "ps: parameter-server pushes per second; sync: PS vs allreduce")
    b.add_argument("args", nargs=argparse.REMAINDER, help="the suite's own options")

    w = sub.add_parser("worker", help="serve one worker for a driver on another machine",
                       description="Serve one graphflow worker: a driver (graphflow train "
                                   "--cluster FILE) ships it a subgraph and runs steps on it. "
                                   "When the driver is done (or fails) the worker forgets its "
                                   "run and waits for the next driver; a driver that died is "
                                   "replaced by the next one to attach.",
                       epilog="example: graphflow worker --listen tcp://10.0.0.2:5555")
    w.add_argument("--listen", required=True,
                   help="control address: tcp://HOST:PORT (or ipc:///PATH)")
    w.add_argument("--exit-with-parent", type=count, default=None, metavar="PID",
                   help="exit once process PID has ended (a driver names itself for the "
                        "workers it starts)")
    w.add_argument("--cpu", type=non_negative, default=None, metavar="N",
                   help="run on CPU N only (a local driver gives each of its workers a core)")
    w.add_argument("--once", action="store_true",
                   help="exit when the first driver is done with this worker, instead of "
                        "waiting for the next one")

    ps = sub.add_parser("ps", help="serve one parameter-server shard",
                        description="Serve one parameter-server shard (normally the replica "
                                    "manager starts these itself).",
                        epilog="example: graphflow ps --listen tcp://10.0.0.5:6000 --index 0 "
                               "--shards 2 --checkpoint-dir /var/tmp/ps0")
    ps.add_argument("args", nargs=argparse.REMAINDER, help="see `graphflow ps --help`")
    # (main() hands `graphflow ps ...` to graphflow.ps's own parser before this one runs)
    return p


DEFAULTS = {  # workload -> (steps, batch, lr); a user's model: 20, its own batch or 64, 0.01
    "digits-lc": (1500, 32, 0.03),
    "lc-large": (20, 64, 0.002),
    # (Adagrad's first step moves every weight by lr: at 0.01 the 2560-wide sigmoid layers
    # saturate and the loss climbs from 9 to 30 before it falls)
    "speech-mlp": (20, 64, 0.001),
}


def cmd_train(args: argparse.Namespace) -> int:
    from graphflow import datasets
    from graphflow.modelspec import load_trainable
    from graphflow.optim import OPTIMIZERS
    from graphflow.runtime.clusterfile import read_cluster_file
    from graphflow.train import DataParallelTrainer, PartitionedTrainer, Trainer

    model = load_trainable(args.workload, seed=args.seed)
    fixed = model.x.shape[0]
    steps, batch, lr = DEFAULTS.get(args.workload, (20, fixed or 64, 0.01))
    steps, batch, lr = args.steps or steps, args.batch or batch, args.lr or lr
    if args.workload == "digits-lc":
        data = datasets.digits(seed=args.seed)
        shift = 2
    else:
        data = datasets.synthetic_for(model, n=4 * batch, seed=args.seed)
        shift = 0
    optimizer = OPTIMIZERS[args.optimizer](lr)
    trainer: Trainer
    if args.replicas > 1:
        from graphflow.replicas.manager import ReplicaOptions
        from graphflow.train import DataParallelTrainer

        options = ReplicaOptions(
            mode=args.sync, n_fetch=args.n_fetch, n_push=args.n_push, staleness=args.staleness,
            warm_start=args.warm_start, compress=args.compress, placement=args.mode,
            algorithm=args.allreduce,
            shard_placement="processes" if args.checkpoint_dir else "threads",
            checkpoint_dir=args.checkpoint_dir)
        parts = args.parts
        if args.cluster:  # replicas x parts remote workers, the shards here on tcp
            options = options.with_cluster_file(args.cluster)
            assert options.hosts is not None
            parts, extra = divmod(len(options.hosts), args.replicas)
            if extra or not parts:
                raise ValueError(f"{args.cluster} lists {len(options.hosts)} workers: not a "
                                 f"multiple of --replicas {args.replicas}")
        trainer = DataParallelTrainer(model, optimizer, args.replicas, args.ps_shards,
                                      parts, args.strategy, options)
    elif args.parts > 1 or args.cluster:
        hosts = read_cluster_file(args.cluster) if args.cluster else None
        if hosts and args.parts > 1 and args.parts != len(hosts):
            raise ValueError(f"--parts {args.parts}, but {args.cluster} lists {len(hosts)} "
                             "workers, one a part (leave --parts out to use them all)")
        trainer = PartitionedTrainer(
            model, optimizer, len(hosts) if hosts else args.parts, args.strategy, args.mode,
            hosts, args.microbatches, args.schedule, batch=batch,
            check_numerics=args.check_numerics)
        idle = [str(s.index) for s in trainer.plan.stats(batch) if s.nodes == 0]
        if idle:
            print(f"graphflow train: note: worker(s) {', '.join(idle)} got no nodes from the "
                  f"{args.strategy} strategy" + (" (no device() scope of the model names them)"
                                                 if args.strategy == "manual" else ""),
                  file=sys.stderr)
        if args.microbatches == "auto":
            print(f"micro-batches: {trainer.microbatches} (auto)", file=sys.stderr)
    else:
        trainer = Trainer(model, optimizer, check_numerics=args.check_numerics)
    start = time.perf_counter()
    try:
        history = trainer.fit(datasets.batches(data.x_train, data.y_train, batch,
                                               seed=args.seed, shift=shift), steps,
                              progress=not args.no_progress, trace=args.trace)
        seconds = time.perf_counter() - start
        accuracy = (trainer.accuracy(data.x_test, data.y_test)
                    if args.workload == "digits-lc" else None)
        record = trainer.manager.record if isinstance(trainer, DataParallelTrainer) else None
    finally:
        if isinstance(trainer, (PartitionedTrainer, DataParallelTrainer)):
            trainer.close()
    result = {"workload": args.workload, "steps": steps, "batch": batch, "seconds": seconds,
              "final_loss": history.losses[-1] if history.losses else None}
    if record is not None:
        result["replica_steps"] = {str(r): n for r, n in sorted(record.steps_done.items())}
        result["failures"] = record.failures
    if accuracy is not None:
        result["test_accuracy"] = accuracy
        result["test_examples"] = len(data.y_test)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.workload}: {steps} steps of batch {batch} in {seconds:.1f} s, "
              f"final loss {result['final_loss']:.4f}")
        if "test_accuracy" in result:
            print(f"test accuracy {100 * result['test_accuracy']:.2f}% on "
                  f"{result['test_examples']} held-out digits")
    return 0


def train_conflict(args: argparse.Namespace) -> str | None:
    """`train` options that would be ignored together: an error, not a silent no-op."""
    if args.microbatches != 1 and (args.replicas > 1 or not (args.parts > 1 or args.cluster)):
        return ("--microbatches pipelines one model split across workers: it needs --parts N "
                "(N > 1) or --cluster FILE, and no --replicas")
    if args.check_numerics and args.replicas > 1:
        return "--check-numerics checks one process or one split model, not --replicas"
    return None


def cmd_show(args: argparse.Namespace) -> int:
    from graphflow.autodiff import gradients
    from graphflow.modelspec import load_model

    name, graph, loss = load_model(args.workload)  # symbolic batch: the figures are at --batch
    if args.parts > 1:
        from graphflow.partitioners import STRATEGIES, partition
        from graphflow.prediction import command_cost

        strategies = STRATEGIES if args.strategy == "all" else [args.strategy]
        plans = [partition(graph, args.parts, s, loss=loss) for s in strategies]
        cost = command_cost(plans, args.batch, args.estimate)
        if args.strategy != "all":
            print(plans[0].report(args.batch, cost))
            return 0
        from graphflow.partitioners.plan import contention_note

        print(f"{name} on {args.parts} workers, batch {args.batch}"
              f"{contention_note(cost.contention, args.parts)}:")
        for strategy, plan in zip(strategies, plans, strict=True):
            cut = sum(t.nbytes(args.batch) for t in plan.transfers)
            prediction = plan.predict(args.batch, cost)
            used = sum(b > 0 for b in prediction.busy)
            spread = max(prediction.busy) * used / sum(prediction.busy)
            print(f"  {strategy:<10} cut {cut / 1e6:8.2f} MB/step in {len(plan.transfers):3d} "
                  f"transfers, predicted step {1e3 * prediction.step_seconds:7.1f} ms, "
                  f"{used} worker(s) busy, the busiest {spread:.2f}x their mean")
        return 0
    if args.backward:
        if loss is None:
            raise GraphflowError(f"--backward: MODEL '{args.workload}' has no loss to "
                                 f"differentiate")
        gradients(loss, graph.parameters())
    print(graph)
    n = sum(prod(p.shape) for p in graph.parameters())
    print(f"# {len(graph)} nodes, {n:,} parameters")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from graphflow.ops.registry import REGISTRY

    width = max(len(name) for name in REGISTRY)
    for name, op in sorted(REGISTRY.items()):
        grad = "grad" if op.grad else "    "
        print(f"{name:<{width}}  {grad}  {op.doc}")
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    from graphflow.viz.command import run

    return run(args)


def cmd_timeline(args: argparse.Namespace) -> int:
    from graphflow.trace.command import run

    return run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from importlib import import_module

    return int(import_module(f"graphflow.bench.{args.suite}").main(args.args))


def cmd_worker(args: argparse.Namespace) -> int:
    from graphflow.runtime.service import serve

    if args.cpu is not None:  # before any thread starts: zmq's and the worker's inherit it
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, AttributeError) as e:
            print(f"graphflow worker: cannot run on CPU {args.cpu}: {e}", file=sys.stderr)
            return 2
    serve(args.listen, announce=True, own_gc=True, parent=args.exit_with_parent,
          once=args.once)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    keep_freed_memory()  # every command runs (or serves) steps: the same tensors again and again
    if argv[:1] == ["ps"]:  # its own parser (argparse cannot pass options through)
        from graphflow.ps.__main__ import main as ps

        return int(ps(argv[1:], prog="graphflow ps"))
    args = _parser().parse_args(argv)
    if args.command == "train" and (conflict := train_conflict(args)):
        print(f"graphflow train: error: {conflict}", file=sys.stderr)
        return 2
    handler = {"train": cmd_train, "show": cmd_show, "ops": cmd_ops, "bench": cmd_bench,
               "worker": cmd_worker, "visualize": cmd_visualize,
               "timeline": cmd_timeline}[args.command]
    try:
        return handler(args)
    except (GraphflowError, ValueError, ImportError, OSError) as e:
        print(f"graphflow {args.command}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `graphflow show lc-large | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
