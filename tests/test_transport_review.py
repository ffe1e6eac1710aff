"""Defects a user review found in the transport: each test failed before its fix."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from graphflow.runtime.calls import WorkerCalls, WorkerFailed
from graphflow.runtime.clusterfile import workers_problem
from graphflow.runtime.mailbox import Mailbox, StepFailed
from graphflow.transport import Endpoint, RpcClient, RpcServer, frames
from graphflow.transport.frames import (
    FrameError,
    decode_tensor,
    encode_message,
    encode_tensor,
)

# a read-only view that reports 1.2 GB without holding it (stride 0)
HUGE = np.broadcast_to(np.float32(0), (300_000_000,))


def test_huge_tensor_refused_by_sender_naming_key_size_and_limit():
    assert HUGE.nbytes > frames.MAX_FRAME_BYTES
    with pytest.raises(FrameError) as e:
        encode_tensor("fc1/relu->w1@mb0", "w0", HUGE)
    msg = str(e.value)
    assert "fc1/relu->w1@mb0" in msg and str(HUGE.nbytes) in msg
    assert str(frames.MAX_FRAME_BYTES) in msg


def test_huge_tensor_refused_by_endpoint_send_at_once():
    with Endpoint("w0", "inproc://review-big-w0", timeout=5.0) as w0, \
            Endpoint("w1", "inproc://review-big-w1", timeout=5.0) as w1:
        w0.connect("w1", w1.address)
        with pytest.raises(FrameError, match=r"'big->w1'.*1200000000 bytes.*limit"):
            w0.send("w1", "big->w1", HUGE)


def test_huge_feed_refused_naming_its_key():
    with pytest.raises(FrameError) as e:
        encode_message({"method": "run_step", "args": {"feeds": {"images": HUGE}}})
    msg = str(e.value)
    assert "'images'" in msg and str(HUGE.nbytes) in msg and str(frames.MAX_FRAME_BYTES) in msg


def test_frame_limit_is_the_module_constant(monkeypatch):
    monkeypatch.setattr(frames, "MAX_FRAME_BYTES", 1024)
    encode_tensor("small", "w0", np.zeros(256, np.float32))  # exactly the limit: sent
    with pytest.raises(FrameError, match=r"'big'.*1028 bytes.*1024-byte limit"):
        encode_tensor("big", "w0", np.zeros(257, np.float32))


def test_worker_step_fails_at_once_on_a_refused_tensor():
    with Endpoint("w1", "inproc://review-mb-w1", timeout=5.0) as w1:
        ep = Endpoint("worker:0", "inproc://review-mb-w0", timeout=5.0)
        ep.connect("w1", w1.address)
        mail = Mailbox("worker:0", ep, timeout=5.0)
        try:
            mail.post("w1", "big->w1", HUGE, 0, False)
            t0 = time.monotonic()
            with pytest.raises(StepFailed, match="big->w1"):
                mail.take(0, {"x": None}, True, time.monotonic() + 5.0)
            assert time.monotonic() - t0 < 1.0  # not the whole timeout
        finally:
            mail.close()


def test_longest_key_the_receiver_takes_goes_through():
    key = "n" * frames.TENSOR_STR_MAX
    meta, x = decode_tensor(*encode_tensor(key, "worker:0", np.ones(3, np.float32)))
    assert meta["key"] == key and x.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("length", [1025, 2000, 4000, 5000])
def test_key_the_receiver_would_drop_is_refused_by_sender(length):
    with pytest.raises(FrameError) as e:
        encode_tensor("n" * length, "worker:0", np.ones(2, np.float32))
    msg = str(e.value)
    assert f"{length} characters" in msg and "1024-byte limit" in msg and len(msg) < 400


def test_long_key_refused_by_endpoint_send_at_once():
    key = "n" * 2000 + "->worker:1@mb0"
    with Endpoint("w0", "inproc://review-key-w0", timeout=5.0) as w0, \
            Endpoint("w1", "inproc://review-key-w1", timeout=5.0) as w1:
        w0.connect("w1", w1.address)
        with pytest.raises(FrameError, match="1024-byte limit"):
            w0.send("w1", key, np.arange(3.0))


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_ipv6_loopback_rpc_and_endpoint():
    with RpcServer("tcp://[::1]:*") as server, \
            RpcClient(server.address, "w0", timeout=5.0) as client:
        assert server.address.startswith("tcp://[::1]:")
        rid = client.send("add", a=2, b=3)
        assert server.handle_one({"add": lambda a, b: a + b}, 5.0)
        assert client.receive(rid, "add") == 5
    with Endpoint("w0", "tcp://[::1]:*", timeout=5.0) as w0, \
            Endpoint("w1", "tcp://[::1]:*", timeout=5.0) as w1:
        w0.connect("w1", w1.address)
        w0.send("w1", "k", np.arange(3.0))
        assert w1.recv("k", expect_from="w0", timeout=5.0).tolist() == [0.0, 1.0, 2.0]


def test_refused_call_names_the_remote_workers_address():
    def attach(driver):
        raise RuntimeError(f"already attached to another driver, not {driver}")

    with RpcServer("tcp://127.0.0.1:*") as server, \
            RpcClient(server.address, "worker:0", timeout=5.0) as client:
        calls = WorkerCalls([client], ["worker:0"])
        rid = calls.send(0, "attach", {"driver": "me"})
        assert server.handle_one({"attach": attach}, 5.0)
        with pytest.raises(WorkerFailed) as e:
            calls.gather("attach", {0: rid})
    assert f"worker:0 at {server.address} failed 'attach'" in str(e.value)


@pytest.mark.parametrize("second", ["tcp://localhost:5741", "tcp://127.0.0.1:05741",
                                    "tcp://LOCALHOST:5741"])
def test_same_worker_spelled_twice_is_caught_naming_both(second):
    if not {a[4][0] for a in socket.getaddrinfo("localhost", 1)} & {"127.0.0.1"} \
            and "localhost" in second.lower():
        pytest.skip("localhost does not resolve to 127.0.0.1 here")
    bad = workers_problem(["tcp://127.0.0.1:5741", second])
    assert bad is not None
    entry, problem = bad
    assert second in entry and "workers[0] = 'tcp://127.0.0.1:5741'" in problem


def test_different_workers_pass():
    assert workers_problem(["tcp://127.0.0.1:5741", "tcp://127.0.0.1:5742",
                            "tcp://[::1]:5741", "tcp://no-such-host.invalid:5741"]) is None
