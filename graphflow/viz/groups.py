"""Which layer a node belongs to: the name scope of the forward node it comes from.

Layers collapse by name scope (`lc1/W`, `lc1/local2d` -> `lc1`); an unscoped op is a layer of
its own (`relu`, `loss`). The spatial partitioner's pieces (`lc1/local2d/part3`,
`lc2/local2d/rows1to0`, `lc1/local2d/in1to2`, `fc/matmul/sum2`, `sigmoid/gathered4/on3`) and
the backward pass (`grad/<forward name>/...`) belong to the layer of the node they were made
from, so every strategy shows the same layers.

>>> forward = {"lc2/local2d/in2", "relu/part0"}
>>> layer_of("grad/lc2/local2d/in2/slice", forward), layer_of("relu/part0", forward)
('lc2', 'relu')
"""

from __future__ import annotations

import re
from collections.abc import Collection

from graphflow.partitioners.recompute import original_name

GRAD = "grad/"
# Suffixes the spatial partitioner appends to the node it splits (see partitioners/spatial.py).
_PIECE = re.compile(r"/(?:(?:part|in|pad|sum|on)\d+|(?:rows|in)\d+to\d+(?:on\d+)?|gathered\d*)$")


def is_backward(name: str) -> bool:
    return name.startswith(GRAD)


def forward_name(name: str, forward: Collection[str]) -> str:
    """The forward node a gradient node was made for (the longest forward-node prefix of the
    name without `grad/`); a forward node's own name otherwise."""
    if not is_backward(name):
        return name
    parts = name[len(GRAD):].split("/")
    for i in range(len(parts), 0, -1):
        candidate = "/".join(parts[:i])
        if candidate in forward:
            return candidate
    return "/".join(parts)


def unsplit_name(name: str) -> str:
    """The name before spatial splitting: `lc1/local2d/part3` -> `lc1/local2d`."""
    while match := _PIECE.search(name):
        name = name[:match.start()]
    return name


def scope_of(name: str) -> str:
    """The name scope of an unsplit forward name; an unscoped name is its own scope."""
    return name.rsplit("/", 1)[0] if "/" in name else name


def layer_of(name: str, forward: Collection[str]) -> str:
    """The layer of node `name`, given the names of the graph's forward nodes (a node's copy on
    another worker, `loss@w1`, belongs to the node's layer)."""
    return scope_of(unsplit_name(forward_name(original_name(name), forward)))
