"""Softmax, log-softmax and the losses: fused softmax cross-entropy and mean squared error.

Softmax and log-softmax reduce over the last axis (logits (N, K)); both subtract the row max
before exponentiating. softmax_cross_entropy takes int labels (N,) and returns the batch mean of
-log_softmax(logits)[i, label_i] through a log-sum-exp, so it never overflows; a label outside
[0, K) is an error naming its row and value.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import DTypeError, ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops.registry import (
    INT_DTYPES,
    Cost,
    CostFn,
    Spec,
    apply,
    elementwise_cost,
    expect_ndim,
    fmt,
    register,
    same_float_dtype,
)

Grads = Sequence[Node | None]


# -- kernels (2-D, one row per example) --------------------------------------------------------

# In the logits' own dtype, sums reassociated: LLVM vectorises the max and the sums, and the exp
# runs in float32 for float32 logits (32 x 8192 logits: loss 1.3 -> 0.8 ms, its gradient 1.4 ->
# 0.8). NaN and inf keep their meaning.
_FAST = {"reassoc", "contract", "nsz"}


@njit(cache=True, nogil=True, inline="always", fastmath=_FAST)
def _row_max(x: np.ndarray, i: int) -> float:
    """max(x[i]) in x's dtype (a row has at least one column: the callers check)."""
    m = x[i, 0]
    for j in range(1, x.shape[1]):
        m = max(m, x[i, j])
    return m


@njit(cache=True, nogil=True, fastmath=_FAST)
def _softmax_kernel(x: np.ndarray, out: np.ndarray, log: bool, scale: float = 1.0) -> None:
    """out = log_softmax(x), or scale * softmax(x), row by row (shifted by the row max)."""
    if x.shape[1] == 0:
        return
    for i in range(x.shape[0]):
        m = _row_max(x, i)
        s = m * 0  # (a zero of x's dtype: a row with a non-finite max is NaN whatever s is)
        for j in range(x.shape[1]):
            e = np.exp(x[i, j] - m)
            out[i, j] = e  # exp once per element: it dominates the time
            s += e
        if log:
            shift = m + np.log(s)
            for j in range(x.shape[1]):
                out[i, j] = x[i, j] - shift
        else:
            inv = scale / s
            for j in range(x.shape[1]):
                out[i, j] *= inv


@njit(cache=True, nogil=True)
def _softmax_grad_kernel(y: np.ndarray, dy: np.ndarray, dx: np.ndarray, log: bool) -> None:
    for i in range(y.shape[0]):
        s = 0.0
        if log:
            for j in range(y.shape[1]):
                s += dy[i, j]
            for j in range(y.shape[1]):
                dx[i, j] = dy[i, j] - np.exp(y[i, j]) * s
        else:
            for j in range(y.shape[1]):
                s += dy[i, j] * y[i, j]
            for j in range(y.shape[1]):
                dx[i, j] = y[i, j] * (dy[i, j] - s)


@njit(cache=True, nogil=True, fastmath=_FAST)
def _xent_kernel(logits: np.ndarray, labels: np.ndarray) -> float:
    """Sum over rows of logsumexp(logits[i]) - logits[i, labels[i]]."""
    total = 0.0
    for i in range(logits.shape[0]):
        m = _row_max(logits, i)
        s = m * 0
        for j in range(logits.shape[1]):
            s += np.exp(logits[i, j] - m)
        total += m + np.log(s) - logits[i, labels[i]]
    return total


@njit(cache=True, nogil=True, fastmath=_FAST)
def _xent_grad_kernel(logits: np.ndarray, labels: np.ndarray, scale: float,
                      dx: np.ndarray) -> None:
    """dx = (softmax(logits) - onehot(labels)) * scale."""
    _softmax_kernel(logits, dx, False, scale)
    for i in range(logits.shape[0]):
        dx[i, labels[i]] -= scale


@njit(cache=True, nogil=True)
def _sq_diff_sum(a: np.ndarray, b: np.ndarray) -> float:
    total = 0.0
    for i in range(a.size):
        d = a[i] - b[i]
        total += d * d
    return total


@njit(cache=True, nogil=True)
def _scaled_diff(a: np.ndarray, b: np.ndarray, scale: float, out: np.ndarray) -> None:
    for i in range(a.size):
        out[i] = scale * (a[i] - b[i])


