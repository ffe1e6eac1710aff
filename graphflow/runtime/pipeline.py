"""Micro-batch pipelining for layerwise plans (beyond DistBelief: it keeps every stage busy).

A schedule is data: for one stage, the ordered list of (phase, micro-batch) tasks, with phase
"F" (the forward nodes), "B" (the backward nodes) or "W" (the deferred weight-gradient nodes,
run once at the end over all micro-batches: ALL). The worker runs exactly this list; with the
W task it also runs, per micro-batch, the forward values that nothing reads (`late_nodes`).

>>> schedule("gpipe", stage=0, stages=2, microbatches=3)
[('F', 0), ('F', 1), ('F', 2), ('B', 0), ('B', 1), ('B', 2), ('W', -1)]
>>> schedule("1f1b", stage=0, stages=2, microbatches=3)
[('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2), ('W', -1)]
>>> schedule("1f1b", stage=1, stages=2, microbatches=3)
[('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2), ('W', -1)]
>>> schedule("eager", stage=0, stages=2, microbatches=4)
[('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3), ('W', -1)]

Deferring weight gradients (as zero-bubble pipelines split backward into B and W) means one
full-batch gemm per weight instead of a small one per micro-batch, and one gradient written
instead of one per micro-batch summed: micro-batches re-read weights but no longer re-write
them. The last stage runs its W while the first drains. The first stage, whose backward feeds
no other stage, also runs W early (the worker decides at run time): in its cooldown, whenever
the next micro-batch's gradient has not arrived yet, a gradient at a time over the
micro-batches done so far (runtime/backlog.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from graphflow.ir import SOURCE_OPS, Node

SCHEDULES = ("gpipe", "1f1b", "eager")
Task = tuple[str, int]
ALL = -1  # the micro-batch of the "W" task: all of them at once

# Ops whose result over a batch joined from micro-batches is the join (row-local ops) or the
# sum (ops contracting the batch) of their per-micro-batch results: only these are deferred.
BATCH_ADDITIVE = frozenset({
    "matmul", "transpose", "reshape", "flatten", "sum_to", "reduce_sum", "add", "sub", "neg",
    "relu_grad", "sigmoid_grad", "tanh_grad", "local2d_grad_weight", "conv2d_grad_weight"})


# The gemm kernels hold 4 rows of a product in registers (ops/small_gemm.py): a micro-batch of
# 22 rows runs its last 2 a row at a time, each re-reading the weight (speech-mlp's output
# layer: 9.2-11 ms at 22 rows, 8.2 at 24).
ROW_BLOCK = 4


def microbatch_rows(rows: int, parts: int) -> list[int]:
    """The rows of each of `parts` micro-batches of a batch of `rows`: whole blocks of
    ROW_BLOCK rows, as evenly as they go, the rows short of a block on the last (64 in 3:
    24, 20, 20); where there are fewer blocks than parts, sizes that differ by at most one.
    Each micro-batch's gradients count rows / batch (as in a mean loss over the whole batch),
    so micro-batches need not be equal.

    >>> microbatch_rows(64, 3), microbatch_rows(18, 4), microbatch_rows(6, 4)
    ([24, 20, 20], [4, 4, 4, 6], [2, 2, 1, 1])
    """
    if not 1 <= parts <= rows:
        raise ValueError(f"a batch of {rows} rows cannot make {parts} micro-batches")
    blocks, rest = divmod(rows, ROW_BLOCK)
    if blocks < parts:
        return [rows // parts + (i < rows % parts) for i in range(parts)]
    sizes = [ROW_BLOCK * (blocks // parts + (i < blocks % parts)) for i in range(parts)]
    sizes[-1] += rest
    return sizes


def schedule(kind: str, stage: int, stages: int, microbatches: int) -> list[Task]:
    """GPipe: every forward, then every backward (fill, drain). 1F1B: after stages - stage - 1
    warm-up forwards, alternate one forward and one backward, so at most `stages` micro-batches
    of activations are alive at once. Eager: 1F1B with twice the warm-up forwards. Without its
    W, a backward takes about as long as a forward, so the first gradient's round trip through
    the later stages takes about 2 (stages - stage - 1) forwards: with 1F1B's warm-up a stage
    waits out half of it (speech-mlp's first stage 9.7 ms of a 100-ms step at 3 micro-batches),
    here it computes. At most 2 (stages - stage) - 1 micro-batches are alive on a stage."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule '{kind}'; known: {', '.join(SCHEDULES)}")
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"bad pipeline: stage {stage} of {stages}, {microbatches} micro-batches")
    forward = [("F", m) for m in range(microbatches)]
    backward = [("B", m) for m in range(microbatches)]
    if kind == "gpipe":
        return forward + backward + [("W", ALL)]
    warmup = min((2 if kind == "eager" else 1) * (stages - stage - 1), microbatches)
    tasks = forward[:warmup]
    for m in range(warmup, microbatches):
        tasks += [forward[m], backward[m - warmup]]
    return tasks + backward[microbatches - warmup:] + [("W", ALL)]


