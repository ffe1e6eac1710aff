"""The control plane: request/reply between the driver and each worker (ROUTER / DEALER).

A request is {"id": n, "method": str, "args": {...}} and a reply {"id": n, "ok": True,
"result": ...} or {"id": n, "ok": False, "error": "TypeName: message"}, both encoded with
`encode_message` (arrays travel as their own frames). A handler's exception becomes an error
reply, never a dead server; a client discards replies to requests it has given up on.

    >>> server = RpcServer("inproc://doc-rpc")
    >>> t = threading.Thread(target=server.handle_one, args=({"add": lambda a, b: a + b}, 5.0))
    >>> t.start()
    >>> client = RpcClient(server.address, "w0", timeout=5.0)
    >>> client.call("add", a=2, b=3)
    5
    >>> t.join(); client.close(); server.close()
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from graphflow.transport.endpoint import PeerTimeout, allow_ipv6, tune
from graphflow.transport.frames import (
    MAX_FRAME_BYTES,
    FrameError,
    TransportError,
    decode_message,
    encode_message,
    message_id,
)
from graphflow.transport.shared import attach

Handlers = Mapping[str, Callable[..., Any]]


class RemoteError(TransportError):
    """A handler on the peer raised: `.peer` names it, `.remote` is "TypeName: message"."""

    def __init__(self, message: str, peer: str = "", remote: str = "") -> None:
        super().__init__(message)
        self.peer, self.remote = peer, remote


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class RpcServer:
    """A ROUTER socket answering requests with `handlers` (method name -> callable(**args)).

    Arrays in results are copied into the reply (a handler may go on updating them); with
    `copy_results=False` they go out zero-copy, so handlers must not modify what they return.
    Argument arrays are read-only views of the request (over inproc, the caller's memory;
    over ipc, maybe a shared-memory buffer the caller fills again later: transport/shared.py):
    a handler that keeps one should keep a copy.

        >>> with RpcServer("tcp://127.0.0.1:*") as s:
        ...     s.handle_one({}, timeout=0.01)
        False
    """

    def __init__(self, bind: str, context: zmq.Context | None = None, *, hwm: int = 64,
                 max_msg_size: int = MAX_FRAME_BYTES, linger: float = 1.0,
                 copy_results: bool = True) -> None:
        self._copy = copy_results
        # shared-memory arrays only from this machine: an ipc socket is a file of this user's
        self._attach = attach if bind.startswith("ipc://") else None
        self._ctx = context if context is not None else zmq.Context.instance()
        self._sock = tune(self._ctx.socket(zmq.ROUTER), hwm, int(linger * 1000))
        self._sock.maxmsgsize = max_msg_size
        self._sock.sndtimeo = 0  # ROUTER drops replies to vanished clients; never block on one
        self._sock.router_mandatory = 1  # (and says so: `reaches`)
        allow_ipv6(self._sock, bind)
        try:
            self._sock.bind(bind)
        except zmq.ZMQError as e:
            self._sock.close(0)
            raise TransportError(f"rpc server: cannot bind {bind!r}: {e}") from e
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.caller: bytes | None = None  # the routing id of the request being answered

    def handle_one(self, handlers: Handlers, timeout: float) -> bool:
        """Answer at most one request that arrives within `timeout` s; True if one was."""
        if not self._sock.poll(max(0, int(timeout * 1000))):
            return False
        try:
            identity, *frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.caller = identity.bytes  # (handlers may ask who is calling: runtime/service.py)
        reply = self._dispatch(handlers, frames)
        try:
            out = encode_message(reply)
        except Exception as e:  # noqa: BLE001 - an unencodable result is the caller's error
            out = encode_message({"id": reply.get("id"), "ok": False,
                                  "error": f"result cannot be sent back: {_error(e)}"})
        try:
            self._sock.send_multipart([identity, *out], copy=self._copy)
        except zmq.ZMQError:
            pass  # the client is gone; it will time out on its side
        return True

    def reaches(self, caller: bytes) -> bool:
        """Whether client `caller` (a routing id, as `.caller`) is still connected. It is sent
        a reply to no request, which an RpcClient drops (a dead peer's connection ends with
        it, or within the heartbeat timeout)."""
        try:
            self._sock.send_multipart([caller, *encode_message({"id": None, "ok": True})])
        except zmq.ZMQError as e:
            return e.errno != zmq.EHOSTUNREACH  # (EAGAIN: there, with replies unread)
        return True

    def _dispatch(self, handlers: Handlers, frames: list[Any]) -> dict[str, Any]:
        try:
            request = decode_message(frames, self._attach)
        except FrameError as e:
            return {"id": message_id(frames), "ok": False, "error": _error(e)}
        if not isinstance(request, dict) or not isinstance(request.get("method"), str) \
                or not isinstance(request.get("args", {}), dict):
            return {"id": None, "ok": False, "error": "FrameError: malformed request"}
        rid, method = request.get("id"), request["method"]
        fn = handlers.get(method)
        if fn is None:
            return {"id": rid, "ok": False, "error": f"LookupError: no method {method!r} "
                                                     f"(have: {', '.join(sorted(handlers))})"}
        try:
            return {"id": rid, "ok": True, "result": fn(**request.get("args", {}))}
        except Exception as e:  # noqa: BLE001 - any handler failure goes back to the caller
            return {"id": rid, "ok": False, "error": _error(e)}

    def serve_forever(self, handlers: Handlers, stop: threading.Event | None = None,
                      poll: float = 0.1) -> None:
        """Answer requests until `stop` is set (checked every `poll` s)."""
        while stop is None or not stop.is_set():
            self.handle_one(handlers, poll)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if not self._sock.closed:
            self._sock.close()

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RpcClient:
    """A DEALER socket calling one server, from one thread at a time: `call`, or `send` now
    and `receive` later.

    `peer_name` names the server in errors; `timeout` (s) is the default per call.
    """

    def __init__(self, address: str, peer_name: str, timeout: float,
                 context: zmq.Context | None = None, *, linger: float = 0.0) -> None:
        self.peer, self.address = peer_name, address
        self._ctx = context if context is not None else zmq.Context.instance()
        self._sock = tune(self._ctx.socket(zmq.DEALER), 64, int(linger * 1000))
        # its own routing id, kept across reconnects: a server tells its callers apart by it
        self._sock.routing_id = b"gf" + uuid.uuid4().bytes
        self.timeout = timeout
        self._ids = itertools.count(1)
        # requests sent and not yet answered, and replies that came while the caller waited
        # for another's (as a run's, called while a stream's steps are in flight)
        self._waiting: set[int] = set()
        self._kept: dict[int, dict[str, Any]] = {}
        allow_ipv6(self._sock, address)
        self._sock.connect(address)

    @property
    def timeout(self) -> float:
        """The default wait (s) for a reply, and for the server to take a request."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = seconds
        self._sock.sndtimeo = max(0, int(seconds * 1000))

    def call(self, method: str, timeout: float | None = None, **args: Any) -> Any:
        """Run `method(**args)` on the server and return its result.

        Raises RemoteError if the handler raised, PeerTimeout if no reply came in time.
        Argument arrays go out zero-copy; `method` and `timeout` cannot be argument names.

            result = client.call("run_step", step=3, feeds={"x": batch})
        """
        return self.receive(self.send(method, **args), method, timeout)

    def send(self, method: str, **args: Any) -> int:
        """Send a request without waiting for its reply; its id, for `receive`. The server
        answers its requests in order, so several may be on their way (as `Cluster.stream`
        sends the next step while one runs). PeerTimeout if the server takes no request
        within the client's `timeout`."""
        rid = next(self._ids)
        try:
            self._sock.send_multipart(encode_message({"id": rid, "method": method,
                                                      "args": args}), copy=False)
        except zmq.Again:
            raise PeerTimeout(f"{self.peer} took no request {method!r} within "
                              f"{self.timeout:g}s", self.peer, method) from None
        self._waiting.add(rid)
        return rid

    @property
    def socket(self) -> zmq.Socket:
        """The socket replies come in on, to poll several clients at once (`zmq.Poller`)."""
        return self._sock

    def has_reply(self, rid: int) -> bool:
        """Whether the reply to `rid` came already, while the caller waited for another's
        (so polling the socket for it would wait in vain)."""
        return rid in self._kept

    def receive(self, rid: int, method: str, timeout: float | None = None) -> Any:
        """The result of request `rid` (a `send` of `method`), waiting at most `timeout` s.
        With 0, only a look at what is here: `rid` stays pending. Otherwise a caller that
        times out gives up on `rid`, and its reply is dropped when it comes. Replies to the
        other pending requests that come first are kept for their own `receive`."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while rid not in self._kept:
            left = deadline - time.monotonic()
            if not self._sock.poll(max(0, int(left * 1000))):
                if wait > 0:
                    self.forget(rid)
                raise PeerTimeout(f"no reply from {self.peer} to {method!r} within {wait:g}s",
                                  self.peer, method)
            reply = decode_message(self._sock.recv_multipart(copy=False))
            got = reply.get("id") if isinstance(reply, dict) else None
            if got in self._waiting:  # (else a late reply to a call given up on)
                self._kept[got] = reply
        reply = self._kept.pop(rid)
        self._waiting.discard(rid)
        if reply.get("ok"):
            return reply.get("result")
        remote = str(reply.get("error"))
        raise RemoteError(f"{self.peer}: {method!r} failed: {remote}", self.peer, remote)

    def forget(self, rid: int) -> None:
        """Give up on request `rid`: its reply, kept or still to come, is dropped."""
        self._waiting.discard(rid)
        self._kept.pop(rid, None)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if not self._sock.closed:
            self._sock.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
