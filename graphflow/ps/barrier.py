"""The shard's bsp barrier: gradients of a step are held until every live replica pushed
them, then their average is applied once; a replica that misses `bsp_deadline` is dropped.

A push names the version its step leads to: a shard restarted from an older checkpoint
jumps to it, and drops held steps the replicas have moved past, rather than waiting for
steps that were applied and then lost (the replicas push their current step again). A crash
can fall between two replicas' fetches of a step, so a restarted shard may hear step s from
one replica and s + 1 from another: step s was applied and lost, and its version is reached
at once, or the replica still at step s would wait for a step that never completes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

log = logging.getLogger("graphflow.ps")


@dataclass
class BspStep:
    """Gradients of one bsp step held until every live replica has pushed it, per key."""

    started: float
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    pushed: dict[str, set[int]] = field(default_factory=dict)
    version: int = 0  # what the replicas wait for once it is applied (0: one more)


class BspBarrier:
    """Mixin of the shard's bsp handlers; the shard provides the attributes below."""

    index: int
    live: set[int]
    replicas: set[int]
    versions: dict[str, int]
    last_step: dict[str, dict[int, int]]
    pending: dict[int, BspStep]
    bsp_deadline: float
    counts: dict[str, int]

    if TYPE_CHECKING:  # provided by Shard
        def _seen(self, key: str, replica: int, step: int) -> bool: ...
        def _apply(self, key: str, grad: np.ndarray) -> None: ...

    def _push_bsp(self, replica: int, step: int, grads: dict[str, np.ndarray],
                  version: int = 0) -> dict[str, Any]:
        if replica not in self.live:
            what = "dropped" if replica in self.replicas else "unknown (not given to init)"
            log.warning("shard %d: bsp step %d: push from %s replica %d ignored",
                        self.index, step, what, replica)
            return {"applied": False, "duplicate": False, "dropped": True}
        self._forget_stale_bsp(replica, step, grads)
        held = self.pending.get(step)
        fresh = 0
        for key, g in grads.items():
            if self._seen(key, replica, step) or (
                    held is not None and replica in held.pushed.get(key, ())):
                continue
            if any(s > step and key in h.pushed for s, h in self.pending.items()):
                self._lost(key, step, version, {replica})
                log.warning("shard %d: bsp step %d of %s from replica %d taken as applied: "
                            "another replica is past it (applied before this shard's restart)",
                            self.index, step, key, replica)
                continue
            if held is None:
                held = self.pending[step] = BspStep(time.monotonic())
            if key in held.sums:
                held.sums[key] += g
            else:
                held.sums[key] = np.array(g, dtype=np.float32)
            held.pushed.setdefault(key, set()).add(replica)
            held.version = max(held.version, version)
            fresh += 1
        self.counts["duplicates"] += len(grads) - fresh
        applied = self._complete_bsp()
        return {"applied": applied > 0, "duplicate": bool(grads) and fresh == 0}

    def _complete_bsp(self) -> int:
        """Apply every held bsp (step, key) that every live replica has pushed."""
        done = 0
        for step in sorted(self.pending):
            held = self.pending[step]
            for key in [k for k, who in held.pushed.items() if self.live <= who]:
                who = held.pushed.pop(key)
                self._apply(key, held.sums.pop(key) / np.float32(len(who)))
                self.versions[key] = max(self.versions[key], held.version)
                for r in who:
                    self.last_step.setdefault(key, {})[r] = step
                done += 1
            if not held.pushed:
                del self.pending[step]
        return done

    def _forget_stale_bsp(self, replica: int, step: int, keys: Collection[str]) -> None:
        """Drop held slices of earlier steps that `replica` never pushed: it can only have
        moved past them if they were applied and then lost to a restart from a checkpoint."""
        for s in [s for s in self.pending if s < step]:
            held = self.pending[s]
            for key in [k for k in keys if replica not in held.pushed.get(k, {replica})]:
                self._lost(key, s, held.version, held.pushed.pop(key))
                del held.sums[key]
                log.warning("shard %d: bsp step %d of %s dropped: replica %d is at step %d "
                            "(applied before this shard's restart)", self.index, s, key,
                            replica, step)
            if not held.pushed:
                del self.pending[s]

    def _lost(self, key: str, step: int, version: int, who: Collection[int]) -> None:
        """Step `step` of `key` was applied before a restart and lost: reach the version it
        led to, and take later pushes of it by `who` as repeats."""
        self.versions[key] = max(self.versions[key], version)
        seen = self.last_step.setdefault(key, {})
        for r in who:
            seen[r] = max(seen.get(r, step), step)

    def _bsp_deadlines(self, now: float) -> None:
        """Drop the live replicas that have not pushed a held step within `bsp_deadline`."""
        for step, held in list(self.pending.items()):
            if now - held.started <= self.bsp_deadline:
                continue
            missed = {r for r in self.live for who in held.pushed.values() if r not in who}
            for r in sorted(missed):
                self.live.discard(r)
                log.warning("shard %d: bsp step %d: dropped replica %d (no push within %gs)",
                            self.index, step, r, self.bsp_deadline)
            self._complete_bsp()
