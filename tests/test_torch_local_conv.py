"""local2d and conv2d (forward and both gradients) against PyTorch, float32."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.conv import conv2d
from graphflow.ops.local import local2d

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional cross-check)")
F = torch.nn.functional


def _close(got, want, rtol=1e-4):
    want = want.detach().numpy() if hasattr(want, "detach") else want
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def _ours(build, x, w, dy):
    """Our output and gradients wrt x and w, with dy flowing into the output."""
    with gf.Graph() as g:
        xp = gf.placeholder("x", x.shape)
        wp = gf.placeholder("w", w.shape)
        out = build(xp, wp)
        dyp = gf.placeholder("dy", dy.shape)
        grads = gf.gradients(out, [xp, wp], dy=dyp)
    assert out.shape == dy.shape
    return gf.Session(g).run([out, grads["x"], grads["w"]], {xp: x, wp: w, dyp: dy})


@pytest.mark.parametrize("n, c, hw, f, k, s, p", [
    (4, 3, (12, 12), 5, 3, 2, 1),     # short patch rows: gather + one gemm a location
    (2, 24, (7, 6), 4, 3, 1, 1),      # long patch rows: one gemm per patch row (direct)
    (3, 8, (9, 9), 6, (3, 2), (2, 1), (0, 1)),
])
def test_local2d_matches_unfold_einsum(n, c, hw, f, k, s, p):
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    ph, pw = (p, p) if isinstance(p, int) else p
    oh, ow = (hw[0] + 2 * ph - kh) // sh + 1, (hw[1] + 2 * pw - kw) // sw + 1
    rng = np.random.default_rng(0)
    xt = rng.standard_normal((n, c, *hw)).astype(np.float32)            # torch NCHW
    wt = rng.standard_normal((oh * ow, c * kh * kw, f)).astype(np.float32)  # (L, K[c,i,j], F)
    dyt = rng.standard_normal((n, f, oh * ow)).astype(np.float32)       # (N, F, L)

    # our layouts: x (H, W, C, N); w (OH, OW, F, K[i,j,c]); y (OH, OW, F, N)
    x = xt.transpose(2, 3, 1, 0).copy()
    w = wt.reshape(oh, ow, c, kh, kw, f).transpose(0, 1, 5, 3, 4, 2).reshape(
        oh, ow, f, kh * kw * c).copy()
    dy = dyt.reshape(n, f, oh, ow).transpose(2, 3, 1, 0).copy()

    y, dx, dw = _ours(lambda a, b: local2d(a, b, (kh, kw), (sh, sw), (ph, pw)), x, w, dy)

    xv = torch.tensor(xt, requires_grad=True)
    wv = torch.tensor(wt, requires_grad=True)
    patches = F.unfold(xv, (kh, kw), padding=(ph, pw), stride=(sh, sw))  # (N, K, L)
    yt = torch.einsum("nkl,lkf->nfl", patches, wv)
    yt.backward(torch.tensor(dyt))

    _close(y, yt.detach().reshape(n, f, oh, ow).permute(2, 3, 1, 0))
    _close(dx, xv.grad.permute(2, 3, 1, 0))
    _close(dw, wv.grad.reshape(oh, ow, c, kh, kw, f).permute(0, 1, 5, 3, 4, 2).reshape(
        oh, ow, f, kh * kw * c))


@pytest.mark.parametrize("n, c, hw, f, k, s, p", [
    (4, 3, (12, 12), 5, 3, 2, 1),
    (2, 6, (9, 8), 4, (3, 2), (1, 2), (2, 0)),
])
def test_conv2d_matches_torch(n, c, hw, f, k, s, p):
    kh, kw = (k, k) if isinstance(k, int) else k
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    w = rng.standard_normal((f, c, kh, kw)).astype(np.float32)
    xv = torch.tensor(x, requires_grad=True)
    wv = torch.tensor(w, requires_grad=True)
    yt = F.conv2d(xv, wv, stride=s, padding=p)
    dy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(dy))

    y, dx, dw = _ours(lambda a, b: conv2d(a, b, stride=s, padding=p), x, w, dy)
    _close(y, yt)
    _close(dx, xv.grad)
    _close(dw, wv.grad)
