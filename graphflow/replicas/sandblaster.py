"""Sandblaster L-BFGS (DistBelief): a coordinator runs L-BFGS without holding the parameters;
replicas compute gradients over portions of each batch handed out on demand (`Sandblaster`).

    with Sandblaster(lambda: PSClient(addresses, layout), [SessionReplica(digits_lc()),
                     SessionReplica(digits_lc())], batches, portions_per_batch=8) as sb:
        trace = sb.run(20)        # [(seconds, batch loss), ...]; sb.log: who ran what
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from graphflow.autodiff import gradients
from graphflow.errors import GraphflowError
from graphflow.executor import Session
from graphflow.models import Model
from graphflow.ps.client import PSClient
from graphflow.runtime.cluster import Cluster

log = logging.getLogger("graphflow.replicas")

PARAM, DIRECTION = "param", "sb/d"
Batch = tuple[np.ndarray, np.ndarray]
Entry = dict[str, Any]  # one line of the coordinator's log


class SandblasterError(GraphflowError):
    """No live replica is left, or an evaluation did not finish in time."""


class Replica(Protocol):
    """A model copy: loss (mean over examples) and gradients by name at the params last set."""

    def set_params(self, values: Mapping[str, np.ndarray]) -> None: ...
    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]: ...


class SessionReplica:
    """A replica in this process, on its own Model: `SessionReplica(digits_lc())`."""

    def __init__(self, model: Model) -> None:
        self.model, self.session = model, Session(model.graph)
        grads = gradients(model.loss, model.graph.parameters())
        self.names, self._fetches = list(grads), [model.loss, *grads.values()]

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            self.session.set(name, value)

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        loss, *grads = self.session.run(self._fetches, {self.model.x: x, self.model.y: y})
        return float(loss), dict(zip(self.names, grads, strict=True))


class ClusterReplica:
    """A partitioned model on a Cluster of workers: `ClusterReplica(Cluster(plan))`."""

    def __init__(self, cluster: Cluster, x: str = "x", y: str = "y") -> None:
        self.cluster, self.x, self.y = cluster, x, y

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        self.cluster.set_params(values)

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        out = self.cluster.gradients({self.x: x, self.y: y})
        return float(out.pop("loss")), out


@dataclass
class Portion:
    index: int
    x: np.ndarray
    y: np.ndarray
    weight: float  # portion size / batch size


def cut(batch: Batch, parts: int) -> list[Portion]:
    """Cut a batch into `parts` portions of (near) equal size, weighted by their share."""
    x, y = batch
    b = [k * len(x) // parts for k in range(parts + 1)]
    return [Portion(k, x[lo:hi], y[lo:hi], (hi - lo) / len(x))
            for k, (lo, hi) in enumerate(itertools.pairwise(b)) if hi > lo]


@dataclass
class _Eval:
    """One gradient evaluation: its portions, who runs what since when, the first results."""

    id: int
    batch: int
    version: int  # of the parameters the portions are computed at
    acc: str  # the shard vector the portions' gradients accumulate into
    portions: list[Portion]
    t0: float = field(default_factory=time.monotonic)
    queue: deque[int] = field(default_factory=deque)
    running: dict[int, dict[int, float]] = field(default_factory=dict)  # i -> {replica: t0}
    losses: dict[int, float] = field(default_factory=dict)  # portion -> weighted loss


class _Scheduler:
    """Hands out portions and backup copies; keeps the log and seconds per portion."""

    POLL = 0.01  # s: idle replicas look again this often while backups may become due

    def __init__(self, replicas: int, backups: bool) -> None:
        self.cond = threading.Condition()
        self.live, self.backups, self.closed = set(range(replicas)), backups, False
        self.current: _Eval | None = None
        self.inflight: dict[str, int] = {}  # accumulator -> portions still running on it
        self.speed: dict[int, float] = {}  # replica -> seconds per portion
        self.log: list[Entry] = []

    def start(self, ev: _Eval) -> None:
        with self.cond:
            ev.queue.extend(p.index for p in ev.portions)
            self.current = ev
            self.cond.notify_all()

    def take(self, r: int) -> tuple[_Eval, Portion, Entry] | None:
        """The next portion for replica `r` (blocks); None once closed or `r` is dead."""
        with self.cond:
            while not self.closed and r in self.live:
                ev = self.current
                active = ev is not None and len(ev.losses) < len(ev.portions)
                pick = self._pick(ev, r) if active else None
                if pick is None:
                    self.cond.wait(self.POLL if active and self.backups else None)
                    continue
                i, backup = pick
                now = ev.running.setdefault(i, {})[r] = time.monotonic()
                self.inflight[ev.acc] = self.inflight.get(ev.acc, 0) + 1
                self.log.append({"eval": ev.id, "batch": ev.batch, "portion": i, "replica": r,
                                 "backup": backup, "start": now, "end": None, "won": None,
                                 "accepted": None, "error": None})
                (log.info if backup else log.debug)("sandblaster: eval %d portion %d -> replica "
                                                    "%d%s", ev.id, i, r, " (backup)" * backup)
                return ev, ev.portions[i], self.log[-1]
            return None

    def _pick(self, ev: _Eval, r: int) -> tuple[int, bool] | None:
        if ev.queue or not self.backups:
            return (ev.queue.popleft(), False) if ev.queue else None
        now, mine = time.monotonic(), self.speed.get(r, 0.0)

        def ahead(q: int, t0: float) -> bool:  # q, on time, would finish before r could
            s = self.speed.get(q)
            return s is not None and now - t0 <= 2 * s and t0 + s <= now + mine

        spare = [i for i, rs in ev.running.items() if rs and r not in rs and i not in ev.losses
                 and not any(ahead(q, t0) for q, t0 in rs.items())]
        return (min(spare, key=lambda i: len(ev.running[i])), True) if spare else None

    def report(self, r: int, ev: _Eval, p: Portion, entry: Entry, loss: float = 0.0,
               accepted: bool = False, error: str | None = None) -> None:
        """Replica `r` finished portion `p` (first result wins) or failed on it (`error`)."""
        with self.cond:
            if (left := self.inflight.pop(ev.acc) - 1) > 0:
                self.inflight[ev.acc] = left
            now, t0 = time.monotonic(), ev.running[p.index].pop(r)
            won = error is None and p.index not in ev.losses
            entry.update(end=now, won=won, accepted=accepted, error=error)
            if won:
                ev.losses[p.index] = p.weight * loss
            if error is None:
                self.speed[r] = 0.7 * self.speed.get(r, now - t0) + 0.3 * (now - t0)
            else:
                self.live.discard(r)
                again = ev is self.current and p.index not in ev.losses and not ev.running[p.index]
                if again:
                    ev.queue.appendleft(p.index)
                log.warning("sandblaster: replica %d failed on eval %d portion %d (%s): it gets "
                            "no more portions; the portion %s", r, ev.id, p.index, error,
                            "goes back to the queue" if again else "is done or run elsewhere")
            self.cond.notify_all()

    def wait(self, ev: _Eval, timeout: float) -> float:
        """The batch loss once every portion has a result."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(ev.losses) < len(ev.portions):
                left = deadline - time.monotonic()
                if not self.live or left <= 0:
                    why = "every replica has failed" if not self.live else f"after {timeout}s"
                    raise SandblasterError(f"eval {ev.id}: {len(ev.losses)} of "
                                           f"{len(ev.portions)} portions done, {why}")
                self.cond.wait(left)
            return math.fsum(ev.losses.values())

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class Sandblaster:
    """The coordinator. L-BFGS's vectors live on the PS shards beside the parameters
    ("param"): each evaluation's gradient, the direction, the last `history` pairs (s_i, y_i);
    it sends vector operations that each shard runs on its own slices and keeps only scalars
    (rho_i, gamma, steps, losses) and names. `ps_client_factory()` makes its PSClient and one
    per replica thread; the shards must already hold the parameters (PSClient.init).

    An evaluation cuts its batch into `portions_per_batch` portions. An idle replica takes
    one (faster ones get more), fetches the parameters if their version changed and
    accumulates the gradient on the shards, weighted portion / batch size, as task
    "eval:portion". With none left to hand out, idle replicas also take portions running
    elsewhere that they could finish first (backups); the first result wins, here and at
    each shard. A replica that raises gets no more portions (its portion is requeued).
    `log`: who ran which portion, backup or not, who won, failures.

    One iteration per batch ((x, y); a Sequence is cycled); a new batch is first evaluated
    at the current point so pairs and line searches stay within a batch (the same batch
    object again is not re-evaluated: a one-batch list is full-batch L-BFGS). Step 1 (first:
    1/|d|), capped at |step| <= `max_step`; Armijo backtracking (`c1`, quadratic
    interpolation in [0.1, 0.5] t) at most `max_backtracks` times, then undo and forget.
    """

    def __init__(self, ps_client_factory: Callable[[], PSClient], replicas: Sequence[Replica],
                 batches: Iterable[Batch], portions_per_batch: int, history: int = 10,
                 max_step: float = 10.0, c1: float = 1e-4, max_backtracks: int = 8,
                 backups: bool = True, eval_timeout: float = 300.0) -> None:
        if min(portions_per_batch, history, len(replicas)) < 1:
            raise ValueError("need replicas, portions_per_batch >= 1 and history >= 1")
        self.factory, self.replicas = ps_client_factory, list(replicas)
        self.portions_per_batch, self.max_step, self.c1 = portions_per_batch, max_step, c1
        self.max_backtracks, self.eval_timeout = max_backtracks, eval_timeout
        self._batches = itertools.cycle(batches) if isinstance(batches, Sequence) else iter(batches)
        self._sched = _Scheduler(len(self.replicas), backups)
        self.log = self._sched.log  # per portion run: eval, portion, replica, backup, won...
        self.evals: list[dict[str, Any]] = []  # per evaluation: batch, seconds, loss
        self._ops: PSClient | None = None
        self._threads: list[threading.Thread] = []
        self._pairs: deque[tuple[int, float]] = deque()  # (slot, rho), oldest first
        self.m, self._gamma, self._retired = history, 1.0, []
        self._batch: Batch | None = None
        self._batch_no = self._eval_no = self._version = 0
        self._g, self._f = "", math.nan  # the gradient's vector name and the loss, here
        self._t0 = 0.0

    def start(self) -> None:
        """Connect the coordinator and start one thread per replica (`run` does it too)."""
        if self._ops is None:
            self._ops, self._t0 = self.factory(), time.monotonic()
            for r in range(len(self.replicas)):
                self._threads.append(threading.Thread(target=self._replica_loop, args=(r,),
                                                      daemon=True, name=f"sandblaster-{r}"))
                self._threads[-1].start()

    def run(self, steps: int) -> list[tuple[float, float]]:
        """`steps` iterations (fewer if batches run out): [(seconds, batch loss after)]."""
        self.start()
        out: list[tuple[float, float]] = []
        with contextlib.suppress(StopIteration):
            for _ in range(steps):
                loss = self.step()
                out.append((time.monotonic() - self._t0, loss))
        return out

    def step(self) -> float:
        """One L-BFGS iteration; the batch loss at the new point."""
        self._advance_batch()
        gd, dn = self._direction()
        if dn == 0.0:
            return self._f
        t = min(1.0 if self._pairs else 1.0 / dn, self.max_step / dn)
        for _ in range(self.max_backtracks + 1):
            self._move(t)
            g, f = self.evaluate(self._batch)
            if f <= self._f + self.c1 * t * gd + 1e-6 * max(1.0, abs(self._f)):  # round-off
                self._accept(t, g, f)
                return f
            log.debug("sandblaster: step %.3g: loss %.6g > %.6g, backtracking", t, f, self._f)
            self._move(-t)
            self._retire(g)
            denom = 2.0 * (f - self._f - gd * t)  # the quadratic through f0, gd and f(t)
            tq = -gd * t * t / denom if denom > 0 and math.isfinite(f) else 0.1 * t
            t = min(max(tq, 0.1 * t), 0.5 * t)
        log.warning("sandblaster: no decrease after %d step lengths: step undone, history "
                    "cleared", self.max_backtracks + 1)
        self._pairs.clear()
        return self._f

    def evaluate(self, batch: Batch) -> tuple[str, float]:
        """Loss and gradient of `batch` at the parameters on the shards: the replicas
        accumulate the gradient into a fresh shard vector, whose name is returned."""
        self.start()
        self._eval_no += 1
        ev = _Eval(self._eval_no, self._batch_no, self._version, f"sb/g{self._eval_no}",
                   cut(batch, self.portions_per_batch))
        self._ops.vec_zero(ev.acc)
        self._sched.start(ev)
        loss = self._sched.wait(ev, self.eval_timeout)
        self.evals.append({"eval": ev.id, "batch": ev.batch, "version": ev.version,
                           "seconds": time.monotonic() - ev.t0, "loss": loss})
        self._retire()
        return ev.acc, loss

    def close(self) -> None:
        """Stop the replica threads (a replica in the middle of a portion finishes it)."""
        self._sched.close()
        for t in self._threads:
            t.join(timeout=self.eval_timeout)
        if self._ops is not None:
            self._ops.close()

    def __enter__(self) -> Sandblaster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- L-BFGS on named shard vectors -------------------------------------------------------
    def _advance_batch(self) -> None:
        batch = next(self._batches)
        if batch is not self._batch:
            self._batch, self._batch_no = batch, self._batch_no + 1
            if self._g:
                self._retire(self._g)
            self._g, self._f = self.evaluate(batch)

    def _direction(self) -> tuple[float, float]:
        """d = -H g by the two-loop recursion into DIRECTION; returns (g.d, |d|)."""
        ops, alphas = self._ops, []
        ops.vec_copy(self._g, DIRECTION)
        for slot, rho in reversed(self._pairs):
            a = rho * ops.vec_dot(f"sb/s{slot}", DIRECTION)
            ops.vec_axpy(-a, f"sb/y{slot}", DIRECTION)
            alphas.append(a)
        if self._pairs:
            ops.vec_scale(self._gamma, DIRECTION)
        for (slot, rho), a in zip(self._pairs, reversed(alphas), strict=True):
            b = rho * ops.vec_dot(f"sb/y{slot}", DIRECTION)
            ops.vec_axpy(a - b, f"sb/s{slot}", DIRECTION)
        ops.vec_scale(-1.0, DIRECTION)
        gd = ops.vec_dot(self._g, DIRECTION)
        if gd >= 0.0 and self._pairs:  # round-off broke H's positive definiteness
            log.warning("sandblaster: not a descent direction (g.d = %.3g): history cleared", gd)
            self._pairs.clear()
            return self._direction()
        return gd, math.sqrt(max(ops.vec_dot(DIRECTION, DIRECTION), 0.0))

    def _move(self, t: float) -> None:
        self._ops.vec_axpy(t, DIRECTION, PARAM)
        self._version += 1

    def _accept(self, t: float, g: str, f: float) -> None:
        """Keep the new point; store s = t d, y = g_new - g_old unless s.y <= 0."""
        used = {k for k, _ in self._pairs}
        slot = min(set(range(self.m)) - used) if len(used) < self.m else self._pairs.popleft()[0]
        ops, s, y = self._ops, f"sb/s{slot}", f"sb/y{slot}"
        ops.vec_copy(DIRECTION, s)
        ops.vec_scale(t, s)
        ops.vec_copy(g, y)
        ops.vec_axpy(-1.0, self._g, y)
        sy, yy, ss = ops.vec_dot(s, y), ops.vec_dot(y, y), ops.vec_dot(s, s)
        if sy > 1e-10 * math.sqrt(ss * yy):
            self._pairs.append((slot, 1.0 / sy))
            self._gamma = sy / yy
        else:
            log.info("sandblaster: pair skipped, curvature s.y = %.3g <= 0", sy)
        self._retire(self._g)
        self._g, self._f = g, f

    def _retire(self, *names: str) -> None:
        """Drop unused gradient vectors once no replica accumulates into them (a losing
        backup still running would re-create a dropped vector on the shards)."""
        self._retired += names
        with self._sched.cond:
            idle = [a for a in self._retired if a not in self._sched.inflight]
        self._retired = [a for a in self._retired if a not in idle]
        for a in idle:
            self._ops.vec_drop(a)

    def _replica_loop(self, r: int) -> None:
        replica, installed = self.replicas[r], -1
        with self.factory() as client:
            while (task := self._sched.take(r)) is not None:
                ev, p, entry = task
                try:
                    if installed != ev.version:
                        replica.set_params(client.fetch())
                        installed = ev.version
                    loss, grads = replica.gradients(p.x, p.y)
                    res = client.accumulate(ev.acc, f"{ev.id}:{p.index}", grads, p.weight)
                except Exception as e:  # noqa: BLE001 - any failure retires the replica
                    self._sched.report(r, ev, p, entry, error=f"{type(e).__name__}: {e}")
                    return
                self._sched.report(r, ev, p, entry, loss, bool(res["accepted"]))
