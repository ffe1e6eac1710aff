"""Local workers share this machine's cores: each gets its share of BLAS and Numba threads,
as a process's environment or, for worker threads, a limit on this process's BLAS pools."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphflow.partitioners.plan import Plan

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# (Numba reads its own at import and refuses a change once its threads run: set it only in
# the environment of a process about to start)
THREAD_VARS = (*BLAS_THREAD_VARS, "NUMBA_NUM_THREADS")


def core_share(workers: int) -> int:
    """Threads each of `workers` local workers may use: more threads than cores (BLAS's own
    pool in every worker) slow them all down."""
    return max(1, (os.cpu_count() or 1) // workers)


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """`n` BLAS / OpenMP threads here and in every worker process started inside (they
    inherit the environment); restores the previous settings on exit. (NUMBA_NUM_THREADS is
    left alone: numba refuses a new value once its pool runs, and our kernels are serial.)"""
    saved = {v: os.environ.get(v) for v in BLAS_THREAD_VARS}
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARS, str(n)))
    try:
        from threadpoolctl import threadpool_limits  # numpy / scipy BLAS already loaded here
        limits: Any = threadpool_limits(n)
    except ImportError:
        limits = nullcontext()
    try:
        with limits:
            yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


BUSY = 0.8  # the least share of a step every worker computes (predicted) for it to be pinned


def pinned_cores(plan: Plan, microbatches: int, local_workers: int,
                 pin: bool | None = None) -> list[int] | None:
    """The core each worker process of a local cluster for `plan` is pinned to, or None.

    Only where every worker can have a core of its own (2 up to the cores this process may
    use, the cluster's workers all the local ones); then as `pin` says, by default where each
    worker computes for most of the step: a pipelined plan, or one the cost model predicts
    keeps every worker busy at least BUSY of the step. A pinned worker's helper threads (zmq's,
    its sender and receiver) wake on its own core, never behind the other worker's kernel:
    unpinned, 4 of 10 freshly started speech-mlp pipelined clusters ran every step 20-35%
    slower than the rest (89-97 ms against 70-74), pinned none of 10 (later checks found one
    pinned cluster in five or six 8-30% slower: rarer, not gone); interleaved, pinned
    speech-mlp pipelined ran 4% faster and lc-large spatial 2% (3 clusters each). Where a
    worker idles, its core serves the other's helper threads: pinned, lc-large mincut (each
    worker busy 60% of the step, predicted) ran 5% slower. One worker, more workers than
    cores, and the workers of several clusters (replicas) stay free to move."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not 2 <= plan.parts <= len(cores) or local_workers != plan.parts or pin is False:
        return None
    if pin is None and microbatches == 1:
        from graphflow.costmodel import CostModel  # (not in a worker's imports)

        # the cache as this process has it (the workers' share of it may be cold: estimates)
        step = plan.predict(64, CostModel.default(64))
        if min(step.busy) < BUSY * step.step_seconds:
            return None
    return cores[:plan.parts]


def start_worker_process(address: str, local_workers: int, cpu: int | None = None,
                         log: str | None = None) -> subprocess.Popen[bytes]:
    """A local `graphflow worker` serving `address`: its share of the cores' threads, on CPU
    `cpu` alone if given, and gone once this process is. Its stderr goes to the file `log`
    (for the driver to quote when the worker dies), or nowhere."""
    pin = ["--cpu", str(cpu)] if cpu is not None else []
    argv = [sys.executable, "-m", "graphflow.cli", "worker", "--listen", address,
            "--exit-with-parent", str(os.getpid()), *pin]
    if log is None:
        return subprocess.Popen(argv, stderr=subprocess.DEVNULL, env=worker_env(local_workers))
    with open(log, "wb") as err:  # (the child keeps its own copy of the file)
        return subprocess.Popen(argv, stderr=err, env=worker_env(local_workers))


def worker_env(workers: int) -> dict[str, str]:
    """The environment of a local worker process: its share of the cores for BLAS and Numba
    threads, unless the user set a thread count."""
    return {**dict.fromkeys(THREAD_VARS, str(core_share(workers))), **os.environ}


class _BlasLimit:
    """Worker threads share this process's BLAS pools: while any cluster of worker threads
    lives, limit the pools to the smallest share of the cores one asked for (threadpoolctl,
    where installed; not when the user set a thread count). The last one out restores them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[int] = []
        self._original: Any = None

    def acquire(self, workers: int) -> bool:
        if workers < 2 or any(v in os.environ for v in BLAS_THREAD_VARS):
            return False
        try:
            import scipy.linalg.cython_blas  # noqa: F401 - loads the BLAS np.dot in kernels calls
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return False
        with self._lock:
            controller = ThreadpoolController()
            if not self._held:
                self._original = controller.info()
            self._held.append(core_share(workers))
            controller.limit(limits=min(self._held), user_api="blas")
        return True

    def release(self, workers: int) -> None:
        from threadpoolctl import ThreadpoolController

        with self._lock:
            self._held.remove(core_share(workers))
            controller = ThreadpoolController()
            if self._held:
                controller.limit(limits=min(self._held), user_api="blas")
                return
            for lib in self._original or []:
                controller.select(filepath=lib["filepath"]).limit(limits=lib["num_threads"])
            self._original = None


BLAS_LIMIT = _BlasLimit()
