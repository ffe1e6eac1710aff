"""The replica manager: R copies of a partitioned model, each on its own shard of the data,
sharing parameters through S parameter-server shards (DistBelief's data parallelism).

Each replica is a Cluster of the plan's workers (threads or local processes); every worker
links to the shards that hold its own parameters (graphflow/replicas/link.py) and pushes its
gradients there; the shards apply them with the optimizer. A replica that fails is dropped and
the others go on; a shard process that dies is restarted from its checkpoint.

>>> import graphflow as gf                                            # doctest: +SKIP
>>> model = gf.models.digits_lc(batch=None)                           # doctest: +SKIP
>>> plan = gf.partition(model.graph, 1, "spatial", loss=model.loss)   # doctest: +SKIP
>>> with ReplicaManager(model, plan, gf.optim.Adagrad(0.05), replicas=2) as rm:  # doctest: +SKIP
...     data = gf.datasets.digits()
...     rm.fit(gf.datasets.batches(data.x_train, data.y_train, 32), steps=300)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np

from graphflow.datasets import pairs
from graphflow.errors import GraphflowError, count_of
from graphflow.executor import Session
from graphflow.models import Model
from graphflow.optim import Optimizer
from graphflow.partitioners.plan import Plan
from graphflow.ps.client import PSClient
from graphflow.ps.layout import Layout
from graphflow.replicas.feed import LOCKSTEP, Feed, share_out
from graphflow.replicas.options import ReplicaOptions
from graphflow.replicas.record import Record, restart_note, resume_note
from graphflow.replicas.shards import ShardGroup
from graphflow.runtime.cluster import Cluster

log = logging.getLogger("graphflow.replicas")

__all__ = ["ReplicaManager", "ReplicaOptions"]  # (the options live in options.py)


class ReplicaManager:
    """Runs `replicas` copies of `plan` against `shards` parameter-server shards. Shards
    that resumed from a checkpoint are in `resumed` ({shard: {"path", "updates", ...}}), and
    shard processes restarted during the run in `record.shard_restarts`; both are noted in
    `record.notes`."""

    def __init__(self, model: Model, plan: Plan, optimizer: Optimizer, replicas: int = 2,
                 shards: int = 2, options: ReplicaOptions | None = None) -> None:
        count_of(replicas, "replicas")
        count_of(shards, "shards")
        self.model, self.plan, self.optimizer = model, plan, optimizer
        self.replicas, self.options = replicas, options or ReplicaOptions()
        self.record = Record()
        self.clusters: list[Cluster | None] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one thread at a time on self.client
        self._session: Session | None = None
        self._t0 = time.perf_counter()
        self._last_loss = float("nan")
        self._failed: set[int] = set()
        self._first: dict[int, int] = {}  # replica -> its cluster's first step number this fit
        # (allreduce needs no shards: the group only lends its directory for addresses)
        self.shards = ShardGroup(0 if self.options.mode == "allreduce" else shards,
                                 self.options.shard_placement,
                                 self.options.checkpoint_dir, self.options.checkpoint_every,
                                 self.options.timeout, listen_host=self.options.ps_host,
                                 on_restart=self._shard_restarted, stamp=self._stamp)
        self.resumed: dict[int, dict[str, Any]] = {}  # shard -> what it resumed from
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        o, parts = self.options, self.plan.parts
        if o.hosts is not None and len(o.hosts) != self.replicas * parts:
            raise ValueError(f"{self.replicas} replicas of {parts} part(s) need "
                             f"{self.replicas * parts} workers, but {len(o.hosts)} hosts "
                             "were given")
        self.clusters = []
        for r in range(self.replicas):  # (appended one by one: close() stops those started)
            hosts = o.hosts[r * parts:(r + 1) * parts] if o.hosts else None
            self.clusters.append(Cluster(self.plan, o.placement, hosts, timeout=o.timeout,
                                         local_workers=self.replicas * parts,
                                         connect_timeout=o.connect_timeout))
        if o.mode == "allreduce":
            self._attach_allreduce()
            return
        initial = self.clusters[0].params()
        shapes = {name: value.shape for name, value in initial.items()}
        self.layout = Layout.build(shapes, len(self.shards.addresses))
        self.client = self._client()
        init = self.client.init(initial, self.optimizer.spec(), list(range(self.replicas)),
                                staleness=o.staleness, bsp_deadline=o.bsp_deadline,
                                run=uuid.uuid4().hex)
        self.resumed = init["resumed"]
        self.record.notes += [resume_note(s, info) for s, info in self.resumed.items()]
        if o.mode == "sandblaster":
            return  # its replicas fetch and accumulate from the driver (sandblaster.py)
        for r, cluster in enumerate(self.clusters):
            assert cluster is not None
            cluster.call_all("ps_attach", {
                "shards": self.shards.addresses, "layout": self.layout.to_dict(),
                "replica": r, "mode": o.mode, "n_fetch": o.n_fetch, "n_push": o.n_push,
                "staleness": o.staleness, "compress": o.compress, "timeout": o.ps_timeout,
                "retry_for": o.timeout / 2})

    def _attach_allreduce(self) -> None:
        """Worker i of every replica forms allreduce group i; replica r is rank r."""
        o, parts = self.options, self.plan.parts
        binds = [[self._allreduce_bind(r, i) for i in range(parts)]
                 for r in range(self.replicas)]
        addresses = [c.call_each("ar_bind", [{"rank": r, "bind": b, "timeout": o.timeout}
                                             for b in binds[r]])
                     for r, c in enumerate(self.clusters) if c is not None]
        for r, cluster in enumerate(self.clusters):
            assert cluster is not None
            cluster.call_each("ar_attach", [
                {"rank": r, "size": self.replicas, "algorithm": o.algorithm,
                 "peers": {str(q): addresses[q][i] for q in range(self.replicas)},
                 "optimizer": self.optimizer.spec(), "timeout": o.timeout}
                for i in range(parts)])

    def _allreduce_bind(self, r: int, i: int) -> str:
        """Where worker i of replica r listens for its allreduce peers."""
        if self.options.hosts:  # the host its control address names, a port picked at bind
            return f"tcp://{urlparse(self.options.hosts[r * self.plan.parts + i]).hostname}:*"
        if self.options.placement == "processes":
            return self.shards.address_for(f"ar{r}-{i}")
        return f"inproc://graphflow-ar-{id(self)}-{r}-{i}"

    def _client(self, names: Any = None) -> PSClient:
        return PSClient(self.shards.addresses, self.layout, timeout=self.options.ps_timeout,
                        retry_for=self.options.timeout, names=names)

    # -- training -----------------------------------------------------------------------------
    def fit(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
            evaluate: tuple[np.ndarray, np.ndarray] | None = None,
            eval_every: float = 1.0, progress: Callable[[int, float], None] | None = None
            ) -> Record:
        """Train until the replicas together have run `steps` steps: each replica takes the
        next batch of `batches` when it is ready for one (so the data is sharded by who is
        free: a faster replica sees more of it). In the lockstep modes (bsp, allreduce) every
        live replica runs the same number of steps, so `steps` is rounded up to a multiple of
        the live replicas (`steps_to_run`; a note in `Record.notes` says so), and a replica
        that fails leaves its share to the others. `Record.steps_run`: the steps run in all.
        With `evaluate` = (x_test, y_test) the PS's parameters are scored every `eval_every` s
        meanwhile and at the end. Sandblaster: `steps` L-BFGS iterations, one batch each."""
        count_of(steps, "steps")
        if self.options.mode == "sandblaster":
            return self._fit_sandblaster(batches, steps, evaluate, eval_every, progress)
        o, live = self.options, [r for r in range(self.replicas) if r not in self._failed]
        if not live:
            raise GraphflowError("every replica failed in an earlier fit: "
                                 + "; ".join(self.record.failures))
        feed = Feed(pairs(batches, self.model.x, self.model.y), steps, live, o.mode,
                    o.staleness, o.warm_start, split=share_out)
        if feed.planned != steps:
            self.record.notes.append(
                f"{o.mode} runs its {len(live)} replicas in lockstep: {steps} steps rounded "
                f"up to {feed.planned} ({feed.rounds} each)")
        self._first = {r: c.step_count for r, c in enumerate(self.clusters) if c is not None}
        threads = [threading.Thread(target=self._replica_loop, args=(r, feed),
                                    daemon=True, name=f"replica{r}") for r in live]
        self._t0 = time.perf_counter()
        for t in threads:
            t.start()
        next_eval = 0.0
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.05)
            if evaluate is not None and time.perf_counter() - self._t0 >= next_eval:
                self.evaluate(*evaluate)
                next_eval = time.perf_counter() - self._t0 + eval_every
            if progress is not None:
                progress(feed.taken, self._last_loss)
        self.record.steps_run = feed.total_done
        if feed.error is not None:  # (the replicas are fine: the batch was not)
            raise feed.error
        if feed.unused:
            self.record.notes.append(f"{feed.unused} batch(es) left unused: too few rows to "
                                     f"share out among the {len(feed.live)} replicas")
        if feed.exhausted and feed.live:
            self.record.notes.append(f"the batches ran out after {feed.total_done} of "
                                     f"{steps} steps")
        elif feed.total_done < steps:
            raise GraphflowError(f"every replica failed after {feed.total_done} of {steps} "
                                 "steps: " + "; ".join(self.record.failures))
        if feed.lockstep and feed.live != set(live):
            self.record.notes.append(
                f"{o.mode}: after replica(s) {', '.join(map(str, sorted(set(live) - feed.live)))}"
                f" failed, the {len(feed.live)} left ran {feed.rounds} steps each, "
                f"{feed.total_done} in all")
        self._flush_pushes()
        if evaluate is not None:
            self.evaluate(*evaluate)
        return self.record

    def steps_to_run(self, steps: int) -> int:
        """The steps `fit(batches, steps)` runs if no replica fails: `steps`, rounded up to a
        multiple of the live replicas in the lockstep modes (bsp, allreduce)."""
        if self.options.mode not in LOCKSTEP:
            return steps
        live = self.replicas - len(self._failed)
        return -(-steps // live) * live

    def _flush_pushes(self) -> None:
        """Downpour pushes on their own threads: a run ends once the live replicas' pushes
        have reached the shards, so that what comes next (evaluate, params, another fit) sees
        every step run. A replica that cannot is dropped, as if it failed at its last step."""
        if self.options.mode != "downpour":
            return
        for r, cluster in enumerate(self.clusters):
            if cluster is None or r in self._failed:
                continue
            try:
                cluster.call_all("ps_flush", {})
            except GraphflowError as e:
                ran = self.record.steps_done.get(r, 0)
                self.record.steps_run -= ran - self._accepted(r, ran, held=False)
                self._replica_failed(r, ran, e)

    def _fit_sandblaster(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
                         evaluate: tuple[np.ndarray, np.ndarray] | None, eval_every: float,
                         progress: Callable[[int, float], None] | None) -> Record:
        from graphflow.replicas.sandblaster import ClusterReplica, Sandblaster

        ids = [r for r, c in enumerate(self.clusters) if c is not None]  # sb's index -> replica
        replicas = [ClusterReplica(self.clusters[r], self.model.x.name, self.model.y.name)
                    for r in ids]
        losses = self.record.losses.setdefault(0, [])  # (the coordinator's batch losses)
        self.record.steps_run = 0
        self.record.steps_done.update(dict.fromkeys(ids, 0))
        self._t0 = next_eval = time.perf_counter()
        batches = batches if isinstance(batches, Sequence) else pairs(batches, self.model.x,
                                                                        self.model.y)
        with Sandblaster(self._client, replicas, batches, self.options.portions) as sb:
            for i in range(steps):
                try:
                    self._last_loss = sb.step()
                except StopIteration:  # (an L-BFGS step takes a batch a line search)
                    self.record.notes.append(f"the batches ran out after {i} of {steps} steps")
                    break
                losses.append((time.perf_counter() - self._t0, i, self._last_loss))
                self.record.steps_run = i + 1
                # each portion's gradient is credited to the replica whose result was used
                won = [ids[e["replica"]] for e in list(sb.log) if e["won"]]
                self.record.steps_done.update({r: won.count(r) for r in ids})
                if evaluate is not None and (time.perf_counter() >= next_eval or
                                             i == steps - 1):
                    self.evaluate(*evaluate)
                    next_eval = time.perf_counter() + eval_every
                if progress is not None:
                    progress(i + 1, self._last_loss)
        self.record.failures += [f"replica {ids[e['replica']]}: {e['error']}" for e in sb.log
                                 if e.get("error")]
        self.record.notes.append(f"sandblaster: a replica's steps are the gradient portions it "
                                 f"computed (up to {self.options.portions} a batch evaluation); "
                                 f"{self.record.steps_run} L-BFGS steps in all")
        return self.record

    def _replica_loop(self, r: int, feed: Feed[tuple[np.ndarray, np.ndarray]]) -> None:
        cluster = self.clusters[r]
        assert cluster is not None
        losses = self.record.losses.setdefault(r, [])
        x_name, y_name = self.model.x.name, self.model.y.name
        step, batch = 0, None
        try:
            while not self._stop.is_set():
                batch = feed.next(r)
                if batch is None:
                    return
                if r in self.options.slow:
                    time.sleep(self.options.slow[r])
                out = cluster.step({x_name: batch[0], y_name: batch[1]})
                self._last_loss = float(out[self.model.loss.name])
                losses.append((time.perf_counter() - self._t0, step, self._last_loss))
                step += 1
                self.record.steps_done[r] = step
                batch = None
                feed.finished(r)
        except GraphflowError as e:
            if self.options.mode == "downpour":  # (pushes go on their own threads)
                accepted = self._accepted(r, step, held=batch is not None)
                batch = None if accepted > step else batch  # (its push got there: it ran)
                step = accepted
            feed.failed(r, batch, done=step)
            self._replica_failed(r, step, e)
        except BaseException:
            feed.failed(r, batch)  # never leave the others waiting for a replica that stopped
            raise

    def _accepted(self, r: int, ran: int, held: bool) -> int:
        """Downpour, replica `r` having failed: how many of the `ran` steps it finished this
        fit (and the one it `held`) the shards took, by their clock of it (its newest push's
        step + 1; the lowest of the shards'; a split replica's workers share a shard's clock).
        Each step counts only once its push is taken; `record.steps_done[r]` is set to that,
        and a note says what was not counted."""
        try:
            with self._lock:
                clocks = self.client.clocks()
        except GraphflowError as e:
            self.record.notes.append(f"replica {r}: could not ask the shards which of its "
                                     f"{ran} steps they took ({e}); all are counted")
            return ran
        pushed = min(dict(c["clocks"]).get(r, 0) for c in clocks.values())
        accepted = max(0, min(pushed - self._first.get(r, 0), ran + held))
        if accepted < ran:
            self.record.notes.append(f"replica {r}: {ran - accepted} of its {ran} steps never "
                                     "reached the parameter server: not counted")
        self.record.steps_done[r] = accepted
        return accepted

    def _replica_failed(self, r: int, step: int, error: BaseException) -> None:
        what = f"replica {r} failed at step {step}: {error}; dropped, the others go on"
        log.error(what)
        self.record.failures.append(what)
        self._failed.add(r)
        if self.options.mode == "allreduce":
            return  # the others' next allreduce names the missing rank and fails too
        try:
            with self._lock:
                self.client.drop(r, f"failed at step {step}")
        except GraphflowError as e:
            log.error("could not tell the shards to drop replica %d: %s", r, e)

    def _steps_so_far(self) -> int:
        if self.options.mode == "sandblaster":
            return self.record.steps_run  # (its steps_done count portions)
        return sum(self.record.steps_done.values())

    def _stamp(self) -> dict[str, Any]:
        """When an event happened: seconds into the fit and its steps so far."""
        return {"seconds": round(time.perf_counter() - self._t0, 3), "step": self._steps_so_far()}

    def _shard_restarted(self, event: dict[str, Any]) -> None:
        self.record.shard_restarts.append(event)
        self.record.notes.append(restart_note(event))

    # -- results ------------------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        """The current parameters (the PS's; with allreduce, the first live replica's), by
        the model's parameter names."""
        if self.options.mode == "allreduce":
            live = next(c for r, c in enumerate(self.clusters) if r not in self._failed)
            assert live is not None
            return self.plan.assemble(live.params())
        with self._lock:
            return self.plan.assemble(self.client.fetch())

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accuracy of the PS's current parameters on (x, y), recorded with the time."""
        if self._session is None:
            self._session = Session(self.model.graph)
        self._session.params.update(self.params())
        acc = self.model.accuracy(self._session, x, y)
        self.record.evals.append((time.perf_counter() - self._t0, self._steps_so_far(), acc))
        return acc

    def close(self) -> None:
        self._stop.set()
        for cluster in self.clusters:
            if cluster is not None:
                cluster.close()
        self.shards.close()

    def __enter__(self) -> ReplicaManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
