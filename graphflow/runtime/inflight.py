"""The driver's steps in flight: sent to the workers and not yet answered (`Cluster.stream`
keeps one or more of them while the workers run another)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SentStep:
    """A step whose requests went out: its number, each worker's request id, its trace, and
    the arrays its feeds were cut into (`FeedBuffers`)."""

    number: int
    requests: dict[int, int]
    traced: int | None
    sent: float
    buffers: list[np.ndarray] = field(default_factory=list)


class FeedBuffers:
    """The arrays the driver cuts workers' feeds into (a spatial worker's rows of the image),
    used again once their step is answered: the worker then had the request, so zmq no longer
    reads them. A fresh 1.7 MB array per worker and step cost the driver's process 700 page
    faults a step (lc-large spatial, 2 workers): 3 ms of a core the workers need. Not over
    inproc (threads), where a worker's values may still be these very arrays."""

    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}

    def take(self, step: SentStep, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        free = self._free.get((shape, dtype.str))
        out = free.pop() if free else np.empty(shape, dtype)
        step.buffers.append(out)
        return out

    def give_back(self, step: SentStep) -> None:
        if self.reuse:
            for b in step.buffers:
                self._free.setdefault((b.shape, b.dtype.str), []).append(b)
        step.buffers.clear()
