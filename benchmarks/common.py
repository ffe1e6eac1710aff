"""Shared benchmark plumbing: thread setup, timing, the optional torch peer, tables and JSON.

Import order matters: `parse_args` sets the BLAS / OpenMP / Numba thread variables, so call it
before anything imports numpy (this module imports numpy only inside functions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMBA_NUM_THREADS")


def parse_args(name: str, doc: str, argv: Sequence[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    """Common flags (--threads, --repeats, --warmup, --json); sets thread variables at once."""
    p = argparse.ArgumentParser(prog=f"benchmarks/{name}.py", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1,
                   help="threads for BLAS, OpenMP, Numba and torch (default 1)")
    p.add_argument("--repeats", type=int, default=7,
                   help="timed repeats; median reported (%(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up runs (%(default)s)")
    p.add_argument("--json", type=Path, default=RESULTS / f"{name}.json",
                   help=f"where to write results (benchmarks/results/{name}.json)")
    if extra:
        extra(p)
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    set_threads(args.threads)
    return args


def set_threads(n: int) -> None:
    """Pin every thread pool to `n`; must run before numpy / numba / torch are imported."""
    late = [m for m in ("numpy", "numba", "torch") if sys.modules.get(m) is not None]
    if late:
        raise RuntimeError(f"set_threads({n}) called after importing {', '.join(late)}; "
                           "thread counts would not apply")
    for var in THREAD_VARS:
        os.environ[var] = str(n)


def load_torch(threads: int) -> Any:
    """The torch module set to `threads` threads, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (or parallel work already started)
        pass
    return torch


def measure(fns: dict[str, Callable[[], Any]], repeats: int,
            warmup: int) -> dict[str, dict[str, Any]]:
    """Time each of `fns` (name -> callable): `warmup` untimed runs each, then `repeats` rounds
    that run them in turn (interleaved, so a busy neighbour slows all alike; every other round
    in reverse, so none always runs first or right after the same one). Per name, seconds:
    median, min and all times (in round order)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(repeats):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "times_s": t}
            for name, t in times.items()}


def machine_info(threads: int, torch: Any) -> dict[str, Any]:
    from graphflow.bench import machine_info as graphflow_machine  # after set_threads

    return {**graphflow_machine(), "threads": threads,
            "torch": torch.__version__ if torch else None}


def ratio(torch_s: float | None, ours_s: float | None) -> float | None:
    """torch time / our time: above 1 means graphflow is faster."""
    if not torch_s or not ours_s:
        return None
    return torch_s / ours_s


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "FAIL"


def time_against_peer(row: dict[str, Any], name: str, args: Any, ours: Callable[[], Any],
                      peer: Callable[[], Callable[[], Any]] | None) -> list[str]:
    """Time graphflow (`ours()` -> (run, profile)) against the torch peer (`peer()` -> run)
    into `row`: per side the median and `<side>_ms`, then the ratio and the verdict. A failure
    of ours is reported in the row (and on stderr) while the peer is still timed."""
    fns: dict[str, Callable[[], Any]] = {}
    try:
        run, profile = ours()
        run()  # compile and check it runs before timing anything
        fns["ours"] = run
        if args.profile:
            profile()
    except Exception as e:  # noqa: BLE001 - one broken row must not hide the others
        row["error"] = f"{type(e).__name__}: {e}"
        print(f"error in {name}: {row['error']}", file=sys.stderr)
    if peer is not None:
        fns["torch"] = peer()
    row.update(measure(fns, args.repeats, args.warmup))
    for side in fns:
        row[f"{side}_ms"] = row[side]["median_s"] * 1e3
    row["ratio"] = ratio(row.get("torch_ms"), row.get("ours_ms"))
    row["verdict"] = "ERROR" if "error" in row else verdict(row["ratio"], row["target"])
    return list(fns)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
                title: str) -> None:
    """Print `rows` as an aligned text table; `columns` is (key, header) pairs."""
    from graphflow.bench import format_table  # imported late: numpy waits for set_threads

    print(f"\n{title}")
    print(format_table(rows, columns))


def write_json(path: Path, benchmark: str, args: Any, torch: Any,
               rows: Sequence[dict[str, Any]], **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": benchmark, "machine": machine_info(args.threads, torch),
           "repeats": args.repeats, "warmup": args.warmup, "rows": list(rows), **extra}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {path}")


def missing_peer_note(torch: Any) -> None:
    if torch is None:
        print("\nPyTorch is not installed: the peer is missing, only graphflow times are shown "
              "(pip install torch to compare).")


def run_main(main: Callable[[], int]) -> None:
    """Exit with main()'s code; on an exception print a one-line message to stderr, exit 1."""
    try:
        code = main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - a benchmark reports any failure and exits non-zero
        if os.environ.get("GRAPHFLOW_BENCH_TRACE"):
            traceback.print_exc()
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)


def profile_ops(graph: Any, fetches: Sequence[Any], feeds: dict[Any, Any],
                params: dict[str, Any], repeats: int = 3,
                by_node: bool = False) -> list[tuple[str, float, int]]:
    """Per-op-type (or per-node) forward time (median of repeats) over one run of `fetches`.

    Runs the executor's schedule node by node with the registry kernels, the way Session does.
    Returns (op, seconds, node count) sorted by time, largest first.
    """
    from graphflow.executor import schedule
    from graphflow.ops.registry import REGISTRY
    plan = schedule(graph, list(fetches), set(feeds))
    runs: list[dict[str, float]] = []
    counts: dict[str, int] = {}
    for _ in range(repeats):
        per_op: dict[str, float] = {}
        values: dict[Any, Any] = {}
        for node, dead in zip(plan.order, plan.frees):
            t0 = time.perf_counter()
            if node in feeds:
                values[node] = feeds[node]
            elif node.op == "parameter":
                values[node] = params[node.name]
            elif node.op == "constant":
                values[node] = node.attrs["value"]
            else:
                values[node] = REGISTRY[node.op].forward([values[x] for x in node.inputs],
                                                         node.attrs)
                key = f"{node.op} {node.name} {node.shape}" if by_node else node.op
                per_op[key] = per_op.get(key, 0.0) + time.perf_counter() - t0
                counts[key] = counts.get(key, 0) + 1
            for d in dead:
                del values[d]
        runs.append(per_op)
    ops = {op: statistics.median(r[op] for r in runs) for op in runs[0]}
    return sorted(((op, t, counts[op] // repeats) for op, t in ops.items()),
                  key=lambda r: -r[1])


def print_profile(title: str, prof: list[tuple[str, float, int]]) -> None:
    total = sum(t for _, t, _ in prof) or 1.0
    rows = [{"op": op, "ms": t * 1e3, "share": f"{100 * t / total:.1f}%", "nodes": n}
            for op, t, n in prof]
    print_table(rows, [("op", "op"), ("nodes", "nodes"), ("ms", "ms"), ("share", "share")],
                title)
