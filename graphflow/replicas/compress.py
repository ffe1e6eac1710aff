"""Gradient compression on push: float16, and top-k with error feedback.

A codec turns one named gradient into a payload (a msgpack-able dict whose arrays travel as raw
frames); the receiving shard turns it back with the module function `decode`, which needs no
codec state, only the shape and dtype it expects:

    >>> codec = make_codec("topk:0.25")
    >>> g = np.array([0.1, -4.0, 0.2, 3.0, 0.0, 0.3, -0.1, 1.0], np.float32)
    >>> payload = codec.encode("w", g)
    >>> decode(payload, g.shape, np.float32)
    array([ 0., -4.,  0.,  3.,  0.,  0.,  0.,  0.], dtype=float32)

Top-k keeps, per name, the residual of what it did not send and adds it to the next gradient
(error feedback), so every element is eventually sent: over many pushes the sum of what the
shard decodes follows the sum of the raw gradients, off by at most the bounded residual.
The transport allows no float16 arrays, so float16 data travels as its raw bytes (uint8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

KINDS = ("none", "float16", "topk")
_F16_TOP = 15        # log2 of what the largest magnitude is scaled to (float16 max: 65504)
_F16_EXP = (-120, 100)  # scale exponents stay where float32 holds the scale and its inverse


class Codec:
    """No compression: the gradient travels as it is (`make_codec(None)` or "none").

        >>> make_codec(None).encode("w", np.ones(2, np.float32))["kind"]
        'none'
    """

    kind = "none"

    def __init__(self) -> None:
        self.bytes_raw = 0      # bytes of the gradients encoded so far
        self.bytes_sent = 0     # bytes of the payloads' arrays

    def spec(self) -> str:
        """The string `make_codec` takes to build this codec again."""
        return self.kind

    def encode(self, name: str, grad: np.ndarray) -> dict[str, Any]:
        """The payload of gradient `name` (the caller may reuse `grad` afterwards)."""
        a = np.ascontiguousarray(grad).reshape(-1)
        return self._count(a, {"kind": "none", "data": a.copy()})

    def _count(self, grad: np.ndarray, payload: dict[str, Any]) -> dict[str, Any]:
        self.bytes_raw += grad.nbytes
        self.bytes_sent += sum(v.nbytes for v in payload.values() if isinstance(v, np.ndarray))
        return payload

    def __repr__(self) -> str:
        return f"make_codec({self.spec()!r})"


class Float16Codec(Codec):
    """Half precision with a power-of-two scale per tensor: half the bytes, relative error
    at most 2**-11 per element (elements far below the tensor's largest lose more).

        >>> p = Float16Codec().encode("w", np.array([1e5, -3.0], np.float32))
        >>> decode(p, (2,), np.float32)
        array([ 9.9968e+04, -3.0000e+00], dtype=float32)
    """

    kind = "float16"

    def encode(self, name: str, grad: np.ndarray) -> dict[str, Any]:
        a = np.asarray(grad).reshape(-1)
        finite = np.abs(a[np.isfinite(a)]) if a.size else a
        top = float(finite.max()) if finite.size else 0.0
        exp = _F16_TOP - math.ceil(math.log2(top)) if top > 0 else 0
        scale = 2.0 ** min(max(exp, _F16_EXP[0]), _F16_EXP[1])
        half = (a * scale).astype(np.float16) if scale != 1.0 else a.astype(np.float16)
        return self._count(a, {"kind": "float16", "data": half.view(np.uint8),
                               "scale": scale})


class TopKCodec(Codec):
    """Send only the `fraction` of elements largest in magnitude (at least one), as indices
    and values; with `feedback` the rest is kept per name and added to the next gradient.
    `fraction` is a fraction, not a percentage: 0.01 sends 1%, and 1 sends every element
    (no compression: the payload is the dense gradient, as "none" sends it). Where the
    indices would cost more bytes than the zeros they leave out (more than about half the
    elements), the selected elements go dense too, zeros elsewhere.

        >>> c = TopKCodec(0.5)
        >>> c.encode("w", np.array([1.0, 0.1], np.float32))["idx"]
        array([0], dtype=int32)
        >>> c.encode("w", np.array([0.0, 0.1], np.float32))["val"]  # 0.1 + 0.1 left over
        array([0.2], dtype=float32)
    """

    kind = "topk"

    def __init__(self, fraction: float, feedback: bool = True) -> None:
        super().__init__()
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"top-k fraction must be in (0, 1], got {fraction!r}")
        self.fraction, self.feedback = fraction, feedback
        self.residual: dict[str, np.ndarray] = {}

    def spec(self) -> str:
        return f"topk:{self.fraction:g}" + ("" if self.feedback else ":nofeedback")

    def k_of(self, size: int) -> int:
        """How many of `size` elements one push sends."""
        return min(size, max(1, math.ceil(self.fraction * size))) if size else 0

    def encode(self, name: str, grad: np.ndarray) -> dict[str, Any]:
        g = np.asarray(grad).reshape(-1)
        if g.dtype not in (np.float32, np.float64):
            raise ValueError(f"top-k gradient {name!r}: dtype {g.dtype} is not float32/float64")
        r = self.residual.get(name) if self.feedback else None
        if r is None:
            r = g.copy()
        elif r.shape != g.shape or r.dtype != g.dtype:
            raise ValueError(f"top-k gradient {name!r}: {g.size} {g.dtype} elements, but its "
                             f"residual has {r.size} {r.dtype} (did the parameter change?)")
        else:
            r += g
        k = self.k_of(r.size)
        itype = np.int32 if r.size < 2**31 else np.int64
        if k == r.size:  # every element ("topk:1"): nothing to select, nothing left over
            self.residual.pop(name, None)
            return self._count(g, {"kind": "none", "data": r})
        idx = np.sort(np.argpartition(np.abs(r), r.size - k)[r.size - k:]).astype(itype)
        if k * (idx.itemsize + r.itemsize) > r.nbytes:
            # the indices would cost more than the zeros they leave out: send it dense (the
            # same decoded gradient, bit for bit)
            payload: dict[str, Any] = {"kind": "none", "data": np.zeros_like(r)}
            payload["data"][idx] = r[idx]
        else:
            payload = {"kind": "topk", "idx": idx, "val": r[idx], "size": int(r.size)}
        if self.feedback:
            r[idx] = 0  # residual -= what was sent
            self.residual[name] = r
        return self._count(g, payload)

    def residual_norm(self) -> float:
        """The L2 norm of everything not yet sent, over all names."""
        return math.sqrt(sum(float(np.dot(r, r)) for r in self.residual.values()))

    def reset(self) -> None:
        """Forget the residuals (e.g. after the parameters were reloaded)."""
        self.residual.clear()


def make_codec(spec: str | Codec | None) -> Codec:
    """A codec from its spec: None / "none", "float16", "topk:FRACTION" (e.g. "topk:0.01";
    append ":nofeedback" to drop the residual). A Codec is returned as it is.

        >>> make_codec("topk:0.01")
        make_codec('topk:0.01')
    """
    if isinstance(spec, Codec):
        return spec
    if spec is None or spec == "none":
        return Codec()
    if spec == "float16":
        return Float16Codec()
    if isinstance(spec, str) and spec.startswith("topk:"):
        parts = spec.split(":")
        try:
            fraction = float(parts[1])
        except ValueError:
            fraction = -1.0
        if len(parts) <= 3 and parts[2:] in ([], ["nofeedback"]) and 0.0 < fraction <= 1.0:
            return TopKCodec(fraction, feedback=len(parts) == 2)
        raise ValueError(f"bad top-k codec {spec!r}: expected 'topk:F' with 0 < F <= 1 "
                         "(optionally ':nofeedback'), e.g. 'topk:0.01'")
    raise ValueError(f"unknown gradient codec {spec!r}; known: none, float16, topk:FRACTION")


def _array(payload: dict[str, Any], field: str, kind: str) -> np.ndarray:
    a = payload.get(field)
    if not isinstance(a, np.ndarray) or a.ndim != 1:
        got = f"shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{kind} payload: field {field!r} must be a 1-d array, got {got}")
    return a


def decode(payload: Any, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """The gradient of `shape` and `dtype` a payload of `Codec.encode` stands for (a new,
    writable array). A payload that does not fit raises ValueError naming what is wrong.

        >>> decode(make_codec("float16").encode("b", np.ones(3)), (3,), np.float32)
        array([1., 1., 1.], dtype=float32)
    """
    n = math.prod(shape)
    if not isinstance(payload, dict):
        raise ValueError(f"gradient payload must be a dict, got {type(payload).__name__}")
    kind = payload.get("kind")
    if kind == "none":
        data = _array(payload, "data", kind)
        if data.size != n:
            raise ValueError(f"none payload: {data.size} elements, expected {n} for shape "
                             f"{tuple(shape)}")
        return data.astype(dtype).reshape(shape)
    if kind == "float16":
        return _decode_f16(payload, n, dtype).reshape(shape)
    if kind == "topk":
        return _decode_topk(payload, n, dtype).reshape(shape)
    raise ValueError(f"unknown gradient payload kind {kind!r}; known: {', '.join(KINDS)}")


def _decode_f16(payload: dict[str, Any], n: int, dtype: Any) -> np.ndarray:
    data = _array(payload, "data", "float16")
    if data.dtype == np.uint8 and data.size == 2 * n:
        data = data.view(np.float16)
    elif data.dtype != np.float16 or data.size != n:
        raise ValueError(f"float16 payload: {data.nbytes} bytes of {data.dtype}, expected "
                         f"{2 * n} bytes ({n} float16 values)")
    scale = payload.get("scale", 1.0)
    lo, hi = _F16_EXP
    if type(scale) not in (float, int) or not 2.0 ** lo <= scale <= 2.0 ** hi \
            or math.frexp(scale)[0] != 0.5:
        raise ValueError(f"float16 payload: scale must be a power of two in [2**{lo}, "
                         f"2**{hi}], got {scale!r}")
    out = data.astype(dtype)
    if scale != 1.0:
        out *= 1.0 / scale  # a power of two: exact
    return out


def _decode_topk(payload: dict[str, Any], n: int, dtype: Any) -> np.ndarray:
    idx, val = _array(payload, "idx", "topk"), _array(payload, "val", "topk")
    size = payload.get("size")
    if type(size) is not int or size != n:
        raise ValueError(f"topk payload: size {size!r}, expected {n}")
    if idx.dtype.kind not in "iu":
        raise ValueError(f"topk payload: indices are {idx.dtype}, expected integers")
    if idx.size != val.size:
        raise ValueError(f"topk payload: {idx.size} indices but {val.size} values")
    if idx.size > n:
        raise ValueError(f"topk payload: {idx.size} elements for a gradient of {n}")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"topk payload: indices out of range [0, {n}): "
                         f"min {int(idx.min())}, max {int(idx.max())}")
    if idx.size > 1 and not np.all(idx[1:] > idx[:-1]):  # (np.unique: 55 ms at 100k)
        raise ValueError("topk payload: indices repeated or out of order (encode sends them "
                         "increasing)")
    out = np.zeros(n, dtype)
    out[idx] = val
    return out
