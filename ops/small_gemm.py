"""A few rows of `a` against a large `b`: a @ b.T and a @ b without packing `b`.

OpenBLAS packs the whole of `b` on every call, so for a few rows against a large weight (a
dense layer on a micro-batch of 16) the packing costs as much as the multiply. Here:

- `matmul_nt`, out = a @ b.T (a dense layer's backward, dx = dy @ w.T) in any float dtype:
  both operands are read along their rows, 4 rows of `a` against 4 rows of `b`: 16 dot
  products that LLVM vectorises and keeps in registers. float32 goes to `lane_gemm` instead,
  1.5-1.8x faster (the rows in a vector's lanes, no dot products to sum up).
- `matmul_nn`, out = a @ b (the forward, y = x @ w): 4 rows of `out` by 64 columns stay in
  16 vector registers (`simd`) while the kernel walks down `b`'s rows, a block of `b` at a
  time that stays in L2 while every row block of `a` passes over it, and a later block is
  prefetched meanwhile. Same shapes: 74 / 79 GFLOP/s at 16 / 64 rows (46 / 68 without the
  prefetch, in the same run), where BLAS runs 45 / 82. `matmul_nn_copied` reads a copy of
  each panel in L1 instead, where b's rows would share cache sets: 200 GFLOP/s at 64 rows.

BLAS wins again from ~128 rows, and at any rows on a CPU without AVX-512: see `wins`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphflow.ops import simd
from graphflow.ops.simd import LANES, prefetch, vfma, vload, vsplat, vstore4

# reassociation lets LLVM vectorise the sums; NaN and inf keep their IEEE meaning
_FAST = {"reassoc", "contract", "nsz"}
MAX_ROWS = 64     # measured crossovers: 64 rows still wins by 1.1-1.5x, 128 ties, 256 loses
NARROW_ROWS = 0   # without AVX-512 (simd.WIDE) numpy's OpenBLAS wins from the first row:
                  # ours ran 0.46-1.06x its speed at 4 rows, 0.43-0.69x at 8 (SciPy's: 0.9-1.8x)
MIN_DEPTH = 256   # shorter dot products leave BLAS ahead (k = 64: 0.8x)
MIN_COLS = 64     # a few output columns (a 10-way classifier) leave BLAS ahead
PANEL = 64        # output columns a `matmul_nn` tile holds: 4 vectors of 16 float32
CHUNK_COLS = 1024  # `matmul_nn` works on b in blocks of BLOCK_ROWS x CHUNK_COLS (512 KB) and
BLOCK_ROWS = 128   # out in chunks of CHUNK_COLS columns (<= 256 KB): both stay in a core's
                   # 1 MB L2. Whole-width blocks let a wide b's out spill (2560 x 8192 at 64
                   # rows: 63 GFLOP/s, against 80 in chunks; 2560-wide b alike, 89-90)
KEEP_ROWS = 64     # `matmul_nn_copied` from this many rows, where b's rows are a multiple
ALIASED_BYTES = 4096  # of this apart (`copies`)
AHEAD = 3          # `matmul_nn` prefetches the b panel it takes this many panels later


def row_limit() -> int:
    """The most rows of `a` for which these kernels can beat BLAS on this CPU."""
    return MAX_ROWS if simd.WIDE else NARROW_ROWS


def wins(m: int, n: int, k: int) -> bool:
    """Whether these kernels beat BLAS for out (m, n) = a (m, k) @ op(b): few rows, long dot
    products, many columns (measured alike for `matmul_nt` and `matmul_nn`)."""
    return 0 < m <= row_limit() and k >= MIN_DEPTH and n >= MIN_COLS


@njit(fastmath=_FAST, nogil=True, cache=True, inline="always")
def _tile4x4(a: np.ndarray, b: np.ndarray, out: np.ndarray, i: int, j: int, zero: float) -> None:
    s00 = s01 = s02 = s03 = zero
    s10 = s11 = s12 = s13 = zero
    s20 = s21 = s22 = s23 = zero
    s30 = s31 = s32 = s33 = zero
    for k in range(a.shape[1]):
        a0, a1, a2, a3 = a[i, k], a[i + 1, k], a[i + 2, k], a[i + 3, k]
        b0, b1, b2, b3 = b[j, k], b[j + 1, k], b[j + 2, k], b[j + 3, k]
        s00 += a0 * b0
        s01 += a0 * b1
        s02 += a0 * b2
        s03 += a0 * b3
        s10 += a1 * b0
        s11 += a1 * b1
        s12 += a1 * b2
        s13 += a1 * b3
        s20 += a2 * b0
        s21 += a2 * b1
        s22 += a2 * b2
        s23 += a2 * b3
        s30 += a3 * b0
        s31 += a3 * b1
        s32 += a3 * b2
        s33 += a3 * b3
    out[i, j], out[i, j + 1], out[i, j + 2], out[i, j + 3] = s00, s01, s02, s03
    out[i + 1, j], out[i + 1, j + 1], out[i + 1, j + 2], out[i + 1, j + 3] = s10, s11, s12, s13
    out[i + 2, j], out[i + 2, j + 1], out[i + 2, j + 2], out[i + 2, j + 3] = s20, s21, s22, s23
    out[i + 3, j], out[i + 3, j + 1], out[i + 3, j + 2], out[i + 3, j + 3] = s30, s31, s32, s33


@njit(fastmath=_FAST, nogil=True, cache=True, inline="always")
def _tile1x4(a: np.ndarray, b: np.ndarray, out: np.ndarray, i: int, j: int, zero: float) -> None:
    s0 = s1 = s2 = s3 = zero
    for k in range(a.shape[1]):
        x = a[i, k]
        s0 += x * b[j, k]
        s1 += x * b[j + 1, k]
        s2 += x * b[j + 2, k]
        s3 += x * b[j + 3, k]
    out[i, j], out[i, j + 1], out[i, j + 2], out[i, j + 3] = s0, s1, s2, s3


@njit(fastmath=_FAST, nogil=True, cache=True, inline="always")
def _dot(a: np.ndarray, b: np.ndarray, i: int, j: int, zero: float) -> float:
    s = zero
    for k in range(a.shape[1]):
        s += a[i, k] * b[j, k]
    return s


@njit(fastmath=_FAST, nogil=True, cache=True)
def matmul_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, zero: float) -> None:
    """out (m, n) = a (m, k) @ b (n, k).T for C-contiguous 2-D arrays of one float dtype;
    `zero` is 0 of that dtype (the sums' type). Column blocks outermost: `b` streams once."""
    m, n = out.shape
    m4, n4 = m - m % 4, n - n % 4
    for j in range(0, n4, 4):
        for i in range(0, m4, 4):
            _tile4x4(a, b, out, i, j, zero)
        for i in range(m4, m):
            _tile1x4(a, b, out, i, j, zero)
    for j in range(n4, n):
        for i in range(m):
            out[i, j] = _dot(a, b, i, j, zero)


@njit(nogil=True, cache=True, inline="always")
def _nn_rows4(a: np.ndarray, b: np.ndarray, o: np.ndarray, i: int, j: int, n: int, k0: int,
              k1: int, b_at: int, b_step: int, ahead: int) -> None:
    """o[i:i+4, j:j+64] += a[i:i+4, k0:k1] @ b's panel (o flat, n columns; b flat, row p of
    the panel at b_at + p * b_step: a row of b, or of a packed copy, ops/packed_gemm.py); on
    the way, the cache line `ahead` floats on from each row goes to L2."""
    last = b.size - 1
    r0, r1, r2, r3 = i * n + j, (i + 1) * n + j, (i + 2) * n + j, (i + 3) * n + j
    c00, c01, c02, c03 = vload(o, r0), vload(o, r0 + 16), vload(o, r0 + 32), vload(o, r0 + 48)
    c10, c11, c12, c13 = vload(o, r1), vload(o, r1 + 16), vload(o, r1 + 32), vload(o, r1 + 48)
    c20, c21, c22, c23 = vload(o, r2), vload(o, r2 + 16), vload(o, r2 + 32), vload(o, r2 + 48)
    c30, c31, c32, c33 = vload(o, r3), vload(o, r3 + 16), vload(o, r3 + 32), vload(o, r3 + 48)
    for p in range(k0, k1):
        q = b_at + p * b_step
        prefetch(b, min(q + ahead, last))
        b0, b1, b2, b3 = vload(b, q), vload(b, q + 16), vload(b, q + 32), vload(b, q + 48)
        x = vsplat(a[i, p])
        c00, c01, c02, c03 = vfma(x, b0, c00), vfma(x, b1, c01), vfma(x, b2, c02), vfma(x, b3, c03)
        x = vsplat(a[i + 1, p])
        c10, c11, c12, c13 = vfma(x, b0, c10), vfma(x, b1, c11), vfma(x, b2, c12), vfma(x, b3, c13)
        x = vsplat(a[i + 2, p])
        c20, c21, c22, c23 = vfma(x, b0, c20), vfma(x, b1, c21), vfma(x, b2, c22), vfma(x, b3, c23)
        x = vsplat(a[i + 3, p])
        c30, c31, c32, c33 = vfma(x, b0, c30), vfma(x, b1, c31), vfma(x, b2, c32), vfma(x, b3, c33)
    for r, c0, c1, c2, c3 in ((r0, c00, c01, c02, c03), (r1, c10, c11, c12, c13),
                              (r2, c20, c21, c22, c23), (r3, c30, c31, c32, c33)):
        vstore4(o, r, c0, c1, c2, c3)


@njit(nogil=True, cache=True, inline="always")
def _copy_panel(b: np.ndarray, j: int, n: int, k0: int, k1: int, later: int,
                out: np.ndarray) -> None:
    """Copy the panel's rows k0:k1 of flat b (n columns, from column j) into `out`, one after
    another, asking for all 4 lines of each row of the panel `later` floats on."""
    last = b.size - 1
    for p in range(k0, k1):
        q = p * n + j
        for line in range(0, PANEL, LANES):
            prefetch(b, min(q + later + line, last))
        vstore4(out, (p - k0) * PANEL, vload(b, q), vload(b, q + 16), vload(b, q + 32),
                vload(b, q + 48))


@njit(nogil=True, cache=True, inline="always")
def _nn_row1(a: np.ndarray, b: np.ndarray, out: np.ndarray, i: int, j: int, n: int, k0: int,
             k1: int, b_at: int, b_step: int) -> None:
    """out[i, j:j+64] += a[i, k0:k1] @ b's panel (as `_nn_rows4`)."""
    r = i * n + j
    c0, c1, c2, c3 = vload(out, r), vload(out, r + 16), vload(out, r + 32), vload(out, r + 48)
    for p in range(k0, k1):
        q = b_at + p * b_step
        x = vsplat(a[i, p])
        c0, c1 = vfma(x, vload(b, q), c0), vfma(x, vload(b, q + 16), c1)
        c2, c3 = vfma(x, vload(b, q + 32), c2), vfma(x, vload(b, q + 48), c3)
    vstore4(out, r, c0, c1, c2, c3)


@njit(nogil=True, cache=True, inline="always")
def _later_panel(j0: int, k0: int, j: int, c: int, k: int) -> tuple[int, int]:
    """(first row, first column) of the b panel `matmul_nn` takes AHEAD panels after the one
    at (k0, j) in chunk j0; the same panel where none is left."""
    k_at, j_at = k0, j
    for _ in range(AHEAD):
        j += PANEL
        if j >= min(c, j0 + CHUNK_COLS):
            j, k0 = j0, k0 + BLOCK_ROWS
            if k0 >= k:
                j0, k0 = j0 + CHUNK_COLS, 0
                j = j0
                if j0 >= c:
                    return k_at, j_at
    return k0, j


@njit(nogil=True, cache=True)
def matmul_nn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """out[:, :c] = a (m, k) @ b (k, n)[:, :c] for C-contiguous 2-D float32 arrays, where c is
    n rounded down to whole 64-column panels; returns c (the caller does the rest).

    b's panel rows lie a row of b apart, too far for the hardware prefetcher: while one panel
    is multiplied, each row block pulls one line a row of a later panel into L2 (4 row blocks
    cover its 4 lines). At 16 / 32 / 64 rows against 2560 x 8192 that measured 1.5 / 1.3 /
    1.1x faster (median of 21 paired runs; one panel ahead was slower, two to eight alike).
    """
    m, k = a.shape
    n = b.shape[1]
    c = n - n % PANEL
    m4 = m - m % 4
    flat_b, flat_out = b.reshape(-1), out.reshape(-1)
    out[:, :c] = 0
    for j0 in range(0, c, CHUNK_COLS):
        j1 = min(c, j0 + CHUNK_COLS)
        for k0 in range(0, k, BLOCK_ROWS):
            k1 = min(k, k0 + BLOCK_ROWS)
            for j in range(j0, j1, PANEL):
                k_next, j_next = _later_panel(j0, k0, j, c, k)
                later = (k_next - k0) * n + j_next - j  # the later panel, from this one
                for i in range(0, m4, 4):
                    line = (i // 4) % (PANEL // LANES) * LANES
                    _nn_rows4(a, flat_b, flat_out, i, j, n, k0, k1, j, n, later + line)
                for i in range(m4, m):
                    _nn_row1(a, flat_b, flat_out, i, j, n, k0, k1, j, n)
    return c


def copies(m: int, n: int) -> bool:
    """Whether `matmul_nn_copied` beats `matmul_nn` for out (m, n): many rows, and b's rows a
    multiple of 4 KB apart, so that a panel's rows share a few cache sets."""
    return m >= KEEP_ROWS and (4 * n) % ALIASED_BYTES == 0


@njit(nogil=True, cache=True)
def matmul_nn_copied(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """`matmul_nn`, but each panel of b is first copied into `kept` (32 KB, in L1; the copy
    asks for all 4 lines of each row of the later panel), and the row blocks read the copy.

    A 2560 x 8192 b's panel rows lie 32 KB apart, so they share a few cache sets, and how few
    depends on where a process's pages fell: at 64 rows, `matmul_nn`'s 16 row blocks each
    reading b ran 16-28 ms in six worker processes, reading the copy 13.4-16.8 (15.7-16.1
    against 13.4 in one process). Where the copy does not pay (`copies`): at 32 rows it was no
    faster against 2560 x 8192, and against 2560 x 2560 (rows 10 KB apart) 2-10% slower.
    """
    m, k = a.shape
    n = b.shape[1]
    c = n - n % PANEL
    m4 = m - m % 4
    flat_b, flat_out = b.reshape(-1), out.reshape(-1)
    kept = np.empty(BLOCK_ROWS * PANEL, np.float32)
    out[:, :c] = 0
    for j0 in range(0, c, CHUNK_COLS):
        for k0 in range(0, k, BLOCK_ROWS):
            k1 = min(k, k0 + BLOCK_ROWS)
            for j in range(j0, min(c, j0 + CHUNK_COLS), PANEL):
                k_next, j_next = _later_panel(j0, k0, j, c, k)
                _copy_panel(flat_b, j, n, k0, k1, (k_next - k0) * n + j_next - j, kept)
                for i in range(0, m4, 4):
                    _nn_rows4(a, kept, flat_out, i, j, n, k0, k1, -k0 * PANEL, PANEL, 0)
                for i in range(m4, m):
                    _nn_row1(a, kept, flat_out, i, j, n, k0, k1, -k0 * PANEL, PANEL)
    return c
