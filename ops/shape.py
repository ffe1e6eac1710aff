"""Data movement: transpose, reshape, flatten, concat, slice, pad.

`transpose` merges input axes that stay adjacent, so the permutations around the locally
connected layer ((N,C,H,W) <-> (H,W,C,N)) become one swap kernel over 8 x 8 register tiles;
other permutations use the generic strided copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError, described
from graphflow.ir import Node, Shape, user_source_line
from graphflow.ops import strided as K
from graphflow.ops.registry import Cost, Spec, apply, axis_arg, fmt, register

Grads = Sequence[Node | None]


def _move_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
               itemsize: int) -> Cost:
    return Cost(0.0, itemsize * prod(out), itemsize * prod(out))


def _view_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
               itemsize: int) -> Cost:
    return Cost(0.0, 0.0, 0.0)


def _copy(src: np.ndarray, dst: np.ndarray) -> None:
    if src.size:
        K.copy_6d(*K.as_6d(src, dst))


# -- transpose ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def swap_kernel(src: np.ndarray, dst: np.ndarray) -> None:
    """dst[p, c, q, a] = src[p, a, q, c] (both C-contiguous), in 8 x 8 tiles within 16 x 16."""
    n_p, n_a, n_q, n_c = src.shape
    a8, c8 = n_a - n_a % 8, n_c - n_c % 8
    tmp = np.empty((8, 8), src.dtype)
    for p in range(n_p):
        for q in range(n_q):
            for a0 in range(0, a8, 16):
                for c0 in range(0, c8, 16):
                    for a in range(a0, min(a0 + 16, a8), 8):
                        for c in range(c0, min(c0 + 16, c8), 8):
                            for i in range(8):
                                for j in range(8):
                                    tmp[j, i] = src[p, a + i, q, c + j]
                            for j in range(8):
                                for i in range(8):
                                    dst[p, c + j, q, a + i] = tmp[j, i]
            for a in range(a8, n_a):
                for c in range(n_c):
                    dst[p, c, q, a] = src[p, a, q, c]
            for a in range(a8):
                for c in range(c8, n_c):
                    dst[p, c, q, a] = src[p, a, q, c]


def _merge_axes(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Merge runs of input axes kept adjacent and in order by `perm`; size-1 axes are dropped."""
    perm = tuple(p for p in perm if shape[p] != 1)
    groups: list[list[int]] = []
    for p in perm:
        if groups and p == groups[-1][-1] + 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = [prod(shape[a] for a in groups[g]) for g in order]
    return merged, [order.index(g) for g in range(len(groups))]


_SWAPS = {(1, 0): "ac", (2, 1, 0): "aqc", (0, 2, 1): "pac", (0, 3, 2, 1): "paqc"}


