"""Multi-machine for real: three network namespaces on a private bridge stand in for three
machines. `graphflow worker --listen tcp://...` runs on two of them; a driver on the third runs
a partitioned training step over tcp and compares it with the single-process step, then one
worker is killed and the driver must name it within its timeout. The workers serve on after
their driver is done (`--once`: they exit).

Needs root and iproute2 (skips otherwise); deselect with `-k "not multimachine"`.
"""

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns import Hosts, Unavailable

PORT = 5555
WORKER_HOSTS = ["a", "b"]   # worker:0 on a, worker:1 on b; the driver runs on c
START_TIMEOUT = 30.0        # s for a worker to listen
FAIL_TIMEOUT = 5.0          # the cluster timeout of the run whose worker is killed
SLACK = 3.0                 # s the driver may take beyond that timeout to report

DRIVER = r'''
import json, select, sys, time
import numpy as np
import graphflow as gf
from graphflow.runtime import Cluster, WorkerFailed

cluster_file, workload, timeout, fail = sys.argv[1], sys.argv[2], float(sys.argv[3]), \
    sys.argv[4] == "fail"
build, shape, n = {"digits-lc": (gf.models.digits_lc, (1, 32, 32), 4),
                   "lc-large": (gf.models.lc_large, (3, 64, 64), 2)}[workload]
rng = np.random.default_rng(0)
feeds = {"x": rng.standard_normal((n, *shape)).astype(np.float32),
         "y": rng.integers(0, 10, n).astype(np.int32)}


def emit(**event):
    print(json.dumps(event), flush=True)


def rel(got, want):
    return float(np.abs(np.asarray(got) - want).max() / (np.abs(want).max() + 1e-12))


ref = build(batch=None)
grads = gf.gradients(ref.loss, ref.graph.parameters())
values = gf.Session(ref.graph).run([ref.loss, *grads.values()],
                                   {ref.x: feeds["x"], ref.y: feeds["y"]})
want_loss, want = values[0], dict(zip(grads, values[1:]))

model = build(batch=None)
plan = gf.partition(model.graph, 2, "spatial", loss=model.loss)
if fail:  # compile the plan's kernels into Numba's on-disk cache: a cold worker would spend
    # part of the short timeout compiling them on its first step
    with Cluster(plan, mode="threads", timeout=120) as warm:
        warm.gradients(feeds)
with Cluster.from_file(plan, cluster_file, timeout=timeout) as cluster:
    start = time.monotonic()
    out = cluster.gradients(feeds)
    seconds = time.monotonic() - start
    got_loss = out.pop("loss")
    got = plan.assemble(out)
    emit(event="step", seconds=seconds, loss=rel(got_loss, want_loss),
         missing=sorted(set(want) - set(got)), extra=sorted(set(got) - set(want)),
         grads={p: rel(got[p], w) for p, w in want.items() if p in got})
    if fail:
        emit(event="ready")
        if not select.select([sys.stdin], [], [], 60)[0] or not sys.stdin.readline():
            emit(event="error", message="no go-ahead on stdin")
            sys.exit(2)
        start = time.monotonic()
        try:
            cluster.gradients(feeds)
            emit(event="failure", raised=False, seconds=time.monotonic() - start)
        except WorkerFailed as e:
            emit(event="failure", raised=True, seconds=time.monotonic() - start,
                 worker=e.worker, message=str(e))
emit(event="closed")
'''


@pytest.fixture(scope="module")
def hosts():
    try:
        h = Hosts.create([*WORKER_HOSTS, "c"])
    except Unavailable as e:
        pytest.skip(reason=str(e))
    try:
        yield h
    finally:
        h.close()


def _env():
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def _log(path):
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def start_workers(hosts, tmp: Path, *options: str):
    """`graphflow worker --listen` on each worker host; returns once all of them listen."""
    procs, logs = {}, {}
    for h in WORKER_HOSTS:
        logs[h] = tmp / f"worker-{h}.log"
        with open(logs[h], "wb") as err:
            procs[h] = hosts.popen(h, [sys.executable, "-m", "graphflow.cli", "worker",
                                       "--listen", f"tcp://{hosts.address(h)}:{PORT}",
                                       *options],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=err, env=_env())
    deadline = time.monotonic() + START_TIMEOUT
    for h in WORKER_HOSTS:
        want = f"graphflow worker listening on tcp://{hosts.address(h)}:{PORT}"
        while want not in _log(logs[h]):
            if procs[h].poll() is not None:
                pytest.fail(f"worker on {h} exited ({procs[h].returncode}):\n{_log(logs[h])}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker on {h} not listening after {START_TIMEOUT:g}s:\n"
                            f"{_log(logs[h])}")
            time.sleep(0.05)
    return procs, logs


@pytest.fixture
def start(hosts, tmp_path):
    """start(*options): `start_workers`, killed after the test (served ones never exit)."""
    started = []

    def run(*options: str):
        procs, logs = start_workers(hosts, tmp_path, *options)
        started.extend(procs.values())
        return procs, logs
    yield run
    for proc in started:
        Hosts.kill(proc)


