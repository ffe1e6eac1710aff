"""Softmax cross-entropy of logits split by classes across workers, without gathering them.

The spatial strategy splits a dense output layer by units, so each worker holds a block of
columns of the logits (speech-mlp: 64 x 8192, 2 MB). Gathered on one worker for the loss, the
blocks crossed twice a step (there, and their gradient back) and one worker computed the
softmax alone while the others waited. Here each worker reduces its block to three numbers a
row, `xent_block`: the row's max m, the sum s of exp(logit - m) over the block, and the logit
of the row's label if the label falls in the block (else 0). `xent_combine` joins the blocks'
(N, 3) statistics into the mean loss: with M = max_j m_j and S = sum_j s_j exp(m_j - M), a
row's loss is M + log S - z. Its gradient sends each block back (N, 3) numbers, and
`xent_block_grad` makes the block's gradient, exp(logit - M) / S - onehot(label), from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops.loss import check_labels, check_logits_labels, input_cost
from graphflow.ops.registry import Spec, apply, fmt, register

STATS = 3  # per row: max, sum of exp(logit - max), the label's logit


# -- kernels -----------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
def _block_kernel(x: np.ndarray, labels: np.ndarray, lo: int, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        m = x[i, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[i, j])
        s = m * 0
        for j in range(x.shape[1]):
            s += np.exp(x[i, j] - m)
        t = labels[i] - lo
        out[i, 0], out[i, 1] = m, s
        out[i, 2] = x[i, t] if 0 <= t < x.shape[1] else 0


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
def _block_grad_kernel(x: np.ndarray, labels: np.ndarray, lo: int, stats: np.ndarray,
                       d: np.ndarray, dx: np.ndarray) -> None:
    """dx = ds exp(x - m) + (dm - ds s) at the first max + dz at the label, row by row."""
    for i in range(x.shape[0]):
        m, s = stats[i, 0], stats[i, 1]
        dm, ds, dz = d[i, 0], d[i, 1], d[i, 2]
        first = -1
        for j in range(x.shape[1]):
            dx[i, j] = ds * np.exp(x[i, j] - m)
            if first < 0 and x[i, j] == m:
                first = j
        if first >= 0:  # (none in a row with a NaN)
            dx[i, first] += dm - ds * s
        t = labels[i] - lo
        if 0 <= t < x.shape[1]:
            dx[i, t] += dz


# -- forwards ----------------------------------------------------------------------------------

def _block_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, labels = ins
    check_labels(x, labels, attrs["classes"])
    out = np.empty((x.shape[0], STATS), x.dtype)
    _block_kernel(x, labels, attrs["lo"], out)
    return out


def _block_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, labels, stats, d = ins
    dx = np.empty_like(x)
    _block_grad_kernel(x, labels, attrs["lo"], stats, d, dx)
    return dx


def _joined(stats: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the max over blocks M, S = sum_j s_j exp(m_j - M), and each block's
    exp(m_j - M) (blocks along the last axis)."""
    m = np.stack([s[:, 0] for s in stats], axis=-1)
    big = m.max(axis=-1, keepdims=True)
    scale = np.exp(m - big)
    total = (np.stack([s[:, 1] for s in stats], axis=-1) * scale).sum(axis=-1)
    return big[:, 0], total, scale


def _combine_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    big, total, _ = _joined(ins)
    z = sum(s[:, 2] for s in ins)
    return np.array(np.mean(big + np.log(total) - z) if len(big) else 0.0, ins[0].dtype)


def _combine_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    *stats, dy = ins
    j, n = attrs["index"], max(stats[0].shape[0], 1)
    _, total, scale = _joined(stats)
    share = scale[:, j] / total * (float(dy) / n)
    out = np.empty_like(stats[j])
    out[:, 0] = stats[j][:, 1] * share
    out[:, 1] = share
    out[:, 2] = -float(dy) / n
    return out


# -- shapes, gradients, costs ------------------------------------------------------------------

def _check_stats(specs: Sequence[Spec]) -> Shape:
    for s in specs:
        if len(s.shape) != 2 or s.shape[1] != STATS:
            raise ShapeError(f"block statistics have shape {fmt(s.shape)}, expected (N, {STATS})")
    return specs[0].shape


def _infer_block(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    check_logits_labels(ins[0], ins[1])
    return Spec((ins[0].shape[0], STATS), ins[0].dtype)


def _infer_block_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    check_logits_labels(ins[0], ins[1])
    _check_stats(ins[2:])
    return Spec(ins[0].shape, ins[0].dtype)


def _infer_combine(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    _check_stats(ins)
    return Spec((), ins[0].dtype)


def _infer_combine_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec(_check_stats(ins[:-1]), ins[0].dtype)


def _block_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> list[Node | None]:
    x, labels = node.inputs
    return [apply("xent_block_grad", x, labels, node, dy, **node.attrs) if wants[0] else None,
            None]


def _combine_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> list[Node | None]:
    return [apply("xent_combine_grad", *node.inputs, dy, index=j) if want else None
            for j, want in enumerate(wants)]


register("xent_block", _infer_block, _block_forward, _block_grad, input_cost(8),
         doc="per row of a block of logits' columns (from column `lo` of `classes`): max m, "
             "sum of exp(logit - m), the label's logit if in the block (inputs logits, labels)")
register("xent_block_grad", _infer_block_grad, _block_grad_forward, None, input_cost(8),
         doc="the gradient of xent_block's logits (inputs logits, labels, its output, dy)")
register("xent_combine", _infer_combine, _combine_forward, _combine_grad, input_cost(8),
         doc="the mean softmax cross-entropy from the blocks' xent_block statistics")
register("xent_combine_grad", _infer_combine_grad, _combine_grad_forward, None, input_cost(8),
         doc="the gradient of xent_combine's input `index` (inputs the statistics, dy)")
