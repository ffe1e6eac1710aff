"""out = a @ b.T for a few rows of `a`, as register-tiled dot products (no packing).

OpenBLAS packs the whole of `b` on every call, so for a few rows against a large weight (a
dense layer's backward pass at a micro-batch of 16: dx = dy @ w.T) the packing costs as much
as the multiply. Both operands are read along their rows here, 4 rows of `a` against 4 rows of
`b` at a time: 16 dot products share 8 loads per step of k and stay in vector registers.
On this machine (one core, float32, k = n = 2560) it runs 55 / 91 GFLOP/s at 16 / 64 rows
where BLAS runs 32 / 59, and BLAS wins again from ~128 rows: see `wins`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# reassociation lets LLVM vectorise the sums; NaN and inf keep their IEEE meaning
_FAST = {"reassoc", "contract", "nsz"}
MAX_ROWS = 64     # measured crossovers: 64 rows still wins by 1.1-1.5x, 128 ties, 256 loses
MIN_DEPTH = 256   # shorter dot products leave BLAS ahead (k = 64: 0.8x)
MIN_COLS = 64     # a few output columns (a 10-way classifier) leave BLAS ahead


def wins(m: int, n: int, k: int) -> bool:
    """Whether `matmul_nt` beats BLAS for out (m, n) = a (m, k) @ b (n, k).T."""
    return m <= MAX_ROWS and k >= MIN_DEPTH and n >= MIN_COLS


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
