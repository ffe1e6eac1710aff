"""out = a.T @ b over a short inner dimension: a dense layer's weight gradient, x.T @ dy, summed
over a batch or a micro-batch of rows.

BLAS runs this as any gemm: it scales out by beta in a pass of its own, then reads and writes
out again to add the product, three passes over an out that is far larger than a and b (at 16
rows, 26 MB of out against 330 KB of inputs). Here each 4 x 64 tile of out is summed in 16
vector registers over the whole inner dimension and written once (read once more only to
accumulate), while a's columns and a chunk of b's columns stay in L1 and L2. One core,
float32, out 2560 x 2560: 1.5 / 2.9 / 5.0 ms at 16 / 32 / 64 rows, where BLAS takes 3.0 /
4.5 / 7.6; 2560 x 8192 at 64 rows: 15 ms against 23 (12.6 since b's chunk is copied first,
see `matmul_tn`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from graphflow.ops import rules, simd
from graphflow.ops.simd import prefetch, vfma, vload, vsplat, vstore4, vzero

MAX_DEPTH = 256   # measured gains: 2x at 16 rows, 1.5x at 64, 1.2x at 256, 1.1x at 512
MIN_COLS = 64     # out's columns go in tiles of PANEL
NARROW_DEPTH = 8  # without AVX-512 (simd.WIDE) it wins only over a few rows, into a large out:
NARROW_OUT = 1 << 21  # 1.6-2.0x at 4 rows, 1.0-1.1x at 8, from 2M elements of out; 0.6-1.4x below
PANEL = 64        # out columns a tile holds: 4 vectors of 16 float32
CHUNK_BYTES = 1 << 17  # b is taken a chunk of columns at a time, this many bytes (in L2)


def wins(m: int, n: int, k: int) -> bool:
    """Whether `matmul_tn` beats BLAS for out (m, n) = a.T @ b with a (k, m), b (k, n)."""
    if not simd.WIDE and (k > NARROW_DEPTH or m * n < NARROW_OUT):
        return False
    return 0 < k <= MAX_DEPTH and m >= 4 and n >= MIN_COLS


@njit(nogil=True, cache=True, inline="always")
def _tile(a: np.ndarray, b: np.ndarray, o: np.ndarray, i: int, m: int, k: int,
          accumulate: bool, b_at: int, o_at: int, o_stride: int) -> None:
    """The 4 x 64 tile of flat o at o_at, rows o_stride apart, (+)= a[:, i:i+4].T @ b's panel
    (a flat, m columns; the panel's k rows of 64 lie one after another in flat b from b_at:
    `_pack`)."""
    rows = (o_at, o_at + o_stride, o_at + 2 * o_stride, o_at + 3 * o_stride)
    if accumulate:  # the tile's lines come in while the sums run, and are read after them
        for r in rows:  # (asked for earlier, or read first, both measured slower: 1.3-1.6x)
            for line in range(0, PANEL, 16):
                prefetch(o, r + line)
    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = vzero()
    c20 = c21 = c22 = c23 = c30 = c31 = c32 = c33 = vzero()
    for p in range(k):
        q, s = b_at + p * PANEL, p * m + i
        b0, b1, b2, b3 = vload(b, q), vload(b, q + 16), vload(b, q + 32), vload(b, q + 48)
        x = vsplat(a[s])
        c00, c01, c02, c03 = vfma(x, b0, c00), vfma(x, b1, c01), vfma(x, b2, c02), vfma(x, b3, c03)
        x = vsplat(a[s + 1])
        c10, c11, c12, c13 = vfma(x, b0, c10), vfma(x, b1, c11), vfma(x, b2, c12), vfma(x, b3, c13)
        x = vsplat(a[s + 2])
        c20, c21, c22, c23 = vfma(x, b0, c20), vfma(x, b1, c21), vfma(x, b2, c22), vfma(x, b3, c23)
        x = vsplat(a[s + 3])
        c30, c31, c32, c33 = vfma(x, b0, c30), vfma(x, b1, c31), vfma(x, b2, c32), vfma(x, b3, c33)
    for r, c0, c1, c2, c3 in zip(rows, (c00, c10, c20, c30), (c01, c11, c21, c31),
                                 (c02, c12, c22, c32), (c03, c13, c23, c33)):
        _put(o, r, c0, c1, c2, c3, accumulate)


@njit(nogil=True, cache=True, inline="always")
def _put(o: np.ndarray, r: int, c0: Any, c1: Any, c2: Any, c3: Any, accumulate: bool) -> None:
    """o[r:r+64] = (c0, c1, c2, c3), or += them."""
    if accumulate:  # (1 * x + c rounds once: the same as x + c)
        one = vsplat(np.float32(1))
        c0, c1 = vfma(one, vload(o, r), c0), vfma(one, vload(o, r + 16), c1)
        c2, c3 = vfma(one, vload(o, r + 32), c2), vfma(one, vload(o, r + 48), c3)
    vstore4(o, r, c0, c1, c2, c3)


@njit(nogil=True, cache=True, inline="always")
def _row(a: np.ndarray, b: np.ndarray, o: np.ndarray, i: int, m: int, k: int,
         accumulate: bool, b_at: int, o_at: int) -> None:
    """o[o_at:o_at+64] (+)= a[:, i] @ b's panel (as `_tile`): the rows below the last whole 4."""
    c0 = c1 = c2 = c3 = vzero()
    for p in range(k):
        q, x = b_at + p * PANEL, vsplat(a[p * m + i])
        c0, c1 = vfma(x, vload(b, q), c0), vfma(x, vload(b, q + 16), c1)
        c2, c3 = vfma(x, vload(b, q + 32), c2), vfma(x, vload(b, q + 48), c3)
    _put(o, o_at, c0, c1, c2, c3, accumulate)


