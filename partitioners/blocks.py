"""How the spatial strategy holds an original tensor while it rewrites a graph: in blocks
along an axis, as per-worker partial sums, or as the flattening of blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphflow.ir import Node


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
