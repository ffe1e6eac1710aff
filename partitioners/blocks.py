"""How the spatial strategy holds an original tensor while it rewrites a graph: in blocks
along an axis, as per-worker partial sums, or as the flattening of blocks; and how a driver
joins the pieces of one it fetches (`Join`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphflow.ir import Graph, Node


@dataclass
class Split:
    """A tensor held as blocks along `axis`: block j, rows bounds[j], lives on workers[j]
    (worker j unless a worker holds several blocks: see `halo_first`)."""

    axis: int
    blocks: list[Node]
    bounds: list[tuple[int, int]]
    workers: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workers = self.workers or list(range(len(self.blocks)))


@dataclass
class Partial:
    """A tensor that is the sum of per-worker partial results (block j on worker j)."""

    blocks: list[Node]


@dataclass
class FlatSplit:
    """flatten(x) of a row-split x: kept lazy so a following matmul can contract per block."""

    source: Split
    shape: tuple[int, ...]  # x's shape without the batch dim


@dataclass(frozen=True)
class Join:
    """An original node the plan holds only in pieces, as fetched: `blocks` joined along
    `axis` ("concat"), then each row flattened ("flatten"), or summed ("sum"), or one node
    under another name ("same").

    >>> Join("flatten", ("a", "b"), axis=1).apply([np.ones((2, 1, 3)), np.zeros((2, 2, 3))])
    array([[1., 1., 1., 0., 0., 0., 0., 0., 0.],
           [1., 1., 1., 0., 0., 0., 0., 0., 0.]])
    """

    how: str
    blocks: tuple[str, ...]
    axis: int = 0

    def apply(self, values: Sequence[np.ndarray]) -> np.ndarray:
        if self.how == "sum":
            return np.sum(values, axis=0)
        if self.how == "same":
            return values[0]
        whole = np.concatenate(values, axis=self.axis)
        return whole.reshape(len(whole), -1) if self.how == "flatten" else whole

    def to_dict(self) -> dict[str, object]:
        return {"how": self.how, "blocks": list(self.blocks), "axis": self.axis}


def joins(held: Mapping[Node, Node | Split | Partial | FlatSplit], out: Graph) -> dict[str, Join]:
    """For each original node held (`_Rewriter.val`) under no node of its name in `out`, how
    to join it from nodes that are there; one whose name is there for another op (the loss,
    combined from per-block statistics) is that node ("same")."""
    found = {}
    for n, v in held.items():
        if n.name in out:
            if out[n.name].op != n.op:
                found[n.name] = Join("same", (n.name,))
            continue
        if isinstance(v, Split):
            join = Join("concat", tuple(b.name for b in v.blocks), v.axis)
        elif isinstance(v, FlatSplit):
            join = Join("flatten", tuple(b.name for b in v.source.blocks), v.source.axis)
        elif isinstance(v, Partial):
            join = Join("sum", tuple(b.name for b in v.blocks))
        else:
            join = Join("same", (v.name,))
        if all(b in out for b in join.blocks):
            found[n.name] = join
    return found
