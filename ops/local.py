"""Locally connected 2-D layer (DistBelief's layer: unshared weights at every output location).

The ops work in HWCN layout (batch last, as cuda-convnet did): the patch of one output
location is `kh` contiguous runs of `kw * C * N` values, and each location is one BLAS gemm
straight into its contiguous (F, N) block of the output.

    x:  (H, W, C, N)           w: (OH, OW, F, KH * KW * C), K ordered (kh, kw, c)
    y:  (OH, OW, F, N)         y[oh, ow] = w[oh, ow] @ patch(oh, ow)   (patch is (K, N))

Padding is zeros and is handled inside the kernels (the clipped part of a patch row is zeroed),
so no padded copy of the input is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops import rules
from graphflow.ops.blas import NT, TR, gemm
from graphflow.ops.registry import (
    CostFn,
    Spec,
    apply,
    dot_cost,
    expect_ndim,
    fmt,
    register,
    same_float_dtype,
)
from graphflow.ops.window import attr_pair, geometry, out_size, pair

Grads = Sequence[Node | None]


# -- kernels -----------------------------------------------------------------------------------
#
# Each location is computed by BLAS gemm calls on raw strided blocks of the flat HWCN arrays.
# "direct" mode makes one gemm per patch row straight from / into the input rows (no patch
# copy at all: best when a row, kw * C values, is long); otherwise the patch is gathered into a
# (K, N) buffer and one gemm covers the location.

@njit(cache=True, nogil=True, inline="always")
def copy_run(dst: np.ndarray, d: int, src: np.ndarray, s: int, n: int, step: int) -> None:
    """dst[d:d+n] = src[s:s+n*step:step]; unsigned indices let LLVM drop the wraparound
    checks and vectorize."""
    d0, s0 = np.uintp(d), np.uintp(s)
    if step == 1:
        for t in range(np.uintp(n)):
            dst[d0 + t] = src[s0 + t]
    else:
        st = np.uintp(step)
        for t in range(np.uintp(n)):
            dst[d0 + t] = src[s0 + t * st]


@njit(cache=True, nogil=True, inline="always")
def zero_run(dst: np.ndarray, d: int, n: int) -> None:
    d0 = np.uintp(d)
    for t in range(np.uintp(n)):
        dst[d0 + t] = 0


@njit(cache=True, nogil=True, inline="always")
def add_run(dst: np.ndarray, d: int, src: np.ndarray, s: int, n: int, step: int) -> None:
    """dst[d:d+n*step:step] += src[s:s+n] (unsigned indices, as in copy_run)."""
    d0, s0 = np.uintp(d), np.uintp(s)
    if step == 1:
        for t in range(np.uintp(n)):
            dst[d0 + t] += src[s0 + t]
    else:
        st = np.uintp(step)
        for t in range(np.uintp(n)):
            dst[d0 + t * st] += src[s0 + t]


@njit(cache=True, nogil=True, inline="always")
def _row_span(h0: int, w0: int, i: int, H: int, W: int, kw: int) -> tuple[int, int, int]:
    """Patch row i of the window at (h0, w0): (input row or -1, first valid col, end col)."""
    h = h0 + i
    if h < 0 or h >= H:
        return -1, 0, 0
    return h, max(w0, 0), min(w0 + kw, W)


@njit(cache=True, nogil=True)
def gather_patch(xf: np.ndarray, H: int, W: int, CN: int, h0: int, w0: int, kh: int, kw: int,
                 pf: np.ndarray) -> None:
    """pf (flat (K, N) patch) <- the kh x kw window at (h0, w0) of flat HWCN xf, zero outside."""
    seg = kw * CN
    for i in range(kh):
        base = i * seg
        h, lo, hi = _row_span(h0, w0, i, H, W, kw)
        if h < 0 or hi <= lo:
            zero_run(pf, base, seg)
            continue
        a = base + (lo - w0) * CN
        b = base + (hi - w0) * CN
        zero_run(pf, base, a - base)
        copy_run(pf, a, xf, (h * W + lo) * CN, b - a, 1)
        zero_run(pf, b, base + seg - b)


@njit(cache=True, nogil=True)
def scatter_patch(pf: np.ndarray, H: int, W: int, CN: int, h0: int, w0: int, kh: int, kw: int,
                  xf: np.ndarray) -> None:
    """flat HWCN xf += the flat (K, N) patch pf at window (h0, w0); the outside is dropped."""
    seg = kw * CN
    for i in range(kh):
        h, lo, hi = _row_span(h0, w0, i, H, W, kw)
        if h < 0 or hi <= lo:
            continue
        add_run(xf, (h * W + lo) * CN, pf, i * seg + (lo - w0) * CN, (hi - lo) * CN, 1)


@njit(cache=True, nogil=True)
def local_forward(x: np.ndarray, w: np.ndarray, kh: int, kw: int, sh: int, sw: int, ph: int,
                  pw: int, direct: bool, y: np.ndarray) -> None:
    H, W, C, N = x.shape
    OH, OW, Fo, K = w.shape
    xf, wf, yf = x.reshape(x.size), w.reshape(w.size), y.reshape(y.size)
    zero, one = np.zeros(1, x.dtype), np.ones(1, x.dtype)
    pf = np.empty(0 if direct else K * N, x.dtype)
    for oh in range(OH):
        for ow in range(OW):
            h0, w0 = oh * sh - ph, ow * sw - pw
            wl, yl = (oh * OW + ow) * Fo * K, (oh * OW + ow) * Fo * N
            if not direct:
                gather_patch(xf, H, W, C * N, h0, w0, kh, kw, pf)
                gemm(NT, NT, Fo, N, K, wf[wl:], K, pf, N, zero, yf[yl:], N)
                continue
            first = True
            for i in range(kh):
                h, lo, hi = _row_span(h0, w0, i, H, W, kw)
                if h < 0 or hi <= lo:
                    continue
                gemm(NT, NT, Fo, N, (hi - lo) * C, wf[wl + (i * kw + lo - w0) * C:], K,
                     xf[(h * W + lo) * C * N:], N, zero if first else one, yf[yl:], N)
                first = False
            if first:
                yf[yl:yl + Fo * N] = 0


@njit(cache=True, nogil=True)
def local_grad_weight(x: np.ndarray, dy: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                      ph: int, pw: int, dw: np.ndarray) -> None:
    """dw[l] = dy[l] @ patch(l).T (per-row gemms measured no faster here: the gemm is
    bound by writing dw, not by the patch copy)."""
    H, W, C, N = x.shape
    OH, OW, Fo, K = dw.shape
    xf, dyf, dwf = x.reshape(x.size), dy.reshape(dy.size), dw.reshape(dw.size)
    zero = np.zeros(1, x.dtype)
    pf = np.empty(K * N, x.dtype)
    for oh in range(OH):
        for ow in range(OW):
            l = oh * OW + ow
            gather_patch(xf, H, W, C * N, oh * sh - ph, ow * sw - pw, kh, kw, pf)
            gemm(NT, TR, Fo, K, N, dyf[l * Fo * N:], N, pf, N, zero, dwf[l * Fo * K:], K)


# error_model="numpy": the update rules divide (ops/rules.py)
@njit(cache=True, nogil=True, error_model="numpy")
def local_grad_weight_update(x: np.ndarray, dy: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                             ph: int, pw: int, p: np.ndarray, rule: int, s: np.ndarray,
                             y: np.ndarray, lr: float, mu: float, eps: float,
                             scale: float) -> None:
    """Update p (OH, OW, F, K) by `rule` (ops/rules.py, with its flat state s) from the
    gradient `scale * (dw + y)`, dw as `local_grad_weight` computes it (y: a flat sum over
    earlier micro-batches, or empty): each location's block of dw goes to the rule while it is
    in cache, so dw is never written out and read back (two passes over an array as large as
    p, which a locally connected layer's weights make the step's largest)."""
    H, W, C, N = x.shape
    OH, OW, Fo, K = p.shape
    xf, dyf, pflat = x.reshape(x.size), dy.reshape(dy.size), p.reshape(p.size)
    zero = np.zeros(1, x.dtype)
    pf = np.empty(K * N, x.dtype)
    block = np.empty(Fo * K, x.dtype)
    for oh in range(OH):
        for ow in range(OW):
            l = oh * OW + ow
            gather_patch(xf, H, W, C * N, oh * sh - ph, ow * sw - pw, kh, kw, pf)
            gemm(NT, TR, Fo, K, N, dyf[l * Fo * N:], N, pf, N, zero, block, K)
            rules.run(rule, pflat, s, block, 0, y, l * Fo * K, Fo * K, lr, mu, eps, scale)


@njit(cache=True, nogil=True)
def local_grad_input(w: np.ndarray, dy: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                     ph: int, pw: int, direct: bool, dx: np.ndarray) -> None:
    """dx (zeroed, HWCN) += every location's w[l].T @ dy[l], added back into its window."""
    H, W, C, N = dx.shape
    OH, OW, Fo, K = w.shape
    wf, dyf, dxf = w.reshape(w.size), dy.reshape(dy.size), dx.reshape(dx.size)
    zero, one = np.zeros(1, dx.dtype), np.ones(1, dx.dtype)
    pf = np.empty(0 if direct else K * N, dx.dtype)
    for oh in range(OH):
        for ow in range(OW):
            h0, w0 = oh * sh - ph, ow * sw - pw
            wl, yl = (oh * OW + ow) * Fo * K, (oh * OW + ow) * Fo * N
            if not direct:
                gemm(TR, NT, K, N, Fo, wf[wl:], K, dyf[yl:], N, zero, pf, N)
                scatter_patch(pf, H, W, C * N, h0, w0, kh, kw, dxf)
                continue
            for i in range(kh):
                h, lo, hi = _row_span(h0, w0, i, H, W, kw)
                if h < 0 or hi <= lo:
                    continue
                gemm(TR, NT, (hi - lo) * C, N, Fo, wf[wl + (i * kw + lo - w0) * C:], K,
                     dyf[yl:], N, one, dxf[(h * W + lo) * C * N:], N)


