"""Exceptions. Each names the node, the user's source line, what was expected and what came."""

import difflib
from collections.abc import Iterable
from numbers import Integral  # (NumPy's integers too)


class GraphflowError(Exception):
    """Base class of every graphflow error."""


class GraphError(GraphflowError):
    """A malformed graph: bad names, nodes from another graph, a graph used outside its context."""


class ShapeError(GraphError):
    """An op's inputs have shapes it cannot take, or a feed has the wrong shape."""


class DTypeError(GraphError):
    """An op's inputs have dtypes it cannot take, or a feed has the wrong dtype."""


class UnknownOpError(GraphError):
    """A node names an op that is not in the registry."""


class CycleError(GraphError):
    """The graph has a cycle, so it has no execution order."""


class MissingFeedError(GraphflowError):
    """A placeholder the fetches depend on was not fed."""


class NonFiniteError(GraphflowError):
    """A node produced NaN or inf while numerics checking was on."""


def located(node: object, message: str) -> str:
    """Prefix `message` with the node's op, name and line: `relu 'h1' (model.py:12): ...`."""
    where = getattr(node, "where", None)
    return f"{where()}: {message}" if callable(where) else message


def count_of(value: object, what: str, minimum: int = 1, also: str = "") -> int:
    """`value` if it is an int >= `minimum` (not a bool), else a ValueError naming `what` (and
    `also`, what else it may be): an API's counts (steps, parts, micro-batches) checked where
    they come in.

        >>> count_of(3, "steps")
        3
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}{also}, got {value!r}")
    return int(value)


def described(value: object) -> str:
    """`int 42`: what a caller passed where something else was expected, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """"; did you mean 'loss'?" for the names of `known` close to `name` ("" if none).

        >>> did_you_mean("los", ["loss", "x"])
        "; did you mean 'loss'?"
    """
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
