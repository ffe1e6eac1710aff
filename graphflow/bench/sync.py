"""`graphflow bench sync`: a synchronous step's gradient exchange as replicas grow, through the
parameter server (BSP: every replica pushes, the shards average and update, every replica
fetches) against a ring and a tree allreduce (FireCaffe), in threads of this process.

Each point is the median time from the moment all replicas are released together to the moment
the last one holds the averaged result (allreduce) or the updated parameters (PS).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from graphflow.argtypes import count, csv_counts_of, positive
from graphflow.bench import (
    add_output_options,
    add_trace_option,
    fill_defaults,
    format_table,
    machine_info,
    single_threaded,
    write_outputs,
)
from graphflow.ps.client import PSClient
from graphflow.ps.layout import Layout
from graphflow.ps.server import ShardThread
from graphflow.replicas.allreduce import bench_allreduce
from graphflow.trace import driver_span, recording

METHODS = ("ps", "ring", "tree")
COLUMNS = [("method", "method"), ("replicas", "R"), ("mb", "MB"), ("ms", "median ms"),
           ("gbs", "GB/s per replica")]


QUICK = {"mb": 0.25, "repeats": 2}  # --quick's defaults; the full run's are FULL
FULL = {"mb": 4.0, "repeats": 15}
MIN_MB = 4 / 2**20  # one float32 element


def megabytes(text: str) -> float:
    """An argparse type: a gradient size in MB, at least one float32 element's worth."""
    mb = positive(" MB")(text)
    if int(mb * 2**20) // 4 < 1:
        raise argparse.ArgumentTypeError(
            f"{text} MB is less than one float32 element; the least is {MIN_MB:.4g} MB "
            "(4 bytes)")
    return mb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graphflow bench sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: graphflow bench sync --replicas 1,2,4 --mb 4")
    p.add_argument("--replicas", type=csv_counts_of("replica"), default=[1, 2, 4],
                   help="replica counts, comma-separated; 1 is always measured (1,2,4)")
    p.add_argument("--mb", type=megabytes, default=None,
                   help=f"gradient size in MB ({FULL['mb']:g}; --quick: {QUICK['mb']:g})")
    p.add_argument("--shards", type=count, default=2, help="parameter-server shards (2)")
    p.add_argument("--repeats", type=count, default=None,
                   help=f"timed exchanges per point ({FULL['repeats']}; --quick: "
                        f"{QUICK['repeats']})")
    add_output_options(p, "sync")
    add_trace_option(p)
    p.add_argument("--quick", action="store_true",
                   help=f"tiny settings, for tests: --mb {QUICK['mb']:g} --repeats "
                        f"{QUICK['repeats']} unless given, and no JSON/PNG unless given")
    return p


def arguments(argv: list[str] | None = None,
              p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The options, those not given filled with --quick's or the full run's defaults; a bad
    one exits 2 (SystemExit)."""
    p = p or parser()
    return fill_defaults(p.parse_args(argv), p, "sync", QUICK, FULL)


def main(argv: list[str] | None = None) -> int:
    """0 when every point ran, 2 on a bad argument."""
    try:
        args = arguments(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    size = int(args.mb * 2**20) // 4
    doc: dict[str, Any] = {"benchmark": "sync", "machine": machine_info(),
                           "settings": {k: str(v) if isinstance(v, Path) else v
                                        for k, v in vars(args).items()}, "points": []}
    with single_threaded(), recording(args.trace):
        for r in args.replicas:
            doc["points"].append({"method": "ps", "replicas": r,
                                  "times_s": ps_exchange(r, args.shards, size, args.repeats)})
            for algorithm in ("ring", "tree"):
                with driver_span("allreduce", f"{algorithm} allreduce x{args.repeats + 1}",
                                 {"replicas": r}):
                    res = bench_allreduce([4 * size], r, algorithm, args.repeats)
                res = res["results"][0]
                doc["points"].append({"method": algorithm, "replicas": r,
                                      "times_s": res["times_s"]})
    for pt in doc["points"]:
        pt["median_s"] = statistics.median(pt["times_s"])
    rows = [{"method": pt["method"], "replicas": pt["replicas"], "mb": 4 * size / 2**20,
             "ms": 1e3 * pt["median_s"], "gbs": 4 * size / pt["median_s"] / 1e9}
            for pt in doc["points"]]
    print(format_table(rows, COLUMNS, left=("method",)))
    write_outputs(doc, args.json, args.png, plot)
    return 0


def ps_exchange(replicas: int, shards: int, size: int, repeats: int) -> list[float]:
    """Times of BSP exchanges of a `size`-element gradient by `replicas` client threads."""
    run = uuid.uuid4().hex[:8]
    threads = [ShardThread(f"inproc://graphflow-sync-{run}-{s}", s, shards)
               for s in range(shards)]
    layout = Layout.build({"g": (size,)}, shards)
    addresses = [t.address for t in threads]
    grad = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    try:
        with PSClient(addresses, layout) as c:
            c.init({"g": np.zeros(size, np.float32)}, {"name": "sgd", "lr": 0.01},
                   list(range(replicas)))
        clients = [PSClient(addresses, layout) for _ in range(replicas)]
        barrier = threading.Barrier(replicas)
        marks: list[list[tuple[float, float]]] = [[] for _ in range(replicas)]

        def replica(r: int) -> None:
            for step in range(repeats + 1):
                barrier.wait(30)
                start = time.perf_counter()
                with driver_span("ps", "bsp push", {"replicas": replicas, "step": step}):
                    clients[r].push(r, step, {"g": grad}, mode="bsp")
                with driver_span("ps", "bsp fetch", {"replicas": replicas, "step": step}):
                    clients[r].fetch(min_version=step + 1)
                marks[r].append((start, time.perf_counter()))

        workers = [threading.Thread(target=replica, args=(r,), name=f"replica {r}")
                   for r in range(replicas)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        for c in clients:
            c.close()
    finally:
        for t in threads:
            t.stop()
    return [max(m[i][1] for m in marks) - min(m[i][0] for m in marks)
            for i in range(1, repeats + 1)]  # the first exchange warms up


def plot(doc: dict[str, Any], path: Path) -> str | None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    fig = Figure(figsize=(6.4, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, method in enumerate(METHODS):
        pts = [(p["replicas"], 1e3 * p["median_s"]) for p in doc["points"]
               if p["method"] == method]
        ax.plot(*zip(*pts, strict=True), "o-", color=f"C{i}",
                label={"ps": f"parameter server ({doc['settings']['shards']} shards, BSP)",
                       "ring": "ring allreduce", "tree": "tree allreduce"}[method])
    ax.set(xlabel="replicas", ylabel="ms per synchronous exchange",
           title=f"{doc['settings']['mb']:g} MB of gradients, threads on "
                 f"{doc['machine']['cpu_count']} cores")
    ax.set_xticks(sorted({p["replicas"] for p in doc["points"]}))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None


if __name__ == "__main__":
    sys.exit(main())
