"""Cases for ops/local.py: locally connected layer in HWCN layout, references by plain loops."""

import numpy as np

from tests.cases import OpCase


def _geo(kernel, stride, padding):
    def two(v):
        return (v, v) if isinstance(v, int) else tuple(v)
    return (*two(kernel), *two(stride), *two(padding))


def _windows(h, w, kernel, stride, padding):
    """Yield (oh, ow, row0, col0) of every window in padded coordinates."""
    kh, kw, sh, sw, ph, pw = _geo(kernel, stride, padding)
    for oh in range((h + 2 * ph - kh) // sh + 1):
        for ow in range((w + 2 * pw - kw) // sw + 1):
            yield oh, ow, oh * sh, ow * sw


def ref_local2d(x, w, kernel, stride=1, padding=0):
    kh, kw, _, _, ph, pw = _geo(kernel, stride, padding)
    H, W, C, N = x.shape
    xp = np.zeros((H + 2 * ph, W + 2 * pw, C, N))
    xp[ph:ph + H, pw:pw + W] = x
    y = np.zeros(w.shape[:3] + (N,))
    for oh, ow, r, c in _windows(H, W, kernel, stride, padding):
        for f in range(w.shape[2]):
            for i in range(kh):
                for j in range(kw):
                    for ch in range(C):
                        y[oh, ow, f] += w[oh, ow, f, (i * kw + j) * C + ch] * xp[r + i, c + j, ch]
    return y


def ref_grad_input(w, dy, kernel, stride=1, padding=0, input_hw=None):
    kh, kw, _, _, ph, pw = _geo(kernel, stride, padding)
    H, W = input_hw
    C, N = w.shape[3] // (kh * kw), dy.shape[3]
    dxp = np.zeros((H + 2 * ph, W + 2 * pw, C, N))
    for oh, ow, r, c in _windows(H, W, kernel, stride, padding):
        for i in range(kh):
            for j in range(kw):
                for ch in range(C):
                    dxp[r + i, c + j, ch] += w[oh, ow, :, (i * kw + j) * C + ch] @ dy[oh, ow]
    return dxp[ph:ph + H, pw:pw + W]


def ref_grad_weight(x, dy, kernel, stride=1, padding=0):
    kh, kw, _, _, ph, pw = _geo(kernel, stride, padding)
    H, W, C, N = x.shape
    xp = np.zeros((H + 2 * ph, W + 2 * pw, C, N))
    xp[ph:ph + H, pw:pw + W] = x
    dw = np.zeros(dy.shape[:3] + (kh * kw * C,))
    for oh, ow, r, c in _windows(H, W, kernel, stride, padding):
        for i in range(kh):
            for j in range(kw):
                for ch in range(C):
                    dw[oh, ow, :, (i * kw + j) * C + ch] = dy[oh, ow] @ xp[r + i, c + j, ch]
    return dw


def _cases(label, hw, c, n, f, kernel, stride, padding):
    kh, kw, sh, sw, ph, pw = _geo(kernel, stride, padding)
    oh, ow = (hw[0] + 2 * ph - kh) // sh + 1, (hw[1] + 2 * pw - kw) // sw + 1
    x_shape, w_shape, y_shape = hw + (c, n), (oh, ow, f, kh * kw * c), (oh, ow, f, n)
    attrs = {"kernel": (kh, kw), "stride": (sh, sw), "padding": (ph, pw)}

    def inputs(*shapes):
        return lambda rng: [rng.standard_normal(s) for s in shapes]

    return [
        OpCase("local2d", inputs(x_shape, w_shape), ref_local2d, attrs, label),
        OpCase("local2d_grad_input", inputs(w_shape, y_shape), ref_grad_input,
               {**attrs, "input_hw": hw}, label),
        OpCase("local2d_grad_weight", inputs(x_shape, y_shape), ref_grad_weight, attrs, label),
    ]


CASES = [
    *_cases("k3s2", (5, 5), 2, 2, 3, 3, 2, 0),
    *_cases("k3s1p1", (4, 4), 2, 2, 2, 3, 1, 1),
    *_cases("k3s2p1", (6, 6), 2, 2, 2, 3, 2, 1),
    *_cases("rect", (6, 5), 2, 2, 2, (3, 2), (1, 2), (1, 0)),
    *_cases("c8", (4, 4), 8, 2, 2, 2, 2, 1),
    # wide patch rows (kw * C >= 64) take the per-row gemm ("direct") kernels
    *_cases("direct", (3, 3), 32, 1, 1, 2, 1, 1),
]
