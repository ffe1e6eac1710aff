"""What the cores of this machine give a synchronous multi-worker step, measured.

For each core alone and then for all cores at once, a process pinned to the core runs
single-threaded work for --seconds:

- compute: a 256 x 256 float32 gemm loop (it stays in the core's cache), timed in chunks of
  about 7 ms. "together / alone" near 1 means the cores do not share execution units; "slow
  chunks" is the share of chunks at least 20% slower than the core's median: a neighbour on the
  host taking the core for a while. A synchronous 2-worker step waits for the slower core at
  every exchange of tensors, so such stretches cost it more than they cost one worker.
- memory: copies of a 200 MB array (GB/s counts bytes read plus written); cores copying at once
  share the memory bandwidth.

    python benchmarks/machine.py                    # 5 s a phase
    python benchmarks/machine.py --seconds 20

`graphflow bench speedup`'s machine ceiling (two independent 1-worker processes over one) is the
end-to-end figure; this script says where it comes from.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

import common

SLOW = 1.2  # a chunk this much slower than the core's median counts as slow
COLUMNS = [("cpu", "core"), ("alone_ms", "gemm chunk ms alone"),
           ("together_ms", "with all cores busy"), ("compute_ratio", "together / alone"),
           ("slow_alone", "slow chunks alone"), ("slow_together", "slow chunks together"),
           ("alone_gbs", "copy GB/s alone"), ("together_gbs", "copy GB/s together")]


def parse_args() -> argparse.Namespace:
    """--seconds and --json only: one thread a core is the point, so the other benchmarks'
    --threads / --repeats / --warmup have no meaning here."""
    p = argparse.ArgumentParser(prog="benchmarks/machine.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of each phase (5)")
    p.add_argument("--json", type=Path, default=common.RESULTS / "machine.json",
                   help="where to write results (benchmarks/results/machine.json)")
    args = p.parse_args()
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    common.set_threads(1)  # (the spawned children inherit it)
    return args


def _work(cpu: int, seconds: float, queue: Any) -> None:
    """Child process: pinned to `cpu`, the gemm chunks for `seconds`, then the copies."""
    import numpy as np

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    a = np.random.default_rng(cpu).random((256, 256), dtype=np.float32)
    chunks, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(20):
            a @ a
        chunks.append(time.perf_counter() - t0)
    src = np.ones(50_000_000, np.float32)
    dst, copies, end = np.empty_like(src), [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append(2 * src.nbytes / (time.perf_counter() - t0) / 1e9)
    queue.put((cpu, chunks, copies))


def run(cpus: list[int], seconds: float) -> dict[int, tuple[list[float], list[float]]]:
    """Run `_work` on `cpus` at once; chunk seconds and copy GB/s by core."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_work, args=(c, seconds, queue), daemon=True) for c in cpus]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        cpu, chunks, copies = queue.get(timeout=4 * seconds + 60)
        out[cpu] = (chunks, copies)
    for p in procs:
        p.join(10.0)
    return out


def _slow_share(chunks: list[float]) -> float:
    median = statistics.median(chunks)
    return sum(c >= SLOW * median for c in chunks) / len(chunks)


def main() -> int:
    args = parse_args()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    alone = {c: run([c], args.seconds)[c] for c in cpus}
    together = run(cpus, args.seconds)
    rows = []
    for c in cpus:
        (ca, ma), (ct, mt) = alone[c], together[c]
        rows.append({"cpu": c, "alone_ms": 1e3 * statistics.median(ca),
                     "together_ms": 1e3 * statistics.median(ct),
                     "compute_ratio": statistics.median(ct) / statistics.median(ca),
                     "slow_alone": f"{_slow_share(ca):.0%}",
                     "slow_together": f"{_slow_share(ct):.0%}",
                     "alone_gbs": statistics.median(ma), "together_gbs": statistics.median(mt)})
    common.print_table(rows, COLUMNS, f"{len(cpus)} cores, each phase {args.seconds:g} s, one "
                                      f"thread a core (median chunk, median copy)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "machine", "machine": common.machine_info(1, None),
           "seconds": args.seconds, "rows": rows}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    common.run_main(main)
