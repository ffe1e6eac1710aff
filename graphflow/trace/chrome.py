"""The Chrome trace-event format (what Perfetto and chrome://tracing open), both ways.

A trace is {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}: one "X"
(complete) event per span with pid / tid / ts / dur in microseconds, and "M" (metadata) events
naming each process ("driver", "worker 0", ...) and thread ("executor", "send", ...) and
giving their order. `otherData.graphflow.processes` says which cluster / worker / replica each
pid is and how its clock was aligned.

>>> doc = document([Track(1, "worker 0", [("executor", "kernel", "fc/matmul", 1.0, 1.002, None)],
...                       {"role": "worker", "cluster": 0, "worker": 0})], t0=1.0)
>>> validate(doc)
>>> [(e.process, e.thread, e.name, e.dur) for e in events(doc)]
[('worker 0', 'executor', 'fc/matmul', 2000.0)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from graphflow.errors import GraphflowError
from graphflow.trace.recorder import THREAD_ORDER, Span

PHASES = frozenset("XBEiIbenCMsftPNOD")  # the trace-event phases a viewer knows
METADATA = frozenset({"process_name", "thread_name", "process_sort_index", "thread_sort_index",
                      "process_labels"})


class TraceError(GraphflowError):
    """A file is not a trace-event document (or not one this tool can draw)."""


@dataclass(frozen=True)
class Track:
    """One process of a trace: its spans (driver-clock seconds) and what it is (`info`)."""

    pid: int
    name: str
    spans: Sequence[Span]
    info: Mapping[str, Any]


class Event(NamedTuple):
    """An "X" event with its process and thread names resolved; times in microseconds."""

    process: str
    thread: str
    pid: int
    tid: int
    cat: str
    name: str
    ts: float
    dur: float
    args: Mapping[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _thread_ids(spans: Sequence[Span]) -> dict[str, int]:
    """Thread name -> tid: the worker's known threads in their order, then the others."""
    names = set(s[0] for s in spans)
    known = [t for t in THREAD_ORDER if t in names]
    return {t: i + 1 for i, t in enumerate(known + sorted(names - set(known)))}


def _meta(kind: str, pid: int, tid: int, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": dict(args)}


def document(tracks: Sequence[Track], t0: float,
             other: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace of `tracks`, times relative to `t0` (seconds on the same clock)."""
    events: list[dict[str, Any]] = []
    for order, track in enumerate(tracks):
        events += [_meta("process_name", track.pid, 0, {"name": track.name}),
                   _meta("process_sort_index", track.pid, 0, {"sort_index": order})]
        tids = _thread_ids(track.spans)
        for thread, tid in tids.items():
            events += [_meta("thread_name", track.pid, tid, {"name": thread}),
                       _meta("thread_sort_index", track.pid, tid, {"sort_index": tid})]
        for thread, cat, name, a, b, args in track.spans:
            event = {"name": name, "cat": cat, "ph": "X", "pid": track.pid,
                     "tid": tids[thread], "ts": _us(a - t0), "dur": _us(max(b - a, 0.0))}
            if args:
                event["args"] = dict(args)
            events.append(event)
    info = {"processes": {str(t.pid): dict(t.info, name=t.name) for t in tracks},
            **dict(other or {})}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"graphflow": info}}


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _problem(i: int, e: Any) -> str | None:
    """What is wrong with event `i`, or None."""
    if not isinstance(e, dict):
        return f"event {i} is a {type(e).__name__}, not an object"
    ph = e.get("ph")
    if ph not in PHASES:
        return f"event {i}: unknown phase {ph!r}"
    if not all(isinstance(e.get(k, 0), int) and not isinstance(e.get(k, 0), bool)
               for k in ("pid", "tid")):
        return f"event {i}: pid and tid must be integers"
    if ph == "M":
        if e.get("name") not in METADATA or not isinstance(e.get("args"), dict):
            return f"event {i}: metadata needs a known name and args"
        return None
    if not isinstance(e.get("name"), str) or not _number(e.get("ts")):
        return f"event {i} ({ph}): needs a name and a finite ts"
    if ph == "X" and not (_number(e.get("dur")) and e["dur"] >= 0):
        return f"event {i} (X {e['name']!r}): dur must be a finite number >= 0"
    if "args" in e and not isinstance(e["args"], dict):
        return f"event {i} ({e['name']!r}): args must be an object"
    return None


def validate(doc: Any) -> None:
    """Raise TraceError unless `doc` is a trace-event document (object or array form)."""
    evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(evs, list):
        raise TraceError("not a trace: expected {\"traceEvents\": [...]} or a list of events")
    problems = [p for i, e in enumerate(evs) if (p := _problem(i, e)) is not None]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise TraceError("bad trace events: " + "; ".join(problems[:3]) + more)


def read(path: str | Path) -> dict[str, Any]:
    """Load and validate a trace file; the array form comes back as {"traceEvents": [...]}."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e})") from None
    validate(doc)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def events(doc: Mapping[str, Any]) -> list[Event]:
    """The "X" events of `doc`, with names, sorted by (pid, tid, ts)."""
    evs = doc["traceEvents"]
    procs = {e["pid"]: e["args"].get("name") for e in evs
             if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"].get("name") for e in evs
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    out = [Event(str(procs.get(e.get("pid", 0)) or f"pid {e.get('pid', 0)}"),
                 str(threads.get((e.get("pid", 0), e.get("tid", 0))) or f"tid {e.get('tid', 0)}"),
                 e.get("pid", 0), e.get("tid", 0), str(e.get("cat", "")), e["name"],
                 float(e["ts"]), float(e["dur"]), e.get("args") or {})
           for e in evs if e.get("ph") == "X"]
    return sorted(out, key=lambda e: (e.pid, e.tid, e.ts))


def process_order(doc: Mapping[str, Any]) -> dict[int, float]:
    """pid -> its sort index (pid itself when the trace gives none)."""
    order: dict[int, float] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "process_sort_index":
            order[e["pid"]] = e["args"].get("sort_index", e["pid"])
    return order
