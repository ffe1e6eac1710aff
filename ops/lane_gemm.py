"""out = a @ b.T against a large `b`, the rows of `a` in a vector's lanes.

A dense layer's backward, dx = dy @ w.T: 16 rows of dy (a micro-batch) or 64 against a 2560 x
2560 or 2560 x 8192 weight. As tiled dot products (`small_gemm.matmul_nt`) every multiply-add
loads an element of each operand, from L2 once dy and w's rows outgrow L1, and the kernel runs
at half the core's peak. Here out.T = b @ a.T instead: a's rows are transposed into a (k, 16 v)
panel, and each step down the dot products takes one to four vectors of it and splats over
them an element of each of a few rows of b. b is read once a pass, its rows front to back;
out's tile (those rows of b by all of a's) stays in registers. While a tile of one or two
vectors runs, the next tile's rows are asked for as far along (1.1x at 2560 x 8192; a
four-vector tile's are not: no faster). One core, float32, 2560 x 2560, 16 / 64 rows: 1.24 /
4.46 ms where the dot products take 2.13 / 7.31; 2560 x 8192: 4.41 / 17.8 against 5.79 / 25.9.

Each output element is one sequential sum down k at any number of rows: a micro-batch's rows
come out bit for bit as they do in the whole batch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphflow.ops import simd
from graphflow.ops.simd import LANES, prefetch, vfma, vload, vsplat, vstore, vzero
from graphflow.ops.small_gemm import MIN_COLS, MIN_DEPTH  # (BLAS's ground, as there)

MAX_ROWS = 4 * LANES  # rows a pass over b serves: out's tile is 4 b rows by 4 vectors of rows
NARROW_ROWS = 0  # without AVX-512 (simd.WIDE) numpy's OpenBLAS wins: ours ran 0.35-0.92x its
                 # speed at 4 rows, 0.57-1.02x at 8, 0.67-1.21x at 16 (SciPy's: 1.1-1.9x at 16)


@njit(nogil=True, cache=True, inline="always")
def _prefetch_next(fb: np.ndarray, k: int, first: int, rows: int, p: int) -> None:
    """Ask for the line at column p of `rows` rows of b (flat, k columns) from row `first`
    on: the next tile's, as far along as this tile is."""
    for t in range(rows):
        prefetch(fb, (first + t) * k + p)


@njit(nogil=True, cache=True, inline="always")
def _lanes1(at: np.ndarray, b: np.ndarray, fb: np.ndarray, tile: np.ndarray, j: int,
            next_rows: int) -> None:
    """tile[t * 16 + r] = at[:, r] . b[j + t] for 8 rows t of b and 16 lanes r."""
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = vzero()
    for p in range(b.shape[1]):
        if p % LANES == 0:
            _prefetch_next(fb, b.shape[1], j + 8, next_rows, p)
        d = vload(at, p * LANES)
        c0, c1 = vfma(vsplat(b[j, p]), d, c0), vfma(vsplat(b[j + 1, p]), d, c1)
        c2, c3 = vfma(vsplat(b[j + 2, p]), d, c2), vfma(vsplat(b[j + 3, p]), d, c3)
        c4, c5 = vfma(vsplat(b[j + 4, p]), d, c4), vfma(vsplat(b[j + 5, p]), d, c5)
        c6, c7 = vfma(vsplat(b[j + 6, p]), d, c6), vfma(vsplat(b[j + 7, p]), d, c7)
    for t, c in enumerate((c0, c1, c2, c3, c4, c5, c6, c7)):
        vstore(tile, t * LANES, c)


@njit(nogil=True, cache=True, inline="always")
def _lanes2(at: np.ndarray, b: np.ndarray, fb: np.ndarray, tile: np.ndarray, j: int,
            next_rows: int) -> None:
    """tile[t * 32 + r] = at[:, r] . b[j + t] for 8 rows t of b and 32 lanes r."""
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = vzero()
    c40 = c41 = c50 = c51 = c60 = c61 = c70 = c71 = vzero()
    for p in range(b.shape[1]):
        if p % LANES == 0:
            _prefetch_next(fb, b.shape[1], j + 8, next_rows, p)
        d0, d1 = vload(at, p * 32), vload(at, p * 32 + 16)
        x = vsplat(b[j, p])
        c00, c01 = vfma(x, d0, c00), vfma(x, d1, c01)
        x = vsplat(b[j + 1, p])
        c10, c11 = vfma(x, d0, c10), vfma(x, d1, c11)
        x = vsplat(b[j + 2, p])
        c20, c21 = vfma(x, d0, c20), vfma(x, d1, c21)
        x = vsplat(b[j + 3, p])
        c30, c31 = vfma(x, d0, c30), vfma(x, d1, c31)
        x = vsplat(b[j + 4, p])
        c40, c41 = vfma(x, d0, c40), vfma(x, d1, c41)
        x = vsplat(b[j + 5, p])
        c50, c51 = vfma(x, d0, c50), vfma(x, d1, c51)
        x = vsplat(b[j + 6, p])
        c60, c61 = vfma(x, d0, c60), vfma(x, d1, c61)
        x = vsplat(b[j + 7, p])
        c70, c71 = vfma(x, d0, c70), vfma(x, d1, c71)
    for t, (c0, c1) in enumerate(((c00, c01), (c10, c11), (c20, c21), (c30, c31),
                                  (c40, c41), (c50, c51), (c60, c61), (c70, c71))):
        vstore(tile, t * 32, c0)
        vstore(tile, t * 32 + 16, c1)


