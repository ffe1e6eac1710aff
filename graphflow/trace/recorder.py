"""Spans of one process: what a thread did from when to when, in that process's clock.

A worker owns a Recorder only while a run is traced (`WorkerService.trace_start`); the hot
paths test `self.trace is not None` and do nothing else when it is off. Times are
`time.perf_counter()` seconds (CLOCK_MONOTONIC on Linux: one clock for every process on a
machine); the driver moves a remote worker's spans onto its own clock (see session.py).

>>> rec = Recorder()
>>> t0 = clock()
>>> rec.add(EXECUTOR, "kernel", "fc/matmul", t0, t0 + 0.002, {"op": "matmul"})
>>> batch = rec.take()
>>> batch["labels"], batch["threads"], len(rec.spans)
([['kernel', 'fc/matmul']], ['executor'], 0)
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

clock = time.perf_counter

# A worker's threads. The executor runs kernels and waits for tensors, one span after another,
# so its spans tile the step; the others run beside it.
EXECUTOR, SEND, RECV, PS_PUSH, PS_FETCH = "executor", "send", "recv", "ps push", "ps fetch"
GC = "gc"  # garbage collections of other threads (a collection stops the process's Python)
THREAD_ORDER = (EXECUTOR, SEND, RECV, PS_PUSH, PS_FETCH, GC)
LIMIT = 2_000_000  # spans kept per take(); more are counted as dropped (a long traced run)

Span = tuple[str, str, str, float, float, "Mapping[str, Any] | None"]  # thread cat name t0 t1


class Recorder:
    """An append-only list of spans; `add` is one tuple append (thread-safe under the GIL)."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.spans: list[Span] = []
        self.limit = limit
        self.dropped = 0

    def add(self, thread: str, cat: str, name: str, t0: float, t1: float,
            args: Mapping[str, Any] | None = None) -> None:
        """Record that `thread` spent [t0, t1] (clock() seconds) on `name` of category `cat`."""
        if len(self.spans) < self.limit:
            self.spans.append((thread, cat, name, t0, t1, args))
        else:
            self.dropped += 1

    @contextmanager
    def span(self, cat: str, name: str, args: Mapping[str, Any] | None = None,
             thread: str | None = None) -> Iterator[None]:
        """A span around a block, on `thread` (default: the calling thread's name). For code
        off the hot path (the driver, benchmarks)."""
        t0 = clock()
        try:
            yield
        finally:
            self.add(thread or threading.current_thread().name, cat, name, t0, clock(), args)

    def take(self) -> dict[str, Any]:
        """Hand over (and forget) the spans recorded so far, in a compact form that travels
        over the RPC: per span a label index, a thread index and (t0, t1); args listed apart."""
        spans, self.spans = self.spans, []
        dropped, self.dropped = self.dropped, 0
        return pack(spans[:], dropped)  # (a copy: a thread may still append to the old list)


def pack(spans: list[Span], dropped: int = 0) -> dict[str, Any]:
    """Spans as {"threads", "labels", "thread", "label", "times", "args", "dropped"}."""
    threads: dict[str, int] = {}
    labels: dict[tuple[str, str], int] = {}
    thread_ix = np.empty(len(spans), np.int32)
    label_ix = np.empty(len(spans), np.int32)
    times = np.empty((len(spans), 2), np.float64)
    args = []
    for i, (thread, cat, name, t0, t1, extra) in enumerate(spans):
        thread_ix[i] = threads.setdefault(thread, len(threads))
        label_ix[i] = labels.setdefault((cat, name), len(labels))
        times[i] = t0, t1
        if extra:
            args.append([i, dict(extra)])
    return {"threads": list(threads), "labels": [list(k) for k in labels],
            "thread": thread_ix, "label": label_ix, "times": times, "args": args,
            "dropped": dropped}


def unpack(batch: Mapping[str, Any]) -> list[Span]:
    """The spans of a `pack`ed batch (as they came over the RPC: checked, not trusted)."""
    threads, labels = list(batch["threads"]), [tuple(x) for x in batch["labels"]]
    thread_ix = np.asarray(batch["thread"])
    label_ix = np.asarray(batch["label"])
    times = np.asarray(batch["times"], np.float64).reshape(-1, 2)
    if not len(thread_ix) == len(label_ix) == len(times):
        raise ValueError(f"trace batch: {len(thread_ix)} threads, {len(label_ix)} labels and "
                         f"{len(times)} times do not match")
    args = {int(i): a for i, a in batch.get("args", [])}
    out: list[Span] = []
    for i, (t, lab, (t0, t1)) in enumerate(zip(thread_ix.tolist(), label_ix.tolist(),
                                               times.tolist())):
        cat, name = labels[lab]
        out.append((threads[t], str(cat), str(name), t0, t1, args.get(i)))
    return out


# -- garbage collections, as spans of the thread that collected ---------------------------------
# A collection of the older generations can take 100 ms here (numba's and the graphs' objects);
# it runs on whichever thread allocated, between or inside kernels. While recorders are live a
# gc callback records each collection: on the thread `bind_thread` named (a worker's executor),
# else on every live recorder's "gc" row.

_live: list[Recorder] = []
_live_lock = threading.Lock()
_bound = threading.local()
_gc_began: dict[int, float] = {}


def _on_gc(phase: str, info: Mapping[str, Any]) -> None:
    ident = threading.get_ident()
    if phase == "start":
        _gc_began[ident] = clock()
        return
    t0 = _gc_began.pop(ident, None)
    if t0 is None:
        return
    t1 = clock()
    args = {"generation": info.get("generation"), "collected": info.get("collected")}
    bound = getattr(_bound, "where", None)
    for rec, thread in [bound] if bound is not None else [(r, GC) for r in _live]:
        rec.add(thread, "gc", f"gc (generation {args['generation']})", t0, t1, args)


def activate(rec: Recorder) -> None:
    """`rec` records this process's garbage collections until `deactivate`."""
    with _live_lock:
        if not _live:
            gc.callbacks.append(_on_gc)
        _live.append(rec)


def deactivate(rec: Recorder) -> None:
    with _live_lock:
        if rec in _live:
            _live.remove(rec)
            if not _live and _on_gc in gc.callbacks:
                gc.callbacks.remove(_on_gc)


def bind_thread(rec: Recorder | None, thread: str = EXECUTOR) -> None:
    """The calling thread's collections go to `rec` as spans of `thread` (None: unbind)."""
    _bound.where = (rec, thread) if rec is not None else None
