"""Runs a graph in one process: dataflow order, feeds and fetches, frees dead values.

>>> import numpy as np, graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 2))
...     y = gf.reduce_sum(x * 2.0)
>>> float(gf.Session(g).run(y, {x: np.ones((3, 2), np.float32)}))
12.0
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphflow.errors import (
    DTypeError,
    GraphError,
    MissingFeedError,
    NonFiniteError,
    ShapeError,
    described,
    did_you_mean,
    located,
)
from graphflow.init import initial_value
from graphflow.ir import Graph, Node, format_tuple, user_source_line
from graphflow.ops.registry import REGISTRY
from graphflow.trace import session as trace
from graphflow.trace.recorder import clock

Feeds = Mapping[Node | str, Any]
Fetches = Node | str | Iterable[Node | str] | Mapping[Any, Node | str]
_EXPECTED = {"fetch": "fetches must be nodes or node names",
             "feed": "feeds must be keyed by nodes or node names"}


@dataclass(frozen=True)
class Schedule:
    """What to run for one (fetches, feeds) pair: order, and after which step each value dies."""

    order: tuple[Node, ...]
    frees: tuple[tuple[Node, ...], ...]  # frees[i]: values no longer needed after order[i]
    held: tuple[Node, ...] = ()  # parameters and constants run: arrays a fetch may alias


def schedule(graph: Graph, fetches: Sequence[Node], fed: set[Node]) -> Schedule:
    """Topological order of what `fetches` need (fed nodes are leaves) and each value's last use."""
    needed: set[Node] = set()
    stack = list(fetches)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n not in fed:
            stack.extend(n.inputs)
    order = graph.toposort(n for n in graph.nodes if n in needed)
    last_use: dict[Node, int] = {}
    for i, n in enumerate(order):
        if n not in fed:
            for x in n.inputs:
                last_use[x] = i
    keep = set(fetches)
    frees: list[list[Node]] = [[] for _ in order]
    for n, i in last_use.items():
        if n not in keep:
            frees[i].append(n)
    held = tuple(n for n in order if n.op in ("parameter", "constant") and n not in fed)
    return Schedule(tuple(order), tuple(tuple(f) for f in frees), held)


class Session:
    """Holds parameter values (by name) and runs fetches of a graph.

    `check_numerics=True` stops at the first node that produces NaN or inf and names it.
    """

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray] | None = None,
                 check_numerics: bool = False) -> None:
        self.graph = graph
        self.check_numerics = check_numerics
        self.params: dict[str, np.ndarray] = {}
        for p in graph.parameters():
            self._initialise(p)
        for name, value in (params or {}).items():
            self.set(name, value)
        self._schedules: dict[tuple[tuple[int, ...], frozenset[int]], Schedule] = {}

    def get(self, name: str) -> np.ndarray:
        """A copy of parameter `name`'s value (the session keeps training its own)."""
        node = self.graph[name] if name in self.graph else None
        if node is None or node.op != "parameter":
            raise KeyError(f"no parameter named '{name}'; parameters: {', '.join(self.params)}")
        return self._param(node).copy()

    def _param(self, node: Node) -> np.ndarray:
        """Parameter `node`'s value, initialised on first use if it joined the graph after
        this session was made (as a new session would: the value depends on name and seed)."""
        value = self.params.get(node.name)
        return self._initialise(node) if value is None else value

    def _initialise(self, node: Node) -> np.ndarray:
        value = self.params[node.name] = initial_value(node.name, node.attrs, self.graph.seed)
        return value

    def set(self, name: str, value: np.ndarray) -> None:
        node = self.graph[name]
        if node.op != "parameter":
            raise GraphError(located(node, "is not a parameter"))
        self.params[name] = checked_value(node, value)

    def run(self, fetches: Fetches, feeds: Feeds | None = None) -> Any:
        """Compute `fetches` given placeholder `feeds`. A fetch, and a feed's key, is a node or a
        node's name. One fetch gives an array, a list (or other iterable) of them a list, and a
        dict of them (such as gradients()' result) a dict with the same keys.

        >>> import numpy as np, graphflow as gf
        >>> with gf.Graph() as g:
        ...     x = gf.placeholder("x", (2,))
        ...     y = gf.mul(x, 3.0, name="y")
        >>> gf.Session(g).run(["y", y], {"x": np.ones(2, np.float32)})[0].tolist()
        [3.0, 3.0]
        """
        if isinstance(fetches, Mapping):
            return dict(zip(fetches, self.run(list(fetches.values()), feeds), strict=True))
        single = isinstance(fetches, Node | str)
        if not single and not isinstance(fetches, Iterable):
            raise GraphError(f"Session.run ({user_source_line()}): {_EXPECTED['fetch']}, got "
                             f"{described(fetches)}")
        if feeds is not None and not isinstance(feeds, Mapping):
            raise GraphError(f"Session.run ({user_source_line()}): feeds must be a dict from "
                             f"nodes or node names to arrays, got {described(feeds)}")
        wanted = [self._node(f, "fetch") for f in ([fetches] if single else fetches)]
        fed = {self._node(k, "feed"): v for k, v in (feeds or {}).items()}
        key = (tuple(id(n) for n in wanted), frozenset(id(n) for n in fed))
        plan = self._schedules.get(key)
        if plan is None:
            plan = self._schedules[key] = schedule(self.graph, wanted, set(fed))
        values = self._execute(plan, fed, wanted)
        held = [self.params[n.name] if n.op == "parameter" else n.attrs["value"]
                for n in plan.held]
        out = _unshared([values[n] for n in wanted], held)
        return out[0] if single else out

    def _node(self, key: Node | str, role: str) -> Node:
        """The graph's node that `key` (a node or its name) stands for; role: fetch or feed."""
        if isinstance(key, str):
            if key in self.graph:
                return self.graph[key]
            hint = did_you_mean(key, (n.name for n in self.graph.nodes))
            raise GraphError(f"Session.run ({user_source_line()}): no node named '{key}' in "
                             f"the graph to {role}{hint}")
        if not isinstance(key, Node):
            raise GraphError(f"Session.run ({user_source_line()}): {_EXPECTED[role]}, got "
                             f"{described(key)}")
        if key.graph is not self.graph:
            raise GraphError(located(key, f"is a {role} but belongs to another graph"))
        return key

    def _execute(self, plan: Schedule, fed: dict[Node, Any],
                 wanted: list[Node]) -> dict[Node, np.ndarray]:
        values: dict[Node, np.ndarray] = {}
        traced = trace.current()  # a run being recorded: each kernel becomes a span
        thread = threading.current_thread().name if traced is not None else ""
        for node, dead in zip(plan.order, plan.frees, strict=True):
            if node in fed:
                values[node] = checked_value(node, fed[node])
            elif traced is None or node.op in ("parameter", "constant"):
                values[node] = self._compute(node, values, wanted)
            else:
                t0 = clock()
                values[node] = self._compute(node, values, wanted)
                traced.driver.add(thread, "kernel", node.name, t0, clock(), {"op": node.op})
            for d in dead:
                del values[d]
        return values

    def _compute(self, node: Node, values: dict[Node, np.ndarray],
                 wanted: list[Node]) -> np.ndarray:
        if node.op == "parameter":
            return self._param(node)
        if node.op == "constant":
            return node.attrs["value"]
        if node.op == "placeholder":
            needs = "needs" if len(wanted) == 1 else "need"
            raise missing_feed(node, f"{_names(wanted)} {needs} it")
        return run_kernel(node, [values[x] for x in node.inputs], self.check_numerics)


