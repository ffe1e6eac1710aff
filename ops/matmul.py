"""Matrix multiply: matmul(a, b) = op(a) @ op(b), op = identity or transpose (attrs transpose_a/b).

The kernel calls BLAS gemm (`blas.gemm`: numpy's OpenBLAS where its wheel ships one) with
transpose flags, so transposed operands are never copied; a few rows against a large b (a
dense layer's forward on a micro-batch) go to `small_gemm`, which does not pack b on every
call (`copies` says when it reads a copy of each panel instead), a @ b.T against a large b
(its backward, dx = dy @ w.T) to `lane_gemm`, which keeps a's rows in vector lanes, and a.T @ b
summed over a few rows (its weight gradient) to `short_gemm`, which writes out once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node
from graphflow.ops import aligned
from graphflow.ops.blas import NT, TR, gemm
from graphflow.ops.lane_gemm import matmul_nt_lanes
from graphflow.ops.lane_gemm import wins as lane_wins
from graphflow.ops.packed_gemm import forward as packed_forward
from graphflow.ops.registry import Cost, Spec, apply, expect_ndim, fmt, register, same_float_dtype
from graphflow.ops.short_gemm import matmul_tn
from graphflow.ops.short_gemm import wins as short_wins
from graphflow.ops.small_gemm import copies, matmul_nn, matmul_nn_copied, matmul_nt, wins

Grads = Sequence[Node | None]


@njit(cache=True, nogil=True)
def matmul_kernel(a: np.ndarray, lda: int, b: np.ndarray, ldb: int, out: np.ndarray, ldc: int,
                  m: int, n: int, k: int, ta: bool, tb: bool, beta: float = 0.0) -> None:
    """Flat row-major out (m, n; row stride ldc) = op(a) @ op(b) + beta * out."""
    gemm(TR if ta else NT, TR if tb else NT, m, n, k, a, lda, b, ldb,
         np.full(1, beta, out.dtype), out, ldc)


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, transpose_a: bool = False,
                transpose_b: bool = False, accumulate: bool = False) -> np.ndarray:
    """out[...] = op(a) @ op(b), or with `accumulate` out += op(a) @ op(b), for C-contiguous
    2-D a, b, out of one float dtype."""
    m, n = out.shape
    k = a.shape[0] if transpose_a else a.shape[1]
    if out.size == 0 or (k == 0 and accumulate):
        return out
    if k == 0:
        out.fill(0)
        return out
    done = 0  # leading columns of out already computed
    float32 = a.dtype == b.dtype == out.dtype == np.float32  # (the vector kernels' type)
    lanes = transpose_b and not transpose_a and float32 and lane_wins(m, n, k)
    if transpose_a and not transpose_b and float32 and short_wins(m, n, k):
        done = matmul_tn(a, b, out, accumulate)
    elif lanes or not transpose_a and wins(m, n, k):
        if accumulate:  # (lane_gemm and small_gemm overwrite their out)
            out += matmul_into(a, b, np.empty_like(out), transpose_a, transpose_b)
            return out
        if lanes:
            matmul_nt_lanes(a, b, out)
            return out
        if transpose_b:
            matmul_nt(a, b, out, out.dtype.type(0))
            return out
        if float32:
            done = packed_forward(a, b, out)  # (by a worker's packed weight: runtime/worker.py)
            if done is None:
                done = (matmul_nn_copied if copies(m, n) else matmul_nn)(a, b, out)
    if done < n:  # the rest, or the last columns short of a whole panel, with BLAS
        matmul_kernel(a.reshape(-1), a.shape[1], b.reshape(-1)[done:], b.shape[1],
                      out.reshape(-1)[done:], n, m, n - done, k, transpose_a, transpose_b,
                      1.0 if accumulate else 0.0)
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
    return matmul_into(a, b, aligned.empty((m, n), a.dtype), ta, tb)


def _accumulate(ins: Sequence[np.ndarray], attrs: dict[str, Any], out: np.ndarray) -> None:
    matmul_into(ins[0], ins[1], out, bool(attrs.get("transpose_a", False)),
                bool(attrs.get("transpose_b", False)), accumulate=True)


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
         doc="op(a) @ op(b) for 2-D a, b (attrs transpose_a, transpose_b)", accumulate=_accumulate)


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
