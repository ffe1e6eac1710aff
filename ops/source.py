"""Source ops: placeholder (fed), parameter (held by the session), constant (in the graph)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphflow.errors import DTypeError, ShapeError
from graphflow.ops.registry import FLOAT_DTYPES, INT_DTYPES, Cost, Spec, register

DTYPES = FLOAT_DTYPES + INT_DTYPES


def _declared(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
    if dtype not in DTYPES:
        raise DTypeError(f"dtype {dtype!r} is not supported, expected one of {', '.join(DTYPES)}")
    for d in shape:
        if d is not None and (not isinstance(d, int) or d < 0):
            raise ShapeError(f"shape {shape} must hold non-negative ints or None (batch)")
    return Spec(shape, dtype)


def _parameter(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    spec = _declared(ins, attrs)
    if None in spec.shape:
        raise ShapeError(f"parameter shape {spec.shape} must be fully known")
    if spec.dtype not in FLOAT_DTYPES:
        raise DTypeError(f"parameter dtype is {spec.dtype}, expected a float dtype")
    return spec


def _constant(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    value = np.asarray(attrs["value"])
    if value.dtype.name not in DTYPES:
        raise DTypeError(f"constant dtype {value.dtype} is not supported")
    return Spec(value.shape, value.dtype.name)


def _free(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
          itemsize: int) -> Cost:
    return Cost(0.0, 0.0, 0.0)


register("placeholder", _declared, None, cost=_free, doc="a tensor fed at run time")
register("parameter", _parameter, None, cost=_free, doc="a trainable tensor held by the session")
register("constant", _constant, None, cost=_free, doc="a small tensor stored in the graph")
