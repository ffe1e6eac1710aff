"""The driver's steps in flight: sent to the workers and not yet answered (`Cluster.stream`
keeps one or more of them while the workers run another)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from graphflow.transport.frames import SharedRef
from graphflow.transport.shared import SHARE_MIN_BYTES, SharedArrays, available

if TYPE_CHECKING:
    from graphflow.partitioners.plan import Plan

Key = tuple[int, tuple[int, ...], str]  # (worker, shape, dtype)


@dataclass
class SentStep:
    """A step whose requests went out: its number, each worker's request id, its trace, the
    arrays its feeds were cut into (`FeedBuffers`), with the worker each went to, and the
    fetches the caller named, joined from the plan's pieces where `Plan.joins` says how."""

    number: int
    requests: dict[int, int]
    traced: int | None
    sent: float
    buffers: list[tuple[int, np.ndarray]] = field(default_factory=list)
    fetches: list[str] = field(default_factory=list)
    fed: dict[str, np.ndarray] = field(default_factory=dict)  # placeholders fetched, as fed

    def results(self, plan: Plan, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fetches' values, from the workers' `values` of the plan's nodes."""
        values = {**values, **self.fed}
        return {name: values[name] if name in values else
                plan.joins[name].apply([values[b] for b in plan.joins[name].blocks])
                for name in self.fetches}


class FeedBuffers:
    """The arrays the driver cuts workers' feeds into (a spatial worker's rows of the image),
    used again once their step is answered: the worker then had the request, so zmq no longer
    reads them. A fresh 1.7 MB array per worker and step cost the driver's process 700 page
    faults a step (lc-large spatial, 2 workers): 3 ms of a core the workers need. Not over
    inproc (threads), where a worker's values may still be these very arrays.

    With `shared` (worker processes on this machine), the buffers are in shared memory and
    every large feed goes in one: a worker maps it instead of zmq copying it over ipc
    (transport/shared.py). A buffer goes to one worker only, the one that mapped it."""

    def __init__(self, reuse: bool, shared: SharedArrays | None = None) -> None:
        self.reuse, self.shared = reuse, shared
        self._free: dict[Key, list[np.ndarray]] = {}

    @classmethod
    def for_mode(cls, mode: str) -> FeedBuffers:
        """A cluster's: reused but with worker threads, shared with worker processes here."""
        local = mode == "processes" and available()
        return cls(reuse=mode != "threads", shared=SharedArrays() if local else None)

    def take(self, step: SentStep, worker: int, shape: tuple[int, ...], dtype: np.dtype
             ) -> np.ndarray:
        """A buffer for a feed of `worker` in `step`, to fill."""
        free = self._free.get((worker, shape, dtype.str))
        if free:
            out = free.pop()
        elif self.shared is not None and math.prod(shape) * dtype.itemsize >= SHARE_MIN_BYTES:
            try:
                out = self.shared.empty(shape, dtype)
            except OSError:  # /dev/shm is full: this feed travels in the message
                out = np.empty(shape, dtype)
        else:
            out = np.empty(shape, dtype)
        step.buffers.append((worker, out))
        return out

    def cut(self, plan: Plan, step: SentStep, worker: int, feeds: Mapping[str, np.ndarray]
            ) -> dict[str, np.ndarray | SharedRef]:
        """What `worker` is fed of `feeds` in `step`, as it travels: its rows cut into buffers
        (`Plan.worker_feeds`), each feed `wire`d."""
        mine = plan.worker_feeds(worker, feeds, partial(self.take, step, worker))
        return {k: self.wire(step, worker, v) for k, v in mine.items()}

    def wire(self, step: SentStep, worker: int, value: np.ndarray) -> np.ndarray | SharedRef:
        """How feed `value` of `worker` travels: by reference when it is (or, large, is copied
        into) a shared buffer; as itself otherwise."""
        if self.shared is None:
            return value
        if (ref := self.shared.ref(value)) is not None:
            return ref
        a = np.asarray(value)
        if a.nbytes < SHARE_MIN_BYTES or a.dtype.hasobject:
            return value
        buf = self.take(step, worker, a.shape, a.dtype)
        np.copyto(buf, a)
        return self.shared.ref(buf) or buf

    def give_back(self, step: SentStep) -> None:
        """`step` was answered: its buffers are free again (and mapped by their workers)."""
        for worker, b in step.buffers:
            if self.shared is not None:
                self.shared.settled(b)
            if self.reuse:
                self._free.setdefault((worker, b.shape, b.dtype.str), []).append(b)
        step.buffers.clear()

    def close(self) -> None:
        """Remove the shared buffers' files (the mappings last while arrays use them)."""
        if self.shared is not None:
            self.shared.close()
