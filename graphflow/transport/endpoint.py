"""The data plane: one `Endpoint` per worker moves tensors to and from its peers over ZeroMQ.

Each endpoint binds one PULL socket (its inbox) and opens one PUSH socket per peer it sends to.
Large arrays go out zero-copy, or to a peer on this machine (ipc) through shared memory, the
message carrying only their header; every receive has a timeout; a peer that does not answer
is a `PeerTimeout` naming the peer and the key, never a hang.

    >>> with Endpoint("w0", "inproc://doc-w0") as w0, Endpoint("w1", "inproc://doc-w1") as w1:
    ...     w0.connect("w1", w1.address)
    ...     _ = w0.send("w1", "fc->w1@mb0", np.arange(4.0), step=0)
    ...     w1.recv("fc->w1@mb0", expect_from="w0", timeout=5.0)
    array([0., 1., 2., 3.])

Threads: zmq sockets are not thread-safe. `connect` and `send` belong to one sending thread
(or any thread before that one starts); `recv_any` and `recv` to one receiving thread; `close`
runs after both have stopped. The two threads never touch the same socket. `interrupt`, from
any other thread, ends the receiving thread's wait in `recv_any` (so it can stop without
waking up every so often to look: idle workers' wake-ups slowed the busy ones beside them).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict, deque
from typing import Any

import numpy as np
import zmq

from graphflow.transport.curve import CurveConfig, allow_clients, disallow_clients
from graphflow.transport.frames import (
    MAX_FRAME_BYTES,
    FrameError,
    TransportError,
    decode_tensor,
    short_key,
    tensor_header,
    wire_array,
)
from graphflow.transport.ring import RING_MIN_BYTES, RingViews, SendRing
from graphflow.transport.shared import available as shared_memory_available

ZERO_COPY_MIN = 64 * 1024      # bytes: smaller arrays are copied (cheaper than tracking)
HEARTBEAT_MS = (1000, 3000, 6000)  # ZMTP heartbeat interval, timeout, remote TTL
MAX_STASH = 4096               # tensors received but not yet asked for
# An ipc send queue holds IPC_SEND_QUEUE x hwm messages: large arrays wait in it as references
# to the sender's own memory, not copies (the inbox's messages are copies; it keeps hwm). Over
# ipc 64 moved 1 MB tensors ~10% faster than 16 in interleaved runs here, over tcp ~10% slower;
# 256 faster than 64 in five of five pairs of runs (by 4-13%: 0.81-1.01 of bare pyzmq against
# 0.74-0.94), where the socket carries the bytes (no ring: transport/ring.py).
IPC_SEND_QUEUE = 16


class PeerTimeout(TransportError):
    """A peer did not deliver (or accept) a message in time. `.peer` and `.key` name it."""

    def __init__(self, message: str, peer: str = "", key: str = "") -> None:
        super().__init__(message)
        self.peer, self.key = peer, key


def tune(sock: zmq.Socket, hwm: int, linger_ms: int) -> zmq.Socket:
    """Common options: small queues, bounded linger, ZMTP heartbeats (dead peers are noticed)."""
    sock.linger = linger_ms
    sock.sndhwm = sock.rcvhwm = hwm
    ivl, timeout, ttl = HEARTBEAT_MS
    sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout)
    sock.setsockopt(zmq.HEARTBEAT_TTL, ttl)
    return sock


def allow_ipv6(sock: zmq.Socket, address: str) -> None:
    """Turn IPv6 on for an IPv6 address (tcp://[::1]:PORT: libzmq refuses it otherwise). Only
    then: an IPv4 socket with it on names itself tcp://[::ffff:127.0.0.1]:PORT."""
    if address.startswith("tcp://") and ":" in address[6:].rpartition(":")[0]:
        sock.ipv6 = 1


class Endpoint:
    """One worker's tensor inbox (bound PULL) and outboxes (a PUSH per peer).

    `bind` is "inproc://NAME", "ipc:///PATH", "tcp://HOST:PORT" or "tcp://HOST:*"; `.address`
    is what peers connect to (the real port). `timeout` (s) bounds every send and is the
    default receive timeout. `hwm` is the queue length in messages of the inbox and of each
    send socket (of an ipc send socket, IPC_SEND_QUEUE times as many). Tensors of at least
    64 KiB to a peer over ipc go through a shared-memory ring (transport/ring.py) unless
    `rings` is False.

        >>> ep = Endpoint("w0", "tcp://127.0.0.1:*")
        >>> ep.address.startswith("tcp://127.0.0.1:")
        True
        >>> ep.close()
    """

    def __init__(self, name: str, bind: str, context: zmq.Context | None = None,
                 timeout: float = 30.0, *, curve: CurveConfig | None = None, hwm: int = 16,
                 max_msg_size: int = MAX_FRAME_BYTES, linger: float = 1.0,
                 rings: bool = True) -> None:
        self.name, self.timeout, self.curve = name, timeout, curve
        self._ctx = context if context is not None else zmq.Context.instance()
        self._hwm, self._linger_ms = hwm, int(linger * 1000)
        self._push: dict[str, zmq.Socket] = {}
        # peers on this machine (ipc): large tensors go to them through a shared-memory ring
        self._local: set[str] = set()
        self._use_rings = rings
        self._rings: dict[str, SendRing] = {}
        self._views = RingViews() if bind.startswith("ipc://") else None
        self._stash: defaultdict[str, deque[tuple[dict[str, Any], np.ndarray]]] = \
            defaultdict(deque)
        self._stashed = 0
        self._domain = ""
        # a pair of inproc sockets: `interrupt` sends on one, a waiting receiver polls the other
        wake = f"inproc://graphflow-wake-{uuid.uuid4().hex}"
        self._wake_rx, self._wake_tx = self._ctx.socket(zmq.PAIR), self._ctx.socket(zmq.PAIR)
        self._wake_rx.linger = self._wake_tx.linger = 0
        self._wake_rx.bind(wake)
        self._wake_tx.connect(wake)
        self._wake_lock = threading.Lock()
        self._pull = tune(self._ctx.socket(zmq.PULL), hwm, self._linger_ms)
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self._poller.register(self._wake_rx, zmq.POLLIN)
        self._pull.maxmsgsize = max_msg_size
        try:
            if curve is not None:
                self._serve_curve(curve)
            allow_ipv6(self._pull, bind)
            self._pull.bind(bind)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"{name}: cannot bind {bind!r}: {e}") from e
        self.address: str = self._pull.getsockopt_string(zmq.LAST_ENDPOINT)

    def _serve_curve(self, curve: CurveConfig) -> None:
        self._domain = f"graphflow/{self.name}/{id(self)}"
        allow_clients(self._ctx, self._domain, curve.allowed_clients)
        self._pull.curve_secretkey = curve.secret_key
        self._pull.curve_publickey = curve.public_key
        self._pull.curve_server = True
        self._pull.zap_domain = self._domain.encode()

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, {getattr(self, 'address', '?')!r})"

    def connect(self, peer: str, address: str, server_public: bytes | None = None) -> None:
        """Open the PUSH socket to `peer` at `address` (its Endpoint's `.address`).

        With `server_public` (the peer's CURVE public key) the connection is encrypted and
        authenticated with this endpoint's own CurveConfig keypair.
        """
        if peer in self._push:
            raise TransportError(f"{self.name}: peer {peer!r} is already connected")
        hwm = self._hwm * (IPC_SEND_QUEUE if address.startswith("ipc://") else 1)
        sock = tune(self._ctx.socket(zmq.PUSH), hwm, self._linger_ms)
        sock.sndtimeo = max(0, int(self.timeout * 1000))
        sock.immediate = 1  # queue only on live connections: a missing peer blocks the send
        if server_public is not None:
            if self.curve is None:
                sock.close(0)
                raise TransportError(f"{self.name}: connect({peer!r}, server_public=...) needs "
                                     "Endpoint(..., curve=CurveConfig(...))")
            sock.curve_secretkey = self.curve.secret_key
            sock.curve_publickey = self.curve.public_key
            sock.curve_serverkey = server_public
        try:
            allow_ipv6(sock, address)
            sock.connect(address)
        except zmq.ZMQError as e:
            sock.close(0)
            raise TransportError(f"{self.name}: cannot connect to {peer} at {address!r}: {e}") \
                from e
        self._push[peer] = sock
        if self._use_rings and address.startswith("ipc://") and shared_memory_available():
            self._local.add(peer)

    @property
    def peers(self) -> list[str]:
        """The peers this endpoint sends to (`connect`ed)."""
        return list(self._push)

    def send(self, peer: str, key: str, array: Any, step: int = 0,
             track: bool = True, wait: bool = True) -> zmq.MessageTracker | None:
        """Send `array` to `peer` under `key`; raises PeerTimeout if not queued within timeout.

        Arrays of at least 64 KiB go out without a copy and a MessageTracker is returned: do not
        modify the array until `tracker.done` (inproc hands the receiver this very memory).
        With `track=False` (for an array nobody writes again) no tracker is made, which saves
        about a third of a zero-copy send's CPU time. Smaller arrays are copied and None is
        returned, and so are arrays to a peer over ipc, copied into a shared-memory slot
        (transport/ring.py) while a slot is free. With `wait=False` a message the peer cannot
        take at once is dropped (returns None), not waited for or reported.
        """
        if not wait:
            try:
                self.offer(peer, key, array, step, track=False)
            except zmq.ZMQError:  # (not connected, say: dropped all the same)
                pass
            return None
        try:
            return self._send(peer, key, array, step, track, 0)
        except zmq.Again:
            raise PeerTimeout(f"{self.name}: could not send tensor {key!r} to {peer} within "
                              f"{self.timeout:g}s (peer not connected, or its queue of "
                              f"{self._push[peer].sndhwm} messages is full)", peer, key) from None

    def offer(self, peer: str, key: str, array: Any, step: int = 0, track: bool = True
              ) -> tuple[bool, zmq.MessageTracker | None]:
        """`send` if `peer`'s queue takes the message at once: (True, what `send` returns);
        (False, None), nothing sent, if it would have to wait."""
        try:
            return True, self._send(peer, key, array, step, track, zmq.NOBLOCK)
        except zmq.Again:
            return False, None

    def _send(self, peer: str, key: str, array: Any, step: int, track: bool,
              flags: int) -> zmq.MessageTracker | None:
        sock = self._push.get(peer)
        if sock is None:
            raise TransportError(f"{self.name}: no peer {peer!r} to send {key!r} to "
                                 f"(connected: {', '.join(self._push) or 'none'})")
        a, dtype = wire_array(array, lambda: f"{self.name}: tensor {short_key(key)}")
        ring = self._ring(peer) if a.nbytes >= RING_MIN_BYTES else None
        ref = ring.put(a) if ring is not None else None
        header = tensor_header(key, self.name, dtype, a.shape, step, ref)
        try:  # (a message's later frames always go once its first has: zmq queues it whole)
            sock.send(header, flags | zmq.SNDMORE)
        except zmq.ZMQError:
            if ring is not None and ref is not None:
                ring.release(ref)
            raise
        if ref is not None:
            sock.send(b"", flags)
            return None
        if a.nbytes >= ZERO_COPY_MIN:
            return sock.send(a, flags, copy=False, track=track)
        sock.send(a, flags, copy=True)
        return None

    def _ring(self, peer: str) -> SendRing | None:
        """The shared-memory ring to `peer`, if it is on this machine and /dev/shm has room."""
        ring = self._rings.get(peer)
        if ring is None and peer in self._local:
            try:
                ring = self._rings[peer] = SendRing()
            except OSError:
                self._local.discard(peer)
        return ring

    def recv_any(self, timeout: float | None = None) -> tuple[dict[str, Any], np.ndarray] | None:
        """The next tensor from any peer as (meta, array); None after `timeout` seconds, or
        at once when another thread calls `interrupt`.

        meta is the header: key, src, dtype, shape, step. The array is read-only (it views the
        received message). Tensors stashed by `recv` come first. A malformed message is
        consumed and raises FrameError; the next call goes on with the next message.
        """
        for key, queue in self._stash.items():
            self._stashed -= 1
            item = queue.popleft()
            if not queue:
                del self._stash[key]
            return item
        return self._recv_wire(self.timeout if timeout is None else timeout)

    def interrupt(self) -> None:
        """End the receiving thread's current (or next) wait in `recv_any`: it returns None."""
        with self._wake_lock:
            if not self._wake_tx.closed:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # wake-ups are pending already

    def _recv_wire(self, timeout: float) -> tuple[dict[str, Any], np.ndarray] | None:
        # Poll first: it returns at once when a message is here, and a receiver mostly waits;
        # trying a non-blocking receive first raised zmq.Again for almost every message (1 MB
        # tensors over ipc: the receiving thread's CPU 4-5 us a message higher, of 23-26).
        ready = self._poller.poll(max(0, int(timeout * 1000)))  # (GIL released)
        if not ready:
            return None
        try:  # messages go before a wake-up: `interrupt` ends a wait, not a stream
            header = self._pull.recv(zmq.NOBLOCK)
        except zmq.Again:  # (or readable, then not: what a poll promises is only likely)
            if any(sock is self._wake_rx for sock, _ in ready):
                while self._wake_rx.poll(0):  # every pending wake-up ends this one wait
                    self._wake_rx.recv()
            return None
        # Frame by frame, not recv_multipart: 3.3 us a message against 5.5 (the header as bytes,
        # one RCVMORE look). A message's frames arrive together, so these never wait.
        frames, more = [header], self._pull.getsockopt(zmq.RCVMORE)
        while more:  # (the rest of a malformed message is consumed too)
            frames.append(self._pull.recv(zmq.NOBLOCK, copy=False))
            more = frames[-1].more
        if len(frames) != 2:
            raise FrameError(f"{self.name}: received a message of {len(frames)} frames, "
                             "expected 2 (header, buffer)")
        return decode_tensor(*frames, self._views.view if self._views is not None else None)

    def recv(self, key: str, expect_from: str, timeout: float | None = None,
             step: int | None = None) -> np.ndarray:
        """Wait for tensor `key` from `expect_from` (and `step`, if given); other tensors that
        arrive meanwhile are stashed for later calls. Raises PeerTimeout after `timeout` s.

        Tensors with the same key come back in arrival order (one peer's order is kept).
        """
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        item = self._take(key, step) if self._stashed else None
        while item is None:
            left = deadline - time.monotonic()
            got = self._recv_wire(left) if left > 0 else None
            if got is None:
                if time.monotonic() >= deadline:
                    raise PeerTimeout(f"{self.name}: no tensor {key!r} from {expect_from} "
                                      f"within {wait:g}s", expect_from, key)
            elif got[0]["key"] == key and (step is None or got[0]["step"] == step):
                item = got
            else:
                self._put(*got)
        meta, array = item
        if meta["src"] != expect_from:
            raise FrameError(f"{self.name}: tensor {key!r} came from {meta['src']!r}, "
                             f"expected {expect_from!r}")
        return array

    def _put(self, meta: dict[str, Any], array: np.ndarray) -> None:
        if self._stashed >= MAX_STASH:
            raise TransportError(f"{self.name}: {self._stashed} tensors received but not asked "
                                 f"for (keys: {', '.join(list(self._stash)[:8])}, ...)")
        self._stash[meta["key"]].append((meta, array))
        self._stashed += 1

    def _take(self, key: str, step: int | None) -> tuple[dict[str, Any], np.ndarray] | None:
        queue = self._stash.get(key)
        if not queue:
            return None
        for i, item in enumerate(queue):
            if step is None or item[0]["step"] == step:
                del queue[i]
                self._stashed -= 1
                if not queue:
                    del self._stash[key]
                return item
        return None

    def close(self) -> None:
        """Close every socket (idempotent). Queued outgoing messages get `linger` to leave."""
        for sock in self._push.values():
            sock.close()
        self._push.clear()
        for ring in self._rings.values():
            ring.close(self._linger_ms / 1000)
        self._rings.clear()
        if not self._pull.closed:
            self._pull.close()
        with self._wake_lock:
            for sock in (self._wake_rx, self._wake_tx):
                sock.close()
        if self._domain:
            disallow_clients(self._ctx, self._domain)
            self._domain = ""

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
