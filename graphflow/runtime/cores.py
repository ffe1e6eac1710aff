"""Local workers share this machine's cores: each gets its share of BLAS and Numba threads,
as a process's environment or, for worker threads, a limit on this process's BLAS pools."""

from __future__ import annotations

import os
import threading
from typing import Any

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# (Numba reads its own at import and refuses a change once its threads run: set it only in
# the environment of a process about to start)
THREAD_VARS = (*BLAS_THREAD_VARS, "NUMBA_NUM_THREADS")


def core_share(workers: int) -> int:
    """Threads each of `workers` local workers may use: more threads than cores (BLAS's own
    pool in every worker) slow them all down."""
    return max(1, (os.cpu_count() or 1) // workers)


def pinned_cores(parts: int, local_workers: int) -> list[int] | None:
    """The core each of a local process cluster's `parts` workers is pinned to, or None.

    Pinned when the cluster's workers are all the local ones and each gets a core of its own
    (2 up to the cores this process may use): a worker's helper threads (zmq's, its sender and
    receiver) then wake on their own worker's core, never behind the other worker's kernel.
    Unpinned, 4 of 10 freshly started speech-mlp pipelined clusters each ran every step
    20-35% slower than the rest (89-97 ms against 70-74) in two runs, 0 of 5 in a third;
    pinned, none of 10, and 4% faster in an interleaved run. A Cluster pins pipelined plans
    only, whose stages are all busy at once: where one worker idles, its core serves the
    other's helper threads (lc-large mincut ran 5% slower pinned, speech-mlp spatial 2%).
    One worker, more workers than cores, or the workers of several clusters (replicas) stay
    free to move."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not 2 <= parts <= len(cores) or local_workers != parts:
        return None
    return cores[:parts]


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
