"""One parameter-server shard: its slices, their versions, optimizer state and clocks, and the
RPC handlers over them. No sockets here (server.py serves the handlers), so every rule can be
tested by calling the methods directly.

Slices are flat arrays keyed like "w[0:300]" (see layout.py). The update rule is one of
graphflow.optim's optimizers, with its state kept per slice key. Pushes carry (replica, step):
per (replica, key) the last applied step is kept, so a retried push is applied once.

    >>> shard = Shard(0)
    >>> shard.init({"w[0:3]": np.zeros(3, np.float32)}, {"name": "sgd", "lr": 0.5}, [0, 1])
    {'restored': False, 'versions': {'w[0:3]': 0}}
    >>> shard.push(0, 0, {"w[0:3]": np.ones(3, np.float32)})
    {'applied': True, 'duplicate': False}
    >>> shard.push(0, 0, {"w[0:3]": np.ones(3, np.float32)})   # the same push again
    {'applied': False, 'duplicate': True}
    >>> shard.fetch()["values"]["w[0:3]"].tolist(), shard.versions
    ([-0.5, -0.5, -0.5], {'w[0:3]': 1})
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphflow.errors import GraphflowError
from graphflow.ops import aligned
from graphflow.optim import Optimizer, make_optimizer
from graphflow.ps import checkpoint as ckpt
from graphflow.ps.barrier import BspBarrier, BspStep
from graphflow.ps.layout import slices_differ
from graphflow.ps.vectors import VectorOps

log = logging.getLogger("graphflow.ps")

CLOCK_LOG_MAX = 100_000  # clock_ok records kept (oldest dropped first)
METHODS = ("init", "fetch", "push", "clock_ok", "drop", "clocks", "vec_dot", "vec_axpy",
           "vec_scale", "vec_copy", "vec_zero", "vec_drop", "accumulate", "checkpoint",
           "stats", "shutdown")


class ShardError(GraphflowError):
    """A request a shard cannot serve (unknown key, wrong size, not initialised...)."""


class Shard(VectorOps, BspBarrier):
    """The state of shard `index` and its handlers (`handlers()`: method name -> callable).

    With `checkpoint_dir`, the newest checkpoint of this index found there is loaded at once
    (`restored_from`; `init` then checks it holds the slices asked for), and `tick()` writes
    one every `checkpoint_every` applied updates and/or every `checkpoint_seconds` s (0: never)
    when something changed.
    """

    def __init__(self, index: int = 0, shards: int = 1,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_every: int = 0, checkpoint_seconds: float = 0.0,
                 keep: int = 2) -> None:
        if not (checkpoint_every >= 0 and checkpoint_seconds >= 0):  # (NaN too: never, silently)
            raise ValueError(f"shard {index}: checkpoint_every and checkpoint_seconds must be "
                             f">= 0 (0: never), got {checkpoint_every}, {checkpoint_seconds}")
        self.index, self.shards = index, shards
        self.params: dict[str, np.ndarray] = {}
        self.vectors: dict[str, dict[str, np.ndarray]] = {}
        self.accepted: dict[str, set[str]] = {}
        self._ops_done: OrderedDict[str, None] = OrderedDict()  # (VectorOps._repeat)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.checkpoint_every, self.checkpoint_seconds, self.keep = (
            checkpoint_every, checkpoint_seconds, keep)
        self.optimizer: Optimizer | None = None
        self.versions: dict[str, int] = {}
        self.last_step: dict[str, dict[int, int]] = {}  # key -> replica -> last applied step
        self.clock: dict[int, int] = {}
        self.live: set[int] = set()
        self.replicas: set[int] = set()  # every replica ever named
        self.staleness: int | None = None
        self.bsp_deadline = 30.0
        self.clock_log: deque[list[Any]] = deque(maxlen=CLOCK_LOG_MAX)
        self.pending: dict[int, BspStep] = {}
        self.counts = {"updates": 0, "duplicates": 0, "checkpoints": 0}
        self.restored_from: Path | None = None
        self.run: str | None = None  # the driver's run these replicas' steps belong to
        self._resumed: dict[str, Any] = {}  # what init reports of a restore
        self.boot = os.urandom(6).hex()
        self.stopping = False
        self.defer_updates = False  # set by the server: apply after the reply went out
        self._deferred: list[tuple[str, np.ndarray]] = []
        self._changes = 0  # updates since the last checkpoint
        self._last_checkpoint = time.monotonic()
        if self.checkpoint_dir is not None:
            found = ckpt.load_newest(self.checkpoint_dir, index, ckpt.parse_state)
            if found is not None:
                self._install(found[1])
                self.restored_from = found[0]
                self._resumed = {"path": str(found[0]), "dir": str(self.checkpoint_dir),
                                 "updates": max(self.versions.values(), default=0)}
                log.warning("shard %d: restored %s (%d slices, %d updates)", index, found[0],
                            len(self.params), self.counts["updates"])

    def handlers(self) -> dict[str, Callable[..., Any]]:
        """Method name -> bound handler, for an RpcServer."""
        return {m: getattr(self, m) for m in METHODS}

    # -- parameters --------------------------------------------------------------------------
    def init(self, values: Mapping[str, np.ndarray], optimizer: Mapping[str, Any],
             replicas: Collection[int], staleness: int | None = None,
             bsp_deadline: float = 30.0, run: str | None = None) -> dict[str, Any]:
        """Take the slices this shard does not hold yet, the optimizer (a spec dict) and the
        replicas. Idempotent: a second init only adds. With a checkpoint directory, new
        slices are checkpointed at once.

        A shard restored from a checkpoint keeps its values and optimizer and must be asked
        for exactly its slices (else ShardError: mixing two models' slices corrupts both); its
        reply's "resumed" is {"path", "dir", "updates" (of its most updated slice)}, with
        "optimizer" if it keeps another one than asked for. An init naming another `run` than
        the one held starts that run on the parameters held: the replicas' pushed steps,
        clocks, live set, held bsp steps and vectors are forgotten (the new run counts its
        steps from 0 again: its pushes would be taken for repeats)."""
        built = make_optimizer(optimizer)
        if built is None:
            raise ShardError(f"shard {self.index}: init needs an optimizer spec")
        new_run = run is not None and run != self.run
        if self.params and (self.restored_from is not None or new_run):
            self._check_layout(values)
        if new_run:
            self._start_run(run)
        if self.optimizer is None:
            self.optimizer = _warmed(built)
        elif self.optimizer.spec() != built.spec():
            log.warning("shard %d: init asks for %s, keeping %s (restored or set before)",
                        self.index, built.spec(), self.optimizer.spec())
        added = [k for k in values if k not in self.params]
        for key in added:
            self.params[key] = aligned.copy(np.asarray(values[key]).reshape(-1), np.float32)
            self.versions[key] = 0
        for r in replicas:
            if r not in self.replicas:
                self.replicas.add(r)
                self.live.add(r)
                self.clock.setdefault(r, 0)
        self.staleness, self.bsp_deadline = staleness, float(bsp_deadline)
        if (added or new_run) and self.checkpoint_dir is not None:
            self.checkpoint()  # so that a shard restarted before its first update resumes
        reply = {"restored": self.restored_from is not None,
                 "versions": {k: self.versions[k] for k in values}}
        if self.restored_from is not None:
            kept = self.optimizer.spec()
            reply["resumed"] = {**self._resumed, **({"optimizer": kept}
                                                     if kept != built.spec() else {})}
        return reply

    def _check_layout(self, values: Mapping[str, np.ndarray]) -> None:
        held = {k: v.size for k, v in self.params.items()}
        wrong = slices_differ(held, {k: np.size(v) for k, v in values.items()})
        if wrong is None:
            return
        where = (f"its checkpoint {self.restored_from}" if self.restored_from is not None
                 else "an earlier run")
        raise ShardError(
            f"shard {self.index}: the slices from {where} are not this run's ({wrong}): "
            + ("the checkpoint directory holds another model's or another shard count's "
               f"parameters; use another one or empty {self.checkpoint_dir}"
               if self.restored_from is not None else "use fresh shards for another model"))

    def _start_run(self, run: str | None) -> None:
        """Forget the replicas of the run held (see `init`)."""
        if self.run is not None or self.replicas:
            log.info("shard %d: run %s starts on the parameters of run %s", self.index, run,
                     self.run)
        self.run = run
        self.last_step, self.clock, self.live, self.replicas = {}, {}, set(), set()
        self.pending, self.vectors, self.accepted = {}, {}, {}
        self.clock_log.clear()
        self._ops_done.clear()

    def fetch(self, keys: Collection[str] | None = None, min_version: int = 0,
              ) -> dict[str, Any]:
        """{"values", "versions"} of `keys` (default all), or {"wait": True} while any of
        them is older than `min_version`; either with "boot", this process's id (a client
        sees a restart by it)."""
        self.flush()
        keys = list(self.params) if keys is None else list(keys)
        self._check_keys(keys)
        if any(self.versions[k] < min_version for k in keys):
            return {"wait": True, "boot": self.boot}
        return {"values": {k: self.params[k] for k in keys},
                "versions": {k: self.versions[k] for k in keys}, "boot": self.boot}

    def push(self, replica: int, step: int, grads: Mapping[str, Any],
             mode: str = "async", version: int = 0) -> dict[str, Any]:
        """Apply (async) or hold until the step is complete (bsp) the gradients of `replica`'s
        step `step`; a slice whose (replica, step) was applied before is ignored. A bsp
        `version` is the one the replicas wait for after this step: a shard restored from an
        older checkpoint jumps to it (the steps in between are lost, not waited for)."""
        if mode not in ("async", "bsp"):
            raise ShardError(f"shard {self.index}: unknown push mode {mode!r} (async, bsp)")
        if self.optimizer is None:
            raise ShardError(f"shard {self.index}: push before init")
        flat = {k: self._grad(k, g) for k, g in grads.items()}
        self.clock[replica] = max(self.clock.get(replica, 0), step + 1)
        if mode == "bsp":
            return self._push_bsp(replica, step, flat, version)
        applied = 0
        for key, g in flat.items():
            if self._seen(key, replica, step):
                continue
            self._apply(key, g)
            self.last_step.setdefault(key, {})[replica] = step
            applied += 1
        self.counts["duplicates"] += len(flat) - applied
        return {"applied": applied > 0, "duplicate": bool(flat) and applied == 0}

    def _seen(self, key: str, replica: int, step: int) -> bool:
        return self.last_step.get(key, {}).get(replica, step - 1) >= step

    def _apply(self, key: str, grad: np.ndarray) -> None:
        if self.defer_updates:
            self._deferred.append((key, grad))
        else:
            assert self.optimizer is not None
            self.optimizer.update(key, self.params[key], grad)
        self._changed([key])
        self.counts["updates"] += 1

    def flush(self) -> None:
        """Run the deferred optimizer updates (`defer_updates`: the server replies to a push
        first and applies it right after, before it reads the next request)."""
        deferred, self._deferred = self._deferred, []
        assert self.optimizer is not None or not deferred
        for key, grad in deferred:
            self.optimizer.update(key, self.params[key], grad)  # type: ignore[union-attr]

    def _changed(self, keys: Collection[str]) -> None:
        for k in keys:
            self.versions[k] += 1
        self._changes += 1

    def _grad(self, key: str, g: Any) -> np.ndarray:
        """A slice's gradient as a flat float array: an array, or a compressed payload
        (a dict from a graphflow.replicas.compress codec)."""
        self._check_keys([key])
        if isinstance(g, dict):
            from graphflow.replicas.compress import decode  # lazy: replicas imports the ps

            try:
                g = decode(g, (self.params[key].size,), self.params[key].dtype)
            except ValueError as e:
                raise ShardError(f"shard {self.index}: gradient of '{key}': {e}") from None
        a = np.asarray(g)
        if a.dtype.kind != "f" or a.size != self.params[key].size:
            raise ShardError(f"shard {self.index}: gradient of '{key}' is {a.size} {a.dtype}, "
                             f"expected {self.params[key].size} floats")
        return a.reshape(-1)

    def _check_keys(self, keys: Collection[str]) -> None:
        unknown = [k for k in keys if k not in self.params]
        if unknown:
            raise ShardError(f"shard {self.index}: no slice {', '.join(map(repr, unknown[:5]))}"
                             f" here (holds {len(self.params)}; init first?)")

    # -- replicas and clocks ------------------------------------------------------------------
    def clock_ok(self, replica: int, clock: int, staleness: int) -> bool:
        """SSP gate: True iff `clock` is at most `staleness` ahead of the slowest live
        replica's clock (recorded in `clock_log` as [time, replica, clock, min]).

        A replica that asks at `clock` has run `clock` steps, so its clock here is at least
        that: a shard restored from an older checkpoint may have lost its last pushes, and a
        replica gated on its own lost clock would wait for a push it never makes."""
        self.clock[replica] = max(self.clock.get(replica, 0), clock)
        slowest = min((self.clock.get(r, 0) for r in self.live), default=clock)
        self.clock_log.append([time.time(), replica, clock, slowest])
        return clock - slowest <= staleness

    def drop(self, replica: int, reason: str) -> None:
        """Remove `replica` from the live set (bsp barriers and ssp no longer wait for it)."""
        if replica in self.live:
            self.live.discard(replica)
            log.warning("shard %d: dropped replica %d (%s)", self.index, replica, reason)
            self._complete_bsp()

    def clocks(self) -> dict[str, Any]:
        """{"clocks": [[replica, clock]...], "live": [...], "log": [[t, replica, clock, min]]}
        (pairs, not a map: msgpack maps here have string keys)."""
        return {"clocks": sorted(self.clock.items()), "live": sorted(self.live),
                "log": list(self.clock_log)}

    def tick(self, now: float | None = None) -> None:
        """Periodic work between requests: bsp deadlines, automatic checkpoints."""
        now = time.monotonic() if now is None else now
        self._bsp_deadlines(now)
        self.flush()
        if self.checkpoint_dir is None or not self._changes:
            return
        if (self.checkpoint_every and self._changes >= self.checkpoint_every) or (
                self.checkpoint_seconds and now - self._last_checkpoint >= self.checkpoint_seconds):
            self.checkpoint()

    # -- checkpoints and administration --------------------------------------------------------
    def stopped(self) -> None:
        """At a clean stop: checkpoint the updates since the last checkpoint, so that a run
        resumed from this directory starts where this one ended."""
        self.flush()
        if self.checkpoint_dir is not None and self._changes:
            self.checkpoint()

    def checkpoint(self) -> str:
        """Write a checkpoint now; its path."""
        if self.checkpoint_dir is None:
            raise ShardError(f"shard {self.index}: no checkpoint directory was given")
        path = ckpt.save(self.checkpoint_dir, self.index, self._state(), self.keep)
        self.counts["checkpoints"] += 1
        self._changes, self._last_checkpoint = 0, time.monotonic()
        log.info("shard %d: checkpoint %s", self.index, path)
        return str(path)

    def _state(self) -> dict[str, Any]:
        self.flush()
        opt = self.optimizer
        return {
            "format": 1, "index": self.index, "run": self.run, "params": self.params,
            "versions": self.versions,
            "optimizer": opt.spec() if opt else None, "slots": opt.state if opt else {},
            "last_step": {k: sorted(v.items()) for k, v in self.last_step.items()},
            "clock": sorted(self.clock.items()), "live": sorted(self.live),
            "replicas": sorted(self.replicas), "staleness": self.staleness,
            "bsp_deadline": self.bsp_deadline, "counts": self.counts,
            "pending": [[s, h.sums, {k: sorted(w) for k, w in h.pushed.items()}, h.version]
                        for s, h in self.pending.items()],
            **self._vector_state()}

    def _install(self, st: dict[str, Any]) -> None:
        self.optimizer = _warmed(st["optimizer"])
        for name in ("run", "params", "versions", "last_step", "clock", "live", "replicas",
                     "staleness", "bsp_deadline", "vectors", "accepted"):
            setattr(self, name, st[name])
        self.counts.update(st["counts"], checkpoints=0)
        now = time.monotonic()  # restarted: every held bsp step gets a full deadline again
        self.pending = {s: BspStep(now, sums, pushed, version)
                        for s, sums, pushed, version in st["pending"]}

    def stats(self) -> dict[str, Any]:
        """Counters ("updates" applied, "duplicates" ignored slice pushes, "checkpoints"
        written by this process), versions, live replicas, what was restored."""
        return {"index": self.index, **self.counts, "versions": dict(self.versions),
                "keys": len(self.params), "live": sorted(self.live),
                "restored": None if self.restored_from is None else str(self.restored_from),
                "bsp_pending": sorted(self.pending), "vectors": sorted(self.vectors),
                "optimizer": self.optimizer.spec() if self.optimizer else None}

    def shutdown(self) -> None:
        """Stop serving after this reply."""
        self.stopping = True


def _warmed(opt: Optimizer | None) -> Optimizer | None:
    """`opt`, its kernel loaded (or compiled) now rather than on the first push, which would
    wait ~0.5 s; pushes bring read-only arrays, a kernel signature of its own."""
    if opt is not None:
        grad = np.zeros(1, np.float32)
        grad.flags.writeable = False
        opt.update("\0warm-up", np.zeros(1, np.float32), grad)
        opt.state.pop("\0warm-up", None)
    return opt
