"""Arrays that start on a page, for the large operands the vector kernels stream.

glibc's malloc (under numpy) starts a block 16 bytes past a 64-byte line in three cases of
four, and where it falls depends on what the process allocated before. A kernel loading
64-byte vectors from a misaligned weight splits every load over two lines: the forward gemm
against speech-mlp's 2560 x 8192 weight ran 10.3-10.9 ms at 32 rows against 8.2-8.8 aligned,
and where a weight landed differed from one worker process to the next.

Where two arrays fall relative to each other within a 4 KB page differed from process to
process too. The weight-gradient gemm (`short_gemm`, 2560 x 8192 over 64 rows) ran 10-20%
slower when its output started 64-448 bytes past its dy in a page (4K aliasing: its loads of
dy's next columns carry the low 12 bits of the stores it has just made), and at full speed
with both at the same place in a page; the forward, the backward and the update did not care
(2026-11-26). So a large array starts on a page: every process lays its arrays out alike.
(Whole pipelined speech-mlp steps ran alike either way, 14 clusters a run: this removes a
draw, not a measured loss.)

An aligned array is a view of a slightly larger buffer, so `flags.owndata` is False for it;
`owns_data` answers for both kinds (views of it, like any view, do not own their data).

    >>> a = empty((256, 256), np.float32)
    >>> a.ctypes.data % PAGE, a.shape, a.flags.owndata, owns_data(a), owns_data(a[1:])
    (0, (256, 256), False, True, False)
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

PAGE = 4096  # bytes: where a large array starts (and so on a 64-byte line, a vector's width)
MIN_BYTES = 64 * 1024  # smaller arrays stay numpy's: they live in cache, and views cost more

_owners: dict[int, weakref.ref[np.ndarray]] = {}  # id -> the aligned array (while it lives)


def empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a page (from MIN_BYTES up)."""
    shape = tuple(int(d) for d in np.atleast_1d(shape))
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE
    a = raw[start:start + nbytes].view(dtype).reshape(shape)
    key = id(a)
    _owners[key] = weakref.ref(a, lambda _, key=key: _owners.pop(key, None))
    return a


def full(shape: Any, value: Any, dtype: Any = np.float32) -> np.ndarray:
    """`empty`, filled with `value`."""
    a = empty(shape, dtype)
    a.fill(value)
    return a


def copy(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A C-contiguous copy of `a` (as `dtype`, if given) that starts on a page."""
    out = empty(a.shape, a.dtype if dtype is None else dtype)
    np.copyto(out, a, casting="same_kind")
    return out


def concatenate(parts: list[np.ndarray], axis: int) -> np.ndarray:
    """`np.concatenate(parts, axis)` into an array that starts on a page."""
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    return np.concatenate(parts, axis=axis, out=empty(shape, parts[0].dtype))


def owns_data(a: np.ndarray) -> bool:
    """Whether `a` owns its memory: numpy's own arrays and those `empty` made, not views."""
    if a.flags.owndata:
        return True
    ref = _owners.get(id(a))
    return ref is not None and ref() is a
