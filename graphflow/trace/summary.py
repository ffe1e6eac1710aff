"""What a trace says in numbers: per worker, how much of each measured step its spans cover.

The driver's "step" spans are the measured step times (from sending the step to the workers to
the last reply). A worker's executor thread (the one that answers the driver) waits for the
step's request ("await step": idle, then the request and its feeds coming in), runs the
step's kernels, waits for its tensors ("recv wait"), updates, and replies ("step reply"), one
span after the other, so its spans tile the step but for the bookkeeping between spans.
`coverage` is their total over the step time; `work` leaves out the wait for the request and
the reply (the part of the step the worker itself spent: the rest is the driver's RPC);
`compute` counts kernels and updates only. Spans of the other threads (send, recv, PS push and
fetch) run beside the executor and are not added in: they would count the same time twice.

>>> from graphflow.trace.chrome import Track, document
>>> doc = document([Track(0, "driver", [("main", "step", "step 0", 0.0, 0.1,
...                                       {"cluster": 0, "step": 0})], {"role": "driver"}),
...                 Track(1, "worker 0", [("executor", "kernel", "a", 0.0, 0.05, None),
...                                       ("executor", "recv", "recv wait", 0.05, 0.095, None)],
...                       {"role": "worker", "cluster": 0, "worker": 0})], t0=0.0)
>>> [(c["process"], c["steps"], round(c["coverage"], 2)) for c in coverage(doc)]
[('worker 0', 1, 0.95)]
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from graphflow.trace.chrome import Event, events
from graphflow.trace.recorder import EXECUTOR


def step_windows(evs: list[Event]) -> dict[int, list[tuple[float, float]]]:
    """cluster number -> its measured steps (start, end) in microseconds, in time order."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in evs:
        if e.process == "driver" and e.cat == "step" and isinstance(e.args.get("cluster"), int):
            out[e.args["cluster"]].append((e.ts, e.end))
    return {c: sorted(w) for c, w in out.items()}


def covered(spans: list[Event], start: float, end: float) -> float:
    """Microseconds of [start, end] inside the union of `spans` (sorted by start): a span
    nested in another (a PS push again inside a BSP barrier) is not counted twice."""
    total, reach = 0.0, start
    for e in spans:
        if e.ts >= end:
            break
        lo, hi = max(e.ts, reach), min(e.end, end)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total


def steady(steps: list[tuple[float, float]], last: int | None = None
           ) -> list[tuple[float, float]]:
    """The steps a summary counts: the `last` ones, or else all but the first when there are
    three or more (the first compiles the kernels and warms the caches: 10x a step, often)."""
    if last is not None:
        return steps[-last:]
    return steps[1:] if len(steps) >= 3 else steps


def coverage(doc: Mapping[str, Any], last_steps: int | None = None) -> list[dict[str, Any]]:
    """Per worker: steps, median step and executor-span total (ms), the median ratios of the
    span total (`coverage`), of its `work` and its `compute` to the step time, the lowest
    coverage of a step, and its executor spans' ms per category (`category_ms`); over the
    `steady` steps."""
    evs = events(doc)
    every = step_windows(evs)
    windows = {c: steady(w, last_steps) for c, w in every.items()}
    procs = doc.get("otherData", {}).get("graphflow", {}).get("processes", {})
    by_thread: dict[tuple[int, str], list[Event]] = defaultdict(list)
    for e in evs:
        by_thread[(e.pid, e.thread)].append(e)
    out = []
    for pid, info in sorted(procs.items(), key=lambda kv: int(kv[0])):
        steps = windows.get(info.get("cluster"), []) if info.get("role") == "worker" else []
        if not steps:
            continue
        spans = by_thread[(int(pid), EXECUTOR)]
        work = [e for e in spans if e.cat not in ("idle", "rpc")]
        compute = [e for e in spans if e.cat in ("kernel", "update")]
        totals = [covered(spans, a, b) for a, b in steps]
        ratios = [t / (b - a) for t, (a, b) in zip(totals, steps) if b > a]
        out.append({"process": info.get("name", f"pid {pid}"), "steps": len(steps),
                    "left_out": len(every[info.get("cluster")]) - len(steps),
                    "step_ms": statistics.median(b - a for a, b in steps) / 1e3,
                    "spans_ms": statistics.median(totals) / 1e3,
                    "coverage": statistics.median(ratios) if ratios else 0.0,
                    "lowest": min(ratios, default=0.0),
                    "work": _median_ratio(work, steps), "compute": _median_ratio(compute, steps),
                    "category_ms": {cat: sum(ms) for cat, ms in per_step(spans, steps).items()}})
    return out


def driver_alone(doc: Mapping[str, Any], last_steps: int | None = None) -> dict[str, Any] | None:
    """A trace of one process (the driver ran the kernels; its steps name no cluster): its
    `steady` steps, and per category the median ms a step (`step` is the step time). None
    when the trace has workers or the driver timed no step."""
    evs = events(doc)
    if step_windows(evs):
        return None
    mine = [e for e in evs if e.process == "driver"]
    every = sorted((e.ts, e.end) for e in mine if e.cat == "step")
    steps = steady(every, last_steps)
    if not steps:
        return None
    spans = sorted(mine, key=lambda e: e.ts)
    return {"steps": len(steps), "left_out": len(every) - len(steps),
            "ms_per_step": {cat: statistics.median(ms)
                            for cat, ms in per_step(spans, steps).items()}}


def per_step(spans: list[Event], steps: list[tuple[float, float]]) -> dict[str, list[float]]:
    """category -> ms of `spans` (sorted by start) inside each of `steps` (disjoint, in time
    order): what a span spends outside the steps counted (the compiling first one) is not."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(steps))
    starts = [a for a, _ in steps]
    for e in spans:
        k = max(bisect.bisect_right(starts, e.ts) - 1, 0)
        while k < len(steps) and steps[k][0] < e.end:
            a, b = steps[k]
            if (inside := min(e.end, b) - max(e.ts, a)) > 0:
                out[e.cat][k] += inside / 1e3
            k += 1
    return dict(out)


def _median_ratio(spans: list[Event], steps: list[tuple[float, float]]) -> float:
    return statistics.median(covered(spans, a, b) / (b - a) for a, b in steps if b > a)


def report(doc: Mapping[str, Any], last_steps: int | None = None) -> str:
    """A few lines for people: each worker's coverage of the steps and where its time went."""
    lines = []
    for c in coverage(doc, last_steps):
        lines.append(f"{c['process']}: executor spans {c['spans_ms']:.1f} ms of a "
                     f"{c['step_ms']:.1f} ms step ({100 * c['coverage']:.1f}%, median of "
                     f"{_which(c, last_steps)}; in the worker's own work {100 * c['work']:.0f}%, "
                     f"computing {100 * c['compute']:.0f}%); in those steps: "
                     f"{_by_size(c['category_ms'])}")
    if not lines and (alone := driver_alone(doc, last_steps)):  # the driver ran the kernels
        lines.append(f"driver (no workers), a step: {_by_size(alone['ms_per_step'])} (median "
                     f"of {_which(alone, last_steps)})")
    return "\n".join(lines) or "no measured steps in this trace (no driver 'step' spans)"


def _which(c: Mapping[str, Any], last_steps: int | None) -> str:
    if last_steps is not None:
        return f"the last {c['steps']} steps"
    return f"{c['steps']} steps" + (", the first left out" if c["left_out"] else "")


def _by_size(ms: Mapping[str, float]) -> str:
    return ", ".join(f"{cat} {v:.1f} ms" for cat, v in sorted(ms.items(), key=lambda kv: -kv[1]))
