"""Served workers (`graphflow worker --listen tcp://...`, here on loopback) outlive their
drivers: each driver attaches, runs and releases them; one that dies is replaced by the next
to attach; a worker whose peer was killed gives up on it within its timeout and serves the next
driver. Also: cluster-file errors name the file and the entry, a worker nobody serves fails
the first call fast, and `Cluster.set_params` takes the model's own parameter names."""

import inspect
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import graphflow as gf
from graphflow.runtime import Cluster, WorkerFailed
from graphflow.runtime.calls import reply_grace
from graphflow.runtime.clusterfile import read_cluster_file

START_TIMEOUT = 60.0  # s for a worker process to listen
SLACK = 3.0           # s a failure may take beyond the timeout that bounds it
SGD = {"name": "sgd", "lr": 0.1}


def small_model():
    """A locally connected layer and a dense one: a spatial plan of 2 parts splits both
    weights into blocks and sends tensors both ways."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1, 12, 12))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.relu(gf.layers.local2d(x, filters=4, kernel_size=3, stride=1, name="lc1"))
        loss = gf.softmax_cross_entropy(gf.layers.dense(gf.flatten(h), 10, name="fc"), y)
    return g, loss


@pytest.fixture(scope="module")
def case():
    """The plan, a batch, and the single-process loss and gradients for it."""
    g, loss = small_model()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 1, 12, 12)).astype(np.float32),
             "y": rng.integers(0, 10, 8).astype(np.int32)}
    grads = gf.gradients(loss, g.parameters())
    values = gf.Session(g).run([loss, *grads.values()], feeds)
    want = {"loss": values[0], **dict(zip(grads, values[1:]))}
    return gf.partition(g, 2, "spatial", loss=loss), feeds, want


def assert_close(got, want):
    """Each value within 1e-5 of the largest of its kind (as tests/test_multimachine.py)."""
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        error = np.abs(got[name] - value).max() / (np.abs(value).max() + 1e-12)
        assert error <= 1e-5, f"{name}: relative error {error:.3g}"


def assert_matches_single_process(cluster, plan, feeds, want):
    got = cluster.gradients(feeds)
    assert_close({"loss": got.pop("loss"), **plan.assemble(got)}, want)


class Served:
    """One `graphflow worker --listen tcp://127.0.0.1:*` process and its stderr."""

    def __init__(self, log: Path, *options: str) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "graphflow.cli", "worker", "--listen",
                 "tcp://127.0.0.1:*", *options],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.address = ""

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_listening(self, deadline: float) -> None:
        while not (m := re.search(r"listening on (tcp://\S+)", self.text())):
            if self.proc.poll() is not None:
                pytest.fail(f"worker exited ({self.proc.returncode}):\n{self.text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker not listening after {START_TIMEOUT:g}s:\n{self.text()}")
            time.sleep(0.05)
        self.address = m.group(1)

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture
def serve(tmp_path):
    """serve(n, *options): n fresh workers, listening; all killed at the end."""
    started: list[Served] = []

    def start(n: int, *options: str) -> list[Served]:
        new = [Served(tmp_path / f"worker{len(started) + i}.log", *options) for i in range(n)]
        started.extend(new)
        deadline = time.monotonic() + START_TIMEOUT
        for w in new:
            w.wait_listening(deadline)
        return new

    yield start
    for w in started:
        if w.alive():
            w.proc.kill()
        w.proc.wait(10)


def test_a_served_worker_serves_one_driver_after_another(case, serve):
    """Two drivers in turn on the same two workers, each as in one process; the workers stay
    up between them and say on stderr who attached and left."""
    plan, feeds, want = case
    workers = serve(2)
    hosts = [w.address for w in workers]
    for _ in range(2):
        with Cluster(plan, hosts=hosts, optimizer=SGD, timeout=10) as cluster:
            assert_matches_single_process(cluster, plan, feeds, want)  # (a fresh run)
            cluster.step(feeds)
        assert all(w.alive() for w in workers), [w.text() for w in workers]
    for w in workers:
        log = w.text()
        assert log.count(f"driver {socket.gethostname()} pid {os.getpid()} attached") == 2, log
        assert log.count(" left") == 2, log


def test_a_worker_started_with_once_exits_when_its_driver_is_done(serve):
    g, loss = small_model()
    (worker,) = serve(1, "--once")
    with Cluster(gf.partition(g, 1, "spatial", loss=loss), hosts=[worker.address],
                 timeout=10) as cluster:
        assert cluster.params()
    assert worker.proc.wait(10) == 0, worker.text()


def test_a_driver_keeps_its_workers_until_it_is_gone(case, serve):
    """While driver A is connected, driver B cannot attach its workers. Once A is gone
    without releasing them (its sockets closed, as when it is killed), B takes them over and
    A's run is dropped: B's starts afresh, and A's requests are refused from then on."""
    plan, feeds, want = case
    workers = serve(2)
    hosts = [w.address for w in workers]
    a = Cluster(plan, hosts=hosts, optimizer=SGD, timeout=10)
    try:
        a.step(feeds)
        with pytest.raises(WorkerFailed, match="serves driver .* still connected"):
            Cluster(plan, hosts=hosts, timeout=10)
        a.step(feeds)  # (untouched)
        for client in a.clients:  # gone, as far as the workers can tell
            client.socket.close(0)
        time.sleep(0.5)  # (their connections end on their own I/O threads)
        with Cluster(plan, hosts=hosts, timeout=10) as b:
            assert_matches_single_process(b, plan, feeds, want)  # not A's trained parameters
    finally:
        for client in a.clients:
            client.close()
    assert all(w.alive() for w in workers)
    assert "is gone without releasing: its run is dropped" in workers[0].text()


