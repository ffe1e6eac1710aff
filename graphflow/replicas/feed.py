"""The batches of one ReplicaManager.fit, handed to the replicas as the consistency mode allows.

- downpour: the next batch goes to whichever replica asks, until `steps` were handed out.
- ssp: the same, but a replica more than `staleness` steps ahead of the slowest live one waits
  here, holding no batch: at the shards' clock gate it would hold one the slowest may need.
- bsp, allreduce (lockstep): every live replica runs one step a round, so the run is whole
  rounds: `steps` rounded up to a multiple of the live replicas (a replica whose partners got
  no batch would wait for them at the barrier until dropped, or time out).

Batches that run out before `steps` end the run there (lockstep: at whole rounds).
A batch whose replica failed on it is given back. A replica that would stop waits while another
still holds a batch, since a failure there may give a batch back or (lockstep) add rounds for
the replicas left, so that the run still has `steps` steps.

    >>> feed = Feed(iter(range(10)), steps=3, replicas=[0, 1], mode="bsp")
    >>> feed.planned, [feed.next(0), feed.next(1)]
    (4, [0, 1])
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from typing import Generic, TypeVar

LOCKSTEP = ("bsp", "allreduce")  # every step waits for every live replica

B = TypeVar("B")


class Feed(Generic[B]):
    """Hands `batches` to `replicas` (see the module docstring); thread-safe. `warm_start`:
    replica 0 runs that many steps before the others get a batch."""

    def __init__(self, batches: Iterator[B], steps: int, replicas: Collection[int],
                 mode: str = "downpour", staleness: int = 0, warm_start: int = 0) -> None:
        if not replicas:
            raise ValueError("a feed needs at least one replica")
        self._it, self.steps, self.mode = batches, steps, mode
        self.staleness, self.warm_start = staleness, warm_start
        self.lockstep = mode in LOCKSTEP
        self.live = set(replicas)
        self.done = dict.fromkeys(replicas, 0)  # steps each replica finished
        self.rounds = -(-steps // len(self.live))  # (lockstep) steps each live replica runs
        self.holding: set[int] = set()
        self._failed_done = 0  # steps finished by replicas that failed since
        self._returned: list[B] = []
        self.exhausted = False  # the batches ran out before `steps`
        self.error: Exception | None = None  # what drawing a batch raised (it ended the run)
        self._last: B | None = None
        self._changed = threading.Condition()

    @property
    def taken(self) -> int:
        """Batches handed out (running or finished)."""
        return self.total_done + len(self.holding)

    @property
    def total_done(self) -> int:
        return sum(self.done.values())

    @property
    def planned(self) -> int:
        """Steps the run will have if no further replica fails (lockstep: whole rounds)."""
        if not self.lockstep:
            return self.steps
        return self._failed_done + len(self.live) * self.rounds

    def next(self, r: int) -> B | None:
        """Replica `r`'s next batch, or None when it is done (waits while that is open)."""
        with self._changed:
            while True:
                more = (self.done[r] < self.rounds if self.lockstep
                        else self.taken < self.steps)
                if not more and not self.holding:
                    return None
                if more and self._may_run(r):
                    batch = self._returned.pop() if self._returned else self._draw(r)
                    if batch is not None:
                        self.holding.add(r)
                        return batch
                    continue  # the batches ran out: what `more` means has changed
                self._changed.wait()

    def _draw(self, r: int) -> B | None:
        """The next batch of the stream; once it runs out, None, and the run shrinks to what
        was drawn (lockstep: to whole rounds, a replica short of the last round's batch
        running the batch drawn last again)."""
        if not self.exhausted:
            try:
                self._last = next(self._it)
                return self._last
            except StopIteration:
                self.exhausted = True
                self._changed.notify_all()
            except Exception as e:  # a bad batch: the run ends here, the caller is told
                self.error, self.exhausted = e, True
                self._changed.notify_all()
        if not self.lockstep:
            self.steps = self.taken
            return None
        self.rounds = max(self.done[q] + (q in self.holding) for q in self.live)
        return self._last if self.done[r] < self.rounds else None

    def _may_run(self, r: int) -> bool:
        if r != 0 and 0 in self.live and self.done[0] < self.warm_start:
            return False  # replica 0 runs alone first
        if self.mode == "ssp":
            return self.done[r] - min(self.done[q] for q in self.live) <= self.staleness
        return True

    def finished(self, r: int) -> None:
        """Replica `r` ran the batch it held."""
        with self._changed:
            self.done[r] += 1
            self.holding.discard(r)
            self._changed.notify_all()

    def failed(self, r: int, batch: B | None) -> None:
        """Replica `r` failed (on `batch`, given back, if it held one): it gets no more, and in
        lockstep the live replicas run more rounds if the run would fall short of `steps`."""
        with self._changed:
            if batch is not None and r in self.holding:
                self._returned.append(batch)
            self.holding.discard(r)
            if r in self.live:
                self.live.discard(r)
                self._failed_done += self.done[r]
            if self.lockstep and self.live:
                short = self.steps - self._failed_done
                self.rounds = max(self.rounds, -(-short // len(self.live)))
            self._changed.notify_all()