@njit(nogil=True, cache=True, inline="always")
def _lanes4(at: np.ndarray, b: np.ndarray, tile: np.ndarray, j: int) -> None:
    """tile[t * 64 + r] = at[:, r] . b[j + t] for 4 rows t of b and 64 lanes r."""
    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = vzero()
    c20 = c21 = c22 = c23 = c30 = c31 = c32 = c33 = vzero()
    for p in range(b.shape[1]):
        q = p * 64
        d0, d1, d2, d3 = vload(at, q), vload(at, q + 16), vload(at, q + 32), vload(at, q + 48)
        x = vsplat(b[j, p])
        c00, c01, c02, c03 = (vfma(x, d0, c00), vfma(x, d1, c01), vfma(x, d2, c02),
                              vfma(x, d3, c03))
        x = vsplat(b[j + 1, p])
        c10, c11, c12, c13 = (vfma(x, d0, c10), vfma(x, d1, c11), vfma(x, d2, c12),
                              vfma(x, d3, c13))
        x = vsplat(b[j + 2, p])
        c20, c21, c22, c23 = (vfma(x, d0, c20), vfma(x, d1, c21), vfma(x, d2, c22),
                              vfma(x, d3, c23))
        x = vsplat(b[j + 3, p])
        c30, c31, c32, c33 = (vfma(x, d0, c30), vfma(x, d1, c31), vfma(x, d2, c32),
                              vfma(x, d3, c33))
    for t, (c0, c1, c2, c3) in enumerate(((c00, c01, c02, c03), (c10, c11, c12, c13),
                                          (c20, c21, c22, c23), (c30, c31, c32, c33))):
        for v, c in enumerate((c0, c1, c2, c3)):
            vstore(tile, t * 64 + v * LANES, c)


@njit(nogil=True, cache=True, inline="always")
def _lane1(at: np.ndarray, b: np.ndarray, tile: np.ndarray, j: int, width: int) -> None:
    """tile[:width] = at (k, width) . b[j]: one row of b (the rows short of a whole tile)."""
    for v in range(0, width, LANES):
        c = vzero()
        for p in range(b.shape[1]):
            c = vfma(vsplat(b[j, p]), vload(at, p * width + v), c)
        vstore(tile, v, c)


def wins(m: int, n: int, k: int) -> bool:
    """Whether `matmul_nt_lanes` beats BLAS for out (m, n) = a (m, k) @ b (n, k).T: long dot
    products against many rows of b, up to MAX_ROWS rows of a (NARROW_ROWS without AVX-512).
    (With AVX-512, past that it still ran 1.45x faster than a one-thread BLAS at 128 and at
    1024 rows, 2560 x 2560, a pass over b for each 64 rows; but BLAS may have more cores than
    this one-thread kernel: `graphflow train` in one process lets it use them all.)"""
    return 0 < m <= (MAX_ROWS if simd.WIDE else NARROW_ROWS) and k >= MIN_DEPTH and n >= MIN_COLS


@njit(nogil=True, cache=True)
def matmul_nt_lanes(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out (m, n) = a (m, k) @ b (n, k).T for C-contiguous 2-D float32 arrays: a pass over b
    for each MAX_ROWS rows of a.

    >>> a, b = np.ones((3, 5), np.float32), np.arange(10, dtype=np.float32).reshape(2, 5)
    >>> out = np.empty((3, 2), np.float32); matmul_nt_lanes(a, b, out); out[0].tolist()
    [10.0, 35.0]
    """
    for i0 in range(0, a.shape[0], MAX_ROWS):
        _rows_pass(a[i0:i0 + MAX_ROWS], b, out[i0:i0 + MAX_ROWS])


@njit(nogil=True, cache=True)
def _rows_pass(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b.T for m <= MAX_ROWS rows of a (out may be a block of rows of a larger out)."""
    m, k = a.shape
    n = b.shape[0]
    vectors = (m + LANES - 1) // LANES
    if vectors == 3:
        vectors = 4  # (a tile of 3 vectors would want a kernel of its own)
    width = vectors * LANES
    at = np.zeros(k * width, np.float32)  # a.T, its rows padded to whole vectors
    for i in range(m):
        for p in range(k):
            at[p * width + i] = a[i, p]
    rows = 8 if vectors < 4 else 4  # b rows a tile takes: 16 accumulators (8 with one vector)
    tile = np.empty(rows * width, np.float32)
    n_tiled = n - n % rows
    fb = b.reshape(-1)
    for j in range(0, n_tiled, rows):
        next_rows = min(rows, n - j - rows)  # (none after the last tile)
        if vectors == 1:
            _lanes1(at, b, fb, tile, j, next_rows)
        elif vectors == 2:
            _lanes2(at, b, fb, tile, j, next_rows)
        else:
            _lanes4(at, b, tile, j)
        for t in range(rows):
            for i in range(m):
                out[i, j + t] = tile[t * width + i]
    for j in range(n_tiled, n):
        _lane1(at, b, tile, j, width)
        for i in range(m):
            out[i, j] = tile[i]
