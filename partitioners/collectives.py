"""All-gather: every worker gets the whole of a tensor held as blocks, one block per worker.

A dense layer split by output units reads its input whole on every worker. Gathered on worker 0
and sent on from there, worker 0 sends k - 1 whole copies (its link carries (k - 1) N bytes
a layer) and, in the backward pass, receives k - 1 whole partial gradients. Here each worker
builds the whole itself and sends and receives (k - 1) / k N bytes: up to `DIRECT_BEST`
workers it takes every other worker's block at once (one round); above, for a power of two, in
log2 k rounds of recursive doubling (k log2 k transfers, not k (k - 1)): in round r worker j
swaps what it has (2^r blocks) with worker j xor 2^r and joins the two in block order. The
backward pass autodiff derives is the mirror image: each worker receives only sums of its own
block's gradient slices (a reduce-scatter; recursive halving).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphflow.ir import Node

# Blocks taken at once, by every worker, up to this many workers: one round of latency where
# recursive doubling takes log2 k (predicted on 10 Gbit/s, speech-mlp on 8: 25.2 against 26.2
# ms; on 16 recursive doubling wins, 20.5 against 22.4).
DIRECT_BEST = 8
# Other worker counts than powers of two take every block at once up to this many workers;
# above, the tensor is gathered on worker 0 (k (k - 1) transfers a layer grow a plan fast).
DIRECT_MAX = 16

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
