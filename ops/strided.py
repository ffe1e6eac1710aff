"""Strided loop kernels shared by the elementwise, reduction and data-movement ops.

Every operand is viewed as a 6-D strided array (broadcast dimensions have stride 0), so one
compiled kernel per dtype serves every op and every broadcast pattern; contiguous same-shape
operands take a flat 1-D path. The op is a small integer code, a loop-invariant branch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_DIMS = 6

# elementwise op codes: out = f(a, b, c)
ADD, SUB, MUL, DIV, MAXIMUM, NEG, EXP, LOG, SQRT, SQUARE, RELU, SIGMOID, TANH = range(13)
RELU_GRAD, SIGMOID_GRAD, TANH_GRAD, MAX_GRAD_A, MAX_GRAD_B, FILL, SQRT_GRAD = range(13, 20)
# reduction codes
R_SUM, R_MAX = 0, 1
SUM_BLOCK = 128  # elements a row sum adds in its input's dtype (_blocked_sum)


@njit(cache=True, nogil=True, inline="always")
def _f(code: int, a: float, b: float, c: float) -> float:
    if code == ADD:
        return a + b
    if code == SUB:
        return a - b
    if code == MUL:
        return a * b
    if code == DIV:
        return a / b
    if code == MAXIMUM:
        return a if a >= b else b
    if code == NEG:
        return -a
    if code == EXP:
        return np.exp(a)
    if code == LOG:
        return np.log(a)
    if code == SQRT:
        return np.sqrt(a)
    if code == SQUARE:
        return a * a
    if code == RELU:
        return a if a > 0 else 0.0
    if code == SIGMOID:
        if a >= 0:
            return 1.0 / (1.0 + np.exp(-a))
        e = np.exp(a)
        return e / (1.0 + e)
    if code == TANH:
        return np.tanh(a)
    if code == RELU_GRAD:  # a = x, b = dy
        return b if a > 0 else 0.0
    if code == SIGMOID_GRAD:  # a = y, b = dy
        return b * a * (1.0 - a)
    if code == TANH_GRAD:  # a = y, b = dy
        return b * (1.0 - a * a)
    if code == MAX_GRAD_A:  # a, b, c = dy
        return c if a >= b else 0.0
    if code == MAX_GRAD_B:
        return 0.0 if a >= b else c
    if code == SQRT_GRAD:  # a = y, b = dy
        return 0.5 * b / a
    return a  # FILL: a is the value


@njit(cache=True, nogil=True)
def map_flat(code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """Contiguous same-shape operands. The hot codes get a loop of their own (branch-free, so
    LLVM vectorises it); the rest share the per-element dispatch."""
    n = out.size
    if code == ADD:
        for i in range(n):
            out[i] = a[i] + b[i]
    elif code == SUB:
        for i in range(n):
            out[i] = a[i] - b[i]
    elif code == MUL:
        for i in range(n):
            out[i] = a[i] * b[i]
    elif code == RELU:
        for i in range(n):
            out[i] = a[i] * (a[i] > 0)
    elif code == RELU_GRAD:
        for i in range(n):
            out[i] = b[i] * (a[i] > 0)
    elif code == SIGMOID_GRAD:
        for i in range(n):
            out[i] = b[i] * a[i] * (1 - a[i])
    elif code == SIGMOID:  # in out's dtype (the dispatch's float64 literals made it 2.9x
        one = out.dtype.type(1)  # slower); exp(-a) = inf gives 0, so no branch is needed
        for i in range(n):
            out[i] = one / (one + np.exp(-a[i]))
    else:
        for i in range(n):
            out[i] = _f(code, a[i], b[i], c[i])


@njit(cache=True, nogil=True)
def _row_with_scalar(code: int, a: np.ndarray, bv: float, out: np.ndarray) -> None:
    """out = a (+ - *) bv along one row: branch-free, so LLVM vectorises it."""
    if code == ADD:
        for i in range(out.size):
            out[i] = a[i] + bv
    elif code == SUB:
        for i in range(out.size):
            out[i] = a[i] - bv
    else:
        for i in range(out.size):
            out[i] = a[i] * bv


@njit(cache=True, nogil=True)
def map_6d(code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    s0, s1, s2, s3, s4, s5 = out.shape
    if (code == ADD or code == SUB or code == MUL) and b.strides[5] == 0:
        # b is constant along the innermost dim (a bias over the batch in HWCN layout, over
        # H x W in NCHW): a row at a time with b as a scalar (5x faster than the dispatch below)
        for i0 in range(s0):
            for i1 in range(s1):
                for i2 in range(s2):
                    for i3 in range(s3):
                        for i4 in range(s4):
                            _row_with_scalar(code, a[i0, i1, i2, i3, i4],
                                             b[i0, i1, i2, i3, i4, 0], out[i0, i1, i2, i3, i4])
        return
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    for i4 in range(s4):
                        for i5 in range(s5):
                            out[i0, i1, i2, i3, i4, i5] = _f(
                                code, a[i0, i1, i2, i3, i4, i5], b[i0, i1, i2, i3, i4, i5],
                                c[i0, i1, i2, i3, i4, i5])


@njit(cache=True, nogil=True)
def reduce_6d(code: int, src: np.ndarray, dst: np.ndarray) -> None:
    """dst (a view with stride 0 on reduced dims, pre-filled) accumulates src."""
    if dst.strides[5] == 0 and src.shape[5] > 1:
        _reduce_inner(code, src, dst)
        return
    s0, s1, s2, s3, s4, s5 = src.shape
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    for i4 in range(s4):
                        for i5 in range(s5):
                            v = src[i0, i1, i2, i3, i4, i5]
                            if code == R_SUM:
                                dst[i0, i1, i2, i3, i4, i5] += v
                            elif v > dst[i0, i1, i2, i3, i4, i5]:
                                dst[i0, i1, i2, i3, i4, i5] = v


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz"})
def _reduce_inner(code: int, src: np.ndarray, dst: np.ndarray) -> None:
    """reduce_6d when the innermost dim is reduced: each row runs into a local accumulator
    (the loop in reduce_6d would store to one address every element, a serial chain at a few
    cycles each: 3.9 ms for lc1's bias gradient; reassociated, the row sum is vectorised).
    Sums are blocked (_blocked_sum): a float32 running total of millions loses its low bits."""
    s0, s1, s2, s3, s4, s5 = src.shape
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    for i4 in range(s4):
                        if code == R_SUM:
                            dst[i0, i1, i2, i3, i4, 0] = _blocked_sum(
                                src[i0, i1, i2, i3, i4], dst[i0, i1, i2, i3, i4, 0])
                        else:
                            acc = dst[i0, i1, i2, i3, i4, 0]
                            for i5 in range(s5):
                                acc = max(acc, src[i0, i1, i2, i3, i4, i5])
                            dst[i0, i1, i2, i3, i4, 0] = acc


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz"}, inline="always")
def _blocked_sum(row: np.ndarray, start: float) -> float:
    """start + sum(row): SUM_BLOCK elements at a time in row's dtype (vectorised), the blocks'
    sums in float64, so a long float32 row keeps its low bits."""
    zero = row[:0].sum()  # (0 in row's dtype)
    n = row.shape[0]
    full = n - n % SUM_BLOCK
    total = np.float64(start)
    for begin in range(0, full, SUM_BLOCK):
        part = zero
        for i in range(SUM_BLOCK):
            part += row[begin + i]
        total += part
    part = zero
    for i in range(full, n):
        part += row[i]
    return total + part


@njit(cache=True, nogil=True)
def copy_6d(src: np.ndarray, dst: np.ndarray) -> None:
    s0, s1, s2, s3, s4, s5 = dst.shape
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    for i4 in range(s4):
                        for i5 in range(s5):
                            dst[i0, i1, i2, i3, i4, i5] = src[i0, i1, i2, i3, i4, i5]


def as_6d(*views: np.ndarray) -> list[np.ndarray]:
    """Same-shape strided views -> 6-D views, merging dims that are contiguous in all of them."""
    keep = [d for d, n in enumerate(views[0].shape) if n != 1]
    shape = [views[0].shape[d] for d in keep]
    strides = [[v.strides[d] for d in keep] for v in views]
    for i in range(len(shape) - 2, -1, -1):
        if all(st[i] == st[i + 1] * shape[i + 1] for st in strides):
            shape[i] *= shape.pop(i + 1)
            for st in strides:
                st[i] = st.pop(i + 1)
    if len(shape) > MAX_DIMS:
        raise ValueError(f"strided kernels handle at most {MAX_DIMS} non-mergeable dims, "
                         f"got shape {views[0].shape}")
    # numpy makes these views itself (a few times faster than as_strided), merging exactly the
    # dims merged above; copy=False raises rather than write into a copy
    full = (1,) * (MAX_DIMS - len(shape)) + tuple(shape)
    return [v.reshape(full, copy=False) for v in views]