class Driver:
    """The driver script running on host c; reads its JSON events with deadlines."""

    def __init__(self, hosts, tmp: Path, workload: str, timeout: float, fail: bool) -> None:
        script, cluster = tmp / "driver.py", tmp / "cluster.toml"
        script.write_text(DRIVER)
        workers = [f"tcp://{hosts.address(h)}:{PORT}" for h in WORKER_HOSTS]
        cluster.write_text(f"workers = {json.dumps(workers)}\n")  # a TOML array too
        self.log = tmp / f"driver-{workload}.log"
        with open(self.log, "wb") as err:
            self.proc = hosts.popen("c", [sys.executable, str(script), str(cluster), workload,
                                          str(timeout), "fail" if fail else "ok"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    bufsize=0, env=_env())
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def event(self, name: str, within: float) -> dict:
        deadline = time.monotonic() + within
        for _ in range(1000):
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                break
            line = self.proc.stdout.readline()
            if not line:
                pytest.fail(f"driver exited ({self.proc.wait(5)}) before '{name}':\n"
                            f"{_log(self.log)}")
            if line.startswith(b"{"):
                got = json.loads(line)
                assert got["event"] == name, f"expected '{name}', driver said {got}"
                return got
        pytest.fail(f"no '{name}' from the driver within {within:g}s:\n{_log(self.log)}")

    def finish(self, within: float) -> int:
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            Hosts.kill(self.proc)
            pytest.fail(f"driver still running after {within:g}s:\n{_log(self.log)}")
        finally:
            self.sel.close()


def assert_step_matches(step):
    assert not step["missing"] and not step["extra"], step
    assert step["loss"] <= 1e-5, f"loss: relative error {step['loss']:.3g}"
    bad = {p: e for p, e in step["grads"].items() if e > 1e-5}
    assert not bad, f"gradients off (relative error): {bad}"


def assert_exits(proc, log, within: float):
    try:
        rc = proc.wait(within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker did not exit {within:g}s after its driver was done:\n{_log(log)}")
    assert rc == 0, f"worker exited with {rc}:\n{_log(log)}"


def assert_serves_on(proc, log, within: float):
    """The worker's driver released it (it says so) and it waits for the next one."""
    deadline = time.monotonic() + within
    while " left" not in _log(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert " left" in _log(log), f"no driver left the worker within {within:g}s:\n{_log(log)}"
    assert proc.poll() is None, f"worker exited ({proc.returncode}):\n{_log(log)}"


def test_multimachine_step_equals_single_process(hosts, tmp_path, start):
    """lc-large (batch 2) split over two hosts: loss and every gradient as in one process;
    the workers, started with --once, exit when the driver closes the cluster."""
    workers, logs = start("--once")
    driver = Driver(hosts, tmp_path, "lc-large", timeout=60.0, fail=False)
    assert_step_matches(driver.event("step", within=90))
    driver.event("closed", within=30)
    assert driver.finish(within=10) == 0, _log(driver.log)
    for h in WORKER_HOSTS:
        assert_exits(workers[h], logs[h], within=10)


def test_multimachine_killed_worker_is_named(hosts, tmp_path, start):
    """digits-lc over two hosts equals one process; then worker:1's host loses its process
    and the next step fails within the timeout, naming worker:1; the survivor serves on."""
    workers, logs = start()
    driver = Driver(hosts, tmp_path, "digits-lc", timeout=FAIL_TIMEOUT, fail=True)
    assert_step_matches(driver.event("step", within=60))
    driver.event("ready", within=10)
    Hosts.kill(workers["b"])
    driver.proc.stdin.write(b"go\n")
    failure = driver.event("failure", within=FAIL_TIMEOUT + 30)
    assert failure["raised"], f"the step after killing worker:1 succeeded: {failure}"
    assert failure["worker"] == "worker:1", failure["message"]
    assert "worker:1" in failure["message"]
    assert failure["seconds"] <= FAIL_TIMEOUT + SLACK, failure
    driver.event("closed", within=20)
    assert driver.finish(within=10) == 0, _log(driver.log)
    assert_serves_on(workers["a"], logs["a"], within=10)  # released by the driver


@pytest.mark.parametrize("sync", ["downpour", "allreduce"])
def test_multimachine_replicas_train_together(hosts, tmp_path, start, sync):
    """Two digits-lc replicas, one on each worker host (`graphflow train --cluster FILE
    --replicas 2`): through two shards that the driver on c runs on tcp, or averaging their
    gradients with each other over tcp (allreduce)."""
    workers, logs = start()
    cluster = tmp_path / "cluster.toml"
    addresses = [f"tcp://{hosts.address(h)}:{PORT}" for h in WORKER_HOSTS]
    cluster.write_text(f"workers = {json.dumps(addresses)}\nps_host = \"{hosts.address('c')}\"\n")
    driver = hosts.popen("c", [sys.executable, "-m", "graphflow.cli", "train", "digits-lc",
                               "--cluster", str(cluster), "--replicas", "2", "--ps-shards", "2",
                               "--sync", sync, "--steps", "400", "--json",
                               "--no-progress"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=_env())
    try:
        out, err = driver.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        Hosts.kill(driver)
        pytest.fail("graphflow train with remote replicas still running after 180 s")
    assert driver.returncode == 0, err.decode(errors="replace")[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert not result["failures"], result
    steps = result["replica_steps"]
    assert sum(steps.values()) == 400 and min(steps.values()) > 50, steps  # both trained
    assert result["test_accuracy"] >= 0.85, result
    for h in WORKER_HOSTS:
        assert_serves_on(workers[h], logs[h], within=10)
