"""Local workers share the machine's cores: BLAS threads beyond a worker's share slow every
worker down (measured: lc-large on 2 workers as threads, 30 steps in 4.1 s oversubscribed,
1.9 s with one BLAS thread each)."""

import os
import subprocess
import sys

import pytest

from graphflow.runtime.cluster import THREAD_VARS, core_share, worker_env


def test_a_worker_process_gets_its_share_of_the_cores(monkeypatch):
    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    env = worker_env(2)
    assert {env[v] for v in THREAD_VARS} == {str(core_share(2))}
    assert core_share(2) == max(1, (os.cpu_count() or 1) // 2) and core_share(10_000) == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")  # the user's own setting wins
    assert worker_env(2)["OPENBLAS_NUM_THREADS"] == "3"


def test_worker_threads_limit_blas_while_the_cluster_lives():
    pytest.importorskip("threadpoolctl")
    code = """
import numpy as np, graphflow as gf
from threadpoolctl import threadpool_info
from graphflow.runtime import Cluster
from graphflow.runtime.cluster import core_share
def blas():
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
before = blas()
m = gf.models.digits_lc()
plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
first, second = Cluster(plan, mode="threads"), Cluster(plan, mode="threads")  # two replicas
first.gradients({"x": np.zeros((4, 1, 32, 32), np.float32), "y": np.zeros(4, np.int32)})
inside = blas()
first.close()  # closed in the order they started: the limit holds until the last one
between = blas()
second.close()
print(inside == between == {core_share(2)}, blas() == before)
"""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"], r.stdout
