"""All-gather: every worker gets the whole of a tensor held as blocks, one block per worker.

A dense layer split by output units reads its input whole on every worker. Gathered on worker 0
and sent on from there, worker 0 sends k - 1 whole copies (its link carries (k - 1) N bytes
a layer) and, in the backward pass, receives k - 1 whole partial gradients. Here each worker
builds the whole itself, in log2 k rounds of recursive doubling when k is a power of two: in
round r worker j swaps what it has (2^r blocks) with worker j xor 2^r and concatenates the two
in block order. Each worker sends and receives (k - 1) / k N bytes in all. The backward pass
autodiff derives from it is the mirror image, recursive halving: each worker receives only the
sums of its own blocks' gradient slices (a reduce-scatter).

Other worker counts concatenate every block on every worker: k (k - 1) transfers a tensor, so
only up to `DIRECT_MAX` workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphflow.ir import Node

DIRECT_MAX = 16
DIRECT_BEST = 8

# on(worker, op, *inputs, name=..., **attrs): a node placed on `worker`
Place = Callable[..., Node]


def gathers(workers: Sequence[int], parts: int) -> bool:
    """Whether `all_gather` serves blocks on `workers` (block j on worker j, all `parts`)."""
    k = len(workers)
    return (k > 1 and list(workers) == list(range(parts))
            and (k & (k - 1) == 0 or k <= DIRECT_MAX))


def all_gather(on: Place, blocks: Sequence[Node], axis: int, name: str) -> list[Node]:
    """The whole tensor on each worker j (list index j), concatenated from `blocks` (block j
    on worker j) along `axis`."""
    k = len(blocks)
    if k <= DIRECT_BEST or k & (k - 1):
        return [on(j, "concat", *blocks, name=f"{name}/gathered/on{j}", axis=axis)
                for j in range(k)]
    have, size = list(blocks), 1
    while size < k:
        have = [on(j, "concat", *_in_order(have, j, size), axis=axis,
                   name=f"{name}/gathered{2 * size}/on{j}") for j in range(k)]
        size *= 2
    return have


def _in_order(have: list[Node], j: int, size: int) -> tuple[Node, Node]:
    """Worker j's and its partner's groups of `size` blocks, the lower blocks first."""
    mine, theirs = have[j], have[j ^ size]
    return (mine, theirs) if j & size == 0 else (theirs, mine)
