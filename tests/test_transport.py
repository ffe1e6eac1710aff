"""The ZeroMQ transport over inproc, ipc and tcp loopback: round trips, zero-copy, untrusted
frames, silent peers, the stash and CURVE (the RPC control plane: test_rpc.py). Every loop is
bounded."""

import gc
import itertools
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from graphflow.errors import GraphflowError
from graphflow.transport import (
    CurveConfig,
    Endpoint,
    FrameError,
    PeerTimeout,
    decode_message,
    decode_tensor,
    encode_message,
    encode_tensor,
)
from graphflow.transport import curve as curve_module
from graphflow.transport import endpoint as endpoint_module

SLACK = 1.0  # seconds allowed beyond a timeout
_ids = itertools.count()


@pytest.fixture(params=["inproc", "ipc", "tcp"])
def addr(request, tmp_path):
    """addr(name) -> a bind address on this test's transport."""
    def make(name):
        n = next(_ids)
        return {"inproc": f"inproc://test-{name}-{n}", "ipc": f"ipc://{tmp_path}/{name}{n}",
                "tcp": "tcp://127.0.0.1:*"}[request.param]
    return make


@pytest.fixture
def pair(addr):
    """Endpoints a -> b, a connected to b, 5 s timeouts."""
    with Endpoint("a", addr("a"), timeout=5.0) as a, Endpoint("b", addr("b"), timeout=5.0) as b:
        a.connect("b", b.address)
        yield a, b


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "scalar": np.array(3.5, np.float32),
        "empty": np.zeros((0, 5), np.float64),
        "1mb": rng.standard_normal((256, 1024), dtype=np.float32),
        "strided": np.arange(1000, dtype=np.int32).reshape(20, 50)[:, ::3],
        "bigendian": np.arange(6, dtype=">f8").reshape(2, 3),
        "int64": np.array([-(2**40), 7], np.int64),
        "uint8": np.arange(256, dtype=np.uint8),
    }


# ---- round trips over real sockets -------------------------------------------------------------

def test_round_trip_every_transport(pair):
    a, b = pair
    for i, (key, x) in enumerate(_arrays().items()):
        a.send("b", key, x, step=i)
        meta, y = b.recv_any(timeout=5.0)
        assert (meta["key"], meta["src"], meta["step"]) == (key, "a", i)
        assert y.dtype == x.dtype.newbyteorder("=") and y.shape == x.shape
        np.testing.assert_array_equal(y, x)
        assert not y.flags.writeable


def test_real_port_and_socket_options():
    with Endpoint("w", "tcp://127.0.0.1:*", hwm=8, max_msg_size=1 << 20, linger=0.5) as ep:
        assert ep.address.startswith("tcp://127.0.0.1:") and not ep.address.endswith("*")
        pull = ep._pull
        assert (pull.rcvhwm, pull.linger, pull.maxmsgsize) == (8, 500, 1 << 20)
        assert pull.getsockopt(zmq.HEARTBEAT_IVL) > 0 and pull.getsockopt(zmq.HEARTBEAT_TTL) > 0
        ep.connect("tcp", "tcp://127.0.0.1:9")
        ep.connect("ipc", "ipc:///tmp/graphflow-test-no-such-socket")
        # an ipc send queue is longer: it holds references to the sender's arrays, not copies
        longer = 8 * endpoint_module.IPC_SEND_QUEUE
        assert (ep._push["tcp"].sndhwm, ep._push["ipc"].sndhwm) == (8, longer)


def test_large_sends_are_zero_copy_and_tracked():
    with Endpoint("a", "inproc://zc-a") as a, Endpoint("b", "inproc://zc-b") as b:
        a.connect("b", b.address)
        x = np.ones(1 << 18, np.float32)
        tracker = a.send("b", "big", x)
        assert a.send("b", "small", np.ones(4, np.float32)) is None
        y = b.recv("big", "a", timeout=5.0)
        assert y.ctypes.data == x.ctypes.data, "inproc should hand over the sender's memory"
        assert not tracker.done, "the receiver still holds the buffer"
        del y
        gc.collect()
        tracker.wait(5.0)
        assert tracker.done
        # untracked (an array nobody writes again): still zero-copy, no tracker
        assert a.send("b", "big2", x, track=False) is None
        z = b.recv("big2", "a", timeout=5.0)
        assert z.ctypes.data == x.ctypes.data and np.array_equal(z, x)


