"""Cases for ops/conv.py: 2-D convolution in NCHW layout, references by plain loops."""

import numpy as np

from tests.cases import OpCase


def _two(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _padded(x, ph, pw):
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp[:, :, ph:ph + H, pw:pw + W] = x
    return xp


def _out(h, w, kh, kw, sh, sw, ph, pw):
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def ref_conv2d(x, w, stride=1, padding=0):
    (sh, sw), (ph, pw) = _two(stride), _two(padding)
    F, C, kh, kw = w.shape
    oh, ow = _out(x.shape[2], x.shape[3], kh, kw, sh, sw, ph, pw)
    xp = _padded(x, ph, pw)
    y = np.zeros((x.shape[0], F, oh, ow))
    for n in range(x.shape[0]):
        for f in range(F):
            for a in range(oh):
                for b in range(ow):
                    y[n, f, a, b] = np.sum(w[f] * xp[n, :, a * sh:a * sh + kh, b * sw:b * sw + kw])
    return y


def ref_grad_input(w, dy, stride=1, padding=0, input_hw=None):
    (sh, sw), (ph, pw) = _two(stride), _two(padding)
    F, C, kh, kw = w.shape
    H, W = input_hw
    dxp = np.zeros((dy.shape[0], C, H + 2 * ph, W + 2 * pw))
    for n in range(dy.shape[0]):
        for f in range(F):
            for a in range(dy.shape[2]):
                for b in range(dy.shape[3]):
                    dxp[n, :, a * sh:a * sh + kh, b * sw:b * sw + kw] += dy[n, f, a, b] * w[f]
    return dxp[:, :, ph:ph + H, pw:pw + W]


def ref_grad_weight(x, dy, kernel, stride=1, padding=0):
    (kh, kw), (sh, sw), (ph, pw) = _two(kernel), _two(stride), _two(padding)
    xp = _padded(x, ph, pw)
    dw = np.zeros((dy.shape[1], x.shape[1], kh, kw))
    for n in range(x.shape[0]):
        for f in range(dy.shape[1]):
            for a in range(dy.shape[2]):
                for b in range(dy.shape[3]):
                    dw[f] += dy[n, f, a, b] * xp[n, :, a * sh:a * sh + kh, b * sw:b * sw + kw]
    return dw


def _cases(label, n, c, hw, f, kernel, stride, padding):
    (kh, kw), (sh, sw), (ph, pw) = _two(kernel), _two(stride), _two(padding)
    oh, ow = _out(*hw, kh, kw, sh, sw, ph, pw)
    x_shape, w_shape, y_shape = (n, c, *hw), (f, c, kh, kw), (n, f, oh, ow)
    attrs = {"stride": (sh, sw), "padding": (ph, pw)}

    def inputs(*shapes):
        return lambda rng: [rng.standard_normal(s) for s in shapes]

    return [
        OpCase("conv2d", inputs(x_shape, w_shape), ref_conv2d, attrs, label),
        OpCase("conv2d_grad_input", inputs(w_shape, y_shape), ref_grad_input,
               {**attrs, "input_hw": hw}, label),
        OpCase("conv2d_grad_weight", inputs(x_shape, y_shape), ref_grad_weight,
               {**attrs, "kernel": (kh, kw)}, label),
    ]


CASES = [
    *_cases("k3s1", 2, 2, (5, 5), 3, 3, 1, 0),
    *_cases("k3s2p1", 2, 2, (6, 6), 3, 3, 2, 1),
    *_cases("k3s1p1", 2, 2, (5, 5), 3, 3, 1, 1),
    *_cases("rect", 2, 2, (6, 5), 2, (3, 2), (2, 1), (0, 1)),
    *_cases("pad2", 1, 2, (4, 4), 2, 3, 3, 2),
]
