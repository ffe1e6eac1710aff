"""A worker as a service: the control RPCs the driver calls (load, connect, step, params).

The same service runs in a thread (threads in one process), in a local process, or on another
machine (`graphflow worker --listen tcp://HOST:PORT`); only the addresses differ.

A served worker outlives its drivers: one that did not start it `attach`es, and `release`s it
when done; the worker drops that run (subgraph, endpoints, links, trace) and waits for the next.
A driver that is gone without releasing (its connection ended) is replaced by the next to
attach; a connected one is not (runtime/ownership.py). A driver `shutdown`s only the workers
it started itself.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from graphflow.lifetime import exit_with_parent
from graphflow.optim import make_optimizer
from graphflow.runtime.mailbox import PeerFailed
from graphflow.runtime.ownership import PROTOCOL, Owners, graphflow_version
from graphflow.runtime.worker import Worker, worker_name

if TYPE_CHECKING:
    from graphflow.replicas.link import AllReduceLink, PSLink
from graphflow.serialize import graph_from_dict
from graphflow.timing import time_kernels, time_update
from graphflow.trace.recorder import EXECUTOR, Recorder, activate, bind_thread, clock, deactivate
from graphflow.transport.endpoint import Endpoint, PeerTimeout
from graphflow.transport.rpc import RpcServer

# A worker process runs its own garbage collector: what `load` built (graph, parameters) and
# what the first step loaded (its kernels) are frozen, so a full collection no longer walks them
# (one took 58 ms, nearly a whole lc-large step; with the first step's kernels still in it,
# 21-41 ms, and about 1 ms after), and the young generations are collected after a step's reply
# is sent, in the wait for the next request, instead of wherever CPython's allocation count
# falls mid-step (seven young collections in each lc-large step, 1.4 ms).
FULL_COLLECTION_EVERY = 100  # steps: cycles promoted to the old generation are freed too
# An idle worker wakes only this often (s) to see whether its parent is gone: a shutdown request
# ends the loop at once. At 0.1 s, with the mailbox's receiver at 0.05, a dozen idle 2-worker
# clusters made a busy pinned one's steps 8% slower (speech-mlp, pipelined).
IDLE_WAIT = 1.0


class WorkerService:
    """RPC handlers around one Worker, created by `load`. With `own_gc` (a worker process,
    not a thread in someone else's), it schedules the process's garbage collection. `say`
    reports drivers attaching and leaving (a served worker's stderr); with `once`, the first
    driver's `release` (or its end: `first_driver_gone`) ends the service."""

    def __init__(self, context: zmq.Context | None = None, own_gc: bool = False,
                 say: Callable[[str], None] | None = None, once: bool = False) -> None:
        self.context = context
        self.own_gc, self.say, self.once = own_gc, say, once
        self.owners = Owners(self._say)  # which driver is attached, which were taken over
        self._server: RpcServer | None = None  # the server answering, who knows the caller
        self._silent: str | None = None  # a peer never delivered in this step: later ones fail
        self._steps = 0  # steps answered since the last load
        self._collect = False  # with own_gc: the request being answered was a step
        self.worker: Worker | None = None
        self.link: PSLink | AllReduceLink | None = None
        self._ar_endpoint: Endpoint | None = None
        self.replica: int | None = None  # the replica this worker belongs to, once attached
        self.trace: Recorder | None = None
        self._answered = clock()  # when the last request was answered (its reply sent)
        self._replying: float | None = None  # when the last step's handler returned
        self.stop = threading.Event()

    def handlers(self, server: RpcServer | None = None) -> dict[str, Any]:
        """Method name -> handler. Given the `server` that answers with them, a caller other
        than the attached driver is refused all but ownership.ANYONE's methods."""
        methods = {"hello": self.hello, "load": self.load, "connect": self.connect,
                   "step": self.step, "get_params": self.get_params,
                   "set_params": self.set_params, "ps_attach": self.ps_attach,
                   "ps_flush": self.ps_flush, "ar_bind": self.ar_bind,
                   "ar_attach": self.ar_attach, "stats": self.stats, "shutdown": self.shutdown,
                   "time_kernels": self.time_kernels, "trace_start": self.trace_start,
                   "trace_clock": self.trace_clock, "trace_take": self.trace_take,
                   "attach": self.attach, "release": self.release}
        self._server = server
        if server is None:
            return methods
        return {method: partial(self._admitted, method, fn) for method, fn in methods.items()}

    def _admitted(self, method: str, fn: Callable[..., Any], **args: Any) -> Any:
        self.owners.admit(method, self._caller())
        return fn(**args)

    @property
    def owner(self) -> bytes | None:  # the attached driver's routing id (RpcServer.caller)
        return self.owners.owner

    def _caller(self) -> bytes | None:
        return self._server.caller if self._server is not None else None

    def _say(self, message: str) -> None:
        if self.say is not None:
            self.say(message)

    def _loaded(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("no plan loaded: call load first")
        return self.worker

    def hello(self) -> dict[str, Any]:
        """Who answers: the driver refuses another graphflow's (ownership.check_workers)."""
        return {"pid": os.getpid(), "version": graphflow_version(), "protocol": PROTOCOL}

    def attach(self, driver: str = "", run: str = "") -> dict[str, Any]:
        """Start the calling driver's run (`driver` describes it, `run` its Cluster); `hello`'s
        reply. A worker whose driver is gone without `release` is taken over (that run dropped;
        with `once`, it exits instead); one whose driver is connected is not: RuntimeError."""
        if self.first_driver_gone():
            raise RuntimeError(f"this worker (--once) served driver {self.owners.driver}, "
                               f"which is gone: it exits")
        if self.owners.attach(self._caller(), driver, run, self._server):
            self._drop_run()
        return self.hello()

    def release(self) -> bool:
        """The attached driver is done: drop its run and wait for the next one (with `once`,
        stop). False, and nothing done, for a driver this worker no longer serves."""
        if not self.owners.release(self._caller()):
            return False
        self._drop_run()
        if self.once:
            self.stop.set()
        return True

    def first_driver_gone(self) -> bool:
        """With `once`: whether the driver is gone without releasing (killed, or silent past
        the heartbeat timeout); then the service stops, as after its `release`."""
        if not (self.once and self._server and self.owners.gone(self._server.reaches)):
            return False
        self._say(f"driver {self.owners.driver} is gone without releasing: this --once worker "
                  f"exits")
        self.stop.set()
        return True

    def load(self, index: int, graph: dict[str, Any], grads: Mapping[str, str],
             data_bind: str, optimizer: Mapping[str, Any] | None = None,
             peer_timeout: float = 30.0, stages: int = 1, loss_join: str = "mean") -> str:
        """Take this worker's subgraph; bind its data endpoint; return the endpoint address."""
        if self.worker is not None:
            self.worker.close()
        endpoint = Endpoint(worker_name(index), data_bind, self.context, peer_timeout)
        self.worker = Worker(index, graph_from_dict(graph), endpoint, grads,
                             make_optimizer(optimizer), peer_timeout, stages, loss_join)
        self.worker.trace = self.trace
        self._silent = None
        if self.own_gc:
            gc.unfreeze()  # (loaded again: what the last load froze may be garbage now)
            gc.collect()
            gc.freeze()
            gc.disable()
        self._steps = 0
        return endpoint.address

    def connect(self, peers: Mapping[str, str]) -> None:
        """Open a connection to every peer this worker sends to."""
        w = self._loaded()
        dsts = {worker_name(n.attrs["dst"]) for n in w.graph.nodes if n.op == "send"}
        for peer in sorted(dsts):
            w.mail.endpoint.connect(peer, peers[peer])

    def ps_attach(self, shards: Sequence[str], layout: Mapping[str, Any], replica: int,
                  mode: str, n_fetch: int = 1, n_push: int = 1, staleness: int = 2,
                  compress: str | None = None, timeout: float = 2.0,
                  retry_for: float = 15.0) -> None:
        """From now on this worker's gradients go to the parameter server (data parallelism):
        a PSLink takes the optimizer's place and fetches the worker's parameters now. Each
        call to a shard waits `timeout` s and is retried for `retry_for` s (a restarting
        shard); the link's own waits (bsp barrier, ssp gate) are bounded by `retry_for`."""
        from graphflow.ps.client import PSClient
        from graphflow.ps.layout import Layout
        from graphflow.replicas.link import PSLink

        w = self._loaded()
        plan = Layout.from_dict(dict(layout))
        names = sorted(w.params)

        def client() -> PSClient:
            return PSClient(list(shards), plan, timeout=timeout, retry_for=retry_for,
                            names=names)

        if self.link is not None:
            self.link.close()
        self.link = PSLink(w.params, client, replica, mode, n_fetch, n_push, staleness,
                           compress, retry_for)
        self.link.trace, self.replica = self.trace, replica
        w.optimizer = self.link

    def ps_flush(self) -> None:
        """Wait until this worker's pushes so far have reached the parameter server."""
        if self.link is not None and hasattr(self.link, "flush"):
            self.link.flush()

    def ar_bind(self, rank: int, bind: str, timeout: float = 30.0) -> str:
        """Bind this worker's endpoint for an allreduce group (rank = its replica); returns
        the address its peers connect to."""
        from graphflow.replicas.allreduce import rank_name

        if self._ar_endpoint is not None:
            self._ar_endpoint.close()
        self._ar_endpoint = Endpoint(rank_name(rank), bind, self.context, timeout)
        return self._ar_endpoint.address

    def ar_attach(self, rank: int, size: int, peers: Mapping[str, str], algorithm: str,
                  optimizer: Mapping[str, Any], timeout: float = 30.0) -> None:
        """From now on this worker averages its gradients with its copies in the other
        replicas (`peers`: rank -> address from `ar_bind`) and applies them itself."""
        from graphflow.replicas.allreduce import AllReduce
        from graphflow.replicas.link import AllReduceLink

        w = self._loaded()
        if self._ar_endpoint is None:
            raise RuntimeError("ar_attach before ar_bind")
        ar = AllReduce(rank, size, self._ar_endpoint, {int(r): a for r, a in peers.items()},
                       algorithm, timeout)
        self._ar_endpoint = None  # the AllReduce owns it now
        updater = make_optimizer(optimizer)
        if updater is None:
            raise ValueError("ar_attach needs an optimizer spec")
        self.link = AllReduceLink(w.params, ar, updater)
        self.link.trace, self.replica = self.trace, rank
        w.optimizer = self.link

    def step(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str], step: int,
             train: bool = True, check_numerics: bool = False, microbatches: int = 1,
             schedule: str = "1f1b", rows: int | None = None,
             only: Sequence[str] | None = None,
             joins: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
        started = clock()
        worker, link = self._loaded(), self.link if train else None
        if self._silent is not None:
            self._refuse(worker, step)
        if link is not None:
            link.before_step(step)
        try:
            out = worker.run_step(feeds, list(fetches), step, train, check_numerics,
                                  microbatches, schedule, rows, only, joins)
        except PeerTimeout as e:  # a peer that sent nothing for `timeout` is dead or hung
            self._silent = f"step {step} waited in vain: {e}"
            raise
        if link is not None:
            link.after_step(step)
        self._collect = self.own_gc
        if (tr := self.trace) is not None:
            # the executor's time before the step: idle, then the driver's request (and its
            # feeds) on the way in; with the reply (`answered`) its spans tile the whole step
            tr.add(EXECUTOR, "idle", "await step", self._answered, started, {"step": step})
            self._replying = clock()
        return out

    def _refuse(self, worker: Worker, step: int) -> None:
        """Fail a step at once after one where a peer never delivered: steps queued behind it
        (streamed) would each wait `timeout` for it again, while a new driver waits."""
        why = f"{worker_name(worker.index)}: step {step} not run, {self._silent}"
        try:
            worker.mail.begin(step)
        finally:
            worker.mail.abort_peers(why)
        raise PeerFailed(why)

    def get_params(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        params = self._loaded().params
        return {n: params[n] for n in (names if names is not None else params)}

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        params = self._loaded().params
        for name, value in values.items():  # (the driver checked them: Cluster.set_params)
            if name not in params or params[name].shape != np.shape(value):
                raise ValueError(f"{worker_name(self._loaded().index)} holds no parameter "
                                 f"'{name}' of shape {np.shape(value)}")
            params[name][...] = value

    def stats(self) -> dict[str, Any]:
        mail = self._loaded().mail
        return {"bytes_sent": mail.bytes_sent, "bytes_received": mail.bytes_received,
                "sent_keys": list(mail.sent_keys), "gc_frozen": gc.get_freeze_count()}

    def time_kernels(self, kernels: Sequence[Mapping[str, Any]],
                     repeats: int = 1) -> dict[str, Any]:
        """Time kernels (`timing.kernel_specs`) and the optimizer's update rates in this
        worker's process: a benchmark calibrates where its steps run, in several processes
        (a freshly started process now and then runs 10-30% slow for its whole life)."""
        return {"kernel_s": time_kernels(kernels, repeats), "update_Bps": time_update(repeats),
                "update_shared_Bps": time_update(repeats, streams=2)}

    # -- tracing (graphflow/trace): on only between trace_start and trace_take(stop=True) ----
    def _set_trace(self, recorder: Recorder | None) -> None:
        """Called on the executor thread (every handler runs on it): its collections too."""
        if self.trace is not None:
            deactivate(self.trace)
        self.trace = recorder
        for holder in (self.worker, self.link):
            if holder is not None:
                holder.trace = recorder
        if recorder is not None:
            activate(recorder)
        bind_thread(recorder, EXECUTOR)

    def trace_start(self) -> dict[str, Any]:
        """Record spans from now on (a fresh recorder); this worker's replica and clock."""
        self._set_trace(Recorder())
        return {"replica": self.replica, "clock": clock(), "pid": os.getpid()}

    def trace_clock(self) -> float:
        """This process's trace clock (the driver aligns remote workers' spans with it)."""
        return clock()

    def trace_take(self, stop: bool = False) -> dict[str, Any]:
        """The spans recorded since the last take (packed, see recorder.pack); with `stop`,
        recording ends."""
        recorder = self.trace
        if recorder is not None:  # since the last reply (a step's, on its way to the driver)
            recorder.add(EXECUTOR, "idle", "await request", self._answered, clock())
        if stop:
            self._set_trace(None)
        return recorder.take() if recorder is not None else Recorder().take()

    def answered(self) -> None:
        """A request was answered: its reply is on the way (called by `serve`). After a step,
        a process that owns its collector collects here, between steps: while the driver
        gathers replies, or, with streamed steps (the next one already queued), just before it."""
        now = clock()
        if self._replying is not None and (tr := self.trace) is not None:
            tr.add(EXECUTOR, "rpc", "step reply", self._replying, now)
        self._replying = None
        if self._collect:
            self._collect, self._steps = False, self._steps + 1
            if self._steps == 1:  # the kernels it loaded stay: frozen with what `load` built
                gc.collect()
                gc.freeze()
            else:
                gc.collect(2 if self._steps % FULL_COLLECTION_EVERY == 0 else 1)
        self._answered = clock()

    def shutdown(self) -> None:
        self.stop.set()

    def _drop_run(self) -> None:
        """Forget a run: what `close` ends, and what this worker knew of it."""
        self.close()
        self.replica, self._silent, self._steps = None, None, 0
        if self.own_gc:  # its graph and parameters, frozen by `load`, are garbage now
            gc.unfreeze()
            gc.collect()
            gc.enable()

    def close(self) -> None:
        self._set_trace(None)
        if self.link is not None:
            self.link.close()
            self.link = None
        if self._ar_endpoint is not None:
            self._ar_endpoint.close()
            self._ar_endpoint = None
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def serve(listen: str, context: zmq.Context | None = None,
          ready: threading.Event | None = None, announce: bool = False,
          own_gc: bool = False, parent: int | None = None, once: bool = False) -> None:
    """Answer control requests at `listen` until `shutdown` (or until process `parent`, the
    driver that started this one, is gone; with `once`, until the first driver releases it);
    `own_gc` when the worker is the whole process (see WorkerService). With `announce`, say
    on stderr where it listens and when drivers attach and leave."""
    service = WorkerService(context, own_gc, _stderr if announce else None, once)
    if parent is not None:
        exit_with_parent(parent, service.stop)
    with RpcServer(listen, context, copy_results=True) as server:
        if ready is not None:
            ready.set()
        if announce:
            print(f"graphflow worker listening on {server.address}", file=sys.stderr,
                  flush=True)
        handlers = service.handlers(server)
        try:
            while not service.stop.is_set():
                if server.handle_one(handlers, IDLE_WAIT):
                    service.answered()
                else:  # (idle: a driver that is gone sends nothing more)
                    service.first_driver_gone()
        finally:
            service.close()


def _stderr(message: str) -> None:
    print(f"graphflow worker: {message}", file=sys.stderr, flush=True)
