"""Local response normalisation across channels (AlexNet / DistBelief style), and its gradient.

For x of shape (N, C, ...) and channel c with window W(c) = [c - size//2, c + size//2] cut to
[0, C):

    d[c] = k + alpha / size * sum_{j in W(c)} x[j]^2        y[c] = x[c] * d[c]^-beta

This is torch.nn.functional.local_response_norm's formula. Since j in W(c) iff c in W(j), the
gradient is

    dx[i] = dy[i] d[i]^-beta - 2 alpha beta / size * x[i] sum_{c in W(i)} dy[c] x[c] d[c]^(-beta-1)

lrn_grad recomputes d from x, so the forward pass stores nothing extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node
from graphflow.ops.registry import Cost, Spec, apply, fmt, register, same_float_dtype

Grads = Sequence[Node | None]


@njit(cache=True, nogil=True)
def _window_sums(x: np.ndarray, n: int, size: int, alpha: float, k: float,
                 d: np.ndarray) -> None:
    """d[c, p] = k + alpha / size * sum over c's channel window of x[n, j, p]^2."""
    c_, p_ = x.shape[1], x.shape[2]
    half = size // 2
    a = alpha / size
    for c in range(c_):
        for p in range(p_):
            d[c, p] = 0.0
        for j in range(max(0, c - half), min(c_, c + half + 1)):
            for p in range(p_):
                d[c, p] += x[n, j, p] * x[n, j, p]
        for p in range(p_):
            d[c, p] = k + a * d[c, p]


@njit(cache=True, nogil=True)
def _lrn_kernel(x: np.ndarray, out: np.ndarray, size: int, alpha: float, beta: float,
                k: float) -> None:
    n_, c_, p_ = x.shape
    d = np.empty((c_, p_), np.float64)
    for n in range(n_):
        _window_sums(x, n, size, alpha, k, d)
        for c in range(c_):
            for p in range(p_):
                out[n, c, p] = x[n, c, p] * d[c, p] ** -beta


@njit(cache=True, nogil=True)
def _lrn_grad_kernel(x: np.ndarray, dy: np.ndarray, dx: np.ndarray, size: int, alpha: float,
                     beta: float, k: float) -> None:
    n_, c_, p_ = x.shape
    half = size // 2
    coef = 2.0 * alpha * beta / size
    d = np.empty((c_, p_), np.float64)
    t = np.empty((c_, p_), np.float64)
    acc = np.empty(p_, np.float64)
    for n in range(n_):
        _window_sums(x, n, size, alpha, k, d)
        for c in range(c_):
            for p in range(p_):
                t[c, p] = dy[n, c, p] * x[n, c, p] * d[c, p] ** (-beta - 1.0)
        for c in range(c_):
            acc[:] = 0.0
            for j in range(max(0, c - half), min(c_, c + half + 1)):
                for p in range(p_):
                    acc[p] += t[j, p]
            for p in range(p_):
                dx[n, c, p] = dy[n, c, p] * d[c, p] ** -beta - coef * x[n, c, p] * acc[p]


def _params(attrs: dict[str, Any]) -> tuple[int, float, float, float]:
    size = attrs.get("size", 5)
    alpha, beta, k = (attrs.get(a, v) for a, v in (("alpha", 1e-4), ("beta", 0.75), ("k", 2.0)))
    if not isinstance(size, (int, np.integer)) or size < 1 or size % 2 == 0:
        raise ShapeError(f"size is {size!r}, expected a positive odd int")
    for what, v in (("alpha", alpha), ("beta", beta), ("k", k)):
        if not isinstance(v, (int, float, np.floating, np.integer)):
            raise ShapeError(f"{what} is {v!r}, expected a number")
    if k <= 0:
        raise ShapeError(f"k is {k}, expected k > 0 (the normaliser's base must stay positive)")
    return int(size), float(alpha), float(beta), float(k)


def _infer_lrn(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x = ins[0]
    if len(x.shape) < 2:
        raise ShapeError(f"input has {len(x.shape)} dims, expected 4 (N, C, H, W) or (N, C, ...)")
    if x.shape[1] is None:
        raise ShapeError(f"input shape {fmt(x.shape)} must have a known channel count C")
    if len(ins) == 2 and tuple(ins[1].shape) != tuple(x.shape):
        raise ShapeError(f"dy has shape {fmt(ins[1].shape)}, expected x's shape {fmt(x.shape)}")
    _params(attrs)
    return Spec(x.shape, same_float_dtype(ins))


def _as3d(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1], -1)


def _lrn_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    (x,) = ins
    out = np.empty_like(x)
    _lrn_kernel(_as3d(x), _as3d(out), *_params(attrs))
    return out


def _lrn_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, dy = ins
    dx = np.empty_like(x)
    _lrn_grad_kernel(_as3d(x), _as3d(dy), _as3d(dx), *_params(attrs))
    return dx


def _lrn_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("lrn_grad", node.inputs[0], dy, **node.attrs)]


def _lrn_cost(per_window: float, per_element: float):  # noqa: ANN202 - a cost function factory
    def cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
             itemsize: int) -> Cost:
        n = prod(out)
        flops = n * (per_window * _params(attrs)[0] + per_element)
        return Cost(float(flops), float(itemsize * sum(prod(s) for s in ins)), float(itemsize * n))
    return cost


register("lrn", _infer_lrn, _lrn_forward, _lrn_grad, _lrn_cost(2, 15),
         doc="local response normalisation across channels (attrs size, alpha, beta, k)")
register("lrn_grad", _infer_lrn, _lrn_grad_forward, None, _lrn_cost(3, 35),
         doc="gradient of lrn (inputs x, dy; lrn's attrs)")


def lrn(x: Node, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0,
        name: str | None = None) -> Node:
    """Local response normalisation across the channels of an (N, C, H, W) tensor:
    y = x / (k + alpha / size * sum of x^2 over `size` neighbouring channels) ** beta.

    >>> import graphflow as gf
    >>> with gf.Graph():
    ...     y = lrn(gf.placeholder("x", (None, 8, 4, 4)), size=3)
    >>> y.shape
    (None, 8, 4, 4)
    """
    return apply("lrn", x, name=name, size=size, alpha=alpha, beta=beta, k=k)
