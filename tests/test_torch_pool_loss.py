"""Pooling, LRN, log-softmax and softmax cross-entropy against PyTorch (float32, fwd + bwd)."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.loss import log_softmax, softmax_cross_entropy
from graphflow.ops.norm import lrn
from graphflow.ops.pool import avg_pool2d, max_pool2d

torch = pytest.importorskip("torch", reason="PyTorch is only a cross-check peer, not a dependency")
F = torch.nn.functional


def _close(got, want, what):
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= 1e-4 * scale, f"{what}: max error {err:.3g} at scale {scale:.3g}"


def _ours(build, x_np):
    """Forward and input gradient (for a random dy) of build(x) in graphflow, float32."""
    with gf.Graph(dtype="float32") as g:
        x = gf.placeholder("x", (None, *x_np.shape[1:]))
        y = build(x)
        dy = gf.placeholder("dy", y.shape)
    grads = gf.gradients(y, [x], dy=dy)
    sess = gf.Session(g)
    out = sess.run(y, {x: x_np})
    dy_np = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    (dx,) = sess.run([grads["x"]], {x: x_np, dy: dy_np})
    return out, dx, dy_np


def _theirs(fn, x_np, dy_np):
    xt = torch.tensor(x_np, requires_grad=True)
    yt = fn(xt)
    yt.backward(torch.tensor(dy_np))
    return yt.detach().numpy(), xt.grad.numpy()


CASES = {
    "max_pool2d": (lambda x: max_pool2d(x, 3, stride=2, padding=1),
                   lambda t: F.max_pool2d(t, 3, stride=2, padding=1)),
    "max_pool2d-2x2": (lambda x: max_pool2d(x, 2),
                       lambda t: F.max_pool2d(t, 2)),
    "avg_pool2d": (lambda x: avg_pool2d(x, 3, stride=2, padding=1),
                   lambda t: F.avg_pool2d(t, 3, stride=2, padding=1, count_include_pad=True)),
    "avg_pool2d-rect": (lambda x: avg_pool2d(x, (3, 2), stride=(1, 2), padding=(1, 0)),
                        lambda t: F.avg_pool2d(t, (3, 2), stride=(1, 2), padding=(1, 0))),
    "lrn": (lambda x: lrn(x, size=5, alpha=0.01, beta=0.75, k=2.0),
            lambda t: F.local_response_norm(t, 5, alpha=0.01, beta=0.75, k=2.0)),
    "lrn-defaults": (lambda x: lrn(x, size=3, alpha=1e-4, beta=0.75, k=1.0),
                     lambda t: F.local_response_norm(t, 3, alpha=1e-4, beta=0.75, k=1.0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_nchw_ops_match_torch(name):
    ours, theirs = CASES[name]
    x = (3.0 * np.random.default_rng(0).standard_normal((4, 6, 12, 12))).astype(np.float32)
    out, dx, dy = _ours(ours, x)
    t_out, t_dx = _theirs(theirs, x, dy)
    _close(out, t_out, f"{name} forward")
    _close(dx, t_dx, f"{name} gradient")


def test_log_softmax_matches_torch():
    x = (4.0 * np.random.default_rng(0).standard_normal((16, 10))).astype(np.float32)
    out, dx, dy = _ours(log_softmax, x)
    t_out, t_dx = _theirs(lambda t: F.log_softmax(t, dim=-1), x, dy)
    _close(out, t_out, "log_softmax forward")
    _close(dx, t_dx, "log_softmax gradient")


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_softmax_cross_entropy_matches_torch(scale):
    rng = np.random.default_rng(0)
    logits_np = (scale * rng.standard_normal((32, 10))).astype(np.float32)
    labels_np = rng.integers(0, 10, 32).astype(np.int64)
    with gf.Graph(dtype="float32") as g:
        logits = gf.placeholder("logits", (None, 10))
        labels = gf.placeholder("labels", (None,), "int64")
        loss = softmax_cross_entropy(logits, labels)
    grads = gf.gradients(loss, [logits])
    loss_v, dlogits = gf.Session(g).run([loss, grads["logits"]],
                                        {logits: logits_np, labels: labels_np})
    lt = torch.tensor(logits_np, requires_grad=True)
    tl = F.cross_entropy(lt, torch.tensor(labels_np))
    tl.backward()
    _close(loss_v, tl.item(), "cross-entropy loss")
    _close(dlogits, lt.grad.numpy(), "cross-entropy gradient")