def test_a_taken_over_driver_is_refused_and_cannot_release(case):
    """At the service: after a takeover, the old driver's calls are refused and its release
    leaves the new driver's run alone."""
    from graphflow.runtime.service import WorkerService

    class Server:  # who is calling, and whether a driver is still connected
        caller, connected = b"A", set()

        def reaches(self, who):
            return who in self.connected

    said, server = [], Server()
    service = WorkerService(say=said.append)
    h = service.handlers(server)
    h["attach"](driver="A")
    server.caller = b"B"
    h["attach"](driver="B")
    assert said == ["driver A attached", "driver A is gone without releasing: its run is "
                    "dropped", "driver B attached"]
    server.caller = b"A"
    with pytest.raises(RuntimeError, match="'stats' refused: this worker now serves driver B"):
        h["stats"]()
    assert h["release"]() is False and service.owner == b"B"
    server.caller = b"B"
    assert h["release"]() is True and service.owner is None and said[-1] == "driver B left"


def test_the_survivor_of_a_killed_worker_serves_the_next_driver(case, serve):
    """worker:1 is killed (SIGKILL) while steps stream: the driver names it within its timeout.
    The survivor abandons the failed step and refuses the steps queued behind it at once, so a
    new driver reaches it within its connect timeout: with a fresh worker beside it, the run
    equals the single-process one."""
    plan, feeds, want = case
    timeout, ahead = 4.0, 4  # unrefused, the queued steps would keep the survivor ~16 s
    survivor, victim = serve(2)
    with Cluster(plan, hosts=[survivor.address, victim.address], optimizer=SGD,
                 timeout=timeout) as cluster:
        cluster.step(feeds)  # (the kernels are compiled)
        killed = 0.0
        with pytest.raises(WorkerFailed) as failure:
            for k, _ in enumerate(cluster.stream((feeds for _ in range(200)), ahead=ahead)):
                if k == 0:
                    victim.proc.kill()
                    killed = time.monotonic()
        seconds = time.monotonic() - killed
    assert failure.value.worker == "worker:1", str(failure.value)
    assert f"worker:1 at {victim.address} did not answer" in str(failure.value)
    # (close releases the survivor, not the silent one: no wait for it before the error)
    assert seconds <= timeout + reply_grace(timeout) + SLACK, seconds
    assert survivor.alive(), survivor.text()
    (fresh,) = serve(1)
    with Cluster(plan, hosts=[survivor.address, fresh.address], timeout=30,
                 connect_timeout=timeout + 1) as cluster:
        assert_matches_single_process(cluster, plan, feeds, want)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_driver_that_cannot_attach_them_all_releases_those_it_could(case, serve):
    plan, _, _ = case
    (live,) = serve(1)
    with pytest.raises(WorkerFailed, match="worker:1 at tcp://127.0.0.1:"):
        Cluster(plan, hosts=[live.address, f"tcp://127.0.0.1:{_unused_port()}"], timeout=30,
                connect_timeout=1.0)
    deadline = time.monotonic() + 5.0
    while " left" not in live.text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert " attached" in live.text() and " left" in live.text(), live.text()