def transpose_array(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """A C-contiguous copy of x.transpose(axes)."""
    out = np.empty([x.shape[a] for a in axes], x.dtype)
    merged, perm = _merge_axes(x.shape, tuple(axes))
    pattern = _SWAPS.get(tuple(perm))
    if pattern is not None and x.size:
        dims = dict(zip(pattern, merged, strict=True))
        p, a, q, c = (dims.get(k, 1) for k in "paqc")
        swap_kernel(x.reshape(p, a, q, c), out.reshape(p, c, q, a))
    else:
        _copy(x.transpose(axes), out)
    return out


def _infer_transpose(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape, axes = ins[0].shape, tuple(attrs["axes"])
    if sorted(axes) != list(range(len(shape))):
        raise ShapeError(f"axes {axes} is not a permutation of 0..{len(shape) - 1} for input "
                         f"{fmt(shape)}")
    return Spec(tuple(shape[a] for a in axes), ins[0].dtype)


def _transpose_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return transpose_array(ins[0], attrs["axes"])


def _transpose_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("transpose", dy, axes=tuple(int(i) for i in np.argsort(node.attrs["axes"])))]


register("transpose", _infer_transpose, _transpose_forward, _transpose_grad, _move_cost,
         doc="permute axes (attr axes)")


# -- reshape / flatten -------------------------------------------------------------------------

def _resolve_shape(src: Shape, target: Sequence[int | None]) -> Shape:
    """The output shape of reshaping `src` to `target` (one -1 allowed; None = batch dim)."""
    target = tuple(target)
    if None in target[1:] or (target[:1] == (None,) and src[:1] != (None,)):
        raise ShapeError(f"shape {target}: None (the batch dim) is only allowed at dim 0, "
                         f"where the input {fmt(src)} has its batch dim")
    if None in src[1:]:
        raise ShapeError(f"input {fmt(src)} has a batch dim (None) past dim 0; cannot reshape it")
    if src[:1] == (None,) and target[:1] != (None,):
        raise ShapeError(f"input {fmt(src)} has a batch dim; the shape {target} must keep it as "
                         f"None at dim 0")
    if sum(d == -1 for d in target) > 1 or any(d is not None and d < -1 for d in target):
        raise ShapeError(f"shape {target} may hold one -1 and non-negative sizes only")
    have = prod(d for d in src if d is not None)
    known = prod(d for d in target if d is not None and d != -1)
    if -1 in target:
        if known == 0 or have % known:
            raise ShapeError(f"cannot reshape {fmt(src)} to {target}: sizes do not divide")
        target = tuple(have // known if d == -1 else d for d in target)
    elif known != have:
        raise ShapeError(f"cannot reshape {fmt(src)} ({have} elements per batch item or in "
                         f"all) to {fmt(target)} ({known})")
    return target


def _infer_reshape(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec(_resolve_shape(ins[0].shape, attrs["shape"]), ins[0].dtype)


def _reshape_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    shape = tuple(x.shape[0] if d is None else d for d in attrs["shape"])
    return x.reshape(shape)  # a view: values are never mutated in place


def _back_to_input(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("reshape", dy, shape=tuple(node.inputs[0].shape))]


register("reshape", _infer_reshape, _reshape_forward, _back_to_input, _view_cost,
         doc="same values in a new shape (attr shape: one -1 allowed, None = the batch dim)")


def _infer_flatten(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape = ins[0].shape
    if not shape:
        raise ShapeError("input is a scalar, expected at least 1 dim (N, ...)")
    if None in shape[1:]:
        raise ShapeError(f"input {fmt(shape)} has a batch dim (None) past dim 0")
    return Spec((shape[0], prod(shape[1:])), ins[0].dtype)


def _flatten_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    return x.reshape(x.shape[0], prod(x.shape[1:]))


register("flatten", _infer_flatten, _flatten_forward, _back_to_input, _view_cost,
         doc="(N, ...) -> (N, prod(...))")


# -- concat / slice / pad ----------------------------------------------------------------------

def _infer_concat(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    if not ins:
        raise ShapeError("concat needs at least one input")
    first = ins[0].shape
    axis = int(attrs["axis"])
    if not -len(first) <= axis < len(first):
        raise ShapeError(f"axis {axis} is out of range for input {fmt(first)}")
    axis %= len(first)
    for i, s in enumerate(ins):
        if s.dtype != ins[0].dtype:
            raise ShapeError(f"input {i} has dtype {s.dtype}, expected {ins[0].dtype}")
        if len(s.shape) != len(first) or any(
                a != b for d, (a, b) in enumerate(zip(s.shape, first)) if d != axis):
            raise ShapeError(f"input {i} has shape {fmt(s.shape)}, expected {fmt(first)} in "
                             f"every dim but {axis}")
        if s.shape[axis] is None:
            raise ShapeError(f"input {i} {fmt(s.shape)}: cannot concat along the batch dim")
    total = sum(s.shape[axis] for s in ins)
    return Spec(first[:axis] + (total,) + first[axis + 1:], ins[0].dtype)


def _concat_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    axis = int(attrs["axis"]) % ins[0].ndim
    shape = list(ins[0].shape)
    shape[axis] = sum(x.shape[axis] for x in ins)
    out = np.empty(shape, ins[0].dtype)
    at = 0
    for x in ins:
        index = (slice(None),) * axis + (slice(at, at + x.shape[axis]),)
        _copy(x, out[index])
        at += x.shape[axis]
    return out


def _concat_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    axis = int(node.attrs["axis"]) % dy.ndim
    grads: list[Node | None] = []
    at = 0
    for x, want in zip(node.inputs, wants, strict=True):
        n = x.shape[axis]
        begin = tuple(at if d == axis else 0 for d in range(dy.ndim))
        end = tuple(at + n if d == axis else None for d in range(dy.ndim))
        grads.append(apply("slice", dy, begin=begin, end=end) if want else None)
        at += n
    return grads


register("concat", _infer_concat, _concat_forward, _concat_grad, _move_cost,
         doc="join inputs along attr axis")


def _infer_slice(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape = ins[0].shape
    begin, end = tuple(attrs["begin"]), tuple(attrs["end"])
    if len(begin) != len(shape) or len(end) != len(shape):
        raise ShapeError(f"begin {begin} and end {end} need {len(shape)} entries, one per dim "
                         f"of input {fmt(shape)}")
    out: list[int | None] = []
    for d, (n, b, e) in enumerate(zip(shape, begin, end)):
        if n is None:
            if b != 0 or e is not None:
                raise ShapeError(f"dim {d} is the batch dim: expected begin 0 and end None, "
                                 f"got {b} and {e}")
            out.append(None)
            continue
        e = n if e is None else e
        if not 0 <= b <= e <= n:
            raise ShapeError(f"dim {d}: expected 0 <= begin <= end <= {n}, got {b} and {e}")
        out.append(e - b)
    return Spec(tuple(out), ins[0].dtype)


def _slice_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """A view where the rows taken are one contiguous run (rows of an HWCN block: the halo
    slices of the spatial strategy), a copy otherwise. Values are never mutated in place."""
    x = ins[0]
    view = x[tuple(slice(b, e) for b, e in zip(attrs["begin"], attrs["end"]))]
    if view.flags.c_contiguous:
        return view
    out = np.empty(view.shape, x.dtype)
    _copy(view, out)
    return out


def contiguous_slice(shape: Sequence[int], out: Sequence[int]) -> bool:
    """Whether slicing a C-contiguous array of `shape` to `out` takes one contiguous run:
    the dims before the innermost one cut are 1 long (those after it are whole)."""
    cut = max((d for d, (n, m) in enumerate(zip(shape, out)) if m != n), default=0)
    return all(m == 1 for m in out[:cut]) or prod(out) == 0


def _slice_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
                itemsize: int) -> Cost:
    if contiguous_slice(ins[0], out):
        return _view_cost(ins, out, attrs, itemsize)
    return _move_cost(ins, out, attrs, itemsize)


def _slice_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    shape = node.inputs[0].shape
    pads = tuple((0, 0) if n is None else (b, n - (n if e is None else e))
                 for n, b, e in zip(shape, node.attrs["begin"], node.attrs["end"]))
    return [apply("pad", dy, pads=pads)]


register("slice", _infer_slice, _slice_forward, _slice_grad, _slice_cost,
         doc="x[begin:end] per dim (attrs begin, end; end None = to the end)")


def _infer_pad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape = ins[0].shape
    pads = tuple(tuple(p) for p in attrs["pads"])
    if len(pads) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ShapeError(f"pads {pads}: expected {len(shape)} non-negative (before, after) pairs "
                         f"for input {fmt(shape)}")
    out: list[int | None] = []
    for d, (n, (b, a)) in enumerate(zip(shape, pads)):
        if n is None and (b or a):
            raise ShapeError(f"dim {d} is the batch dim: expected pads (0, 0), got {(b, a)}")
        out.append(None if n is None else n + b + a)
    return Spec(tuple(out), ins[0].dtype)


def _pad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    pads = attrs["pads"]
    out = np.zeros([n + b + a for n, (b, a) in zip(x.shape, pads)], x.dtype)
    _copy(x, out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, pads))])
    return out


def _pad_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    shape, pads = node.inputs[0].shape, node.attrs["pads"]
    begin = tuple(b for b, _ in pads)
    end = tuple(None if n is None else b + n for n, (b, _) in zip(shape, pads))
    return [apply("slice", dy, begin=begin, end=end)]


register("pad", _infer_pad, _pad_forward, _pad_grad, _move_cost,
         doc="zero padding (attr pads: (before, after) per dim)")


# -- the DSL's functions -----------------------------------------------------------------------

def transpose(x: Node, axes: Sequence[int], name: str | None = None) -> Node:
    """Permute axes: `transpose(x, (2, 3, 1, 0))` turns (N, C, H, W) into (H, W, C, N)."""
    return apply("transpose", x, name=name, axes=tuple(int(a) for a in axes))


def reshape(x: Node, shape: Sequence[int | None], name: str | None = None) -> Node:
    """Reshape; one -1 is inferred, None at dim 0 keeps the batch dim: `reshape(x, (None, -1))`."""
    return apply("reshape", x, name=name, shape=tuple(shape))


def flatten(x: Node, name: str | None = None) -> Node:
    """(N, ...) -> (N, prod(...))."""
    return apply("flatten", x, name=name)


def concat(xs: Sequence[Node], axis: int, name: str | None = None) -> Node:
    """Join `xs` along `axis` (not the batch dim)."""
    if isinstance(xs, Node | str) or not isinstance(xs, Iterable):
        raise TypeError(f"concat ({user_source_line()}): xs must be a list of nodes, got "
                        f"{described(xs)}")
    return apply("concat", *xs, name=name, axis=axis_arg("concat", axis))


def slice_(x: Node, begin: Sequence[int], end: Sequence[int | None],
           name: str | None = None) -> Node:
    """x[begin[0]:end[0], ...]; an end of None runs to the end of that dim."""
    return apply("slice", x, name=name, begin=tuple(begin), end=tuple(end))


def pad(x: Node, pads: Sequence[tuple[int, int]], name: str | None = None) -> Node:
    """Zero padding: `pads[d] = (before, after)` for each dim d."""
    return apply("pad", x, name=name, pads=tuple((int(b), int(a)) for b, a in pads))
