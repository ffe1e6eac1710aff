"""Matrix multiply: matmul(a, b) = op(a) @ op(b), op = identity or transpose (attrs transpose_a/b).

Two BLAS routes, picked per transpose pattern by measurement (64 x 2560 x 8192 float32, one
thread): OpenBLAS 0.3.31 bundled with NumPy is ~20% faster than SciPy's 0.3.30 (which numba's
`np.dot` calls) on a @ b and as fast on a @ b.T, while SciPy's is ~10% faster on a.T @ b (the
weight gradient). So a @ op(b) calls NumPy's `cblas_?gemm` through an external symbol, and
a.T @ op(b) (and everything when that library is not found) calls `np.dot` inside njit on
transposed views, which BLAS reads in place (F-contiguous operands are not copied).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit, types

from graphflow.errors import ShapeError
from graphflow.ir import Node
from graphflow.ops.registry import Cost, Spec, apply, expect_ndim, fmt, register, same_float_dtype

Grads = Sequence[Node | None]


@njit(cache=True, nogil=True)
def dot_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b; a and b may be C- or F-contiguous (transposed views), out is C-contiguous."""
    np.dot(a, b, out)


def _load_numpy_cblas() -> tuple[Any, Any] | None:
    """NumPy's bundled OpenBLAS cblas_sgemm / cblas_dgemm (ILP64) as numba external functions."""
    site = os.path.dirname(os.path.dirname(np.__file__))
    libs = sorted(glob.glob(os.path.join(site, "numpy.libs", "libscipy_openblas64_*.so")))
    if not libs:
        return None
    try:
        from llvmlite import binding

        binding.load_library_permanently(libs[0])
        if not binding.address_of_symbol("scipy_cblas_sgemm64_"):
            return None
    except (OSError, RuntimeError):
        return None
    i32, i64, p = types.int32, types.int64, types.voidptr
    funcs = []
    for name, f in (("scipy_cblas_sgemm64_", types.float32),
                    ("scipy_cblas_dgemm64_", types.float64)):
        sig = types.void(i32, i32, i32, i64, i64, i64, f, p, i64, p, i64, f, p, i64)
        funcs.append(types.ExternalFunction(name, sig))
    return funcs[0], funcs[1]


_CBLAS = _load_numpy_cblas()

if _CBLAS is not None:
    _sgemm, _dgemm = _CBLAS

    @njit(cache=True, nogil=True)
    def sgemm_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray, ta: bool, tb: bool) -> None:
        """out = op(a) @ op(b) for C-contiguous float32 (row-major cblas_sgemm)."""
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        _sgemm(101, 112 if ta else 111, 112 if tb else 111, m, n, k, np.float32(1.0), a.ctypes,
               max(a.shape[1], 1), b.ctypes, max(b.shape[1], 1), np.float32(0.0), out.ctypes,
               max(n, 1))

    @njit(cache=True, nogil=True)
    def dgemm_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray, ta: bool, tb: bool) -> None:
        """out = op(a) @ op(b) for C-contiguous float64 (row-major cblas_dgemm)."""
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        _dgemm(101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a.ctypes,
               max(a.shape[1], 1), b.ctypes, max(b.shape[1], 1), 0.0, out.ctypes, max(n, 1))


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, transpose_a: bool = False,
                transpose_b: bool = False) -> np.ndarray:
    """out[...] = op(a) @ op(b) for C-contiguous a, b, out of one float dtype."""
    if out.size == 0:
        return out
    if a.shape[int(not transpose_a)] == 0:
        out.fill(0)
        return out
    if _CBLAS is not None and not transpose_a:
        kernel = sgemm_kernel if out.dtype == np.float32 else dgemm_kernel
        kernel(a, b, out, False, transpose_b)
    else:
        dot_kernel(a.T if transpose_a else a, b.T if transpose_b else b, out)
    return out


def _dims(ins: Sequence[Spec], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    expect_ndim(ins[0], 2, "input a", "(M, K)")
    expect_ndim(ins[1], 2, "input b", "(K, N)")
    m, ka = ins[0].shape[::-1] if attrs.get("transpose_a", False) else ins[0].shape
    kb, n = ins[1].shape[::-1] if attrs.get("transpose_b", False) else ins[1].shape
    return m, ka, kb, n


def _infer(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    dtype = same_float_dtype(ins)
    m, ka, kb, n = _dims(ins, attrs)
    if ka != kb:
        ta, tb = (".T" if attrs.get(k, False) else "" for k in ("transpose_a", "transpose_b"))
        raise ShapeError(f"inner dims differ: a{ta} is {fmt((m, ka))}, b{tb} is {fmt((kb, n))}, "
                         f"expected a{ta}'s dim 1 == b{tb}'s dim 0")
    return Spec((m, n), dtype)


def _forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    a, b = ins
    ta, tb = bool(attrs.get("transpose_a", False)), bool(attrs.get("transpose_b", False))
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    return matmul_into(a, b, np.empty((m, n), a.dtype), ta, tb)


def _cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
          itemsize: int) -> Cost:
    k = ins[0][0] if attrs.get("transpose_a", False) else ins[0][1]
    m, n = out
    return Cost(2.0 * m * n * k, itemsize * (m * k + k * n), itemsize * m * n)


def _grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    """With A = op(a), B = op(b): dA = dy B^T, dB = A^T dy, transposed back when a/b were."""
    a, b = node.inputs
    ta, tb = bool(node.attrs.get("transpose_a", False)), bool(node.attrs.get("transpose_b", False))
    da = db = None
    if wants[0]:
        da = (apply("matmul", b, dy, transpose_a=tb, transpose_b=True) if ta
              else apply("matmul", dy, b, transpose_a=False, transpose_b=not tb))
    if wants[1]:
        db = (apply("matmul", dy, a, transpose_a=True, transpose_b=ta) if tb
              else apply("matmul", a, dy, transpose_a=not ta, transpose_b=False))
    return [da, db]


register("matmul", _infer, _forward, _grad, _cost,
         doc="op(a) @ op(b) for 2-D a, b (attrs transpose_a, transpose_b)")


# -- the DSL's functions -----------------------------------------------------------------------

def matmul(a: Node, b: Node, transpose_a: bool = False, transpose_b: bool = False,
           name: str | None = None) -> Node:
    """op(a) @ op(b), where op transposes when the flag is set.

    >>> import graphflow as gf
    >>> with gf.Graph():
    ...     x = gf.placeholder("x", (None, 3))
    ...     w = gf.parameter("w", (4, 3))
    ...     matmul(x, w, transpose_b=True).shape
    (None, 4)
    """
    return apply("matmul", a, b, name=name, transpose_a=transpose_a, transpose_b=transpose_b)
