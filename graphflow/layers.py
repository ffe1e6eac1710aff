"""Layers built from registered ops: dense, local2d (DistBelief's locally connected layer,
unshared weights), conv2d, pooling and normalisation. Activations are NCHW, except that
local2d also takes and gives (H, W, C, N), its kernels' own layout (`layout="HWCN"`).

A layer opens a name scope, so its parameters are `<name>/W` and `<name>/b` (the parameter
server keys parameters by these names).

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 3, 16, 16))
...     h = gf.layers.local2d(x, filters=4, kernel_size=5, stride=2, name="lc1")
>>> h.shape, g["lc1/W"].shape
((None, 4, 6, 6), (6, 6, 4, 75))
"""

from __future__ import annotations

from graphflow.dsl import name_scope, parameter
from graphflow.errors import ShapeError
from graphflow.init import taken
from graphflow.ir import Node, current_graph, format_tuple, user_source_line
from graphflow.ops.conv import conv2d as conv2d_op
from graphflow.ops.elementwise import add
from graphflow.ops.local import local2d as local2d_op
from graphflow.ops.matmul import matmul
from graphflow.ops.norm import lrn
from graphflow.ops.pool import avg_pool2d, max_pool2d
from graphflow.ops.shape import transpose
from graphflow.ops.window import is_int, pair

__all__ = ["HWCN_TO_NCHW", "NCHW_TO_HWCN", "avg_pool2d", "conv2d", "dense", "local2d", "lrn",
           "max_pool2d"]

NCHW_TO_HWCN = (2, 3, 1, 0)  # transpose(x, NCHW_TO_HWCN): an NCHW image in local2d's layout
HWCN_TO_NCHW = (3, 2, 0, 1)


def _where(kind: str, name: str) -> str:
    """`conv2d 'c1' (model.py:12)`: a layer's errors come before its nodes exist."""
    return f"{kind} '{name}' ({user_source_line()})"


def _pair(v: int | tuple[int, int], what: str, minimum: int, kind: str,
          name: str) -> tuple[int, int]:
    try:
        return pair(v, what, minimum)
    except ShapeError as e:
        raise ShapeError(f"{_where(kind, name)}: {e}") from None


def _count(v: int, what: str, kind: str, name: str) -> int:
    if not is_int(v) or v < 1:
        raise ShapeError(f"{_where(kind, name)}: {what} must be a positive int, got {v!r}")
    return int(v)


