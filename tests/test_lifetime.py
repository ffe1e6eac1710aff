"""A driver's local worker processes end with it, however it ends (here: SIGKILL, so nothing
of its own runs to close them), and with a cluster the driver dropped without closing."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import graphflow as gf
from graphflow.lifetime import POLL_SECONDS, exit_with_parent, is_gone
from graphflow.partitioners import partition
from graphflow.runtime import Cluster

DRIVER = """
import os, sys, time
import graphflow as gf
from graphflow.partitioners import partition
from graphflow.runtime import Cluster
model = gf.models.digits_lc(batch=None)
cluster = Cluster(partition(model.graph, 2, "spatial", loss=model.loss), mode="processes",
                  timeout=60)
print(" ".join(str(p.pid) for p in cluster._procs), flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (exited; whoever adopted it has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_local_workers_exit_when_their_driver_is_killed():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        line = driver.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, f"driver printed {line!r}"
        assert not any(gone(p) for p in workers)
    finally:
        driver.kill()
        driver.wait(10)
    deadline = time.monotonic() + 10 * POLL_SECONDS + 5.0
    while not all(gone(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if not gone(p)]
    for p in left:  # do not leave them behind if the assertion fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their driver"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_cluster_dropped_without_close_ends_its_workers():
    model = gf.models.digits_lc(batch=None)
    cluster = Cluster(partition(model.graph, 2, "spatial", loss=model.loss), mode="processes",
                      timeout=60)
    workers, sockets = [p.pid for p in cluster._procs], cluster._local.tmp
    assert not any(gone(p) for p in workers)
    del cluster
    gc.collect()
    assert all(gone(p) for p in workers)
    assert not os.path.exists(sockets)


def test_exit_with_parent_stops_once_that_process_has_ended():
    stays = threading.Event()
    exit_with_parent(os.getppid(), stays)
    ended_child = subprocess.Popen([sys.executable, "-c", "pass"])
    ended_child.wait(30)  # reaped: its pid names no process now
    ended, calls = threading.Event(), []
    exit_with_parent(ended_child.pid, ended, lambda: calls.append("on_exit"))
    assert ended.wait(4 * POLL_SECONDS)
    assert calls == ["on_exit"]
    assert not stays.wait(3 * POLL_SECONDS)
    stays.set()  # ends its watcher


def test_a_live_process_that_is_not_the_parent_is_not_gone():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not is_gone(other.pid, was_parent=False)
        assert is_gone(other.pid, was_parent=True)  # it is not this process's parent
    finally:
        other.kill()
        other.wait(10)
    assert is_gone(other.pid, was_parent=False)


@pytest.mark.parametrize("pid", [0, -1])
def test_exit_with_parent_refuses_pids_that_name_groups(pid):
    with pytest.raises(ValueError, match="pid must be positive"):
        exit_with_parent(pid, threading.Event())


def test_a_worker_process_that_dies_at_start_is_named_with_its_last_words(tmp_path, monkeypatch):
    # every Python started with this PYTHONPATH (here: only the cluster's workers) dies at once
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nsys.stderr.write('no worker today: the disk is on fire\\n')\n"
        "sys.stderr.flush()\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    t0 = time.monotonic()
    with pytest.raises(gf.runtime.WorkerFailed,
                       match="(?s)worker:0 exited with code 3 before answering 'hello'"
                             ".*the disk is on fire") as failure:
        Cluster(plan, mode="processes", timeout=60)
    assert failure.value.worker == "worker:0"
    # named once it is gone, not after the 60-s timeout, and the dead are not asked to shut down
    assert time.monotonic() - t0 < 8


def test_a_worker_process_slow_to_start_is_waited_for(tmp_path, monkeypatch):
    # a loaded machine: each worker takes 3 s to start, more than its 1-s timeout and the
    # driver's 1-s grace for a reply
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    with Cluster(plan, mode="processes", timeout=1.0) as cluster:
        assert set(plan.assemble(cluster.params())) == {p.name for p in
                                                        model.graph.parameters()}
