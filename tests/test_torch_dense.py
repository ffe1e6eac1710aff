"""A dense layer x @ W + b, forward and gradients, against torch.nn.functional.linear."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.matmul import matmul
from graphflow.ops.reduce import reduce_sum

torch = pytest.importorskip("torch", reason="torch is only a cross-check peer, not a dependency")


def _close(ours, theirs):
    theirs = theirs.detach().numpy()
    scale = max(1.0, float(np.abs(theirs).max()))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("transpose_w", [False, True])
def test_dense_matches_torch_linear(transpose_w):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 50)).astype(np.float32)
    w = rng.standard_normal((30, 50) if transpose_w else (50, 30)).astype(np.float32)
    b = rng.standard_normal(30).astype(np.float32)
    r = rng.standard_normal((8, 30)).astype(np.float32)
    with gf.Graph() as g:
        xp = gf.placeholder("x", (None, 50))
        wp = gf.parameter("W", w.shape)
        bp = gf.parameter("b", (30,))
        y = gf.add(matmul(xp, wp, transpose_b=transpose_w), bp)
        rp = gf.placeholder("r", (None, 30))
        loss = reduce_sum(gf.mul(y, rp))
        grads = gf.gradients(loss, [xp, wp, bp])
    sess = gf.Session(g, params={"W": w, "b": b})
    out = sess.run([y, grads["x"], grads["W"], grads["b"]], {xp: x, rp: r})

    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w if transpose_w else w.T.copy(), requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    ty = torch.nn.functional.linear(tx, tw, tb)
    (ty * torch.tensor(r)).sum().backward()
    _close(out[0], ty)
    _close(out[1], tx.grad)
    _close(out[2], tw.grad if transpose_w else tw.grad.T)
    _close(out[3], tb.grad)
