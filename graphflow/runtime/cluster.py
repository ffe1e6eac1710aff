"""The driver: starts (or reaches) one worker per plan part, ships each its subgraph, runs steps.

Three placements of workers, one code path: `mode="threads"` runs each worker in a thread of
this process (the nogil kernels run side by side), `mode="processes"` starts one local process
per worker, and `hosts=[...]` uses `graphflow worker --listen` processes already running on
other machines. Only the addresses differ: inproc, ipc or tcp.

>>> import numpy as np, graphflow as gf
>>> model = gf.models.digits_lc()
>>> plan = gf.partition(model.graph, 2, "spatial", loss=model.loss)
>>> with Cluster(plan, optimizer={"name": "sgd", "lr": 0.1}) as cluster:
...     x, y = np.zeros((4, 1, 32, 32), np.float32), np.zeros(4, np.int32)
...     out = cluster.step({"x": x, "y": y})
>>> float(out["loss"]) > 0
True
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import numpy as np
import zmq

from graphflow.errors import GraphflowError
from graphflow.runtime.calls import WorkerCalls, WorkerFailed, reply_grace
from graphflow.runtime.clusterfile import CONNECT_TIMEOUT, check_hosts, read_cluster_file
from graphflow.runtime.cores import BLAS_LIMIT, pinned_cores
from graphflow.runtime.heap import keep_freed_memory
from graphflow.runtime.inflight import FeedBuffers, SentStep
from graphflow.runtime.launch import PROCESS_START, LocalWorkers, reap
from graphflow.runtime.options import check_cluster_options, check_pipeline
from graphflow.runtime.ownership import check_workers
from graphflow.runtime.planargs import Feeds, Fetches, PlanArgs
from graphflow.runtime.prune import worker_runs
from graphflow.runtime.worker import worker_name
from graphflow.serialize import graph_to_dict
from graphflow.trace import session as tracing
from graphflow.trace.recorder import clock
from graphflow.transport.rpc import RpcClient

if TYPE_CHECKING:  # (a worker process starts without the partitioners)
    from graphflow.partitioners.plan import Plan


def _reap(procs: list[subprocess.Popen[bytes]], tmp: str | None, feeds: FeedBuffers) -> None:
    """End what a cluster dropped without close still holds: processes, folders, feed files."""
    feeds.close()
    reap(procs, tmp)


class Cluster:
    """Runs `plan` on its workers. `optimizer` ({"name": "sgd", "lr": 0.1}) updates each
    worker's parameters in place after every `step`; `timeout` bounds every wait. With
    `microbatches` > 1 each batch is cut into that many micro-batches that flow through a
    layerwise plan's stages in `schedule` order ("gpipe", "1f1b" or "eager": see
    runtime/pipeline.py), gradients averaged. `local_workers` (default: the plan's parts) is
    how many workers of this and other clusters share this machine's cores; each local worker
    gets its share of BLAS threads, and with `pin` (default: where it keeps it busy) a core of
    its own (runtime/cores.py). Threads-mode workers keep freed memory (runtime/heap.py).
    Remote workers (`hosts`) must answer the first call within `connect_timeout` s; with
    `check_numerics` every step stops at the first node making a NaN or inf. Feeds and
    fetches are nodes or node names, as `gf.Session` takes them; once `close`d (again, or at
    the end of its `with`), a call raises GraphflowError."""

    def __init__(self, plan: Plan, mode: str = "threads", hosts: Sequence[str] | None = None,
                 optimizer: Mapping[str, Any] | None = None, timeout: float = 30.0,
                 microbatches: int = 1, schedule: str = "eager",
                 local_workers: int | None = None, pin: bool | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, check_numerics: bool = False) -> None:
        self.closed = False
        check_cluster_options(mode, hosts, microbatches, timeout, connect_timeout)
        if hosts is not None:
            mode = "remote"
            check_hosts(hosts, plan.parts)
        self.plan, self.mode, self.timeout = plan, mode, timeout
        self.connect_timeout, self.check_numerics = connect_timeout, check_numerics
        check_pipeline(plan, microbatches, schedule)
        self.microbatches, self.schedule = int(microbatches), schedule
        self._args = PlanArgs(plan)
        # (a loss that is no mean or sum over the batch trains without micro-batches only)
        self._loss_join = self._args.loss_join() if microbatches > 1 else "mean"
        self.names = [worker_name(i) for i in range(plan.parts)]
        self.context = zmq.Context.instance()
        self._local = LocalWorkers(mode, uuid.uuid4().hex[:8], self.context)
        self._procs = self._local.procs
        # the workers of every cluster here share the cores (replicas: replicas x parts)
        self.local_workers, self.pin = local_workers or plan.parts, pin
        self._blas_limited = mode == "threads" and BLAS_LIMIT.acquire(self.local_workers)
        self.step_count = 0
        self._feed_buffers = FeedBuffers.for_mode(mode)
        # a cluster dropped without close still ends its worker processes (when collected, or
        # at the interpreter's exit); a killed driver's workers end by themselves (lifetime.py)
        self._reap = weakref.finalize(self, _reap, self._procs, self._local.tmp,
                                      self._feed_buffers)
        self._finished = 0.0  # when the last step's replies were all in
        self.trace_label: str | None = None  # names its workers in a trace of several clusters
        self.clients: list[RpcClient] = []
        self.attached = False  # remote workers were asked to `attach` (close releases them)
        try:
            self.control = self._start_workers(hosts)
            # a worker waits `timeout` for a peer, then reports which one was silent; the
            # driver waits a little longer, so only a dead or hung worker fails to answer
            self.clients = [RpcClient(a, n, timeout + reply_grace(timeout), self.context)
                            for a, n in zip(self.control, self.names, strict=True)]
            self._worker_calls = WorkerCalls(self.clients, self.names, self._local.ended,
                                             self._local.last_words)
            self._load(optimizer)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_file(cls, plan: Plan, path: str, **kwargs: Any) -> Cluster:
        """Remote workers named in a TOML cluster file, one per plan part:

            workers = ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]
        """
        check_hosts(hosts := read_cluster_file(path), plan.parts, path)
        return cls(plan, hosts=hosts, **kwargs)

    # -- start-up -----------------------------------------------------------------------------
    def _start_workers(self, hosts: Sequence[str] | None) -> list[str]:
        if self.mode == "remote":
            return list(hosts or [])
        if self.mode == "threads":  # the workers' tensors, every step again: see runtime/heap
            keep_freed_memory()
        pins = (pinned_cores(self.plan, self.microbatches, self.local_workers, self.pin)
                if self.mode == "processes" else None)
        return self._local.start(self.plan.parts, self.local_workers, pins, self.timeout)

    def _data_bind(self, i: int, control: str) -> str:
        if self.mode == "remote":
            return f"tcp://{urlparse(control).hostname}:*"
        return self._local.data_bind(i)

    def _load(self, optimizer: Mapping[str, Any] | None) -> None:
        self._greet()
        loads = [{"index": i, "graph": graph_to_dict(w.graph), "grads": self.plan.grads,
                  "data_bind": self._data_bind(i, c), "optimizer": dict(optimizer or {}),
                  "peer_timeout": self.timeout, "stages": self.plan.parts,
                  "loss_join": self._loss_join}
                 for i, (w, c) in enumerate(zip(self.plan.workers, self.control, strict=True))]
        data = self.call_each("load", loads)
        self.call_all("connect", {"peers": dict(zip(self.names, data, strict=True))})

    def _greet(self) -> None:
        """The first call. A local process has at least PROCESS_START s to start (Python and
        its imports take seconds on a busy machine; one that dies is still named within a
        second). A remote worker, of this graphflow (check_workers), is attached to this run;
        it must answer within `connect_timeout` (a wrong address fails fast)."""
        wait = self.clients[0].timeout
        if self.mode != "remote":
            self._first_call(max(wait, PROCESS_START * (self.mode == "processes")), ("hello", {}))
            return
        first = min(self.connect_timeout, wait)
        try:
            self._first_call(first, ("hello", {}), ("attach", {
                "driver": f"{socket.gethostname()} pid {os.getpid()}", "run": self._local.run}))
        except WorkerFailed as e:
            self.attached = True  # (some may have: close releases every one that answered)
            if not e.silent:
                raise
            at = self.control[self.names.index(e.worker)]
            raise WorkerFailed(f"{e.worker} at {at} did not answer within {first:g}s: is "
                               f"`graphflow worker --listen {at}` running there and reachable? "
                               f"(or busy with another driver's step; a slow network: "
                               f"connect_timeout, `graphflow train --connect-timeout`)",
                               e.worker, silent=True) from None
        self.attached = True

    def _first_call(self, seconds: float, *calls: tuple[str, Mapping[str, Any]]) -> None:
        """`calls` (method, args) sent at once to each worker, given `seconds` to answer (then
        its timeout): one answering attaches though another is silent; `hello` checked first."""
        wait = self.clients[0].timeout
        for client in self.clients:
            client.timeout = seconds
        try:
            sent = [(m, {i: self._calls.send(i, m, a) for i in range(len(self.clients))})
                    for m, a in calls]
            for method, rids in sent:
                replies = self._calls.gather(method, rids)
                if method == "hello":
                    check_workers(self.names, self.control, [replies[i] for i in rids])
        finally:
            for client in self.clients:
                client.timeout = wait

    # -- calls (runtime/calls.py) ---------------------------------------------------------------
    @property
    def _calls(self) -> WorkerCalls:
        self._check_open()
        return self._worker_calls

    def _check_open(self) -> None:
        if self.closed:  # (its sockets are: zmq would say "Socket operation on non-socket")
            raise GraphflowError("the cluster is closed: its workers were shut down or "
                                 "released by close() (or at the end of its `with` block)")

    def call_each(self, method: str, args: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Call a WorkerService method on every worker, worker i with args[i]."""
        return self._calls.call_each(method, args)

    def call_all(self, method: str, args: Mapping[str, Any]) -> list[Any]:
        """Call a WorkerService method with the same arguments on every worker."""
        return self._calls.call_each(method, [args] * self.plan.parts)

    # -- the public API -----------------------------------------------------------------------
    def run(self, feeds: Feeds, fetches: Fetches = (), train: bool = False,
            check_numerics: bool = False) -> dict[str, np.ndarray]:
        """One step of every worker; returns the fetched values by node name. Without `train`
        the workers compute only what the fetches depend on, so only the placeholders those
        read must be fed (the logits need no labels); a training step needs them all."""
        self._check_open()
        return self._finish_step(self._send_step(feeds, fetches, train, check_numerics))

    def stream(self, batches: Iterable[Feeds], fetches: Fetches | None = None,
               ahead: int = 1) -> Iterator[dict[str, np.ndarray]]:
        """Training steps over `batches`, yielding each one's fetched values (the loss by
        default) in order: the same steps, results and parameters as `step` called on each.

        Up to `ahead` later steps wait at the workers while one runs, so each worker starts
        the next step as soon as its own part of this one is done: a pipeline's fill and
        drain and the driver's round trip overlap the neighbouring steps, not add to them.
        Every worker still updates its parameters from step t before it starts step t+1,
        and a step's tensors are keyed by its number, so nothing goes stale.

            for out in cluster.stream(batches):
                print(out["loss"])

        Other calls may come between its steps (the logits of held-out data, `params()`):
        they see the parameters after the steps already sent. A consumer that stops early
        leaves the steps already sent to finish when the stream is closed. Close it where
        you stop (`with contextlib.closing(cluster.stream(...))`) to have such a step's
        failure raised there: a stream left to the garbage collector can only print it, and
        the cluster's next call fails naming the worker. When
        `batches` raises (or a batch is refused), the steps already sent finish too before
        that exception propagates: a failure of theirs is raised, chained to it.
        """
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        self._check_open()
        fetches = None if fetches is None else self._args.fetches(fetches)  # (once: an iterator)
        sent: deque[SentStep] = deque()
        try:
            for feeds in batches:
                sent.append(self._send_step(feeds, fetches, train=True))
                if len(sent) > ahead:
                    yield self._take_first(sent)
            while sent:
                yield self._take_first(sent)
        finally:  # stopped early, or `batches` failed: the steps sent still update parameters
            while sent and not self.closed:
                self._take_first(sent)

    def _take_first(self, sent: deque[SentStep]) -> dict[str, np.ndarray]:
        """The results of the first of the streamed steps `sent`, removed; if it failed, the
        steps after it cannot finish, and are dropped."""
        try:
            return self._finish_step(sent.popleft())
        except BaseException:
            for step in sent:  # (their replies, when they come, are dropped)
                for i, rid in step.requests.items():
                    self.clients[i].forget(rid)
            sent.clear()
            raise

    def _send_step(self, feeds: Feeds, fetches: Fetches | None, train: bool,
                   check_numerics: bool = False) -> SentStep:
        calls = self._calls  # (a closed cluster says so before any mistake in the feeds)
        if fetches is None:  # a training step's default: the loss
            fetches = [self.plan.loss] if self.plan.loss else []
        wanted: list[list[str]] = [[] for _ in self.names]
        asked = self._args.fetches(fetches)
        names = self._args.pieces(asked)
        for name in names:
            wanted[self.plan.worker_of(name)].append(name)
        # a run that does not train computes only what its fetches need (runtime/prune.py)
        only = worker_runs(None if train else self._args.needed(names), self.plan)
        checked = self._args.feeds(feeds, None if train else asked)
        session = tracing.current()  # a traced run: the workers record, the driver times steps
        traced = session.join(self) if session is not None else None
        rows = self._args.rows(checked, self.microbatches)
        # (refused before any worker is sent its part: a part sent alone would run on)
        joins = [self._args.joins(w) if self.microbatches > 1 else None for w in wanted]
        step = SentStep(self.step_count, {}, traced, clock(), fetches=asked,
                        fed={n: checked[n] for n in asked if n in self._args.placeholders})
        for i in range(self.plan.parts):
            step.requests[i] = calls.send(i, "step", {
                "feeds": self._feed_buffers.cut(self.plan, step, i, checked), "fetches": wanted[i],
                "step": step.number, "train": train, "microbatches": self.microbatches,
                "check_numerics": check_numerics or self.check_numerics,
                "schedule": self.schedule, "rows": rows, "only": only[i],
                "joins": joins[i]})
        self.step_count += 1
        return step

    def _finish_step(self, step: SentStep) -> dict[str, np.ndarray]:
        t0 = max(step.sent, self._finished)  # (a streamed step waited for the one before)
        results = self._calls.gather("step", step.requests)
        self._feed_buffers.give_back(step)  # (a failed step's are dropped: zmq may hold them)
        self._finished = clock()
        if (session := tracing.current()) is not None:
            session.step(self, step.traced, step.number, t0)
        return step.results(self.plan, {k: v for r in results.values() for k, v in r.items()})

    def step(self, feeds: Feeds, fetches: Fetches | None = None) -> dict[str, np.ndarray]:
        """A training step: forward, backward and each worker's parameter update; fetches
        the loss unless told otherwise."""
        self._check_open()
        return self._finish_step(self._send_step(feeds, fetches, train=True))

    def gradients(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """The loss and every parameter's gradient (by parameter name), without updating."""
        if self.plan.loss is None:
            raise GraphflowError("the plan has no loss, so no gradients: partition with "
                                 "loss=..., as gf.partition(model.graph, parts, strategy, "
                                 "loss=model.loss)")
        grads = self.plan.grads
        if "loss" in grads:  # (the loss's key)
            raise GraphflowError("a parameter is named 'loss': rename it, or run() its gradient")
        out = self.run(feeds, [self.plan.loss, *grads.values()])
        return {"loss": out[self.plan.loss], **{p: out[g] for p, g in grads.items()}}

    def params(self) -> dict[str, np.ndarray]:
        self._check_open()
        return {k: v for r in self.call_all("get_params", {}) for k, v in r.items()}

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite parameters on the workers that hold them, by `params()`'s names or the
        model's: one the plan split into blocks (`fc/W` as `fc/W/part0`, ...) is split alike.
        KeyError for an unknown name, ValueError for a wrong shape, before anything is written:
        `cluster.set_params(gf.Session(model.graph).params)`."""
        self._check_open()
        each = self._args.parameters(values)
        self.call_each("set_params", [{"values": v} for v in each])

    def stats(self) -> list[dict[str, Any]]:
        self._check_open()
        return self.call_all("stats", {})

    def clock_probe(self, i: int) -> float:
        """Worker i's trace clock (one short round trip: graphflow/trace aligns clocks)."""
        return float(self._calls.call(i, "trace_clock", {}))

    def close(self) -> None:
        """Shut down the workers it started (release remote ones). Again: nothing to do."""
        if self.closed:
            return
        session = tracing.current()
        if session is not None and self.clients:
            session.leave(self)  # hand the workers' spans over while they are still there
        self.closed = True  # (even if what follows fails: the finalizer still reaps processes)
        # the workers it started end; remote ones serve on (unattached: the next driver takes them)
        if self.mode != "remote" or self.attached:
            self._tell_all("release" if self.mode == "remote" else "shutdown")
        for client in self.clients:
            client.close()
        self._local.join(5.0)  # (those still there are killed next)
        self._reap()
        if self._blas_limited:
            BLAS_LIMIT.release(self.local_workers)
            self._blas_limited = False

    def _tell_all(self, method: str) -> None:
        """Call `method` on every worker still there (not one that fell silent: it would only
        hold up the error that names it), waiting 5 s at most for all."""
        deadline, sent = time.monotonic() + min(self.timeout, 5.0), {}
        calls = getattr(self, "_worker_calls", None)
        silent = calls.silent if calls is not None else set()
        for i, client in enumerate(self.clients):
            with contextlib.suppress(GraphflowError):  # gone already
                if not self._local.ended(i) and i not in silent:
                    sent[i] = client.send(method)
        for i, rid in sent.items():
            with contextlib.suppress(GraphflowError):  # gone or hung: nothing to do for it
                self.clients[i].receive(rid, method, max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Cluster:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
