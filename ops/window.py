"""A sliding window's arguments and geometry, shared by local2d, conv2d and the pools: kernel,
stride and padding as pairs of ints, checked so that a bad one is named (the shape rule, or the
layer, says which node and line)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphflow.errors import ShapeError


def is_int(v: Any) -> bool:
    """A Python or NumPy int, not a bool (True is no size, stride or count)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def pair(v: int | Sequence[int], what: str, minimum: int) -> tuple[int, int]:
    """An int or a 2-sequence of ints (each >= minimum: 0 or 1) as a tuple (rows, cols)."""
    t = (v, v) if is_int(v) else tuple(v) if isinstance(v, (list, tuple, np.ndarray)) else ()
    if len(t) != 2 or not all(is_int(d) and d >= minimum for d in t):
        sign = "positive" if minimum == 1 else "non-negative"
        raise ShapeError(f"{what} must be a {sign} int or a pair of them, got {v!r}")
    return int(t[0]), int(t[1])


def attr_pair(v: Any, what: str, minimum: int) -> Any:
    """`v` as an attrs pair; a bad value stays, for the shape rule to reject naming the node."""
    try:
        return pair(v, what, minimum)
    except ShapeError:
        return v


def geometry(attrs: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(kh, kw, sh, sw, ph, pw) from an op's attrs."""
    kh, kw = pair(attrs["kernel"], "kernel", 1)
    sh, sw = pair(attrs.get("stride", 1), "stride", 1)
    ph, pw = pair(attrs.get("padding", 0), "padding", 0)
    return kh, kw, sh, sw, ph, pw


def out_size(h: int, w: int, attrs: dict[str, Any]) -> tuple[int, int]:
    """Output (OH, OW) of a (h, w) input; a ShapeError when the window does not fit."""
    kh, kw, sh, sw, ph, pw = geometry(attrs)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise ShapeError(f"input {h}x{w} with padding ({ph}, {pw}) is smaller than the "
                         f"{kh}x{kw} kernel, so the output would be empty")
    return oh, ow
