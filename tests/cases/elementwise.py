"""Cases for ops/elementwise.py."""

import numpy as np

from tests.cases import OpCase


def _pair(a_shape, b_shape, positive_b=False):
    def make(rng):
        b = rng.standard_normal(b_shape)
        return [rng.standard_normal(a_shape), np.abs(b) + 0.5 if positive_b else b]
    return make


def _one(shape, positive=False):
    def make(rng):
        x = rng.standard_normal(shape)
        return [np.abs(x) + 0.5 if positive else x]
    return make


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


CASES = [
    OpCase("add", _pair((3, 4), (3, 4)), np.add),
    OpCase("add", _pair((2, 3, 4), (4,)), np.add, label="bias"),
    OpCase("add", _pair((3, 1), (1, 4)), np.add, label="outer"),
    OpCase("add", _pair((3, 2, 4, 37), (3, 2, 4, 1)), np.add, label="bias HWCN"),
    OpCase("sub", _pair((3, 4), (3, 1)), np.subtract),
    OpCase("mul", _pair((2, 3, 4), (3, 1)), np.multiply),
    OpCase("mul", _pair((), (2, 3)), np.multiply, label="scalar"),
    OpCase("div", _pair((3, 4), (4,), positive_b=True), np.divide),
    OpCase("maximum", _pair((3, 4), (3, 4)), np.maximum),
    OpCase("maximum", _pair((3, 4), (4,)), np.maximum, label="bcast"),
    OpCase("max_grad_a", lambda r: [r.standard_normal((3, 4)), r.standard_normal(4),
                                    r.standard_normal((3, 4))],
           lambda a, b, dy: np.where(a >= b, dy, 0.0)),
    OpCase("max_grad_b", lambda r: [r.standard_normal((3, 4)), r.standard_normal(4),
                                    r.standard_normal((3, 4))],
           lambda a, b, dy: np.where(a >= b, 0.0, dy)),
    OpCase("neg", _one((3, 4)), np.negative),
    OpCase("exp", _one((3, 4)), np.exp),
    OpCase("log", _one((3, 4), positive=True), np.log),
    OpCase("sqrt", _one((3, 4), positive=True), np.sqrt),
    OpCase("square", _one((3, 4)), np.square),
    OpCase("relu", _one((2, 3, 4)), lambda x: np.maximum(x, 0)),
    OpCase("sigmoid", _one((3, 4)), _sigmoid),
    OpCase("sigmoid", lambda r: [np.array([-800.0, -30.0, 0.0, 30.0, 800.0])], _sigmoid,
           label="extremes"),
    OpCase("tanh", _one((3, 4)), np.tanh),
    OpCase("relu_grad", _pair((3, 4), (3, 4)), lambda x, dy: np.where(x > 0, dy, 0.0)),
    OpCase("sigmoid_grad", _pair((3, 4), (3, 4)), lambda y, dy: dy * y * (1 - y)),
    OpCase("tanh_grad", _pair((3, 4), (3, 4)), lambda y, dy: dy * (1 - y * y)),
    OpCase("sqrt_grad", _pair((3, 4), (3, 4), positive_b=False), lambda y, dy: 0.5 * dy / y),
    OpCase("ones_like", _one((3, 4)), np.ones_like),
    OpCase("sum_to", _one((2, 3, 4)), lambda g, shape: g.sum(axis=(0, 2), keepdims=True)[0],
           attrs={"shape": (3, 1)}),
    OpCase("sum_to", _one((5, 3)), lambda g, shape: g.sum(axis=0), attrs={"shape": (3,)},
           label="rows"),
    # a bias gradient in (H, W, C, N) layout: long innermost rows (a vector body and a tail)
    OpCase("sum_to", _one((5, 3, 37)), lambda g, shape: g.sum(axis=2, keepdims=True),
           attrs={"shape": (5, 3, 1)}, label="last axis"),
    OpCase("broadcast_like", _pair((3, 1), (2, 3, 4)),
           lambda g, like: np.broadcast_to(g, like.shape).copy(), no_grad=(1,)),
]