# -- shape rules -------------------------------------------------------------------------------

def _same(a: Shape, b: Shape) -> bool:
    """Equal shapes, a None (batch) matching anything."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _infer_softmax(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x = ins[0]
    if len(x.shape) < 1:
        raise ShapeError("input is a scalar, expected (N, K) logits (softmax runs over the last "
                         "axis)")
    if len(ins) == 2 and not _same(ins[1].shape, x.shape):
        raise ShapeError(f"dy has shape {fmt(ins[1].shape)}, expected y's shape {fmt(x.shape)}")
    return Spec(x.shape, same_float_dtype(ins))


def check_logits_labels(logits: Spec, labels: Spec) -> None:
    expect_ndim(logits, 2, "logits", "(N, K)")
    if labels.dtype not in INT_DTYPES:
        raise DTypeError(f"labels dtype is {labels.dtype}, expected int32 or int64 class indices")
    expect_ndim(labels, 1, "labels", "(N,)")
    if not _same(labels.shape, logits.shape[:1]):
        raise ShapeError(f"labels have shape {fmt(labels.shape)}, expected "
                         f"{fmt(logits.shape[:1])} (one per row of logits {fmt(logits.shape)})")


def _infer_xent(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    check_logits_labels(ins[0], ins[1])
    return Spec((), same_float_dtype(ins[:1]))


def _check_scalar(spec: Spec, what: str) -> None:
    if spec.shape != ():
        raise ShapeError(f"{what} has shape {fmt(spec.shape)}, expected a scalar ()")


def _infer_xent_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    logits, labels, dloss = ins
    check_logits_labels(logits, labels)
    _check_scalar(dloss, "dloss")
    return Spec(logits.shape, same_float_dtype([logits, dloss]))


def _infer_mse(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    pred, target = ins[:2]
    if not _same(pred.shape, target.shape):
        raise ShapeError(f"pred has shape {fmt(pred.shape)} and target {fmt(target.shape)}, "
                         f"expected the same shape")
    if len(ins) == 3:
        _check_scalar(ins[2], "dloss")
        return Spec(pred.shape, same_float_dtype(ins))
    return Spec((), same_float_dtype(ins))


# -- forward wrappers --------------------------------------------------------------------------

def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def _softmax_forward(log: bool):  # noqa: ANN202 - a kernel wrapper factory
    def forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        (x,) = ins
        out = np.empty_like(x)
        if x.size:
            _softmax_kernel(_rows(x), _rows(out), log)
        return out
    return forward


def _softmax_grad_forward(log: bool):  # noqa: ANN202 - a kernel wrapper factory
    def forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        y, dy = ins
        dx = np.empty_like(y)
        if y.size:
            _softmax_grad_kernel(_rows(y), _rows(dy), _rows(dx), log)
        return dx
    return forward


def check_labels(logits: np.ndarray, labels: np.ndarray, classes: int | None = None) -> None:
    """Raise ValueError naming the first row whose label is not a class index in [0, K) (K:
    `classes`, else the logits' columns)."""
    n, k = logits.shape[0], classes or logits.shape[1]
    if labels.shape != (n,):
        raise ValueError(f"labels have shape {labels.shape}, expected ({n},) to match logits "
                         f"{logits.shape}")
    bad = np.flatnonzero((labels < 0) | (labels >= k))
    if bad.size:
        row = int(bad[0])
        more = f" (and {bad.size - 1} more bad rows)" if bad.size > 1 else ""
        raise ValueError(f"label {int(labels[row])} in row {row} is out of range [0, {k}) for "
                         f"{k} classes{more}")


def _xent_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    logits, labels = ins
    check_labels(logits, labels)
    total = _xent_kernel(logits, labels) if logits.shape[0] else 0.0
    return np.array(total / max(logits.shape[0], 1), logits.dtype)


def _xent_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    logits, labels, dloss = ins
    check_labels(logits, labels)
    dx = np.empty_like(logits)
    if logits.shape[0]:
        _xent_grad_kernel(logits, labels, float(dloss) / logits.shape[0], dx)
    return dx


def _check_same(pred: np.ndarray, target: np.ndarray) -> None:
    if pred.shape != target.shape:
        raise ValueError(f"pred has shape {pred.shape} and target {target.shape}, expected the "
                         f"same shape")


def _mse_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    pred, target = ins
    _check_same(pred, target)
    total = _sq_diff_sum(pred.reshape(-1), target.reshape(-1))
    return np.array(total / max(pred.size, 1), pred.dtype)


def _mse_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    pred, target, dloss = ins
    _check_same(pred, target)
    out = np.empty_like(pred)
    _scaled_diff(pred.reshape(-1), target.reshape(-1), 2.0 * float(dloss) / max(pred.size, 1),
                 out.reshape(-1))
    return out


# -- gradient rules and costs ------------------------------------------------------------------

def _by_output(grad_op: str):  # noqa: ANN202 - gradient rules that read the op's output
    def rule(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
        return [apply(grad_op, node, dy)]
    return rule


def _xent_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    logits, labels = node.inputs
    return [apply("softmax_cross_entropy_grad", logits, labels, dy) if wants[0] else None, None]


def _mse_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    g = apply("mse_grad", *node.inputs, dy)
    return [g if wants[0] else None, apply("neg", g) if wants[1] else None]


def input_cost(flops_per_element: float) -> CostFn:
    """Cost proportional to the first input's size, reading every input (a loss's output is a
    scalar; ops/split_loss.py's are a few numbers a row)."""
    def cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
             itemsize: int) -> Cost:
        n = prod(ins[0])
        return Cost(flops_per_element * n, float(itemsize * sum(prod(s) for s in ins)),
                    float(itemsize * prod(out)))
    return cost


register("softmax", _infer_softmax, _softmax_forward(False), _by_output("softmax_grad"),
         elementwise_cost(12), doc="exp(x - max) / sum(exp(x - max)) over the last axis")
register("log_softmax", _infer_softmax, _softmax_forward(True), _by_output("log_softmax_grad"),
         elementwise_cost(12), doc="x - max - log(sum(exp(x - max))) over the last axis")
register("softmax_grad", _infer_softmax, _softmax_grad_forward(False), None, elementwise_cost(4),
         doc="y * (dy - sum(dy * y)) over the last axis (inputs y = softmax output, dy)")
register("log_softmax_grad", _infer_softmax, _softmax_grad_forward(True), None,
         elementwise_cost(13),
         doc="dy - exp(y) * sum(dy) over the last axis (inputs y = log_softmax output, dy)")
register("softmax_cross_entropy", _infer_xent, _xent_forward, _xent_grad, input_cost(13),
         doc="mean over rows of -log_softmax(logits)[i, labels[i]] (inputs logits (N, K), "
             "int labels (N,); output a scalar)")
register("softmax_cross_entropy_grad", _infer_xent_grad, _xent_grad_forward, None,
         input_cost(14), doc="(softmax(logits) - onehot(labels)) * dloss / N "
                              "(inputs logits, labels, dloss)")
register("mse", _infer_mse, _mse_forward, _mse_grad, input_cost(3),
         doc="mean of (pred - target)^2 over all elements (a scalar)")
register("mse_grad", _infer_mse, _mse_grad_forward, None, input_cost(3),
         doc="2 * (pred - target) * dloss / size (inputs pred, target, dloss)")


# -- the DSL's functions -----------------------------------------------------------------------

def softmax(x: Node, name: str | None = None) -> Node:
    """Softmax over the last axis, e.g. class probabilities from (N, K) logits."""
    return apply("softmax", x, name=name)


def log_softmax(x: Node, name: str | None = None) -> Node:
    """Log of the softmax over the last axis, computed without overflow."""
    return apply("log_softmax", x, name=name)


def softmax_cross_entropy(logits: Node, labels: Node, name: str | None = None) -> Node:
    """Mean cross-entropy of (N, K) logits against int class labels (N,): a scalar loss.

    >>> import graphflow as gf
    >>> with gf.Graph():
    ...     logits = gf.placeholder("logits", (None, 10))
    ...     loss = softmax_cross_entropy(logits, gf.placeholder("y", (None,), "int32"))
    >>> loss.shape
    ()
    """
    return apply("softmax_cross_entropy", logits, labels, name=name)


def mse(pred: Node, target: Node, name: str | None = None) -> Node:
    """Mean of (pred - target)^2 over all elements: a scalar loss."""
    return apply("mse", pred, target, name=name)
