"""Cases for ops/loss.py: softmax family and losses against direct NumPy formulas."""

import numpy as np

from tests.cases import OpCase


def _lse(x):
    m = x.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def softmax_ref(x):
    return np.exp(x - _lse(x))


def log_softmax_ref(x):
    return x - _lse(x)


def xent_ref(logits, labels):
    rows = np.arange(len(labels))
    return np.mean(_lse(logits)[:, 0] - logits[rows, labels])


def xent_grad_ref(logits, labels, dloss):
    onehot = np.eye(logits.shape[1])[labels]
    return (softmax_ref(logits) - onehot) * dloss / len(labels)


def _x(shape, scale=1.0):
    return lambda rng: [scale * rng.standard_normal(shape)]


def _y_dy(shape, ref):
    return lambda rng: [ref(rng.standard_normal(shape)), rng.standard_normal(shape)]


def _logits_labels(n, k, dtype="int64", scale=1.0, dloss=False):
    def make(rng):
        ins = [scale * rng.standard_normal((n, k)), rng.integers(0, k, n).astype(dtype)]
        return ins + [np.array(rng.standard_normal())] if dloss else ins
    return make


def _pair(shape, dloss=False):
    def make(rng):
        ins = [rng.standard_normal(shape), rng.standard_normal(shape)]
        return ins + [np.array(rng.standard_normal())] if dloss else ins
    return make


EXTREME = np.array([[1000.0, -1000.0, 0.0], [-800.0, -790.0, -805.0], [50.0, 50.0, 49.0]])

CASES = [
    OpCase("softmax", _x((4, 5)), softmax_ref),
    OpCase("softmax", _x((2, 3, 4), 3.0), softmax_ref, label="3d"),
    OpCase("softmax", lambda r: [EXTREME.copy()], softmax_ref, label="extreme"),
    OpCase("log_softmax", _x((4, 5)), log_softmax_ref),
    OpCase("log_softmax", lambda r: [EXTREME.copy()], log_softmax_ref, label="extreme"),
    OpCase("softmax_grad", _y_dy((4, 5), softmax_ref),
           lambda y, dy: y * (dy - (dy * y).sum(-1, keepdims=True))),
    OpCase("log_softmax_grad", _y_dy((4, 5), log_softmax_ref),
           lambda y, dy: dy - np.exp(y) * dy.sum(-1, keepdims=True)),
    OpCase("softmax_cross_entropy", _logits_labels(6, 5), xent_ref),
    OpCase("softmax_cross_entropy", _logits_labels(4, 3, "int32", 2.0), xent_ref,
           label="int32"),
    OpCase("softmax_cross_entropy", lambda r: [EXTREME.copy(), np.array([1, 2, 0])], xent_ref,
           label="extreme"),
    OpCase("softmax_cross_entropy_grad", _logits_labels(6, 5, dloss=True), xent_grad_ref),
    OpCase("softmax_cross_entropy_grad", _logits_labels(4, 3, "int32", dloss=True),
           xent_grad_ref, label="int32"),
    OpCase("mse", _pair((3, 4)), lambda p, t: np.mean((p - t) ** 2)),
    OpCase("mse", _pair((5,)), lambda p, t: np.mean((p - t) ** 2), label="1d"),
    OpCase("mse_grad", _pair((3, 4), dloss=True), lambda p, t, d: 2 * (p - t) * d / p.size),
]
