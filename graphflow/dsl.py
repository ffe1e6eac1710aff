"""The model-building DSL: placeholders, parameters, name and device scopes, operator overloads.

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 3))
...     with gf.name_scope("fc"):
...         w = gf.parameter("W", (3, 2))
...     y = x @ w - 1.0
>>> w.name, y.shape
('fc/W', (None, 2))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from graphflow.errors import GraphError, ShapeError, described
from graphflow.init import INITIALIZERS, check_options
from graphflow.ir import Dim, Node, current_graph, user_source_line
from graphflow.ops.registry import apply


def _dims(shape: Any, op: str, name: str) -> tuple[Any, ...]:
    """`shape` as a tuple, NumPy ints as ints; the op's shape rule checks each dim."""
    if not isinstance(shape, list | tuple):
        batch = " (None for the batch dim)" if op == "placeholder" else ""
        raise ShapeError(f"{op} '{name}' ({user_source_line()}): shape must be a tuple of "
                         f"ints{batch}, got {shape!r}")
    return tuple(int(d) if isinstance(d, np.integer) else d for d in shape)


def placeholder(name: str, shape: Sequence[Dim], dtype: str | None = None) -> Node:
    """A tensor fed at run time; `None` in `shape` is the batch dimension."""
    g = current_graph()
    attrs = {"shape": _dims(shape, "placeholder", name), "dtype": dtype or g.dtype}
    return g.add("placeholder", (), attrs, name=name)


def parameter(name: str, shape: Sequence[int], init: str = "glorot_uniform",
              dtype: str | None = None, **init_args: Any) -> Node:
    """A trainable tensor named `scope/name`, initialised by the named, seeded `init`."""
    g = current_graph()
    where = f"parameter '{name}' ({user_source_line()})"
    if init not in INITIALIZERS:
        raise GraphError(f"{where}: unknown initializer '{init}', known: "
                         f"{', '.join(INITIALIZERS)}")
    check_options(init, init_args, where)
    attrs = {"shape": _dims(shape, "parameter", name), "dtype": dtype or g.dtype, "init": init,
             **init_args}
    return g.add("parameter", (), attrs, name=name)


def constant(value: Any, dtype: str | None = None, name: str | None = None) -> Node:
    """A small tensor stored in the graph (floats take the graph's dtype unless given)."""
    g = current_graph()
    arr = np.asarray(value)
    if dtype is None and arr.dtype.kind == "f":
        dtype = g.dtype
    return g.add("constant", (), {"value": np.array(arr, dtype=dtype)}, name=name)


@contextmanager
def name_scope(scope: str) -> Iterator[None]:
    """Prefix names created inside with `scope/` (a layer's parameters become `scope/W`)."""
    g = current_graph()
    g._scopes.append(scope)
    try:
        yield
    finally:
        g._scopes.pop()


@contextmanager
def device(name: str | None) -> Iterator[None]:
    """Place nodes created inside on `name` (e.g. "worker:1"); the manual partitioner reads it."""
    if name is not None and not isinstance(name, str):
        raise GraphError(f"device ({user_source_line()}): a device is a name 'worker:K' "
                         f"(K the worker's index) or None, got {described(name)}")
    g = current_graph()
    g._devices.append(name)
    try:
        yield
    finally:
        g._devices.pop()


def _binary(op: str, reverse: bool = False) -> Any:
    def method(self: Node, other: Any) -> Node:
        return apply(op, other, self) if reverse else apply(op, self, other)
    method.__name__ = f"__{'r' if reverse else ''}{op}__"
    return method


# Operator overloads live here, beside the ops they call (TF1 attaches them the same way).
# NumPy defers to them: `array * node` is one mul node, not an array of per-element ones.
Node.__array_ufunc__ = None
Node.__add__ = _binary("add")
Node.__radd__ = _binary("add", reverse=True)
Node.__sub__ = _binary("sub")
Node.__rsub__ = _binary("sub", reverse=True)
Node.__mul__ = _binary("mul")
Node.__rmul__ = _binary("mul", reverse=True)
Node.__truediv__ = _binary("div")
Node.__rtruediv__ = _binary("div", reverse=True)
Node.__matmul__ = _binary("matmul")
Node.__rmatmul__ = _binary("matmul", reverse=True)
Node.__neg__ = lambda self: apply("neg", self)
