"""BLAS gemm callable from @njit kernels on flat arrays with explicit leading dimensions.

numba's `np.dot` only takes whole 2-D arrays; the locally connected and conv kernels multiply
sub-blocks of flat buffers (one output location, one patch row), so they call gemm directly
through numba's own binding to SciPy's BLAS (`numba.np.linalg`, the code behind `np.dot`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import overload
from numba.np.linalg import _BLAS, ensure_blas, get_blas_kind

NT, TR = ord("n"), ord("t")  # op(a) = a, op(a) = a.T


def gemm(ta: int, tb: int, m: int, n: int, k: int, a: np.ndarray, lda: int, b: np.ndarray,
         ldb: int, beta: np.ndarray, c: np.ndarray, ldc: int) -> None:
    """Row-major c[:m, :n] = op(a) @ op(b) + beta[0] * c on flat arrays (jitted code only)."""
    raise TypeError("gemm runs only inside @njit kernels")


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
