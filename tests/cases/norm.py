"""Cases for ops/norm.py: local response normalisation with a channel-window mask matrix."""

import numpy as np

from tests.cases import OpCase


def _mask(c, size):
    """M[c, j] = 1 where channel j is in channel c's window."""
    idx = np.arange(c)
    return (np.abs(idx[:, None] - idx[None, :]) <= size // 2).astype(float)


def _denominator(x, size, alpha, k):
    m = _mask(x.shape[1], size)
    return k + alpha / size * np.einsum("cj,nj...->nc...", m, x * x)


def lrn_ref(x, size=5, alpha=1e-4, beta=0.75, k=2.0):
    return x / _denominator(x, size, alpha, k) ** beta


def lrn_grad_ref(x, dy, size=5, alpha=1e-4, beta=0.75, k=2.0):
    """dx[i] = sum_c dy[c] * dy[c]/dx[i], the Jacobian written out per channel pair."""
    d = _denominator(x, size, alpha, k)
    m = _mask(x.shape[1], size)
    diag = dy * d ** -beta
    # d y[c] / d x[i] (off the diagonal) = -beta x[c] d[c]^(-beta-1) * alpha/size * 2 x[i] M[c, i]
    cross = np.einsum("ci,nc...->ni...", m, dy * x * d ** (-beta - 1))
    return diag - 2 * alpha * beta / size * x * cross


def _x(shape, scale=1.0):
    return lambda rng: [scale * rng.standard_normal(shape)]


def _x_dy(shape, scale=1.0):
    return lambda rng: [scale * rng.standard_normal(shape), rng.standard_normal(shape)]


STRONG = {"size": 5, "alpha": 0.5, "beta": 0.75, "k": 2.0}
NARROW = {"size": 3, "alpha": 1.0, "beta": 0.5, "k": 1.0}

CASES = [
    OpCase("lrn", _x((2, 6, 3, 3), 2.0), lrn_ref, attrs=STRONG),
    OpCase("lrn", _x((1, 4, 2, 5), 2.0), lrn_ref, attrs=NARROW, label="narrow"),
    OpCase("lrn", _x((2, 3, 2, 2), 2.0), lrn_ref, attrs={**STRONG, "size": 7}, label="wide"),
    OpCase("lrn", _x((3, 5)), lrn_ref, attrs={"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 2.0},
           label="defaults-2d"),
    OpCase("lrn_grad", _x_dy((2, 6, 3, 3), 2.0), lrn_grad_ref, attrs=STRONG),
    OpCase("lrn_grad", _x_dy((1, 4, 2, 5), 2.0), lrn_grad_ref, attrs=NARROW, label="narrow"),
]