def test_message_over_max_size_is_dropped():
    with Endpoint("a", "tcp://127.0.0.1:*", timeout=1.0) as a, \
            Endpoint("b", "tcp://127.0.0.1:*", max_msg_size=1024) as b:
        a.connect("b", b.address)
        a.send("b", "big", np.ones(1 << 16, np.float32))
        with pytest.raises(PeerTimeout):
            b.recv("big", "a", timeout=0.5)


# ---- untrusted decoding --------------------------------------------------------------------------

def _header(**fields):
    meta = {"key": "k", "src": "w0", "dtype": "float32", "shape": [2], "step": 0, **fields}
    return msgpack.packb(meta)


@pytest.mark.parametrize("header, payload, message", [
    (b"\x80" + b"\x00" * 5000, b"", "exceeds the 4096-byte cap"),
    (b"\xc1garbage", b"", "bad msgpack"),
    (b"\xdd\xff\xff\xff\xff", b"", "bad msgpack"),            # claims a 4G-element array
    (msgpack.packb([1, 2]), b"", "expected a map"),
    (_header(dtype="O"), b"\0" * 16, "dtype 'O' is not allowed"),
    (_header(dtype="<U4"), b"\0" * 16, "dtype '<U4' is not allowed"),
    (_header(dtype="complex64"), b"\0" * 16, "not allowed"),
    (_header(), b"\0" * 7, "needs 8 bytes, the payload has 7"),
    (_header(shape=[-2]), b"", "negative"),
    (_header(shape=[1] * 9), b"\0" * 4, "at most 8"),
    (_header(shape=[2.0]), b"\0" * 8, "non-integer"),
    (_header(step="1"), b"\0" * 8, "'step' must be int"),
    (_header(step=True), b"\0" * 8, "'step' must be int"),
    (_header(dtype=["float32"]), b"\0" * 8, "dtype \\['float32'\\] is not allowed"),
    (_header(key=None), b"\0" * 8, "'key' must be str"),
    (_header(key="k" * 1025), b"\0" * 8, "bad msgpack"),              # the unpack limits
    (_header(**{f"x{i}": 0 for i in range(12)}), b"\0" * 8, "bad msgpack"),
    (_header(extra=b"bytes"), b"\0" * 8, "bad msgpack"),
])
def test_bad_tensor_frames_raise_frame_error(header, payload, message):
    with pytest.raises(FrameError, match=message) as info:
        decode_tensor(header, payload)
    assert isinstance(info.value, GraphflowError)


def test_decoding_views_an_aligned_buffer_and_copies_a_misaligned_one():
    raw = bytearray(np.array([0, 1.5, -2.0], np.float32).tobytes())
    meta, x = decode_tensor(_header(shape=[2]), memoryview(raw)[4:12])
    assert np.shares_memory(x, np.frombuffer(raw, np.uint8)) and not x.flags.writeable
    assert x.tolist() == [1.5, -2.0] and meta["key"] == "k"
    shifted = bytearray(b"\0" + raw)  # (malloc'd: float32 at odd addresses)
    _, y = decode_tensor(_header(shape=[2]), memoryview(shifted)[5:13])
    assert not np.shares_memory(y, np.frombuffer(shifted, np.uint8))
    assert y.flags.aligned and y.tolist() == [1.5, -2.0]


def test_frame_error_names_key_and_sender():
    with pytest.raises(FrameError, match="tensor 'lc1/relu->w1@mb0' from 'w3'"):
        decode_tensor(_header(key="lc1/relu->w1@mb0", src="w3"), b"\0")


def test_encode_refuses_disallowed_dtypes():
    with pytest.raises(FrameError, match="dtype '\\|O' cannot be sent"):
        encode_tensor("k", "w0", np.array([object()]))


def test_hostile_frames_over_a_socket_raise_then_recv_continues():
    with Endpoint("w", "tcp://127.0.0.1:*") as ep:
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.linger = 0
        raw.connect(ep.address)
        hostile = [[b"one frame"], [b"\xc1", b""], [_header(dtype="O"), b"x" * 8],
                   [_header(shape=[10**12]), b""], [b"a", b"b", b"c"]]
        for frames in hostile:
            raw.send_multipart(frames)
        raw.send_multipart(encode_tensor("good", "peer", np.arange(3.0)))
        errors, deadline = 0, time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                got = ep.recv_any(timeout=1.0)
            except FrameError:
                errors += 1
                continue
            assert got is not None and got[0]["key"] == "good"
            break
        raw.close()
        assert errors == len(hostile)