def batch_axis(node: Node) -> int | None:
    """The axis of `node`'s value that holds the batch (its one symbolic dimension)."""
    axes = [i for i, d in enumerate(node.shape or ()) if d is None]
    return axes[0] if len(axes) == 1 else None


def deferred_weight_nodes(order: list[Node], users: dict[Node, list[Node]],
                          grad_nodes: set[Node]) -> list[Node]:
    """The backward nodes that only feed parameter gradients and can run once over the joined
    micro-batches: batch-additive ops whose outside inputs are parameters, constants or values
    with one batch axis, ending in batch-free gradients. In `order`'s order.

    A gradient on its way back along the data path (a batched backward value that another
    batched backward node reads) runs per micro-batch, even where it feeds only weight
    gradients, as in a first stage: then its work overlaps the later stages' backward passes
    instead of waiting for the last micro-batch."""
    deferred = {n for n in order if n.op in BATCH_ADDITIVE and is_backward(n)}
    deferred -= {n for n in grad_nodes if batch_axis(n) is not None}
    deferred -= {n for n in deferred if batch_axis(n) is not None and any(
        is_backward(u) and batch_axis(u) is not None for u in users[n])}

    def stays(n: Node) -> bool:
        joinable = all(x in deferred or x.op in ("parameter", "constant")
                       or batch_axis(x) is not None for x in n.inputs)
        feeds_gradients = n in grad_nodes or bool(users[n]) and all(
            u in deferred for u in users[n])
        return joinable and feeds_gradients

    while True:  # a node that must run per micro-batch takes down what it needs from it
        leaving = {n for n in deferred if not stays(n)}
        if not leaving:
            break
        deferred -= leaving
    return [n for n in order if n in deferred]


def is_backward(node: Node) -> bool:
    """Backward nodes are the ones autodiff made (`grad/...`) and the transfers of their values."""
    if node.op in ("send", "recv"):
        return str(node.attrs["key"]).startswith("grad/")
    return node.name.startswith("grad/")


def late_nodes(order: list[Node], users: dict[Node, list[Node]]) -> list[Node]:
    """The forward nodes only fetched, which nothing else reads (a loss once the backward
    starts from a constant): a pipelined worker runs them last, in its W phase, so that no
    micro-batch's gradient waits for them (speech-mlp's loss: 1 ms a micro-batch)."""
    return [n for n in order if not users[n] and not is_backward(n)
            and n.op not in ("send", "recv", *SOURCE_OPS)]


def runs_weights_early(nodes: Iterable[Node]) -> bool:
    """Whether a stage runs its W phase a micro-batch at a time, in its cooldown while a
    gradient is late (zero-bubble style): its backward receives gradients but sends none, so
    filling its waits delays no one (the first stage)."""
    backward = [n for n in nodes if is_backward(n)]
    return any(n.op == "recv" for n in backward) and not any(n.op == "send" for n in backward)


def check_linear(transfers: list[tuple[str, int, int]]) -> None:
    """Pipelining needs forward tensors to flow to later stages and gradients to earlier ones
    (a layerwise plan); anything else could deadlock under 1F1B."""
    for key, src, dst in transfers:
        backward = key.startswith("grad/")
        if (dst <= src) != backward:
            raise ValueError(f"tensor '{key}' goes from worker {src} to worker {dst}: micro-batch "
                             "pipelining needs a layerwise plan (forward values flow to later "
                             "stages, gradients to earlier ones)")