# -- op definitions ----------------------------------------------------------------------------

def expect_known(shape: Shape, dims: Sequence[int], what: str) -> None:
    """Only the batch dimension may be None: dims `dims` of `shape` must be known, positive."""
    if any(shape[d] is None for d in dims):
        raise ShapeError(f"{what} {fmt(shape)} may be unknown (None) only in its batch dim N")
    if any(shape[d] < 1 for d in dims):
        raise ShapeError(f"{what} {fmt(shape)} has an empty dimension")


def _batch(a: Shape, b: Shape) -> int | None:
    na, nb = a[-1], b[-1]
    if na is not None and nb is not None and na != nb:
        raise ShapeError(f"batch sizes differ: {na} vs {nb}")
    return na if na is not None else nb


def _check_weight(w: Shape, oh: int, ow: int, k: int, what: str = "weight") -> None:
    if tuple(w[:2]) != (oh, ow) or w[3] != k:
        raise ShapeError(f"{what} is {fmt(w)}, expected ({oh}, {ow}, F, {k}) = (OH, OW, F, "
                         f"KH*KW*C) for this input and kernel")


def _infer_local2d(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, w = ins
    expect_ndim(x, 4, "input", "(H, W, C, N)")
    expect_ndim(w, 4, "weight", "(OH, OW, F, KH*KW*C)")
    dtype = same_float_dtype(ins)
    expect_known(x.shape, (0, 1, 2), "input")
    expect_known(w.shape, range(4), "weight")
    kh, kw = geometry(attrs)[:2]
    oh, ow = out_size(x.shape[0], x.shape[1], attrs)
    _check_weight(w.shape, oh, ow, kh * kw * x.shape[2])
    return Spec((oh, ow, w.shape[2], x.shape[3]), dtype)


def _infer_grad_input(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    w, dy = ins
    expect_ndim(w, 4, "weight", "(OH, OW, F, KH*KW*C)")
    expect_ndim(dy, 4, "output gradient", "(OH, OW, F, N)")
    dtype = same_float_dtype(ins)
    expect_known(w.shape, range(4), "weight")
    expect_known(dy.shape, (0, 1, 2), "output gradient")
    kh, kw = geometry(attrs)[:2]
    h, wd = pair(attrs["input_hw"], "input_hw", 1)
    if w.shape[3] % (kh * kw):
        raise ShapeError(f"weight K = {w.shape[3]} is not a multiple of the {kh}x{kw} kernel")
    oh, ow = out_size(h, wd, attrs)
    _check_weight(w.shape, oh, ow, w.shape[3])
    if tuple(dy.shape[:3]) != tuple(w.shape[:3]):
        raise ShapeError(f"output gradient is {fmt(dy.shape)}, expected ({oh}, {ow}, "
                         f"{w.shape[2]}, N)")
    return Spec((h, wd, w.shape[3] // (kh * kw), dy.shape[3]), dtype)


def _infer_grad_weight(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, dy = ins
    expect_ndim(x, 4, "input", "(H, W, C, N)")
    expect_ndim(dy, 4, "output gradient", "(OH, OW, F, N)")
    dtype = same_float_dtype(ins)
    expect_known(x.shape, (0, 1, 2), "input")
    expect_known(dy.shape, (0, 1, 2), "output gradient")
    kh, kw = geometry(attrs)[:2]
    oh, ow = out_size(x.shape[0], x.shape[1], attrs)
    if tuple(dy.shape[:2]) != (oh, ow):
        raise ShapeError(f"output gradient is {fmt(dy.shape)}, expected ({oh}, {ow}, F, N)")
    _batch(x.shape, dy.shape)
    return Spec((oh, ow, dy.shape[2], kh * kw * x.shape[2]), dtype)


def _direct(kw: int, c: int) -> bool:
    """Per-row gemms beat gather + one gemm once a patch row (kw * C values) is long enough
    (measured: kw * C = 21 gathers faster, 160 runs direct faster)."""
    return kw * c >= 64


def _local2d_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, w = (np.ascontiguousarray(a) for a in ins)
    kh, kw, sh, sw, ph, pw = geometry(attrs)
    y = np.empty(w.shape[:3] + x.shape[3:], x.dtype)
    if y.size:  # BLAS rejects an empty batch
        local_forward(x, w, kh, kw, sh, sw, ph, pw, _direct(kw, x.shape[2]), y)
    return y


def _grad_input_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    w, dy = (np.ascontiguousarray(a) for a in ins)
    kh, kw, sh, sw, ph, pw = geometry(attrs)
    c = w.shape[3] // (kh * kw)
    dx = np.zeros(tuple(attrs["input_hw"]) + (c, dy.shape[3]), dy.dtype)
    if dx.size:
        local_grad_input(w, dy, kh, kw, sh, sw, ph, pw, _direct(kw, c), dx)
    return dx


def _grad_weight_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, dy = (np.ascontiguousarray(a) for a in ins)
    kh, kw, sh, sw, ph, pw = geometry(attrs)
    if x.shape[3] == 0:  # BLAS rejects an empty batch
        return np.zeros(dy.shape[:3] + (kh * kw * x.shape[2],), x.dtype)
    dw = np.empty(dy.shape[:3] + (kh * kw * x.shape[2],), x.dtype)
    local_grad_weight(x, dy, kh, kw, sh, sw, ph, pw, dw)
    return dw


def _local2d_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    x, w = node.inputs
    geo = {k: node.attrs[k] for k in ("kernel", "stride", "padding")}
    return [apply("local2d_grad_input", w, dy, input_hw=tuple(x.shape[:2]), **geo)
            if wants[0] else None,
            apply("local2d_grad_weight", x, dy, **geo) if wants[1] else None]


def _cost(weight: int, grad: int) -> CostFn:
    """2 N K F OH OW flops (one (F, K) x (K, N) product a location): a dot product of K terms
    (w is (OH, OW, F, K)) per element of y or dy (OH, OW, F, N)."""
    return dot_cost(weight, grad, lambda w: w[3])


register("local2d", _infer_local2d, _local2d_forward, _local2d_grad, _cost(1, 2),
         doc="locally connected 2-D layer, HWCN: x (H, W, C, N), w (OH, OW, F, KH*KW*C) -> "
             "(OH, OW, F, N); attrs kernel, stride, padding")
register("local2d_grad_input", _infer_grad_input, _grad_input_forward, None, _cost(0, 1),
         doc="gradient of local2d wrt its input: (w, dy) -> (H, W, C, N); attrs as local2d "
             "and input_hw")
register("local2d_grad_weight", _infer_grad_weight, _grad_weight_forward, None, _cost(2, 1),
         doc="gradient of local2d wrt its weight: (x, dy) -> (OH, OW, F, KH*KW*C)")


# -- the DSL's functions -----------------------------------------------------------------------

def local2d(x: Node, w: Node, kernel: int | tuple[int, int], stride: int | tuple[int, int] = 1,
            padding: int | tuple[int, int] = 0, name: str | None = None) -> Node:
    """Locally connected layer in HWCN layout: an unshared (F, KH*KW*C) filter bank at each of
    the OH x OW output locations, zero padding.

    >>> import graphflow as gf
    >>> from graphflow.ops.local import local2d
    >>> with gf.Graph() as g:
    ...     x = gf.placeholder("x", (8, 8, 3, None))
    ...     w = gf.parameter("w", (3, 3, 4, 3 * 3 * 3))
    ...     y = local2d(x, w, kernel=3, stride=2)
    >>> y.shape
    (3, 3, 4, None)
    """
    return apply("local2d", x, w, name=name, kernel=attr_pair(kernel, "kernel", 1),
                 stride=attr_pair(stride, "stride", 1), padding=attr_pair(padding, "padding", 0))
