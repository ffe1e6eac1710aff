"""Cases for ops/pool.py: NumPy loop references over explicitly padded inputs."""

import numpy as np

from tests.cases import OpCase


def _windows(h, w, kernel, stride, padding):
    """(out_h, out_w, [(oh, ow, rows, cols)]) with rows/cols slices into the padded input."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride or kernel, padding
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    wins = [(i, j, slice(i * sh, i * sh + kh), slice(j * sw, j * sw + kw))
            for i in range(ho) for j in range(wo)]
    return ho, wo, wins


def _pad(x, padding, value):
    ph, pw = padding
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def max_pool_ref(x, kernel, stride=None, padding=(0, 0)):
    ho, wo, wins = _windows(*x.shape[2:], kernel, stride, padding)
    xp = _pad(x, padding, -np.inf)
    out = np.empty(x.shape[:2] + (ho, wo))
    for i, j, r, c in wins:
        out[:, :, i, j] = xp[:, :, r, c].max(axis=(2, 3))
    return out


def max_pool_grad_ref(x, dy, kernel, stride=None, padding=(0, 0)):
    _, _, wins = _windows(*x.shape[2:], kernel, stride, padding)
    ph, pw = padding
    xp = _pad(x, padding, -np.inf)
    dxp = np.zeros_like(xp)
    for n, ch in np.ndindex(x.shape[:2]):
        for i, j, r, c in wins:
            win = xp[n, ch, r, c]
            a, b = np.unravel_index(np.argmax(win), win.shape)  # first max
            dxp[n, ch, r.start + a, c.start + b] += dy[n, ch, i, j]
    return dxp[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]]


def avg_pool_ref(x, kernel, stride=None, padding=(0, 0)):
    ho, wo, wins = _windows(*x.shape[2:], kernel, stride, padding)
    xp = _pad(x, padding, 0.0)
    out = np.empty(x.shape[:2] + (ho, wo))
    for i, j, r, c in wins:
        out[:, :, i, j] = xp[:, :, r, c].sum(axis=(2, 3)) / (kernel[0] * kernel[1])
    return out


def avg_pool_grad_ref(dy, input_hw, kernel, stride=None, padding=(0, 0)):
    _, _, wins = _windows(*input_hw, kernel, stride, padding)
    ph, pw = padding
    dxp = np.zeros(dy.shape[:2] + (input_hw[0] + 2 * ph, input_hw[1] + 2 * pw))
    for i, j, r, c in wins:
        dxp[:, :, r, c] += dy[:, :, i, j, None, None] / (kernel[0] * kernel[1])
    return dxp[:, :, ph:ph + input_hw[0], pw:pw + input_hw[1]]


def _distinct(shape):
    """Values without ties (a scaled permutation), so max pooling is differentiable."""
    def make(rng):
        n = int(np.prod(shape))
        return [(rng.permutation(n).reshape(shape) - n / 2) / 10.0]
    return make


def _distinct_and_dy(shape, dy_shape):
    def make(rng):
        return _distinct(shape)(rng) + [rng.standard_normal(dy_shape)]
    return make


def _normal(shape):
    return lambda rng: [rng.standard_normal(shape)]


K2 = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0)}
K3S2P1 = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}
K23 = {"kernel": (2, 3), "stride": (1, 2), "padding": (1, 0)}

CASES = [
    OpCase("max_pool2d", _distinct((2, 2, 5, 5)), max_pool_ref, attrs=K2),
    OpCase("max_pool2d", _distinct((2, 2, 5, 5)), max_pool_ref, attrs=K3S2P1, label="pad"),
    OpCase("max_pool2d", _distinct((1, 2, 4, 6)), max_pool_ref, attrs=K23, label="rect"),
    OpCase("max_pool2d", lambda r: [-1.0 - r.permutation(9).reshape(1, 1, 3, 3) / 10],
           max_pool_ref, attrs=K3S2P1, label="negative-pad"),
    OpCase("max_pool2d_grad", _distinct_and_dy((2, 2, 5, 5), (2, 2, 3, 3)), max_pool_grad_ref,
           attrs=K3S2P1),
    OpCase("max_pool2d_grad", lambda r: [np.zeros((1, 1, 4, 4)), r.standard_normal((1, 1, 2, 2))],
           max_pool_grad_ref, attrs=K2, label="ties-first"),
    # 2x2 at stride 2 has its own kernel; an odd last row and column are in no window
    OpCase("max_pool2d_grad", _distinct_and_dy((2, 3, 5, 7), (2, 3, 2, 3)), max_pool_grad_ref,
           attrs=K2, label="pairs"),
    OpCase("avg_pool2d", _normal((2, 2, 5, 5)), avg_pool_ref, attrs=K3S2P1),
    OpCase("avg_pool2d", _normal((1, 2, 4, 6)), avg_pool_ref, attrs=K23, label="rect"),
    OpCase("avg_pool2d_grad", _normal((2, 2, 3, 3)), avg_pool_grad_ref,
           attrs={**K3S2P1, "input_hw": (5, 5)}),
    OpCase("avg_pool2d_grad", _normal((1, 2, 5, 2)), avg_pool_grad_ref,
           attrs={**K23, "input_hw": (4, 6)}, label="rect"),
]