def test_an_address_nobody_serves_fails_the_first_call_fast_naming_it(case):
    plan, _, _ = case
    hosts = [f"tcp://127.0.0.1:{_unused_port()}" for _ in range(2)]
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as failure:
        Cluster(plan, hosts=hosts, timeout=60, connect_timeout=1.0)
    assert time.monotonic() - start < 1.0 + SLACK
    message = str(failure.value)
    assert hosts[0] in message and "did not answer within 1s" in message, message
    default = inspect.signature(Cluster).parameters["connect_timeout"].default
    assert 0 < default <= 15  # seconds, whatever the step `timeout`


@pytest.mark.parametrize("text, entry", [
    ('workers = ["tcp://127.0.0.1:5555"', "not valid TOML"),
    ('workers = ["tcp://127.0.0.1:99999"]', "workers[0] = 'tcp://127.0.0.1:99999'"),
    ("workers = []", "workers = []: list one"),
    ('workers = ["tcp://:5555", "tcp://127.0.0.1:5556"]', "workers[0] = 'tcp://:5555': no host"),
    ('workers = ["tcp://127.0.0.1:5555", "tcp://127.0.0.1"]',
     "workers[1] = 'tcp://127.0.0.1': no port"),
    ('workers = ["127.0.0.1:5555"]', "workers[0] = '127.0.0.1:5555'"),
    ('workers = ["tcp://a:1", "tcp://a:1"]', "workers[1] = 'tcp://a:1': repeats workers[0]"),
    ('workers = "tcp://127.0.0.1:5555"', "expected a list"),
    ('worker = ["tcp://127.0.0.1:5555"]', "no `workers"),
    ("workers = [5555]", "workers[0] = 5555: not a string"),
])
def test_a_cluster_file_error_names_the_file_and_the_entry(tmp_path, text, entry):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError) as error:
        read_cluster_file(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}: ") and entry in message, message
    assert "\n" not in message


def test_hosts_are_checked_before_any_wait(case, tmp_path):
    plan, _, _ = case
    with pytest.raises(ValueError, match=r"hosts\[0\] = 'tcp://:5555': no host"):
        Cluster(plan, hosts=["tcp://:5555", "tcp://127.0.0.1:5556"])
    path = tmp_path / "one.toml"
    path.write_text('workers = ["tcp://127.0.0.1:5555"]\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: 1 worker\(s\) for a plan "
                                         r"of 2 part\(s\)"):
        Cluster.from_file(plan, str(path))


def test_set_params_takes_the_models_names_and_splits_them_like_the_plan(case):
    """Whole parameters (as a Session holds them) reach their blocks; the plan's own names
    still work; the gradients are then those of the single process at those values."""
    plan, feeds, _ = case
    g, loss = small_model()
    grads = gf.gradients(loss, g.parameters())
    session = gf.Session(g)
    rng = np.random.default_rng(1)
    values = {name: rng.standard_normal(v.shape).astype(v.dtype)
              for name, v in session.params.items()}
    with Cluster(plan, timeout=30) as cluster:
        assert "lc1/W" not in cluster.params()  # held as blocks
        cluster.set_params(values)
        held = plan.assemble(cluster.params())
        for name, value in values.items():
            np.testing.assert_array_equal(held[name], value, err_msg=name)
        block = "fc/W/part1"
        cluster.set_params({block: np.zeros(plan.graph[block].shape, np.float32)})
        assert not cluster.params()[block].any()
        cluster.set_params(values)
        session.params.update(values)
        want = dict(zip(grads, session.run(list(grads.values()), feeds)))
        got = cluster.gradients(feeds)
        assert_close(plan.assemble({k: v for k, v in got.items() if k != "loss"}), want)


def test_set_params_refuses_unknown_names_and_wrong_shapes_before_writing(case):
    plan, _, _ = case
    with Cluster(plan, timeout=30) as cluster:
        before = cluster.params()
        good = {"fc/b": np.ones(10, np.float32)}
        with pytest.raises(KeyError, match="no parameter no/such/param; it has .*'?fc/W"):
            cluster.set_params({**good, "no/such/param": np.zeros(3, np.float32)})
        with pytest.raises(ValueError, match=r"parameter 'lc1/W' has shape \(10, 10, 4, 9\), "
                                             r"the value given has shape \(10, 10, 4\)"):
            cluster.set_params({**good, "lc1/W": np.zeros((10, 10, 4), np.float32)})
        with pytest.raises(ValueError, match=r"'fc/W/part0' has shape \(\d+, 10\), the value "
                                             r"given has shape \(3,\)"):
            cluster.set_params({"fc/W/part0": np.zeros(3, np.float32)})
        after = cluster.params()
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)
