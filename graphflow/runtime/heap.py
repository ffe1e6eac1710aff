"""Keep freed tensors' memory in the process's heap (glibc's malloc).

glibc hands every freed block over 128 KB (M_MMAP_THRESHOLD) back to the kernel. A training
step allocates the same tensors again, so each step faulted in, and the kernel zeroed, fresh
pages for all of them: 3300 page faults per speech-mlp step at batch 64, and weight-gradient
gemms 1.4x slower in a pipelined step. With higher thresholds the blocks stay for the next step
(1 fault per step; the heap holds the step's peak memory).

Threads get arenas of their own, heaps of at most 64 MB that cannot hold a larger block: a
threads-mode worker mapped speech-mlp's 84 MB output-layer gradient afresh every step, and ran
10% slower than a worker process. One arena (M_ARENA_MAX) serves every thread from the heap.

The command line (so every worker process and driver it starts) calls `keep_freed_memory`
first, and so does a threads-mode Cluster; a library user may call it too. It does nothing
where malloc is not glibc's or where the user tunes it (any MALLOC_* environment variable).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # mallopt's
SETTINGS = ((M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 1 << 28),
            (M_ARENA_MAX, 1))


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process and keep later threads in its
    one arena; True if they were set."""
    if any(k.startswith("MALLOC_") for k in os.environ):
        return False  # the user's own tuning wins
    mallopt = _mallopt()
    return mallopt is not None and all(mallopt(param, value) == 1 for param, value in SETTINGS)


@functools.cache
def _mallopt() -> Any:
    """libc's mallopt, or None where malloc is not glibc's (macOS, musl): looked up once, as
    every threads-mode cluster start asks (find_library runs ldconfig)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return None
