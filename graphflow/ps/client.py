"""The client side of the parameter server: whole parameters in, slices fanned out to shards.

A PSClient talks only to the shards holding its `names` (a worker's own parameters), splits
values and gradients by the layout, sends each shard its slices (in parallel threads when there
are several shards) and joins what comes back. A call that gets no reply in `timeout` s (a
shard restarting) is retried on a fresh socket for up to `retry_for` s, each retry logged;
retrying a push is safe because shards apply each (replica, step) once.

    client = PSClient(["ipc:///tmp/ps/ps0", "ipc:///tmp/ps/ps1"], layout)
    client.init(initial_values, {"name": "adagrad", "lr": 0.05}, replicas=[0, 1])
    client.push(replica=0, step=0, grads_by_name=grads)
    params = client.fetch()
    client.close()

One instance per thread (its sockets are not thread-safe).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import zmq

from graphflow.errors import GraphflowError
from graphflow.ps.layout import Layout
from graphflow.transport.endpoint import PeerTimeout
from graphflow.transport.rpc import RpcClient

log = logging.getLogger("graphflow.ps")


class PSError(GraphflowError):
    """A shard did not answer in time (after retries) or could not serve a request."""


class PSClient:
    """Fans fetch / push / vector operations out to the shards of `layout` (see the module
    docstring). `addresses[s]` is shard s's address; the vector operations run on every slice
    of the connected shards, so a Sandblaster coordinator uses a client for all names."""

    def __init__(self, addresses: list[str], layout: Layout, timeout: float = 10.0,
                 retry_for: float = 30.0, names: Collection[str] | None = None,
                 context: zmq.Context | None = None, parallel: bool = True) -> None:
        if len(addresses) != layout.shards:
            raise ValueError(f"{len(addresses)} shard addresses for a layout of "
                             f"{layout.shards} shards")
        self.addresses, self.layout = list(addresses), layout
        self.timeout, self.retry_for = timeout, retry_for
        self.names = list(layout.shapes) if names is None else list(names)
        self.shards = layout.shards_of(self.names)
        self.keys = {s: layout.keys_on(s, self.names) for s in self.shards}
        self.retries = 0
        self._uid, self._ops = uuid.uuid4().hex[:12], 0
        self.versions: dict[str, int] = {}  # of the slices last fetched
        self.boots: dict[int, str] = {}  # shard -> the process that answered the last fetch
        self._ctx = context
        self._rpc = {s: self._connect(s) for s in self.shards}
        self._pool = ThreadPoolExecutor(len(self.shards), thread_name_prefix="psclient") \
            if parallel and len(self.shards) > 1 else None

    def _op_id(self) -> str:
        """A fresh id for a write that must not be done twice when its call is retried."""
        self._ops += 1
        return f"{self._uid}-{self._ops}"

    def peer(self, s: int) -> str:
        """How errors name shard `s`."""
        return f"ps:{s} at {self.addresses[s]}"

    def _connect(self, s: int) -> RpcClient:
        return RpcClient(self.addresses[s], self.peer(s), self.timeout, self._ctx)

    def _call(self, s: int, method: str, **args: Any) -> Any:
        """One shard's `method`, retried on timeouts for up to `retry_for` s."""
        start, attempt = time.monotonic(), 0
        while True:
            try:
                return self._rpc[s].call(method, **args)
            except PeerTimeout as e:
                waited = time.monotonic() - start
                if waited >= self.retry_for:
                    raise PSError(f"{self.peer(s)}: no reply to {method!r} within "
                                  f"{self.timeout:g}s, retried for {waited:.1f}s") from e
                attempt += 1
                self.retries += 1
                log.warning("%s: no reply to %r within %gs; retrying (attempt %d, %.1fs of "
                            "%gs)", self.peer(s), method, self.timeout, attempt, waited,
                            self.retry_for)
                self._rpc[s].close()
                self._rpc[s] = self._connect(s)

    def _fan(self, method: str, args: Mapping[int, Mapping[str, Any]]) -> dict[int, Any]:
        """{shard: result} of `method(**args[shard])` on each listed shard, all at once."""
        if self._pool is None or len(args) < 2:
            return {s: self._call(s, method, **a) for s, a in args.items()}
        futures = {s: self._pool.submit(self._call, s, method, **a) for s, a in args.items()}
        wait(futures.values())  # every socket is idle again before anything is raised
        return {s: f.result() for s, f in futures.items()}

    def _all(self, method: str, **args: Any) -> dict[int, Any]:
        return self._fan(method, {s: args for s in self.shards})

    # -- parameters ------------------------------------------------------------------------------
    def init(self, values_by_name: Mapping[str, np.ndarray], optimizer_spec: Mapping[str, Any],
             replicas: Collection[int], staleness: int | None = None,
             bsp_deadline: float = 30.0, run: str | None = None) -> dict[str, Any]:
        """Give the shards their slices (a restored shard keeps its own, and refuses other
        slices than it holds: RemoteError), the optimizer and the replicas; `run` names the
        driver's run (see Shard.init). {"restored": any shard restored, "versions": {key:
        version}, "resumed": {shard: {"path", "dir", "updates"[, "optimizer"]}} of the shards
        restored from a checkpoint}."""
        split = self.layout.split(values_by_name)
        common = {"optimizer": dict(optimizer_spec), "replicas": list(replicas),
                  "staleness": staleness, "bsp_deadline": bsp_deadline,
                  **({"run": run} if run is not None else {})}
        out = self._fan("init", {s: {"values": split.get(s, {}), **common}
                                 for s in self.shards})
        return {"restored": any(r["restored"] for r in out.values()),
                "versions": {k: v for r in out.values() for k, v in r["versions"].items()},
                "resumed": {s: r["resumed"] for s, r in sorted(out.items()) if "resumed" in r}}

    def fetch(self, min_version: int = 0, wait: float | None = None) -> dict[str, np.ndarray]:
        """{name: array} of this client's parameters, once every slice's version is at least
        `min_version` (polled with short sleeps for up to `wait` s, default `timeout`)."""
        limit = self.timeout if wait is None else wait
        deadline = time.monotonic() + limit
        todo, got, pause = list(self.shards), {}, 0.001
        while True:
            out = self._fan("fetch", {s: {"keys": self.keys[s], "min_version": min_version}
                                      for s in todo})
            self.boots.update({s: r["boot"] for s, r in out.items() if "boot" in r})
            got.update({s: r for s, r in out.items() if not r.get("wait")})
            todo = [s for s in todo if s not in got]
            if not todo:
                break
            if time.monotonic() >= deadline:
                raise PSError(f"{', '.join(map(self.peer, todo))}: slices still older than "
                              f"version {min_version} after {limit:g}s")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        self.versions = {k: v for r in got.values() for k, v in r["versions"].items()}
        return self.layout.join({k: v for r in got.values() for k, v in r["values"].items()})

    def push(self, replica: int, step: int, grads_by_name: Mapping[str, np.ndarray],
             mode: str = "async", codec: Any = None, version: int = 0) -> dict[str, Any]:
        """Send each shard its slices of the gradients of `replica`'s step `step`.
        {"applied": any slice applied now, "duplicate": every shard saw it before, "dropped":
        the shards that ignored it (bsp: they dropped the replica)}.
        `codec` (a graphflow.replicas.compress codec) encodes each slice for the wire; its
        state (top-k residuals) is kept per slice key."""
        split = self.layout.split(grads_by_name)
        if codec is not None and codec.kind != "none":
            split = {s: {k: codec.encode(k, g) for k, g in d.items()} for s, d in split.items()}
        elif codec is not None:  # raw arrays are the uncompressed payload, without a copy
            n = sum(g.nbytes for d in split.values() for g in d.values())
            codec.bytes_raw += n
            codec.bytes_sent += n
        extra = {"version": version} if version else {}  # (bsp: see Shard.push)
        out = self._fan("push", {s: {"replica": replica, "step": step, "grads": d,
                                     "mode": mode, **extra} for s, d in split.items()})
        return {"applied": any(r["applied"] for r in out.values()),
                "duplicate": bool(out) and all(r["duplicate"] for r in out.values()),
                "dropped": sorted(s for s, r in out.items() if r.get("dropped"))}

    # -- replicas and clocks -------------------------------------------------------------------
    def clock_ok(self, replica: int, clock: int, staleness: int) -> bool:
        """SSP gate: True iff every connected shard says `clock` is within `staleness`."""
        return all(self._all("clock_ok", replica=replica, clock=clock,
                             staleness=staleness).values())

    def drop(self, replica: int, reason: str) -> None:
        """Remove `replica` from every connected shard's live set."""
        self._all("drop", replica=replica, reason=reason)

    def clocks(self) -> dict[int, dict[str, Any]]:
        """{shard: its clocks(): clocks, live set, clock_ok log}."""
        return self._all("clocks")

    # -- Sandblaster vector operations ---------------------------------------------------------
    def vec_dot(self, a: str, b: str) -> float:
        """a . b over every connected shard's slices (the partial sums added)."""
        return float(sum(self._all("vec_dot", a=a, b=b).values()))

    def vec_axpy(self, alpha: float, x: str, y: str) -> None:
        """y += alpha * x on every connected shard."""
        self._all("vec_axpy", alpha=float(alpha), x=x, y=y, op=self._op_id())

    def vec_scale(self, alpha: float, x: str) -> None:
        """x *= alpha on every connected shard."""
        self._all("vec_scale", alpha=float(alpha), x=x, op=self._op_id())

    def vec_copy(self, src: str, dst: str) -> None:
        """dst = src on every connected shard."""
        self._all("vec_copy", src=src, dst=dst)

    def vec_zero(self, name: str) -> None:
        """name = 0 (and its accepted tasks forgotten) on every connected shard."""
        self._all("vec_zero", name=name)

    def vec_drop(self, name: str) -> None:
        """Forget vector `name` on every connected shard."""
        self._all("vec_drop", name=name)

    def accumulate(self, name: str, task: str, grads_by_name: Mapping[str, np.ndarray],
                   weight: float = 1.0) -> dict[str, Any]:
        """name += weight * grads on the shards holding them, unless `task` was accepted
        there before. {"accepted": any shard accepted it, "shards": {shard: accepted}}."""
        split = self.layout.split(grads_by_name)
        out = self._fan("accumulate", {s: {"name": name, "task": task, "grads": d,
                                           "weight": float(weight)} for s, d in split.items()})
        shards = {s: bool(r["accepted"]) for s, r in out.items()}
        return {"accepted": any(shards.values()), "shards": shards}

    # -- administration ------------------------------------------------------------------------
    def checkpoint(self) -> dict[int, str]:
        """Every connected shard writes a checkpoint now: {shard: path}."""
        return self._all("checkpoint")

    def stats(self) -> dict[int, dict[str, Any]]:
        """{shard: its stats()}."""
        return self._all("stats")

    def shutdown(self) -> None:
        """Stop every connected shard (no retries: a stopped shard does not answer)."""
        for s in self.shards:
            try:
                self._rpc[s].call("shutdown")
            except PeerTimeout:
                log.warning("%s: no reply to 'shutdown'", self.peer(s))

    def close(self) -> None:
        """Close the sockets and the fan-out threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for c in self._rpc.values():
            c.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
