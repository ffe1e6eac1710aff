"""A worker as a service: the control RPCs the driver calls (load, connect, step, params).

The same service runs in a thread (threads in one process), in a local process, or on another
machine (`graphflow worker --listen tcp://HOST:PORT`); only the addresses differ.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from graphflow.runtime.worker import Worker, make_optimizer, worker_name

if TYPE_CHECKING:
    from graphflow.replicas.link import AllReduceLink, PSLink
from graphflow.serialize import graph_from_dict
from graphflow.transport.endpoint import Endpoint
from graphflow.transport.rpc import RpcServer


class WorkerService:
    """RPC handlers around one Worker, created by `load`."""

    def __init__(self, context: zmq.Context | None = None) -> None:
        self.context = context
        self.worker: Worker | None = None
        self.link: PSLink | AllReduceLink | None = None
        self._ar_endpoint: Endpoint | None = None
        self.stop = threading.Event()

    def handlers(self) -> dict[str, Any]:
        return {"hello": self.hello, "load": self.load, "connect": self.connect,
                "step": self.step, "get_params": self.get_params, "set_params": self.set_params,
                "ps_attach": self.ps_attach, "ar_bind": self.ar_bind,
                "ar_attach": self.ar_attach, "stats": self.stats, "shutdown": self.shutdown}

    def _loaded(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("no plan loaded: call load first")
        return self.worker

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid()}

    def load(self, index: int, graph: dict[str, Any], grads: Mapping[str, str],
             data_bind: str, optimizer: Mapping[str, Any] | None = None,
             peer_timeout: float = 30.0, stages: int = 1) -> str:
        """Take this worker's subgraph; bind its data endpoint; return the endpoint address."""
        if self.worker is not None:
            self.worker.close()
        endpoint = Endpoint(worker_name(index), data_bind, self.context, peer_timeout)
        self.worker = Worker(index, graph_from_dict(graph), endpoint, grads,
                             make_optimizer(optimizer), peer_timeout, stages)
        return endpoint.address

    def connect(self, peers: Mapping[str, str]) -> None:
        """Open a connection to every peer this worker sends to."""
        w = self._loaded()
        dsts = {worker_name(n.attrs["dst"]) for n in w.graph.nodes if n.op == "send"}
        for peer in sorted(dsts):
            w.endpoint.connect(peer, peers[peer])

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
        w.optimizer = self.link

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
        w.optimizer = self.link

    def step(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str], step: int,
             train: bool = True, check_numerics: bool = False, microbatches: int = 1,
             schedule: str = "1f1b") -> dict[str, np.ndarray]:
        worker, link = self._loaded(), self.link if train else None
        if link is not None:
            link.before_step(step)
        out = worker.run_step(feeds, list(fetches), step, train, check_numerics, microbatches,
                              schedule)
        if link is not None:
            link.after_step(step)
        return out

    def get_params(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        params = self._loaded().params
        return {n: params[n] for n in (names if names is not None else params)}

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        params = self._loaded().params
        for name, value in values.items():
            if name not in params or params[name].shape != np.shape(value):
                raise ValueError(f"{worker_name(self._loaded().index)} holds no parameter "
                                 f"'{name}' of shape {np.shape(value)}")
            params[name][...] = value

    def stats(self) -> dict[str, Any]:
        w = self._loaded()
        return {"bytes_sent": w.bytes_sent, "bytes_received": w.bytes_received,
                "sent_keys": list(w.sent_keys)}

    def shutdown(self) -> None:
        self.stop.set()

    def close(self) -> None:
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
          ready: threading.Event | None = None, announce: bool = False) -> None:
    """Answer control requests at `listen` until `shutdown`."""
    service = WorkerService(context)
    with RpcServer(listen, context, copy_results=True) as server:
        if ready is not None:
            ready.set()
        if announce:
            print(f"graphflow worker listening on {server.address}", file=sys.stderr,
                  flush=True)
        try:
            server.serve_forever(service.handlers(), service.stop)
        finally:
            service.close()
