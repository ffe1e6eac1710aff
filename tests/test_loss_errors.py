"""Errors of the loss, pooling and normalisation ops: shape rules and out-of-range labels."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.loss import mse, softmax_cross_entropy
from graphflow.ops.norm import lrn
from graphflow.ops.pool import avg_pool2d, max_pool2d


def _xent_graph():
    with gf.Graph(dtype="float32") as g:
        logits = gf.placeholder("logits", (None, 4))
        labels = gf.placeholder("labels", (None,), "int32")
        loss = softmax_cross_entropy(logits, labels)
        grads = gf.gradients(loss, [logits])
    return g, logits, labels, loss, grads["logits"]


@pytest.mark.parametrize("bad,row", [(4, 2), (-1, 1), (100, 0)])
def test_out_of_range_label_names_row_and_value(bad, row):
    g, logits, labels, loss, dlogits = _xent_graph()
    y = np.array([0, 1, 3], np.int32)
    y[row] = bad
    feeds = {logits: np.zeros((3, 4), np.float32), labels: y}
    sess = gf.Session(g)
    for fetch in (loss, dlogits):
        with pytest.raises(ValueError, match=rf"label {bad} in row {row} is out of range \[0, 4\)"):
            sess.run(fetch, feeds)


def test_label_dtype_and_shape_are_checked():
    with gf.Graph():
        logits = gf.placeholder("logits", (8, 4))
        with pytest.raises(gf.DTypeError, match="labels dtype is float32, expected int32"):
            softmax_cross_entropy(logits, gf.placeholder("f", (8,)))
        with pytest.raises(gf.ShapeError, match=r"labels have shape \(7,\), expected \(8,\)"):
            softmax_cross_entropy(logits, gf.placeholder("y7", (7,), "int64"))
        with pytest.raises(gf.ShapeError, match=r"labels has 2 dims, expected 1"):
            softmax_cross_entropy(logits, gf.placeholder("y2", (8, 1), "int64"))
        with pytest.raises(gf.ShapeError, match=r"logits has 3 dims, expected 2 \(N, K\)"):
            softmax_cross_entropy(gf.placeholder("l3", (8, 4, 1)),
                                  gf.placeholder("y", (8,), "int64"))


def test_mse_needs_equal_shapes():
    with gf.Graph():
        with pytest.raises(gf.ShapeError, match=r"pred has shape \(N, 3\) and target \(N, 4\)"):
            mse(gf.placeholder("p", (None, 3)), gf.placeholder("t", (None, 4)))


def test_pool_and_lrn_shape_errors():
    with gf.Graph():
        x3 = gf.placeholder("x3", (None, 8, 8))
        x = gf.placeholder("x", (None, 3, 4, 4))
        with pytest.raises(gf.ShapeError, match=r"input has 3 dims, expected 4 \(N, C, H, W\)"):
            max_pool2d(x3, 2)
        with pytest.raises(gf.ShapeError, match="smaller than the 5x5 kernel"):
            avg_pool2d(x, 5)
        with pytest.raises(gf.ShapeError, match="padding .* must be smaller than the kernel"):
            max_pool2d(x, 2, padding=2)
        with pytest.raises(gf.ShapeError, match="size is 4, expected a positive odd int"):
            lrn(x, size=4)


def test_pool_shapes_keep_the_batch_dim():
    with gf.Graph():
        x = gf.placeholder("x", (None, 3, 9, 7))
        assert max_pool2d(x, 3, stride=2, padding=1).shape == (None, 3, 5, 4)
        assert avg_pool2d(x, (2, 3), stride=1).shape == (None, 3, 8, 5)
