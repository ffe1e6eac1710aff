"""A traced run, seen from the driver: which clusters take part, their workers' spans on one clock.

`recording(path)` opens a Session for the block it wraps. A Cluster that runs a step inside it
joins (its workers start recording: the `trace_start` RPC) and hands its workers' spans over
when it closes or when the block ends, whichever comes first (`trace_take`, which also stops
them). Nothing is recorded outside the block, and no worker goes on recording after it: the
session is this module's one global, set and cleared by `recording` only.

Clocks: spans are `perf_counter()` seconds of the process that recorded them. Workers that
are threads of the driver or processes on its machine share its CLOCK_MONOTONIC, so their
spans need no correction. For remote workers (`graphflow worker --listen tcp://...`) the
driver estimates each one's offset from RPC round trips: it reads its own clock before (a)
and after (b) asking the worker for its clock (w), assumes the reply was read at the midpoint,
offset = (a + b) / 2 - w, and keeps the probe with the shortest round trip (its error is at
most half of that round trip, which is written into the trace).

    with recording("run.json"):
        trainer.fit(batches, steps=5)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graphflow.errors import GraphflowError
from graphflow.trace.chrome import Track, document
from graphflow.trace.recorder import Recorder, Span, clock, unpack

PROBES = 5  # clock probes per remote worker
_CURRENT: Session | None = None
_CURRENT_LOCK = threading.Lock()


class Traced(Protocol):
    """What a session needs of a cluster (graphflow.runtime.cluster.Cluster)."""

    mode: str
    names: list[str]

    def call_all(self, method: str, args: Mapping[str, Any]) -> list[Any]: ...

    def clock_probe(self, i: int) -> float: ...


def current() -> Session | None:
    """The session being recorded, if any (one at a time, per process)."""
    return _CURRENT


def driver_span(cat: str, name: str, args: Mapping[str, Any] | None = None
                ) -> AbstractContextManager[None]:
    """A span of the driver's calling thread around a block, when a run is being traced."""
    session = _CURRENT
    return nullcontext() if session is None else session.driver.span(cat, name, args)


def estimate_offset(probe: Callable[[], float], probes: int = PROBES) -> tuple[float, float]:
    """(offset, round trip) in seconds: this clock minus the clock `probe()` reads remotely,
    from the probe with the shortest round trip (midpoint rule, see the module docstring)."""
    best = (0.0, float("inf"))
    for _ in range(probes):
        a = clock()
        w = probe()
        b = clock()
        if b - a < best[1]:
            best = ((a + b) / 2 - w, b - a)
    return best


@dataclass
class _Member:
    """A cluster in the session: its workers' spans collected so far, one list per worker."""

    number: int
    cluster: Traced  # held to the end: its id() is the key, never to be reused meanwhile
    label: str | None
    offsets: list[tuple[float, float]]
    replicas: list[int | None]
    spans: list[list[Span]]
    open: bool = True  # its spans are not collected yet
    dropped: int = 0


