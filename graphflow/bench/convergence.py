"""`graphflow bench convergence`: DistBelief's Fig. 4 on this machine.

Test accuracy against wall time on digits-lc for one model trained alone with SGD, and for
replicas sharing a sharded parameter server: Downpour with a fixed rate, Downpour with Adagrad,
BSP, SSP and Sandblaster L-BFGS. Prints each mode's time to 95% and its best accuracy, writes
JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from graphflow import datasets, models
from graphflow.argtypes import count, learning_rate, seconds
from graphflow.bench import (
    add_output_options,
    add_trace_option,
    csv_choices,
    fill_defaults,
    format_table,
    machine_info,
    single_threaded,
    write_outputs,
)
from graphflow.optim import SGD, Adagrad, Optimizer
from graphflow.partitioners import partition
from graphflow.progress import Progress
from graphflow.replicas.manager import ReplicaManager, ReplicaOptions
from graphflow.trace import recording
from graphflow.train import Trainer

MODES = ("sgd", "downpour-sgd", "downpour-adagrad", "bsp", "ssp", "sandblaster")
LABELS = {"sgd": "SGD, 1 model", "downpour-sgd": "Downpour SGD", "downpour-adagrad":
          "Downpour + Adagrad", "bsp": "BSP SGD", "ssp": "SSP (s=2) SGD",
          "sandblaster": "Sandblaster L-BFGS"}
TARGET = 0.97  # Downpour + Adagrad must reach it
MARK = 0.95    # time to this accuracy is the figure of merit
SHIFT = 2      # the digits' light augmentation (pixels)
SANDBLASTER_BATCH = 512  # examples per L-BFGS iteration, cut into portions of --batch


# --quick's defaults and the full run's (a gentler fixed rate when quick: 40 asynchronous steps
# at 0.05 ended at 14-80%)
QUICK = {"steps": 40, "eval_every": 0.2, "sgd_lr": 0.02}
FULL = {"steps": 1500, "eval_every": 0.5, "sgd_lr": 0.05}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphflow bench convergence", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: graphflow bench convergence --modes downpour-adagrad,bsp --steps 800")
    p.add_argument("--modes", type=csv_choices(MODES), default=list(MODES),
                   help=f"comma-separated (default all: {','.join(MODES)})")
    p.add_argument("--replicas", type=count, default=2, help="model replicas (2)")
    p.add_argument("--shards", type=count, default=2, help="parameter-server shards (2)")
    p.add_argument("--steps", type=count, default=None,
                   help=f"mini-batches per mode, all replicas together ({FULL['steps']}; "
                        f"--quick: {QUICK['steps']})")
    p.add_argument("--batch", type=count, default=32,
                   help=f"mini-batch size, at most the training set's and (with sandblaster) "
                        f"{SANDBLASTER_BATCH} (32)")
    p.add_argument("--lr", type=learning_rate, default=0.03, help="Adagrad's learning rate (0.03)")
    p.add_argument("--sgd-lr", type=learning_rate, default=None,
                   help=f"fixed SGD rate ({FULL['sgd_lr']}; --quick: {QUICK['sgd_lr']})")
    p.add_argument("--placement", default="processes", choices=["processes", "threads"],
                   help="replicas' workers as local processes (default) or threads")
    p.add_argument("--eval-every", type=seconds, default=None,
                   help=f"seconds between scores ({FULL['eval_every']}; --quick: "
                        f"{QUICK['eval_every']})")
    p.add_argument("--seed", type=int, default=0)
    add_output_options(p, "convergence")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    add_trace_option(p)
    p.add_argument("--quick", action="store_true",
                   help="tiny settings, for tests: " + " ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                   + " unless given, and no JSON/PNG unless given")
    return p


def arguments(argv: list[str] | None = None,
              p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The options, those not given filled with --quick's or the full run's defaults; a bad
    one exits 2 (SystemExit)."""
    p = p or parser()
    args = fill_defaults(p.parse_args(argv), p, "convergence", QUICK, FULL)
    if "sandblaster" in args.modes and args.batch > SANDBLASTER_BATCH:
        p.error(f"argument --batch: {args.batch} is more than sandblaster's "
                f"{SANDBLASTER_BATCH}-example batches (drop sandblaster from --modes)")
    return args


