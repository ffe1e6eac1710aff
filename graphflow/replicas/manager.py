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
from dataclasses import dataclass, field, replace
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
from graphflow.replicas.feed import LOCKSTEP, Feed
from graphflow.replicas.link import MODES as PS_MODES
from graphflow.replicas.record import Record, resume_note
from graphflow.replicas.shards import ShardGroup
from graphflow.runtime.cluster import Cluster
from graphflow.runtime.clusterfile import CONNECT_TIMEOUT, load_cluster_file

log = logging.getLogger("graphflow.replicas")

MODES = (*PS_MODES, "allreduce", "sandblaster")


@dataclass
class ReplicaOptions:
    """How replicas share parameters. `mode`: downpour, bsp or ssp through the parameter
    server, allreduce (synchronous, no PS: `algorithm` ring or tree) or sandblaster (L-BFGS,
    one iteration per batch, cut into `portions`; the optimizer is not used); `n_fetch` / `n_push`:
    downpour's fetch and push intervals in steps; `staleness`: ssp's s; `warm_start`: steps
    replica 0 runs alone first (downpour; ssp up to staleness + 1); `compress`: None,
    "float16" or "topk:FRACTION"; `slow`: replica -> seconds added to each of its steps (for
    experiments and tests).

    Placement: `placement` threads or processes of this machine, or `hosts`: the control
    addresses of `graphflow worker`s elsewhere, replicas x parts of them (replica r gets
    hosts[r * parts:(r + 1) * parts]); the shards then listen on tcp at `ps_host`, an address
    of this machine those workers reach (`from_cluster_file` reads both)."""

    mode: str = "downpour"
    algorithm: str = "ring"
    portions: int = 8
    n_fetch: int = 1
    n_push: int = 1
    staleness: int = 2
    warm_start: int = 0
    compress: str | None = None
    placement: str = "threads"
    shard_placement: str = "threads"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 200
    bsp_deadline: float = 10.0  # < timeout / 2: the barrier drops a replica before others give up
    timeout: float = 30.0
    connect_timeout: float = CONNECT_TIMEOUT  # remote workers' time to answer the first call
    ps_timeout: float = 2.0
    slow: dict[int, float] = field(default_factory=dict)
    hosts: list[str] | None = None
    ps_host: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode '{self.mode}'; known: {', '.join(MODES)}")
        if self.algorithm not in ("ring", "tree"):
            raise ValueError(f"unknown allreduce algorithm '{self.algorithm}': ring or tree")
        if self.hosts and not self.ps_host and self.mode != "allreduce":
            raise ValueError("replicas on remote workers need ps_host: an address of this "
                             "machine the workers reach, for the parameter-server shards")
        if self.warm_start and (self.mode in LOCKSTEP or (
                self.mode == "ssp" and self.warm_start > self.staleness + 1)):
            # (replica 0 would wait at its first barrier, or the ssp gate, for the others)
            raise ValueError(f"warm_start {self.warm_start}: replica 0 cannot run alone in "
                             f"{self.mode} mode" + (f" past staleness {self.staleness} + 1"
                                                    if self.mode == "ssp" else ""))

    def with_cluster_file(self, path: str) -> ReplicaOptions:
        """These options with `hosts` and `ps_host` from a TOML cluster file:
        `workers = ["tcp://10.0.0.2:5555", ...]` and `ps_host = "10.0.0.1"`."""
        data = load_cluster_file(path)
        ps_host = data.get("ps_host")
        if ps_host is not None and not isinstance(ps_host, str):
            raise ValueError(f"{path}: ps_host must be a string such as \"10.0.0.1\"")
        return replace(self, hosts=data["workers"], ps_host=ps_host)


class ReplicaManager:
    """Runs `replicas` copies of `plan` against `shards` parameter-server shards. Shards
    that resumed from a checkpoint are in `resumed` ({shard: {"path", "updates", ...}}) and
    noted in `record.notes`."""

    def __init__(self, model: Model, plan: Plan, optimizer: Optimizer, replicas: int = 2,
                 shards: int = 2, options: ReplicaOptions | None = None) -> None:
        if replicas < 1 or shards < 1:
            raise ValueError(f"need at least one replica and one shard, got {replicas}, {shards}")
        self.model, self.plan, self.optimizer = model, plan, optimizer
        self.replicas, self.options = replicas, options or ReplicaOptions()
        self.record = Record()
        self.clusters: list[Cluster | None] = []
        # (allreduce needs no shards: the group only lends its directory for addresses)
        self.shards = ShardGroup(0 if self.options.mode == "allreduce" else shards,
                                 self.options.shard_placement,
                                 self.options.checkpoint_dir, self.options.checkpoint_every,
                                 self.options.timeout, listen_host=self.options.ps_host)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one thread at a time on self.client
        self._session: Session | None = None
        self._t0 = time.perf_counter()
        self._last_loss = float("nan")
        self._failed: set[int] = set()
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
                    o.staleness, o.warm_start)
        if feed.planned != steps:
            self.record.notes.append(
                f"{o.mode} runs its {len(live)} replicas in lockstep: {steps} steps rounded "
                f"up to {feed.planned} ({feed.rounds} each)")
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
                self._replica_failed(r, self.record.steps_done.get(r, 0), e)

    def _fit_sandblaster(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
                         evaluate: tuple[np.ndarray, np.ndarray] | None, eval_every: float,
                         progress: Callable[[int, float], None] | None) -> Record:
        from graphflow.replicas.sandblaster import ClusterReplica, Sandblaster

        replicas = [ClusterReplica(c, self.model.x.name, self.model.y.name)
                    for c in self.clusters if c is not None]
        losses, self.record.steps_done[0] = self.record.losses.setdefault(0, []), 0
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
                self.record.steps_done[0] = i + 1
                if evaluate is not None and (time.perf_counter() >= next_eval or
                                             i == steps - 1):
                    self.evaluate(*evaluate)
                    next_eval = time.perf_counter() + eval_every
                if progress is not None:
                    progress(i + 1, self._last_loss)
        self.record.failures += [f"replica {e['replica']}: {e['error']}" for e in sb.log
                                 if e.get("error")]
        self.record.steps_run = self.record.steps_done.get(0, 0)
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
            feed.failed(r, batch)
            self._replica_failed(r, step, e)
        except BaseException:
            feed.failed(r, batch)  # never leave the others waiting for a replica that stopped
            raise

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
        self.record.evals.append((time.perf_counter() - self._t0,
                                  sum(self.record.steps_done.values()), acc))
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
