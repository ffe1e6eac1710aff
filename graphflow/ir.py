"""The graph IR: Nodes (op, inputs, attrs, static shape, dtype, placement, source line) and Graph.

The IR never executes. A Graph is built by the DSL (graphflow.dsl) and read by autodiff, the
partitioners and the executor.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphflow.errors import (
    CycleError,
    DTypeError,
    GraphError,
    UnknownOpError,
    did_you_mean,
    located,
)

if TYPE_CHECKING:
    import networkx as nx

Dim = int | None  # None is the symbolic batch dimension
Shape = tuple[Dim, ...]
SOURCE_OPS = ("placeholder", "parameter", "constant")  # values that come from outside: no work

_PACKAGE_DIRS = tuple(  # graphflow and its two top-level packages: not the user's lines
    os.path.dirname(os.path.abspath(os.path.join(os.path.dirname(__file__), *p)))
    for p in (("x",), ("..", "ops", "x"), ("..", "partitioners", "x"))
)
_local = threading.local()


def format_shape(shape: Shape) -> str:
    """`[N, 3, 64, 64]`: N stands for the symbolic batch dimension."""
    return "[" + ", ".join("N" if d is None else str(d) for d in shape) + "]"


def format_tuple(shape: Shape) -> str:
    """`(N, 3, 64, 64)`, `(8,)`: a shape as Python prints a tuple, N the batch dimension."""
    dims = ["N" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def twin_of(graph: Graph, node: Node) -> Node | None:
    """`graph`'s node that `node` stands for: itself, or in a copy of its graph (a plan's, a
    model built again) the node of its name, op, shape and dtype; None if there is none."""
    if node.graph is graph:
        return node
    twin = graph[node.name] if node.name in graph else None
    same = twin is not None and (twin.op, tuple(twin.shape), twin.dtype) == (
        node.op, tuple(node.shape), node.dtype)
    return twin if same else None


def user_source_line() -> str:
    """file:line of the innermost stack frame outside graphflow: where the user created a node."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        # (contextlib: a `with gf.device(...)` block's body runs in its __enter__)
        if not path.startswith(_PACKAGE_DIRS) and "importlib" not in path and (
                os.path.basename(path) != "contextlib.py"):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclass(eq=False, repr=False)
class Node:
    """One op application. Nodes compare by identity; `name` is unique within its graph."""

    op: str
    name: str
    inputs: tuple[Node, ...]
    attrs: dict[str, Any]
    shape: Shape
    dtype: str
    device: str | None = None
    source: str = "<unknown>"
    graph: Graph | None = field(default=None, compare=False)

    def where(self) -> str:
        return f"{self.op} '{self.name}' ({self.source})"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"<{self.name}: {self.op} {self.dtype}{format_shape(self.shape)}>"