def main(argv: list[str] | None = None) -> int:
    """0 when every mode ran (and Downpour + Adagrad, if run, reached 97%), 1 otherwise,
    2 on a bad argument."""
    p = parser()
    try:
        args = arguments(argv, p)
        data = datasets.digits(seed=args.seed)
        if args.batch > len(data.x_train):
            p.error(f"argument --batch: {args.batch} is more than the "
                    f"{len(data.x_train)} training examples")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    doc: dict[str, Any] = {"benchmark": "convergence", "machine": machine_info(),
                           "settings": {k: str(v) if isinstance(v, Path) else v
                                        for k, v in vars(args).items()}, "runs": {}}
    with single_threaded(), recording(args.trace):
        for mode in args.modes:
            doc["runs"][mode] = run_mode(mode, data, args)
    print(format_table([_row(m, r) for m, r in doc["runs"].items()], COLUMNS,
                       left=("mode", "note")))
    write_outputs(doc, args.json, args.png, plot)
    failed = any("error" in r for r in doc["runs"].values())
    missed = "downpour-adagrad" in doc["runs"] and not args.quick and \
        doc["runs"]["downpour-adagrad"].get("best", 0.0) < TARGET
    return 1 if failed or missed else 0


COLUMNS = [("mode", "mode"), ("replicas", "R"), ("steps", "steps"), ("seconds", "seconds"),
           ("to95", "s to 95%"), ("best", "best acc"), ("final", "final acc"), ("note", "note")]


def _row(mode: str, r: dict[str, Any]) -> dict[str, Any]:
    return {"mode": LABELS[mode], "replicas": r.get("replicas", "-"),
            "steps": r.get("steps", "-"), "seconds": r.get("seconds", "-"),
            "to95": r.get("time_to_95") if r.get("time_to_95") is not None else "never",
            "best": r.get("best", "-"), "final": r.get("final", "-"),
            "note": r.get("error") or r.get("note", "-")}


def run_mode(mode: str, data: datasets.Dataset, args: argparse.Namespace) -> dict[str, Any]:
    """Train digits-lc in `mode`; the accuracy curve and its summary."""
    model = models.digits_lc(batch=None, seed=args.seed)
    batches = datasets.batches(data.x_train, data.y_train, args.batch, seed=args.seed,
                               shift=SHIFT)
    bar = Progress(args.steps, LABELS[mode], enabled=not args.no_progress)
    start = time.perf_counter()
    try:
        if mode == "sgd":
            curve, replicas = _single(model, batches, data, args, bar), 1
        elif mode == "sandblaster":
            curve, replicas = _sandblaster(model, data, args, bar), args.replicas
        else:
            curve, replicas = _replicated(mode, model, batches, data, args, bar), args.replicas
    except Exception as e:  # noqa: BLE001 - one failed mode is reported, the others still run
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        bar.__exit__()
    out = summarize(curve, replicas, time.perf_counter() - start)
    if mode == "sandblaster":
        out["note"] = f"L-BFGS iterations of {SANDBLASTER_BATCH} examples"
    return out


def summarize(curve: list[tuple[float, int, float]], replicas: int,
              seconds: float) -> dict[str, Any]:
    """curve: (seconds, steps so far, test accuracy) points."""
    to95 = next((t for t, _, acc in curve if acc >= MARK), None)
    return {"replicas": replicas, "steps": curve[-1][1] if curve else 0,
            "seconds": round(seconds, 2),
            "curve": [[round(t, 3), s, round(a, 4)] for t, s, a in curve],
            "time_to_95": None if to95 is None else round(to95, 2),
            "best": max((a for _, _, a in curve), default=0.0),
            "final": curve[-1][2] if curve else 0.0}