def _window(kernel_size: int | tuple[int, int], stride: int | tuple[int, int],
            padding: int | tuple[int, int], kind: str,
            name: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The validated (kh, kw), (sh, sw), (ph, pw) of a windowed layer."""
    return (_pair(kernel_size, "kernel_size", 1, kind, name),
            _pair(stride, "stride", 1, kind, name), _pair(padding, "padding", 0, kind, name))


def _scope(kind: str, name: str | None) -> str:
    return name or current_graph().new_name(kind)


def _expect_image(x: Node, kind: str, name: str, layout: str = "NCHW") -> int:
    """The channels of image `x` in `layout` (its letters name x's dims)."""
    if layout not in ("NCHW", "HWCN"):
        raise ValueError(f"{_where(kind, name)}: layout {layout!r} is not 'NCHW' or 'HWCN'")
    if len(x.shape) != 4:
        raise ShapeError(f"{_where(kind, name)}: input has {len(x.shape)} dims, expected 4 "
                         f"({', '.join(layout)})")
    unknown = [d for d, size in zip(layout, x.shape, strict=True) if d != "N" and size is None]
    if unknown:  # (an NCHW batch given as HWCN: its H would be the batch's size)
        raise ShapeError(f"{_where(kind, name)}: input of shape {format_tuple(x.shape)} has "
                         f"no size for {unknown[0]} in layout {layout}; only N may be None")
    return int(x.shape[layout.index("C")])


def _out_size(size: int, kernel: int, stride: int, pad: int, kind: str, name: str) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ShapeError(f"{_where(kind, name)}: kernel {kernel} with padding {pad} does not "
                         f"fit an input of size {size}")
    return out


def dense(x: Node, units: int, name: str | None = None, init: str = "glorot_uniform",
          bias: bool = True) -> Node:
    """x @ W + b for x of shape (N, features)."""
    scope = _scope("dense", name)
    if len(x.shape) != 2:
        raise ShapeError(f"{_where('dense', scope)}: input has {len(x.shape)} dims, expected 2 "
                         f"(N, features); flatten it first")
    if x.shape[1] is None:
        raise ShapeError(f"{_where('dense', scope)}: dense needs a known input feature size, "
                         f"got an input of shape {format_tuple(x.shape)}")
    units = _count(units, "units", "dense", scope)
    with name_scope(scope):
        w = parameter("W", (int(x.shape[1]), units), init=init)
        y = matmul(x, w)
        return add(y, parameter("b", (units,), init="zeros")) if bias else y


def local2d(x: Node, filters: int, kernel_size: int | tuple[int, int],
            stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
            name: str | None = None, init: str = "glorot_uniform", bias: bool = True,
            layout: str = "NCHW") -> Node:
    """Locally connected 2-D layer: a conv2d whose weights differ at every output location.

    W is (OH, OW, filters, KH*KW*C). The op runs in (H, W, C, N) layout, where each location's
    patch is a few contiguous rows and one BLAS call. With layout "NCHW" x is (N, C, H, W),
    transposed in and out, and b is (filters, OH, OW); with "HWCN" x and the output are
    (H, W, C, N) and b is (OH, OW, filters, 1): stacked layers then pass activations on with
    no transposes between them (lc-large: a tenth of its step).
    """
    scope = _scope("local2d", name)
    channels = _expect_image(x, "local2d", scope, layout)
    filters = _count(filters, "filters", "local2d", scope)
    (kh, kw), (sh, sw), (ph, pw) = _window(kernel_size, stride, padding, "local2d", scope)
    rows, cols = layout.index("H"), layout.index("W")
    oh = _out_size(int(x.shape[rows]), kh, sh, ph, "local2d", scope)
    ow = _out_size(int(x.shape[cols]), kw, sw, pw, "local2d", scope)
    k = kh * kw * channels
    with name_scope(scope):
        w = parameter("W", (oh, ow, filters, k), init=init,
                      **taken(init, fan_in=k, fan_out=filters))
        if layout == "HWCN":
            y = local2d_op(x, w, (kh, kw), (sh, sw), (ph, pw))
            return add(y, parameter("b", (oh, ow, filters, 1), init="zeros")) if bias else y
        y = local2d_op(transpose(x, NCHW_TO_HWCN), w, (kh, kw), (sh, sw), (ph, pw))
        y = transpose(y, HWCN_TO_NCHW)
        return add(y, parameter("b", (filters, oh, ow), init="zeros")) if bias else y


def conv2d(x: Node, filters: int, kernel_size: int | tuple[int, int],
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           name: str | None = None, init: str = "glorot_uniform", bias: bool = True) -> Node:
    """2-D convolution with shared weights W (filters, C, KH, KW) and bias b (filters, 1, 1)."""
    scope = _scope("conv2d", name)
    channels = _expect_image(x, "conv2d", scope)
    filters = _count(filters, "filters", "conv2d", scope)
    (kh, kw), (sh, sw), (ph, pw) = _window(kernel_size, stride, padding, "conv2d", scope)
    _out_size(int(x.shape[2]), kh, sh, ph, "conv2d", scope)
    _out_size(int(x.shape[3]), kw, sw, pw, "conv2d", scope)
    fan_in = channels * kh * kw
    with name_scope(scope):
        w = parameter("W", (filters, channels, kh, kw), init=init,
                      **taken(init, fan_in=fan_in, fan_out=filters * kh * kw))
        y = conv2d_op(x, w, (sh, sw), (ph, pw))
        return add(y, parameter("b", (filters, 1, 1), init="zeros")) if bias else y