class Graph:
    """A computation graph. Use as a context manager so DSL calls add nodes to it.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     x = gf.placeholder("x", (None, 4))
    ...     y = gf.relu(x)
    >>> [n.op for n in g.nodes]
    ['placeholder', 'relu']
    """

    def __init__(self, dtype: str = "float32", seed: int = 0) -> None:
        from graphflow.ops.registry import FLOAT_DTYPES  # the registry imports ir

        self.source = user_source_line()  # where it was made: errors tell two graphs apart
        if not isinstance(dtype, str) or dtype not in FLOAT_DTYPES:
            hint = did_you_mean(dtype, FLOAT_DTYPES) if isinstance(dtype, str) else ""
            raise DTypeError(f"Graph ({self.source}): dtype {dtype!r} is not supported, "
                             f"expected one of {', '.join(FLOAT_DTYPES)} (the default dtype of "
                             f"placeholders and parameters){hint}")
        self.dtype = dtype  # default float dtype of placeholders and parameters
        self.seed = seed
        self.nodes: list[Node] = []
        self._by_name: dict[str, Node] = {}
        self._name_counts: dict[str, int] = {}
        self._scopes: list[str] = []
        self._devices: list[str | None] = []
        self._sources: list[str] = []  # autodiff: a gradient node takes its forward node's line
        # node name -> its gradient node's name, recorded by gradients() for placements
        self.gradients: dict[str, str] = {}

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> Graph:
        _graph_stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _graph_stack().pop()

    @contextmanager
    def sourced(self, source: str) -> Iterator[None]:
        """Nodes added inside take `source` as their line (autodiff: the forward node's)."""
        self._sources.append(source)
        try:
            yield
        finally:
            self._sources.pop()

    @property
    def scope(self) -> str:
        return "/".join(self._scopes)

    @property
    def current_device(self) -> str | None:
        return self._devices[-1] if self._devices else None

    # -- building -----------------------------------------------------------------------------
    def new_name(self, base: str, explicit: bool = False) -> str:
        """A unique name under the current scope; an explicit name must be free."""
        full = f"{self.scope}/{base}" if self._scopes else base
        if explicit:
            if full in self._by_name:
                raise GraphError(f"name '{full}' is already used in this graph "
                                 f"({user_source_line()})")
            return full
        count = self._name_counts.get(full, 0)
        name = full if count == 0 else f"{full}_{count}"
        while name in self._by_name:
            count += 1
            name = f"{full}_{count}"
        self._name_counts[full] = count + 1
        return name

    def add(
        self,
        op: str,
        inputs: Sequence[Node],
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
        device: str | None = None,
    ) -> Node:
        """Add a node: look the op up, infer its shape and dtype, record placement and source."""
        from graphflow.ops.registry import REGISTRY  # the registry imports ir

        attrs = dict(attrs or {})
        source = self._sources[-1] if self._sources else user_source_line()
        if name is not None and not isinstance(name, str):
            raise GraphError(f"{op} ({source}): a name must be a str, got "
                             f"{type(name).__name__} {name!r}")
        if name is not None and "@" in name:  # partitioners/recompute.py names copies so
            raise GraphError(f"{op} '{name}' ({source}): a name may not hold '@', which marks "
                             "a node's copy on another worker (loss@w1)")
        full = self.new_name(name or op, explicit=name is not None)
        node = Node(op, full, tuple(inputs), attrs, (), "", device or self.current_device,
                    source, self)
        if op not in REGISTRY:
            raise UnknownOpError(located(node, f"unknown op '{op}'; known ops: "
                                               f"{', '.join(sorted(REGISTRY))}"))
        for x in node.inputs:
            if not isinstance(x, Node) or x.graph is not self:
                raise GraphError(located(node, f"input {x!r} is not a node of this graph"))
        node.shape, node.dtype = REGISTRY[op].infer_node(node)
        self.nodes.append(node)
        self._by_name[full] = node
        return node

    def insert(self, op: str, name: str, inputs: Sequence[Node], attrs: dict[str, Any],
               shape: Shape, dtype: str, device: str | None = None,
               source: str = "<unknown>") -> Node:
        """Add a node whose shape and dtype are already known (passes that copy or rewrite
        nodes use this; the DSL uses `add`). Call validate() after a batch of inserts."""
        if name in self._by_name:
            raise GraphError(f"{op} '{name}' ({source}): name already used in this graph")
        node = Node(op, name, tuple(inputs), dict(attrs), tuple(shape), dtype, device, source,
                    self)
        self.nodes.append(node)
        self._by_name[name] = node
        return node

    def remove(self, nodes: Iterable[Node]) -> None:
        """Drop `nodes` (rewriting passes use this for copies nothing reads any more)."""
        gone = set(nodes)
        for n in self.nodes:
            if n not in gone and any(x in gone for x in n.inputs):
                raise GraphError(located(n, "still reads a node being removed"))
        self.nodes = [n for n in self.nodes if n not in gone]
        for n in gone:
            del self._by_name[n.name]

    # -- reading ------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node named '{name}' in this graph") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def parameters(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "parameter"]

    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    def toposort(self, nodes: Iterable[Node] | None = None) -> list[Node]:
        """Kahn's order of `nodes` (default: all); ties keep creation order. Raises CycleError."""
        subset = list(self.nodes if nodes is None else nodes)
        members = set(subset)
        indegree = {n: sum(1 for x in n.inputs if x in members) for n in subset}
        users: dict[Node, list[Node]] = {n: [] for n in subset}
        for n in subset:
            for x in n.inputs:
                if x in members:
                    users[x].append(n)
        ready = [n for n in subset if indegree[n] == 0]
        order: list[Node] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for u in users[n]:
                indegree[u] -= 1
                if indegree[u] == 0:
                    ready.append(u)
        if len(order) != len(subset):
            stuck = [n for n in subset if indegree[n] > 0]
            raise CycleError(located(stuck[0], "the graph has a cycle through "
                                     + " -> ".join(n.name for n in stuck[:8])))
        return order

    def ancestors(self, targets: Iterable[Node]) -> list[Node]:
        """`targets` and every node they depend on, in topological order."""
        seen: set[Node] = set()
        stack = list(targets)
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(n.inputs)
        return self.toposort(n for n in self.nodes if n in seen)

    def validate(self) -> None:
        """Check op names, graph membership, acyclicity and every node's stored shape and dtype."""
        from graphflow.ops.registry import REGISTRY

        for n in self.nodes:
            if n.op not in REGISTRY:
                raise UnknownOpError(located(n, f"unknown op '{n.op}'"))
            for x in n.inputs:
                if x.graph is not self or self._by_name.get(x.name) is not x:
                    raise GraphError(located(n, f"input {x!r} is not a node of this graph"))
        self.toposort()
        for n in self.nodes:
            shape, dtype = REGISTRY[n.op].infer_node(n)
            if (shape, dtype) != (n.shape, n.dtype):
                raise GraphError(located(n, f"stored {n.dtype}{list(n.shape)} but its inputs "
                                            f"give {dtype}{list(shape)}"))

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph keyed by node name, with op, shape, dtype, device and source as attributes."""
        import networkx as nx  # (here: a worker process starts 0.2 s sooner without it)

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, op=n.op, shape=n.shape, dtype=n.dtype, device=n.device,
                       source=n.source)
        for n in self.nodes:
            for x in n.inputs:
                g.add_edge(x.name, n.name)
        return g

    def __str__(self) -> str:
        """A jaxpr-like listing, one node a line."""
        lines = []
        for n in self.nodes:
            args = ", ".join(x.name for x in n.inputs)
            shown = {k: v for k, v in n.attrs.items() if k not in ("value", "shape", "dtype")
                     or n.op not in SOURCE_OPS}
            attrs = ", ".join(f"{k}={v}" for k, v in shown.items())
            dev = f" @{n.device}" if n.device else ""
            lines.append(f"{n.name}: {n.dtype}{format_shape(n.shape)} = {n.op}({args})"
                         + (f" {{{attrs}}}" if attrs else "") + dev)
        return "\n".join(lines)


def users_of(nodes: Iterable[Node]) -> dict[Node, list[Node]]:
    """node -> the nodes of `nodes` that read it (once per input slot that reads it)."""
    nodes = list(nodes)
    users: dict[Node, list[Node]] = {n: [] for n in nodes}
    for n in nodes:
        for x in n.inputs:
            users.setdefault(x, []).append(n)
    return users


def steps_to_send(order: Sequence[Node], users: Mapping[Node, list[Node]],
                  sends: Callable[[Node], bool]) -> dict[Node, int]:
    """For every node of `order` (a topological order) that is a send (`sends(n)`) and every
    node one depends on, how many nodes away its nearest send is (a send: 0); recvs have none
    (they arrive, they are not run). A worker runs these first: a peer may be waiting."""
    steps: dict[Node, int] = {}
    for n in reversed(order):
        if sends(n):
            steps[n] = 0
        elif n.op != "recv" and (ahead := [steps[u] for u in users[n] if u in steps]):
            steps[n] = 1 + min(ahead)
    return steps


def _graph_stack() -> list[Graph]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def open_graph() -> Graph | None:
    """The innermost graph whose `with` block is open here, or None."""
    stack = _graph_stack()
    return stack[-1] if stack else None


def current_graph() -> Graph:
    stack = _graph_stack()
    if not stack:
        raise GraphError(f"no graph is open ({user_source_line()}): build ops inside "
                         "`with gf.Graph() as g:`")
    return stack[-1]
