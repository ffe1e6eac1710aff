"""Pinning local worker processes to cores: when it applies, that it really happens, and a
worker told to run on a CPU it cannot have says so."""

import os
import subprocess
import sys

import numpy as np
import pytest

from graphflow import models
from graphflow.partitioners import partition
from graphflow.runtime import cores
from graphflow.runtime.cluster import Cluster

CORES = sorted(os.sched_getaffinity(0))


def test_each_worker_gets_a_core_of_its_own_only_where_it_keeps_it_busy(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5, 7})
    model = models.lc_large(batch=None)
    plans = {k: partition(model.graph, k, "spatial", loss=model.loss) for k in (1, 2, 4, 5)}
    assert cores.pinned_cores(plans[2], 1, 2) == [0, 2]  # spatial: both busy all the step
    assert cores.pinned_cores(plans[4], 1, 4) == [0, 2, 5, 7]
    assert cores.pinned_cores(plans[1], 1, 1) is None  # one worker stays free to move
    assert cores.pinned_cores(plans[5], 1, 5) is None  # more workers than cores
    assert cores.pinned_cores(plans[2], 1, 4) is None  # two clusters' workers share the cores
    assert cores.pinned_cores(plans[2], 1, 2, pin=False) is None
    mincut = partition(model.graph, 2, "mincut", loss=model.loss)
    assert cores.pinned_cores(mincut, 1, 2) is None  # each worker idles 40% of the step
    assert cores.pinned_cores(mincut, 1, 2, pin=True) == [0, 2]
    layerwise = partition(model.graph, 2, "layerwise", loss=model.loss)
    assert cores.pinned_cores(layerwise, 1, 2) is None
    assert cores.pinned_cores(layerwise, 2, 2) == [0, 2]  # pipelined: every stage busy


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to give 2 workers one each")
@pytest.mark.parametrize(("strategy", "microbatches", "pin", "pinned"), [
    ("layerwise", 2, None, True),  # by default a pipelined plan's workers
    ("layerwise", 1, None, False),  # not a plan that leaves a worker idle half the step
    ("layerwise", 1, True, True), ("layerwise", 2, False, False)])
def test_a_process_cluster_pins_its_workers(strategy, microbatches, pin, pinned):
    model = models.digits_lc(batch=None)
    plan = partition(model.graph, 2, strategy, loss=model.loss)
    rng = np.random.default_rng(0)
    feeds = {model.x.name: rng.standard_normal((4, 1, 32, 32)).astype(np.float32),
             model.y.name: rng.integers(0, 10, 4).astype(np.int32)}
    with Cluster(plan, mode="processes", optimizer={"name": "sgd", "lr": 0.1}, pin=pin,
                 microbatches=microbatches) as c:
        c.step(feeds)
        got = [os.sched_getaffinity(p.pid) for p in c._procs]
        tasks = os.listdir(f"/proc/{c._procs[1].pid}/task")
        threads = [os.sched_getaffinity(int(t)) for t in tasks]
    if pinned:
        assert got == [{CORES[0]}, {CORES[1]}]
        assert all(t == {CORES[1]} for t in threads), "zmq's and the worker's threads too"
    else:
        assert got == [set(CORES)] * 2


def test_a_worker_refuses_a_cpu_it_cannot_have(tmp_path):
    bad = max(CORES) + 4096
    r = subprocess.run([sys.executable, "-m", "graphflow.cli", "worker", "--listen",
                        f"ipc://{tmp_path}/w", "--cpu", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"cannot run on CPU {bad}" in r.stderr