# ---- control messages ----------------------------------------------------------------------------

def test_message_round_trip_with_nested_arrays():
    arrays = _arrays()
    obj = {"plan": {"workers": ["w0", "w1"], "arrays": list(arrays.values())}, "lr": 0.1,
           "n": np.int64(3), "ok": True, "none": None, "raw": b"\x00\xff"}
    frames = encode_message(obj)
    assert len(frames) == 1 + len(arrays)
    back = decode_message([bytes(f) for f in frames])
    assert back["n"] == 3 and back["raw"] == b"\x00\xff" and back["plan"]["workers"] == ["w0", "w1"]
    for x, y in zip(arrays.values(), back["plan"]["arrays"]):
        assert y.dtype == x.dtype.newbyteorder("=")
        np.testing.assert_array_equal(x, y)


def test_bad_messages_raise_frame_error():
    frames = [bytes(f) for f in encode_message({"w": np.ones(4, np.float32)})]
    with pytest.raises(FrameError, match="1 array frames but the header references 0"):
        decode_message([msgpack.packb({"w": 1}), frames[1]])
    with pytest.raises(FrameError, match="does not match one of the 0 array frames"):
        decode_message(frames[:1])
    with pytest.raises(FrameError, match="needs 16 bytes, the payload has 3"):
        decode_message([frames[0], b"abc"])
    evil = msgpack.packb(msgpack.ExtType(1, msgpack.packb([0, "O", 2])))
    with pytest.raises(FrameError, match="dtype 'O' is not allowed"):
        decode_message([evil, b"\0" * 16])
    with pytest.raises(FrameError, match="unknown msgpack extension"):
        decode_message([msgpack.packb(msgpack.ExtType(9, b"")), b""])
    with pytest.raises(FrameError, match="cannot encode a object"):
        encode_message({"x": object()})


# ---- silent peers and the stash ----------------------------------------------------------------

def test_recv_from_a_silent_peer_times_out_naming_peer_and_key(pair):
    _, b = pair
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout, match="no tensor 'fc->w1@mb0' from w7 within 0.3s") as info:
        b.recv("fc->w1@mb0", expect_from="w7", timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 0.3 + SLACK
    assert (info.value.peer, info.value.key) == ("w7", "fc->w1@mb0")


def test_send_to_a_peer_that_never_binds_times_out(addr):
    ghost = addr("ghost").replace("tcp://127.0.0.1:*", "tcp://127.0.0.1:1")
    with Endpoint("a", addr("a"), timeout=0.3) as a:
        a.connect("ghost", ghost)
        t0 = time.monotonic()
        with pytest.raises(PeerTimeout, match="tensor 'k' to ghost within 0.3s"):
            for _ in range(64):  # bounded: at most the queue length plus one get through
                a.send("ghost", "k", np.zeros(8, np.float32))
        assert time.monotonic() - t0 < 0.3 + SLACK


def test_stash_returns_keys_that_arrived_out_of_order(pair):
    a, b = pair
    a.send("b", "second", np.full(3, 2.0))
    a.send("b", "first", np.full(3, 1.0))
    a.send("b", "second", np.full(3, 4.0), step=1)
    np.testing.assert_array_equal(b.recv("first", "a"), np.full(3, 1.0))
    np.testing.assert_array_equal(b.recv("second", "a", step=1), np.full(3, 4.0))
    t0 = time.monotonic()
    np.testing.assert_array_equal(b.recv("second", "a", timeout=0.0), np.full(3, 2.0))
    assert time.monotonic() - t0 < 0.1
    assert b.recv_any(timeout=0.05) is None


def test_recv_checks_the_sender(pair):
    a, b = pair
    a.send("b", "k", np.ones(2))
    with pytest.raises(FrameError, match="came from 'a', expected 'w9'"):
        b.recv("k", "w9")


def test_send_needs_a_connected_peer():
    with Endpoint("a", "inproc://lonely") as a:
        with pytest.raises(GraphflowError, match="no peer 'w1'"):
            a.send("w1", "k", np.ones(2))
        with pytest.raises(GraphflowError, match="a: cannot bind 'inproc://lonely'"):
            Endpoint("a", "inproc://lonely")
    a.close()  # idempotent


def test_a_sender_and_a_receiver_thread_per_endpoint(pair):
    """The runtime's pattern: on each worker one thread sends while another receives."""
    a, b = pair
    b.connect("a", a.address)
    n, got, errors = 50, {"a": [], "b": []}, []

    def sender(ep, peer):
        try:
            for i in range(n):
                ep.send(peer, f"{ep.name}->{peer}", np.full(20000, i, np.float32), step=i)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def receiver(ep, peer):
        try:
            for i in range(n):
                got[ep.name].append(ep.recv(f"{peer}->{ep.name}", peer, timeout=5.0, step=i)[0])
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=f, args=args, daemon=True) for f, args in
               [(sender, (a, "b")), (sender, (b, "a")), (receiver, (a, "b")), (receiver, (b, "a"))]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20.0)
    assert not errors and not any(t.is_alive() for t in threads)
    assert got == {"a": list(range(n)), "b": list(range(n))}


