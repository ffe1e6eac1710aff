"""Locally connected 2-D layer (DistBelief's layer: unshared weights at every output location).

The ops work in HWCN layout (batch last, as cuda-convnet did): the patch of one output
location is `kh` contiguous runs of `kw * C * N` values, and each location is one BLAS gemm
straight into its contiguous (F, N) block of the output.

    x:  (H, W, C, N)           w: (OH, OW, F, KH * KW * C), K ordered (kh, kw, c)
    y:  (OH, OW, F, N)         y[oh, ow] = w[oh, ow] @ patch(oh, ow)   (patch is (K, N))

Padding is zeros and is handled inside the kernels (the clipped part of a patch row is zeroed),
so no padded copy of the input is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from graphflow.ops.registry import Cost, Spec, apply, expect_ndim, fmt, register, same_float_dtype
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape

Grads = Sequence[Node | None]


# -- kernels -----------------------------------------------------------------------------------
#
# Each location is computed by BLAS gemm calls on raw strided blocks of the flat HWCN arrays.
# "direct" mode makes one gemm per patch row straight from / into the input rows (no patch
# copy at all: best when a row, kw * C values, is long); otherwise the patch is gathered into a
# (K, N) buffer and one gemm covers the location.

def gemm(ta: int, tb: int, m: int, n: int, k: int, a: np.ndarray, lda: int, b: np.ndarray,
         ldb: int, beta: np.ndarray, c: np.ndarray, ldc: int) -> None:
    """Row-major c[:m, :n] = op(a) @ op(b) + beta * c on flat arrays (jitted code only)."""
    raise NotImplementedError("gemm is only callable from jitted kernels")


@overload(gemm, jit_options={"cache": True, "nogil": True})
def _gemm_impl(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
    ensure_blas()
    xxgemm = _BLAS().numba_xxgemm(a.dtype)
    kind = ord(get_blas_kind(a.dtype, "gemm"))

    def impl(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
        # BLAS is column-major: row-major C = A B is column-major C^T = B^T A^T.
        one = np.ones(1, c.dtype)
        xxgemm(kind, tb, ta, n, m, k, one.ctypes, b.ctypes, ldb, a.ctypes, lda, beta.ctypes,
               c.ctypes, ldc)
    return impl


NT, TR = ord("n"), ord("t")


@njit(cache=True, nogil=True, inline="always")
def _row_span(h0: int, w0: int, i: int, H: int, W: int, kw: int) -> tuple[int, int, int]:
    """Patch row i of the window at (h0, w0): (input row or -1, first valid col, end col)."""
    h = h0 + i
    if h < 0 or h >= H:
        return -1, 0, 0
    return h, max(w0, 0), min(w0 + kw, W)


@njit(cache=True, nogil=True)
def gather_patch(xf: np.ndarray, H: int, W: int, CN: int, h0: int, w0: int, kh: int, kw: int,
                 pf: np.ndarray) -> None:
    """pf (flat (K, N) patch) <- the kh x kw window at (h0, w0) of flat HWCN xf, zero outside."""
    seg = kw * CN
    for i in range(kh):
        base = i * seg
        h, lo, hi = _row_span(h0, w0, i, H, W, kw)
        if h < 0 or hi <= lo:
            pf[base:base + seg] = 0
            continue
        a = base + (lo - w0) * CN
        b = base + (hi - w0) * CN
        pf[base:a] = 0
        src = (h * W + lo) * CN
        pf[a:b] = xf[src:src + b - a]
        pf[b:base + seg] = 0


@njit(cache=True, nogil=True)
def scatter_patch(pf: np.ndarray, H: int, W: int, CN: int, h0: int, w0: int, kh: int, kw: int,
                  xf: np.ndarray) -> None:
    """flat HWCN xf += the flat (K, N) patch pf at window (h0, w0); the outside is dropped."""
    seg = kw * CN
    for i in range(kh):
        h, lo, hi = _row_span(h0, w0, i, H, W, kw)
        if h < 0 or hi <= lo:
            continue
        a = i * seg + (lo - w0) * CN
        dst = (h * W + lo) * CN
        for j in range((hi - lo) * CN):
            xf[dst + j] += pf[a + j]
