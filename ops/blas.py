"""BLAS gemm callable from @njit kernels on flat arrays with explicit leading dimensions.

numba's `np.dot` only takes whole 2-D arrays; the locally connected and conv kernels multiply
sub-blocks of flat buffers (one output location, one patch row), so they call gemm directly.

Which BLAS: numpy's own where its wheel ships one (scipy-openblas64, OpenBLAS 0.3.31 here),
else SciPy's, the one numba's `np.dot` binds. On this AVX2 VM numpy's ran lc-large's
per-location gemms 14-28% faster and a dense layer's at 32 rows 25-35% faster than SciPy's
0.3.30. Kernels call the symbol `graphflow_<s|d>gemm` (CBLAS's row-major gemm, 64-bit
integers); this module points it at numpy's function, or at a shim over SciPy's, when it is
imported. Compiled kernels name only the symbol, so Numba's cache stays valid either way.
GRAPHFLOW_NUMPY_BLAS=0 takes SciPy's (to compare, or where numpy's misbehaves).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llvmlite.binding as ll
import numpy as np
from numba import cfunc, types
from numba.extending import overload
from numba.np.linalg import _BLAS, ensure_blas
from numba.np.numpy_support import as_dtype, from_dtype

NT, TR = ord("n"), ord("t")  # op(a) = a, op(a) = a.T
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enums
_SYMBOLS = {np.float32: "graphflow_sgemm", np.float64: "graphflow_dgemm"}
_NUMPY_NAMES = {np.float32: "scipy_cblas_sgemm64_", np.float64: "scipy_cblas_dgemm64_"}


def _signature(dtype: type) -> types.Type:
    real = from_dtype(np.dtype(dtype))
    ptr = types.CPointer(real)
    i32, i64 = types.int32, types.int64
    return types.void(i32, i32, i32, i64, i64, i64, real, ptr, i64, ptr, i64, real, ptr, i64)


def _numpy_openblas() -> ctypes.CDLL | None:
    """The OpenBLAS numpy's wheel ships (Linux, Windows: numpy.libs; macOS: numpy/.dylibs),
    if it has CBLAS's gemm with 64-bit integers; else None."""
    here = Path(np.__file__).parent
    for path in sorted([*here.parent.glob("numpy.libs/*openblas64*"),
                        *here.glob(".dylibs/*openblas64*")]):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        if all(hasattr(lib, name) for name in _NUMPY_NAMES.values()):
            return lib
    return None


def _scipy_gemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN201
    """CBLAS's row-major gemm over SciPy's BLAS (jitted code only): numba's binding is
    column-major, so it computes C^T = op(B)^T op(A)^T."""
    raise TypeError("_scipy_gemm runs only inside jitted code")


@overload(_scipy_gemm, jit_options={"cache": True})
def _scipy_gemm_impl(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
    ensure_blas()
    xxgemm = _BLAS().numba_xxgemm(a.dtype)
    dtype = as_dtype(a.dtype)
    kind, no, yes = (np.int8(ord(ch)) for ch in ("s" if dtype == np.float32 else "d", "n", "t"))

    def impl(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
        scalars = np.empty(2, dtype)
        scalars[0], scalars[1] = alpha, beta
        xxgemm(kind, no if tb == NO_TRANS else yes, no if ta == NO_TRANS else yes, n, m, k,
               scalars.ctypes, b, ldb, a, lda, scalars[1:].ctypes, c, ldc)
    return impl


def _scipy_shim(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN201
    """A C function (`cfunc`, one per dtype, cached: compiled once, not at every start)."""
    _scipy_gemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


def _bind() -> str:
    """Point each `_SYMBOLS` entry at a gemm; returns whose (numpy's or SciPy's)."""
    lib = None if os.environ.get("GRAPHFLOW_NUMPY_BLAS") == "0" else _numpy_openblas()
    for dtype, symbol in _SYMBOLS.items():
        if lib is not None:
            address = ctypes.cast(getattr(lib, _NUMPY_NAMES[dtype]), ctypes.c_void_p).value
        else:
            address = cfunc(_signature(dtype), cache=True)(_scipy_shim).address
        ll.add_symbol(symbol, address)
    return "numpy" if lib is not None else "scipy"


BLAS = _bind()


def gemm(ta: int, tb: int, m: int, n: int, k: int, a: np.ndarray, lda: int, b: np.ndarray,
         ldb: int, beta: np.ndarray, c: np.ndarray, ldc: int) -> None:
    """Row-major c[:m, :n] = op(a) @ op(b) + beta[0] * c on flat arrays (jitted code only)."""
    raise TypeError("gemm runs only inside @njit kernels")


@overload(gemm, jit_options={"cache": True, "nogil": True})
def _gemm_impl(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
    dtype = np.dtype(str(a.dtype)).type
    call = types.ExternalFunction(_SYMBOLS[dtype], _signature(dtype))
    one = dtype(1)

    def impl(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # noqa: ANN001, ANN202
        call(ROW_MAJOR, NO_TRANS if ta == NT else TRANS, NO_TRANS if tb == NT else TRANS,
             m, n, k, one, a.ctypes, lda, b.ctypes, ldb, beta[0], c.ctypes, ldc)
    return impl