# ---- CURVE ---------------------------------------------------------------------------------------

def test_curve_allows_listed_clients_and_refuses_others():
    server_keys, good, bad = (CurveConfig.generate() for _ in range(3))
    curve = CurveConfig(server_keys.secret_key, server_keys.public_key, [good.public_key])
    with Endpoint("srv", "tcp://127.0.0.1:*", curve=curve, timeout=2.0) as srv, \
            Endpoint("good", "tcp://127.0.0.1:*", curve=good, timeout=2.0) as g, \
            Endpoint("bad", "tcp://127.0.0.1:*", curve=bad, timeout=0.5) as b, \
            Endpoint("plain", "tcp://127.0.0.1:*", timeout=0.5) as p:
        g.connect("srv", srv.address, server_public=server_keys.public_key)
        b.connect("srv", srv.address, server_public=server_keys.public_key)
        p.connect("srv", srv.address)
        g.send("srv", "k", np.arange(4.0))
        np.testing.assert_array_equal(srv.recv("k", "good"), np.arange(4.0))
        for ep in (b, p):
            try:
                ep.send("srv", "intruder", np.ones(2))
            except PeerTimeout:
                pass  # refused at the handshake: nothing is queued
        with pytest.raises(PeerTimeout):
            srv.recv("intruder", "bad", timeout=0.5)
    assert not curve_module._AUTH, "the authenticator stops with the last CURVE endpoint"


def test_tensors_already_here_come_before_a_pending_wake_up():
    with Endpoint("w0", "inproc://first-w0") as w0, Endpoint("w1", "inproc://first-w1") as w1:
        w0.connect("w1", w1.address)
        w0.send("w1", "a", np.arange(2.0))
        w0.send("w1", "b", np.arange(3.0))
        w1.interrupt()  # ends a wait, not a stream: both tensors first, then the wait ends
        assert [w1.recv_any(5.0)[0]["key"] for _ in range(2)] == ["a", "b"]
        t0 = time.monotonic()
        assert w1.recv_any(5.0) is None and time.monotonic() - t0 < 2.5


def test_interrupt_ends_a_receivers_wait_and_later_tensors_still_come():
    with Endpoint("w0", "inproc://interrupt-w0") as w0, \
            Endpoint("w1", "inproc://interrupt-w1") as w1:
        w0.connect("w1", w1.address)
        got = []
        waiter = threading.Thread(target=lambda: got.append(w1.recv_any(30.0)))
        t0 = time.monotonic()
        waiter.start()
        time.sleep(0.2)
        w1.interrupt()
        waiter.join(5.0)
        assert not waiter.is_alive() and got == [None] and time.monotonic() - t0 < 5.0
        w1.interrupt()  # wake-ups pile up without blocking the caller, and end one wait
        w1.interrupt()
        assert w1.recv_any(5.0) is None
        w0.send("w1", "act", np.arange(3.0), step=2)
        meta, x = w1.recv_any(5.0)
        assert meta["key"] == "act" and x.tolist() == [0.0, 1.0, 2.0]