@dataclass
class Session:
    """The spans of one traced run (see the module docstring); `document()` is the trace."""

    path: Path | None = None
    t0: float = field(default_factory=clock)
    driver: Recorder = field(default_factory=Recorder)
    notes: list[str] = field(default_factory=list)
    _members: dict[int, _Member] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def join(self, cluster: Traced) -> int | None:
        """Start tracing `cluster`'s workers, once; its number in this session (None if its
        workers could not start: the step that follows reports why)."""
        with self._lock:
            member = self._members.get(id(cluster))
            if member is None:
                member = _Member(len(self._members), cluster,
                                 getattr(cluster, "trace_label", None), [], [],
                                 [[] for _ in cluster.names])
                self._members[id(cluster)] = member
                fresh = True
            else:
                fresh = False
        if fresh:
            self._start(cluster, member)
        return member.number if member.offsets else None

    def _start(self, cluster: Traced, member: _Member) -> None:
        try:
            started = cluster.call_all("trace_start", {})
            member.replicas = [s.get("replica") for s in started]
            member.offsets = [estimate_offset(lambda i=i: cluster.clock_probe(i))
                              if cluster.mode == "remote" else (0.0, 0.0)
                              for i in range(len(cluster.names))]
        except GraphflowError as e:
            self.notes.append(f"cluster {member.number}: tracing did not start: {e}")

    def step(self, cluster: Traced, number: int | None, step: int, t0: float) -> None:
        """The driver's span of one step of `cluster` (the step time the workers' spans tile)."""
        if number is not None:
            self.driver.add(threading.current_thread().name, "step", f"step {step}", t0,
                            clock(), {"cluster": number, "step": step})

    def leave(self, cluster: Traced) -> None:
        """Collect `cluster`'s spans and stop its workers recording (before it closes)."""
        member = self._members.get(id(cluster))
        if member is None or not member.open:
            return
        member.open = False
        if not member.offsets:
            return
        try:
            batches = cluster.call_all("trace_take", {"stop": True})
        except GraphflowError as e:
            self.notes.append(f"cluster {member.number}: spans lost: {e}")
            return
        for i, batch in enumerate(batches):
            offset = member.offsets[i][0]
            try:
                spans = unpack(batch)
            except (ValueError, TypeError, KeyError, IndexError) as e:
                self.notes.append(f"cluster {member.number} worker {i}: bad spans: {e}")
                continue
            member.spans[i] += [(th, cat, name, a + offset, b + offset, args)
                                for th, cat, name, a, b, args in spans]
            member.dropped += int(batch.get("dropped", 0))

    def tracks(self) -> list[Track]:
        """The driver and every worker, in order, their spans on the driver's clock."""
        out = [Track(0, "driver", self.driver.spans[:], {"role": "driver"})]
        many = len(self._members) > 1
        for m in sorted(self._members.values(), key=lambda m: m.number):
            for i, spans in enumerate(m.spans):
                replica = m.replicas[i] if i < len(m.replicas) else None
                prefix = "".join([f"{m.label} " if m.label else "",
                                  f"replica {replica} " if replica is not None else "",
                                  f"cluster {m.number} " if many and not m.label
                                  and replica is None else ""])
                offset, rtt = m.offsets[i] if i < len(m.offsets) else (0.0, 0.0)
                out.append(Track(len(out), f"{prefix}worker {i}", spans, {
                    "role": "worker", "cluster": m.number, "worker": i, "replica": replica,
                    "clock_offset_us": 1e6 * offset, "clock_error_us": 5e5 * rtt,
                    "dropped": m.dropped}))
        return out

    def document(self) -> dict[str, Any]:
        """The trace-event JSON document of everything collected so far."""
        return document(self.tracks(), self.t0, {
            "clock": "perf_counter (CLOCK_MONOTONIC); remote workers shifted by an RPC "
                     "midpoint estimate (clock_offset_us, error <= clock_error_us)",
            "notes": list(self.notes), "driver_dropped": self.driver.dropped})

    def finish(self) -> dict[str, Any]:
        """Collect from every cluster still open, write `path` (if any); the document."""
        for member in list(self._members.values()):
            if member.open:
                self.leave(member.cluster)
        doc = self.document()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        return doc


@contextmanager
def recording(path: str | Path | None) -> Iterator[Session | None]:
    """Trace the clusters that run steps inside the block; write `path` (Chrome trace-event
    JSON) at its end. `recording(None)` does nothing (yields None), so a command can always
    write `with recording(args.trace):`.

        with recording("run.json") as session:
            trainer.fit(batches, steps=5)
        doc = session.document()
    """
    global _CURRENT
    if path is None:
        yield None
        return
    with _CURRENT_LOCK:
        if _CURRENT is not None:
            raise RuntimeError("a trace is already being recorded in this process")
        session = _CURRENT = Session(Path(path))
    try:
        yield session
    finally:
        with _CURRENT_LOCK:
            _CURRENT = None
        session.finish()