def _unshared(out: list[np.ndarray], held: list[np.ndarray]) -> list[np.ndarray]:
    """`out` with a copy for each array that is, or is a view of, one of `held` (parameters the
    session trains in place, constants the graph owns); the rest are the run's own."""
    if not held:
        return out
    owners = {id(_owner(a)) for a in held}
    return [a.copy() if id(_owner(a)) in owners else a for a in out]


def _owner(a: np.ndarray) -> object:
    """The object whose memory array `a` views (itself if it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a if a.base is None else a.base


def run_kernel(node: Node, inputs: list[np.ndarray], check_numerics: bool = False) -> np.ndarray:
    """Apply `node`'s kernel to its input values; errors name the node and the user's line."""
    try:
        out = REGISTRY[node.op].forward(inputs, node.attrs)
    except ValueError as e:  # bad values the shape rules cannot see (e.g. a label >= K)
        raise ValueError(located(node, str(e))) from e
    if check_numerics:
        _check_finite(node, out, "produced")
    return out


def accumulate_kernel(node: Node, inputs: list[np.ndarray], out: np.ndarray,
                      check_numerics: bool = False) -> np.ndarray:
    """out += `node`'s value, through its op's `accumulate` (no temporary); returns out."""
    accumulate = REGISTRY[node.op].accumulate
    if accumulate is None:
        raise TypeError(f"op '{node.op}' of '{node.name}' cannot accumulate into an array")
    accumulate(inputs, node.attrs, out)
    if check_numerics:
        _check_finite(node, out, "accumulated into")
    return out


def _check_finite(node: Node, out: np.ndarray, verb: str) -> None:
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        raise NonFiniteError(located(node, f"{verb} {int(np.isnan(out).sum())} NaN and "
                                           f"{int(np.isinf(out).sum())} inf values"))


def missing_feed(node: Node, why: str) -> MissingFeedError:
    """Placeholder `node` was not fed, though `why` ("'loss' needs it"): what to feed it."""
    article = "an" if node.dtype[:1] in "aeio" else "a"  # an int32, a float32, a uint8
    return MissingFeedError(located(node, f"is not fed, but {why}; expected {article} "
                                          f"{node.dtype} array of shape "
                                          f"{format_tuple(node.shape)}"))


def _names(nodes: list[Node]) -> str:
    return ", ".join(f"'{n.name}'" for n in nodes[:4]) + (" ..." if len(nodes) > 4 else "")


def checked_value(node: Node, value: Any) -> np.ndarray:
    """A fed or set value as a contiguous array of the node's dtype, after checking its shape."""
    arr = np.asarray(value)
    if arr.ndim != len(node.shape) or any(
            d is not None and d != a for d, a in zip(node.shape, arr.shape, strict=True)):
        raise ShapeError(located(node, f"fed shape {arr.shape}, expected "
                                       f"{format_tuple(node.shape)}"))
    if arr.dtype != np.dtype(node.dtype):
        if not np.can_cast(arr.dtype, node.dtype, casting="same_kind"):
            raise DTypeError(located(node, f"fed dtype {arr.dtype}, expected {node.dtype}"))
        arr = arr.astype(node.dtype)
    return np.require(arr, requirements="C")  # ascontiguousarray would make 0-d arrays 1-d
