"""Served workers (`graphflow worker --listen`, on loopback) and their drivers, as a review
found them: another graphflow's worker is refused before `load`, a `--once` worker whose
driver was killed exits, a driver taken over stays refused after the new one released the
worker, and one worker listed twice in a cluster is named as such."""

import threading
import time
import uuid
from unittest import mock

import pytest

import graphflow as gf
from graphflow.runtime import Cluster, WorkerFailed
from graphflow.runtime.ownership import PROTOCOL, graphflow_version
from graphflow.runtime.service import WorkerService
from graphflow.transport import rpc
from graphflow.transport.rpc import RemoteError, RpcClient, RpcServer
from tests.test_remote_workers import START_TIMEOUT, Served, small_model

GONE = 8.0  # s for a worker to notice a driver's ended connection (heartbeats: 3-6 s)


@pytest.fixture
def worker(tmp_path):
    """worker(*options): one fresh `graphflow worker` process, listening; killed at the end."""
    started: list[Served] = []

    def start(*options: str) -> Served:
        w = Served(tmp_path / f"worker{len(started)}.log", *options)
        started.append(w)
        w.wait_listening(time.monotonic() + START_TIMEOUT)
        return w

    yield start
    for w in started:
        if w.alive():
            w.proc.kill()
        w.proc.wait(10)


def client(address: str, routing: bytes | None = None) -> RpcClient:
    """An RpcClient; with `routing`, under that routing id (a paused driver reconnecting)."""
    if routing is None:
        return RpcClient(address, "worker:0", timeout=5.0)
    with mock.patch.object(rpc.uuid, "uuid4", return_value=uuid.UUID(bytes=routing[2:])):
        return RpcClient(address, "worker:0", timeout=5.0)


def attach_when_free(c: RpcClient, driver: str) -> None:
    """Attach once the worker sees its last driver gone (bounded: GONE s)."""
    deadline = time.monotonic() + GONE
    while True:
        try:
            c.call("attach", driver=driver)
            return
        except RemoteError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("hello, theirs", [
    ({"pid": 1}, "an older graphflow that reports no version"),
    ({"pid": 1, "version": "0.0.1", "protocol": 1}, "graphflow 0.0.1 (protocol 1)")])
def test_a_worker_of_another_graphflow_is_refused_before_load(hello, theirs):
    """An older worker's `load` takes no `loss_join`: the driver refuses it at `hello`,
    naming its address and both versions, instead of a TypeError from `load`."""
    def load(index, graph, grads, data_bind, optimizer=None, peer_timeout=30.0, stages=1):
        return "tcp://127.0.0.1:1"

    handlers = {"hello": lambda: hello, "attach": lambda driver="": hello,
                "release": lambda: True, "load": load}
    stop = threading.Event()
    with RpcServer("tcp://127.0.0.1:*") as server:
        thread = threading.Thread(target=server.serve_forever, args=(handlers, stop, 0.05))
        thread.start()
        try:
            g, loss = small_model()
            with pytest.raises(WorkerFailed) as failure:
                Cluster(gf.partition(g, 1, "spatial", loss=loss), hosts=[server.address],
                        timeout=5)
        finally:
            stop.set()
            thread.join(5)
    message = str(failure.value)
    assert f"worker:0 at {server.address} runs {theirs}" in message, message
    assert f"this driver graphflow {graphflow_version()} (protocol {PROTOCOL})" in message


def test_a_served_worker_names_its_version(worker):
    w = worker()
    c = client(w.address)
    try:
        reply = c.call("hello")
    finally:
        c.close()
    assert (reply["version"], reply["protocol"]) == (graphflow_version(), PROTOCOL)


def test_a_once_worker_exits_when_its_driver_is_killed(worker):
    """Its driver's connection ends without `release` (as when it is SIGKILLed)."""
    w = worker("--once")
    c = client(w.address)
    c.call("attach", driver="A")
    c.close()
    assert w.proc.wait(GONE) == 0, w.text()
    assert "driver A is gone without releasing: this --once worker exits" in w.text()


def test_a_driver_taken_over_is_refused_after_the_new_one_released(worker):
    """Driver A pauses (its connection ends), B takes the worker over and releases it; A
    resumes (reconnects under its routing id): its calls are refused as taken over, not
    answered with "no plan loaded"."""
    w = worker()
    a = client(w.address)
    a.call("attach", driver="A")
    routing = a.socket.routing_id
    a.close()
    b = client(w.address)
    try:
        attach_when_free(b, "B")
        assert b.call("release") is True
    finally:
        b.close()
    a = client(w.address, routing)
    try:
        with pytest.raises(RemoteError, match="'stats' refused: this worker now serves driver "
                                              "B, which took it over while this driver "
                                              "seemed gone"):
            a.call("stats")
        assert a.call("release") is False  # (and nothing to release)
    finally:
        a.close()
    assert w.alive(), w.text()


def test_one_worker_listed_twice_is_named_not_the_drivers_own_connection():
    """Two entries of one cluster reach the same worker: the second attach comes from the
    same driver run. Two runs of one process (two Clusters) are still told apart."""
    class Server:  # who is calling; every driver is still connected
        caller, address = b"first", "tcp://127.0.0.1:5555"

        def reaches(self, who):
            return True

    server, said = Server(), []
    h = WorkerService(say=said.append).handlers(server)
    h["attach"](driver="host pid 7", run="r1")
    server.caller = b"second"
    with pytest.raises(RuntimeError, match=r"this worker \(tcp://127.0.0.1:5555\) is listed "
                                           r"twice in the cluster of driver host pid 7: one "
                                           r"worker, two entries"):
        h["attach"](driver="host pid 7", run="r1")
    with pytest.raises(RuntimeError, match="serves driver host pid 7, which is still connected"):
        h["attach"](driver="host pid 7", run="r2")
