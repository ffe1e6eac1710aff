"""The control plane (transport/rpc.py): calls, requests sent ahead, handler errors, hostile
frames, late replies and a SIGKILLed server. Every loop is bounded."""

import select
import signal
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from graphflow.transport import PeerTimeout, RemoteError, RpcClient, RpcServer, decode_message

SLACK = 1.0  # seconds allowed beyond a timeout

HANDLERS = {
    "add": lambda a, b: a + b,
    "scale": lambda x, by: x * by,
    "fail": lambda: 1 / 0,
    "echo": lambda value, delay=0.0: (time.sleep(delay), value)[1],
}


@pytest.fixture
def server():
    stop = threading.Event()
    with RpcServer("tcp://127.0.0.1:*") as srv:
        t = threading.Thread(target=srv.serve_forever, args=(HANDLERS, stop), daemon=True)
        t.start()
        yield srv
        stop.set()
        t.join(5.0)


def test_rpc_call_returns_results(server):
    with RpcClient(server.address, "w0", timeout=5.0) as c:
        assert c.call("add", a=2, b=3) == 5
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(c.call("scale", x=x, by=2), x * 2)


def test_rpc_remote_exception_is_remote_error(server):
    with RpcClient(server.address, "w0", timeout=5.0) as c:
        with pytest.raises(RemoteError, match="w0: 'fail' failed: ZeroDivisionError: division"):
            c.call("fail")
        with pytest.raises(RemoteError, match="LookupError: no method 'nope'"):
            c.call("nope")
        assert c.call("add", a=1, b=1) == 2, "the server survives handler errors"


def test_rpc_server_survives_hostile_requests(server):
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger, raw.rcvtimeo = 0, 5000
    raw.connect(server.address)
    for frames in ([b"\xc1"], [msgpack.packb([1, 2])], [msgpack.packb({"method": 3})]):
        raw.send_multipart(frames)
        reply = decode_message(raw.recv_multipart())
        assert reply["ok"] is False and "FrameError" in reply["error"]
    # a header that reads but holds a bad array: the error goes back under the request's id
    raw.send_multipart([msgpack.packb({"id": 9, "method": "add",
                                       "args": {"a": msgpack.ExtType(7, b"")}})])
    reply = decode_message(raw.recv_multipart())
    assert reply["id"] == 9 and "unknown msgpack extension type 7" in reply["error"]
    raw.close()
    with RpcClient(server.address, "w0", timeout=5.0) as c:
        assert c.call("add", a=1, b=2) == 3


def test_rpc_requests_sent_ahead_are_answered_in_order(server):
    with RpcClient(server.address, "w0", timeout=5.0) as c:
        ids = [c.send("echo", value=i, delay=0.05) for i in range(3)]
        assert [c.receive(rid, "echo") for rid in ids] == [0, 1, 2]
        first, second = c.send("echo", value="kept"), c.send("add", a=1, b=2)
        assert c.receive(second, "add") == 3
        assert c.has_reply(first), "the reply to a pending request that came first is kept"
        assert c.receive(first, "echo", timeout=0) == "kept"
        assert not c.has_reply(first)
        given_up = c.send("echo", value="dropped")
        c.forget(given_up)
        assert c.call("add", a=2, b=2) == 4
        assert not c.has_reply(given_up), "a reply to a request given up on is not kept"


def test_rpc_late_reply_is_discarded(server):
    with RpcClient(server.address, "w0", timeout=0.2) as c:
        with pytest.raises(PeerTimeout, match="no reply from w0 to 'echo' within 0.2s"):
            c.call("echo", value="stale", delay=0.6)
        assert c.call("echo", value="fresh", timeout=5.0) == "fresh"
        assert not c._kept, "the timed-out call's reply came and was dropped, not kept"


SERVER = """
from graphflow.transport import RpcServer
server = RpcServer("tcp://127.0.0.1:*")
print(server.address, flush=True)
server.serve_forever({"ping": lambda: "pong"})
"""


def test_rpc_killed_server_raises_peer_timeout():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([proc.stdout], [], [], 30.0)[0], "server did not start"
        address = proc.stdout.readline().strip()
        with RpcClient(address, "worker-3", timeout=0.5) as c:
            assert c.call("ping", timeout=10.0) == "pong"
            proc.send_signal(signal.SIGKILL)
            proc.wait(5.0)
            t0 = time.monotonic()
            with pytest.raises(PeerTimeout, match="no reply from worker-3 to 'ping'"):
                c.call("ping")
            assert time.monotonic() - t0 < 0.5 + SLACK
    finally:
        proc.kill()
        proc.wait(5.0)


def test_the_driver_takes_replies_as_they_come_and_returns_them_in_worker_order(monkeypatch):
    """worker:0 answers last, yet each worker's reply stays at its index; a worker failing on
    its own is reported at once, not after its peers' timeout."""
    import graphflow as gf
    from graphflow.partitioners import partition
    from graphflow.runtime import Cluster, WorkerFailed
    from graphflow.runtime.service import WorkerService

    greet = WorkerService.hello

    def hello(self):
        if self.worker is None:  # the cluster's own hello, before its workers are loaded
            return greet(self)
        index, fail = self.worker.index, getattr(self, "fail", False)
        if index == 0:
            time.sleep(3.0 if fail else 0.3)
        if fail and index == 1:
            raise RuntimeError("worker:1 broke")
        return {"index": index}

    monkeypatch.setattr(WorkerService, "hello", hello)
    model = gf.models.digits_lc(batch=None)
    with Cluster(partition(model.graph, 3, "layerwise", loss=model.loss), timeout=30) as cluster:
        assert [r["index"] for r in cluster.call_all("hello", {})] == [0, 1, 2]
        monkeypatch.setattr(WorkerService, "fail", True, raising=False)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailed, match="worker:1 broke") as failure:
            cluster.call_all("hello", {})
        assert failure.value.worker == "worker:1" and time.monotonic() - t0 < SLACK
