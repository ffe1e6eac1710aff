"""Cases for ops/reduce.py."""

import numpy as np

from tests.cases import OpCase


def _one(shape):
    return lambda rng: [rng.standard_normal(shape)]


def _np(fn):
    def ref(x, axes=None, keepdims=False):
        return np.asarray(fn(x, axis=axes, keepdims=keepdims))
    return ref


def _mean_grad_ref(dy, x, axes=None, keepdims=False):
    count = x.size if axes is None else np.prod([x.shape[a] for a in np.atleast_1d(axes)])
    if not keepdims:
        dy = np.expand_dims(dy, axes if axes is not None else tuple(range(x.ndim)))
    return np.broadcast_to(dy, x.shape) / count


def _max_grad_ref(x, y, dy, axes=None, keepdims=False):
    """Independent reference: loop over the kept positions, argmax (first) over the rest."""
    axes = tuple(range(x.ndim)) if axes is None else tuple(np.atleast_1d(axes) % x.ndim)
    out = np.zeros_like(x)
    rest = [d for d in range(x.ndim) if d not in axes]
    dy_keep = dy if keepdims else np.expand_dims(dy, axes)
    for idx in np.ndindex(*[x.shape[d] for d in rest]):
        sel = [slice(None)] * x.ndim
        for d, i in zip(rest, idx):
            sel[d] = i
        block = x[tuple(sel)]
        first = np.unravel_index(np.argmax(block), block.shape)
        full = list(sel)
        for d, i in zip(axes, first):
            full[d] = i
        gsel = tuple(0 if d in axes else sel[d] for d in range(x.ndim))
        out[tuple(full)] = dy_keep[gsel]
    return out


def _max_grad_inputs(shape, axes, keepdims=False):
    def make(rng):
        x = rng.standard_normal(shape)
        x.reshape(-1)[:2] = 5.0  # a tie: the first maximal element gets dy
        y = np.max(x, axis=axes, keepdims=keepdims)
        return [x, y, rng.standard_normal(y.shape)]
    return make


CASES = [
    OpCase("reduce_sum", _one((3, 4)), _np(np.sum), label="all"),
    OpCase("reduce_sum", _one((2, 3, 4)), _np(np.sum), attrs={"axes": (0, 2)}, label="axes02"),
    OpCase("reduce_sum", _one((2, 3, 4)), _np(np.sum), attrs={"axes": -1, "keepdims": True},
           label="keepdims"),
    OpCase("reduce_mean", _one((3, 4)), _np(np.mean), label="all"),
    OpCase("reduce_mean", _one((2, 3, 4)), _np(np.mean), attrs={"axes": 1}, label="axis1"),
    OpCase("reduce_mean", _one((2, 3, 4)), _np(np.mean), attrs={"axes": (0, 1), "keepdims": True},
           label="keepdims"),
    OpCase("reduce_max", _one((3, 4)), _np(np.max), label="all"),
    OpCase("reduce_max", _one((2, 3, 4)), _np(np.max), attrs={"axes": (0, 2)}, label="axes02"),
    OpCase("reduce_max", _one((3, 37)), _np(np.max), attrs={"axes": 1}, label="rows"),
    OpCase("reduce_max", _one((2, 3, 4)), _np(np.max), attrs={"axes": 1, "keepdims": True},
           label="keepdims"),
    OpCase("reduce_mean_grad", lambda r: [r.standard_normal((3,)), r.standard_normal((2, 3, 4))],
           _mean_grad_ref, attrs={"axes": (0, 2)}),
    OpCase("reduce_mean_grad", lambda r: [r.standard_normal(()), r.standard_normal((3, 4))],
           _mean_grad_ref, label="all"),
    OpCase("reduce_max_grad", _max_grad_inputs((2, 3, 4), (0, 2)), _max_grad_ref,
           attrs={"axes": (0, 2)}),
    OpCase("reduce_max_grad", _max_grad_inputs((3, 4), 1, True), _max_grad_ref,
           attrs={"axes": 1, "keepdims": True}, label="keepdims"),
]
