"""The batches of one ReplicaManager.fit, handed to the replicas as the consistency mode allows.

- downpour: the next batch goes to whichever replica asks, until `steps` were handed out.
- ssp: the same, but a replica more than `staleness` steps ahead of the slowest live one waits
  here, holding no batch: at the shards' clock gate it would hold one the slowest may need.
- bsp, allreduce (lockstep): every live replica runs one step a round, so the run is whole
  rounds: `steps` rounded up to a multiple of the live replicas (a replica whose partners got
  no batch would wait for them at the barrier until dropped, or time out). A round's batches
  are dealt together, when its first replica asks.

Batches that run out before `steps` end the run there. Each batch is run once: in lockstep, a
last round short of batches cuts the ones left into a share per replica (`split`, such as
`share_out`), so the round's averaged update is theirs; with no batch left, the run ends at
the round before. A batch whose replica failed on it is given back. A replica that would stop
waits while another still holds a batch, since a failure there may give a batch back or
(lockstep) add rounds for the replicas left, so that the run still has `steps` steps.

    >>> feed = Feed(iter(range(10)), steps=3, replicas=[0, 1], mode="bsp")
    >>> feed.planned, [feed.next(0), feed.next(1)]
    (4, [0, 1])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

LOCKSTEP = ("bsp", "allreduce")  # every step waits for every live replica

B = TypeVar("B")


class Feed(Generic[B]):
    """Hands `batches` to `replicas` (see the module docstring); thread-safe. `warm_start`:
    replica 0 runs that many steps before the others get a batch. `split(batches, n)`: the
    batches cut into n shares (None if they cannot be), for a last lockstep round short of
    batches; without it, or if it gives None, those batches go unused (`unused`)."""

    def __init__(self, batches: Iterator[B], steps: int, replicas: Collection[int],
                 mode: str = "downpour", staleness: int = 0, warm_start: int = 0,
                 split: Callable[[list[B], int], list[B] | None] | None = None) -> None:
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
        self._dealt: dict[int, B] = {}  # (lockstep) the round's batches not yet taken
        self._split = split
        self.unused = 0  # (lockstep) batches left out of a short last round
        self.exhausted = False  # the batches ran out before `steps`
        self.error: Exception | None = None  # what drawing a batch raised (it ended the run)
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
                    batch = self._take(r)
                    if batch is not None:
                        self.holding.add(r)
                        return batch
                    continue  # the batches ran out: what `more` means has changed
                self._changed.wait()

    def _take(self, r: int) -> B | None:
        """Replica `r`'s next batch, or None once the batches ran out (the run shrinks to
        what was drawn)."""
        if self.lockstep:
            if r not in self._dealt:
                self._deal(self.done[r])
            return self._dealt.pop(r, None)
        batch = self._returned.pop() if self._returned else self._draw()
        if batch is None:
            self.steps = self.taken
        return batch

    def _deal(self, round_: int) -> None:
        """A batch of round `round_` for each live replica that is to run it (the batches
        given back first). Short of batches, the ones left are shared out and the run ends
        with this round; with none left, before it."""
        wanting = [q for q in sorted(self.live)
                   if q not in self._dealt and self.done[q] + (q in self.holding) == round_]
        got: list[B] = []
        while len(got) < len(wanting):
            batch = self._returned.pop() if self._returned else self._draw()
            if batch is None:
                break
            got.append(batch)
        if len(got) < len(wanting):
            shares = self._split(got, len(wanting)) if got and self._split else None
            if shares is None:
                self.unused += len(got)
            got = shares or []
            self.rounds = round_ + 1 if got else round_
            self._changed.notify_all()
        self._dealt.update(zip(wanting, got, strict=False))

    def _draw(self) -> B | None:
        """The next batch of the stream; None once it ran out or failed (`error`)."""
        if self.exhausted:
            return None
        try:
            return next(self._it)
        except StopIteration:
            self.exhausted = True
        except Exception as e:  # a bad batch: the run ends here, the caller is told
            self.error, self.exhausted = e, True
        self._changed.notify_all()
        return None

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

    def failed(self, r: int, batch: B | None, done: int | None = None) -> None:
        """Replica `r` failed (on `batch`, given back, if it held one): it gets no more, and in
        lockstep the live replicas run more rounds if the run would fall short of `steps`.
        `done`: the steps of `r` that count, if fewer than it finished (downpour: pushes that
        never reached the shards); the others run the rest."""
        with self._changed:
            if done is not None:
                self.done[r] = done
            if batch is not None and r in self.holding:
                self._returned.append(batch)
            if r in self._dealt:  # dealt, not taken yet
                self._returned.append(self._dealt.pop(r))
            self.holding.discard(r)
            if r in self.live:
                self.live.discard(r)
                self._failed_done += self.done[r]
            if self.lockstep and self.live:
                short = self.steps - self._failed_done
                self.rounds = max(self.rounds, -(-short // len(self.live)))
            self._changed.notify_all()


def share_out(batches: Sequence[tuple[np.ndarray, np.ndarray]], parts: int
              ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """(x, y) `batches` joined and cut into `parts` shares of (near) equal rows; None if
    there are fewer rows than parts (a share would be empty).

        >>> [len(x) for x, _ in share_out([(np.zeros((5, 2)), np.zeros(5))], 2)]
        [3, 2]
    """
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    if len(x) < parts:
        return None
    return list(zip(np.array_split(x, parts), np.array_split(y, parts), strict=True))
