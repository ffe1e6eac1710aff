"""Local workers share the machine's cores: BLAS threads beyond a worker's share slow every
worker down (measured: lc-large on 2 workers as threads, 30 steps in 4.1 s oversubscribed,
1.9 s with one BLAS thread each)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from graphflow.runtime.cores import THREAD_VARS, core_share, worker_env


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
from graphflow.runtime.cores import core_share
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


HEAP_PROBE = """
import resource, sys, threading
import numpy as np
from graphflow.runtime.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
counts = []
def steps():
    for _ in range(3):  # a step's tensors, allocated, written and freed again
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a, b = np.ones(16 << 20, np.float32), np.ones(6 << 20, np.float32)
        del a, b
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
if sys.argv[2] == "thread":  # (glibc gives a new thread an arena of its own, unless told not to)
    runner = threading.Thread(target=steps)
    runner.start()
    runner.join()
else:
    steps()
print(kept, counts[1] + counts[2])
"""


@pytest.mark.parametrize("where", ["main", "thread"])
def test_keep_freed_memory_stops_the_page_faults_of_repeated_tensors(monkeypatch, where):
    """In the main thread, and in a thread (a threads-mode worker's executor): there glibc
    gives each thread an arena of its own, whose blocks over 64 MB were mapped afresh every
    time (speech-mlp's output-layer gradient, 84 MB: a threads-mode step 10% slower)."""
    for var in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(var)

    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, mode, where],
                             capture_output=True, text=True, check=True).stdout.split()
        return out[0], int(out[1])

    kept, with_heap = faults("keep")
    if kept != "True":
        pytest.skip(reason="malloc is not glibc's: its defaults stay")
    _, without = faults("default")
    assert with_heap < 50 < without, (with_heap, without)


STEPS = """
import os, sys
import numpy as np, graphflow as gf
from graphflow.runtime import Cluster
def faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])
m = gf.models.speech_mlp(batch=None)
plan = gf.partition(m.graph, 1, "layerwise", loss=m.loss)
rng = np.random.default_rng(0)
feeds = {"x": rng.standard_normal((64, 440), dtype=np.float32),
         "y": rng.integers(0, 8192, 64, dtype=np.int32)}
with Cluster(plan, mode=sys.argv[1], optimizer={"name": "sgd", "lr": 0.01}) as cluster:
    for _ in range(2):
        cluster.step(feeds)
    pid = cluster._procs[0].pid if cluster._procs else os.getpid()
    before = faults(pid)
    for _ in range(3):
        cluster.step(feeds)
    print((faults(pid) - before) / 3)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_a_worker_reuses_its_tensors_memory_from_step_to_step(mode):
    """Steps after the first allocate the same tensors again: the worker's heap keeps their
    memory, so a step faults in (and the kernel zeroes) almost no fresh pages (measured: 1 a
    step, against 3300 with glibc's defaults). A worker thread's tensors come from the
    process's heap too (the cluster sets it up): 1700 fresh pages a step before, among them
    the 84 MB output-layer gradient's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    r = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    per_step = float(r.stdout.split()[-1])
    assert per_step < 500, f"{per_step:.0f} page faults per step"


def test_a_worker_process_freezes_what_its_first_step_loaded():
    """A full collection walks what the garbage collector tracks: the kernels a worker's first
    step loads are frozen with what `load` built, once, after that step (left in, they made
    each full collection 21-41 ms)."""
    import graphflow as gf
    from graphflow.runtime import Cluster

    model = gf.models.digits_lc(batch=None)
    plan = gf.partition(model.graph, 1, "layerwise", loss=model.loss)
    feeds = {"x": np.zeros((4, 1, 32, 32), np.float32), "y": np.zeros(4, np.int32)}
    with Cluster(plan, mode="processes", optimizer={"name": "sgd", "lr": 0.1}) as cluster:
        loaded = cluster.stats()[0]["gc_frozen"]
        frozen = []
        for _ in range(3):
            cluster.step(feeds)
            frozen.append(cluster.stats()[0]["gc_frozen"])
    assert loaded > 0 and frozen[0] > loaded + 10_000  # (about 50,000 here)
    assert all(abs(f - frozen[0]) < 100 for f in frozen)  # later steps freeze nothing more
