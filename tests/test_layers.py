"""Layers: the local2d layer in its two layouts computes the same function."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.errors import ShapeError


def _run(layout, x, w, b, weights):
    """Output of a local2d layer in `layout` on x, and the gradients of sum(out * weights)
    wrt x, W and b (each in the layout's own shapes)."""
    with gf.Graph() as g:
        xp = gf.placeholder("x", x.shape)
        out = gf.layers.local2d(xp, 4, 3, stride=2, padding=1, name="lc", layout=layout)
        loss = gf.reduce_sum(out * gf.constant(weights))
        grads = gf.gradients(loss, [xp, g["lc/W"], g["lc/b"]])
    sess = gf.Session(g, {"lc/W": w, "lc/b": b})
    return sess.run([out, grads["x"], grads["lc/W"], grads["lc/b"]], {xp: x})


def test_local2d_hwcn_layout_equals_nchw():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)  # N, C, H, W
    w = rng.standard_normal((5, 4, 4, 27)).astype(np.float32)  # OH, OW, F, KH*KW*C
    b = rng.standard_normal((4, 5, 4)).astype(np.float32)  # F, OH, OW
    weights = rng.standard_normal((2, 4, 5, 4)).astype(np.float32)
    y, dx, dw, db = _run("NCHW", x, w, b, weights)
    to_hwcn = gf.layers.NCHW_TO_HWCN
    y2, dx2, dw2, db2 = _run("HWCN", x.transpose(to_hwcn), w, b.transpose(1, 2, 0)[..., None],
                             weights.transpose(to_hwcn))
    assert y2.shape == (5, 4, 4, 2)
    np.testing.assert_allclose(y2.transpose(gf.layers.HWCN_TO_NCHW), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx2.transpose(gf.layers.HWCN_TO_NCHW), dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw2, dw, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db2[..., 0], db.transpose(1, 2, 0), rtol=1e-5, atol=1e-5)


def test_local2d_layout_errors_name_the_layer():
    with gf.Graph():
        x = gf.placeholder("x", (8, 8, 3, None))
        with pytest.raises(ValueError, match=r"local2d 'lc'.*layout 'NHWC' is not"):
            gf.layers.local2d(x, 4, 3, name="lc", layout="NHWC")
        with pytest.raises(ShapeError, match=r"local2d 'lc'.*expected 4 \(H, W, C, N\)"):
            gf.layers.local2d(gf.placeholder("v", (8, 3, None)), 4, 3, name="lc",
                              layout="HWCN")