def simulate(kind: str, microbatches: int, forward: Sequence[float], backward: Sequence[float],
             weights: Sequence[float | Sequence[float]],
             hops: Sequence[float] = (), updates: Sequence[Sequence[float]] = (),
             starts: Sequence[float] = ()) -> list[float]:
    """When each stage ends its step under schedule `kind` (stage s starting at starts[s],
    default 0: in a stream of steps, when it ended the last one), the worker's rules included:
    stage s takes forward[s] / backward[s] seconds per micro-batch and weights[s] per
    micro-batch of W work (a list: per group of W nodes, see runtime/backlog.py); a
    micro-batch's tensors take hops[s] seconds between stages s and s + 1 (either way); the
    first stage runs W early in its cooldown, a group at a time, while a gradient is late;
    updates[s][g] seconds of updates follow group g's last run, in the W task.

    >>> simulate("gpipe", 2, [1, 1], [1, 1], [0, 0])  # fill, 2 + 2 busy, drain
    [6.0, 5.0]
    >>> simulate("1f1b", 2, [1, 1], [1, 1], [[0.5, 0.5], 0])  # its W fills stage 0's wait
    [7.0, 5.0]
    >>> simulate("gpipe", 2, [1, 1], [1, 1], [0, 0], updates=[[0.5], [1]])  # after the W
    [6.5, 6.0]
    >>> simulate("gpipe", 2, [1, 1], [1, 1], [0, 2])  # the last stage's W: 2 a micro-batch
    [6.0, 9.0]
    >>> simulate("gpipe", 2, [1, 1], [1, 1], [0, 2], starts=[6.0, 9.0])  # streamed: 8 a step
    [14.0, 17.0]
    """
    stages = len(forward)
    hops = list(hops) or [0.0] * (stages - 1)
    groups = [[float(w)] if isinstance(w, int | float) else [float(g) for g in w]
              for w in weights]
    after = [list(u) + [0.0] * (len(g) - len(u))
             for g, u in zip(groups, list(updates) or [[]] * stages, strict=True)]
    tasks = [schedule(kind, s, stages, microbatches) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}  # (phase, stage, micro-batch) -> end time
    free, nxt = [float(t) for t in starts] or [0.0] * stages, [0] * stages
    pending = [[0] * len(g) for g in groups]  # per stage and group: micro-batches not taken
    last_forward = [max(i for i, (p, _) in enumerate(t) if p == "F") for t in tasks]

    def take(s: int, g: int) -> None:
        free[s] += pending[s][g] * groups[s][g]
        pending[s][g] = 0

    while any(nxt[s] < len(tasks[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while nxt[s] < len(tasks[s]):
                phase, mb = tasks[s][nxt[s]]
                if phase == "W":
                    for g in range(len(groups[s])):
                        take(s, g)
                        free[s] += after[s][g]
                    nxt[s] += 1
                    continue
                # the input: the previous stage's forward, or the next stage's backward
                src = ("F", s - 1, mb) if phase == "F" else ("B", s + 1, mb)
                if 0 <= src[1] < stages and src not in done:
                    break  # that stage has not got there yet
                ready = done[src] + hops[min(s, src[1])] if 0 <= src[1] < stages else 0.0
                if phase == "B" and s == 0 and nxt[s] > last_forward[s]:
                    for g in range(len(groups[s])):  # W fills the wait, a group at a time
                        if ready <= free[s]:
                            break
                        take(s, g)
                work = forward[s] if phase == "F" else backward[s]
                free[s] = done[phase, s, mb] = max(free[s], ready) + work
                if phase == "B":
                    pending[s] = [p + 1 for p in pending[s]]
                nxt[s] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"schedule '{kind}' deadlocks with {stages} stages")
    return free


def split_batch(name: str, value: np.ndarray, parts: int) -> list[np.ndarray]:
    """Feed `name`'s batch in `parts` micro-batches (`microbatch_rows`)."""
    if parts == 1:
        return [value]
    if value.ndim == 0 or len(value) < parts:
        raise ValueError(f"feed '{name}' of shape {value.shape}: its batch cannot make "
                         f"{parts} micro-batches")
    return np.split(value, np.cumsum(microbatch_rows(len(value), parts))[:-1])