@njit(nogil=True, cache=True)
def _pack(b: np.ndarray, n: int, k: int, j0: int, j1: int, out: np.ndarray) -> None:
    """Copy b's columns j0:j1 (flat b, n columns, k rows) into `out` panel by panel, each
    panel's rows one after another."""
    for p in range(k):
        s, q = p * n + j0, p * PANEL
        for _ in range(j0, j1, PANEL):
            vstore4(out, q, vload(b, s), vload(b, s + 16), vload(b, s + 32), vload(b, s + 48))
            s, q = s + PANEL, q + k * PANEL


def matmul_tn(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool) -> int:
    """out[:, :c] = a.T @ b[:, :c], or with `accumulate` out[:, :c] += ..., for C-contiguous
    float32 a (k, m), b (k, n), out (m, n), where c is n rounded down to whole 64-column
    panels; returns c (the caller does the rest). Row blocks of out run along a chunk of b's
    columns, so out is written a few rows at a time, front to back.

    The chunk is copied first, panel by panel (`_pack`): every row block reads each panel,
    and in b its rows lie a row of b apart, 32 KB for an 8192-wide layer, where they share a
    few cache sets (how few depends on where a process's pages fell). Read from b, the 2560 x
    8192 weight gradient over 64 rows took 15.6-19.9 ms in eight worker processes, copied
    12.7-13.1 (in one process, interleaved: 15.7 against 12.6; 2560 x 2560, 4.6 against 4.0)."""
    none = out.reshape(-1)[:0]
    return _tn(a, b, out, accumulate, -1, none, none, 0.0, 0.0, 0.0, 0.0)


def matmul_tn_update(a: np.ndarray, b: np.ndarray, p: np.ndarray, rule: int, s: np.ndarray,
                     y: np.ndarray, lr: float, mu: float, eps: float, scale: float) -> None:
    """Update p (m, n) by `rule` (ops/rules.py, with its state s) from the gradient
    `scale * (a.T @ b + y)` (y: a sum over earlier micro-batches, or empty): each 4 rows of
    the product, over a chunk of columns, go to the rule while they are in L1, so the product
    is never written out and read back (two passes over an array as large as p). For
    C-contiguous float32 a (k, m), b (k, n), p (m, n), n whole 64-column panels."""
    if b.shape[1] % PANEL or not wins(*p.shape, a.shape[0]):
        raise ValueError(f"matmul_tn_update: no tiles for a product {p.shape} over "
                         f"{a.shape[0]} rows")
    _tn(a, b, p, False, rule, s.reshape(-1), y.reshape(-1), lr, mu, eps, scale)


# error_model="numpy": the update rules divide (ops/rules.py)
@njit(nogil=True, cache=True, error_model="numpy")
def _tn(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool, rule: int,
        s: np.ndarray, y: np.ndarray, lr: float, mu: float, eps: float, scale: float) -> int:
    """`matmul_tn` (rule < 0), or `matmul_tn_update` with out as p."""
    k, m = a.shape
    n = b.shape[1]
    c = n - n % PANEL
    m4 = m - m % 4
    flat_a, flat_b, flat_out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    chunk = max(PANEL, CHUNK_BYTES // (4 * max(k, 1)) // PANEL * PANEL)
    panels = np.empty(k * min(chunk, c), np.float32)
    rows = np.empty(4 * min(chunk, c), np.float32)  # a row block on its way to the rule (L1)
    for j0 in range(0, c, chunk):
        j1 = min(c, j0 + chunk)
        _pack(flat_b, n, k, j0, j1, panels)
        w = j1 - j0
        for i in range(0, m4, 4):
            for j in range(j0, j1, PANEL):
                if rule < 0:
                    _tile(flat_a, panels, flat_out, i, m, k, accumulate, (j - j0) * k,
                          i * n + j, n)
                else:
                    _tile(flat_a, panels, rows, i, m, k, False, (j - j0) * k, j - j0, w)
                    if i + 4 < m4:  # the next row block's part of p, for its rule
                        for r in range(4):
                            for line in range(0, PANEL, 16):
                                prefetch(flat_out, (i + 4 + r) * n + j + line)
                                if y.size:
                                    prefetch(y, (i + 4 + r) * n + j + line)
            if rule >= 0:  # (a call per tile's row of 64 instead: 1.7-3.5x slower)
                for r in range(4):
                    rules.run(rule, flat_out, s, rows, r * w, y, (i + r) * n + j0, w, lr, mu,
                              eps, scale)
        for i in range(m4, m):
            for j in range(j0, j1, PANEL):
                if rule < 0:
                    _row(flat_a, panels, flat_out, i, m, k, accumulate, (j - j0) * k, i * n + j)
                else:
                    _row(flat_a, panels, rows, i, m, k, False, (j - j0) * k, j - j0)
            if rule >= 0:
                rules.run(rule, flat_out, s, rows, 0, y, i * n + j0, w, lr, mu, eps, scale)
    return c