def _single(model: models.Model, batches: Any, data: datasets.Dataset,
            args: argparse.Namespace, bar: Progress) -> list[tuple[float, int, float]]:
    trainer = Trainer(model, SGD(args.sgd_lr))
    curve: list[tuple[float, int, float]] = []
    start = next_eval = time.perf_counter()
    for step in range(args.steps):
        loss = trainer.step(*next(batches))
        bar.update(loss=loss)
        if time.perf_counter() >= next_eval or step == args.steps - 1:
            elapsed = time.perf_counter() - start
            curve.append((elapsed, step + 1, trainer.accuracy(data.x_test, data.y_test)))
            next_eval = time.perf_counter() + args.eval_every
    return curve


def _replicated(mode: str, model: models.Model, batches: Any, data: datasets.Dataset,
                args: argparse.Namespace, bar: Progress) -> list[tuple[float, int, float]]:
    optimizer: Optimizer = Adagrad(args.lr) if mode == "downpour-adagrad" else SGD(args.sgd_lr)
    sync = mode.split("-")[0]
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    options = ReplicaOptions(mode=sync, placement=args.placement, staleness=2)
    with ReplicaManager(model, plan, optimizer, args.replicas, args.shards, options) as rm:
        _label(rm, mode)

        def progress(done: int, loss: float) -> None:
            bar.update(done - bar.done, loss=loss)
        record = rm.fit(batches, args.steps, evaluate=(data.x_test, data.y_test),
                        eval_every=args.eval_every, progress=progress)
    return record.evals


def _label(rm: ReplicaManager, mode: str) -> None:
    """Name the replicas' workers after the mode in a --trace."""
    for cluster in rm.clusters:
        if cluster is not None:
            cluster.trace_label = mode


def _sandblaster(model: models.Model, data: datasets.Dataset, args: argparse.Namespace,
                 bar: Progress) -> list[tuple[float, int, float]]:
    """L-BFGS on large batches; the coordinator and replicas share the PS shards' vectors.
    An iteration evaluates a new batch twice (at the old point, then the new): as many
    iterations as make the same number of examples as the other modes' `steps` batches."""
    iterations = max(2, args.steps * args.batch // (2 * SANDBLASTER_BATCH))
    bar.total = iterations
    batches = datasets.batches(data.x_train, data.y_train, SANDBLASTER_BATCH, seed=args.seed,
                               shift=SHIFT)
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    options = ReplicaOptions(mode="sandblaster", placement=args.placement,
                             portions=SANDBLASTER_BATCH // args.batch)
    with ReplicaManager(model, plan, SGD(1.0), args.replicas, args.shards, options) as rm:
        _label(rm, "sandblaster")

        def progress(done: int, loss: float) -> None:
            bar.update(done - bar.done, loss=loss)
        record = rm.fit(batches, iterations, evaluate=(data.x_test, data.y_test),
                        eval_every=args.eval_every, progress=progress)
    return record.evals


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """Accuracy against wall time, one line per mode. A message instead without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    ax = fig.subplots()
    for i, (mode, run) in enumerate(doc["runs"].items()):
        if run.get("curve"):
            t, _, acc = zip(*run["curve"], strict=True)
            ax.plot(t, 100 * np.asarray(acc), "-", color=f"C{i}",
                    label=f"{LABELS[mode]} ({run['replicas']})")
    ax.axhline(100 * MARK, color="gray", ls=":", lw=1)
    ax.axhline(100 * TARGET, color="gray", ls="--", lw=1)
    ax.set(xlabel="wall time (s)", ylabel="test accuracy (%)", ylim=(50, 100),
           title=f"digits-lc on {doc['machine']['cpu_count']} cores: accuracy against time")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # (no curve, e.g. every mode failed: no legend)
        ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None


if __name__ == "__main__":
    sys.exit(main())
