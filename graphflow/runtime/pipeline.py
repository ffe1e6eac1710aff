"""Micro-batch pipelining for layerwise plans (beyond DistBelief: it keeps every stage busy).

A schedule is data: for one stage, the ordered list of (phase, micro-batch) tasks, with phase
"F" (the forward nodes) or "B" (the backward nodes). The worker runs exactly this list.

>>> schedule("gpipe", stage=0, stages=2, microbatches=3)
[('F', 0), ('F', 1), ('F', 2), ('B', 0), ('B', 1), ('B', 2)]
>>> schedule("1f1b", stage=0, stages=2, microbatches=3)
[('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
>>> schedule("1f1b", stage=1, stages=2, microbatches=3)
[('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2)]
"""

from __future__ import annotations

from graphflow.ir import Node

SCHEDULES = ("gpipe", "1f1b")
Task = tuple[str, int]


def schedule(kind: str, stage: int, stages: int, microbatches: int) -> list[Task]:
    """GPipe: every forward, then every backward (fill, drain). 1F1B: after stages - stage - 1
    warm-up forwards, alternate one forward and one backward, so at most `stages` micro-batches
    of activations are alive at once."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule '{kind}'; known: {', '.join(SCHEDULES)}")
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"bad pipeline: stage {stage} of {stages}, {microbatches} micro-batches")
    forward = [("F", m) for m in range(microbatches)]
    backward = [("B", m) for m in range(microbatches)]
    if kind == "gpipe":
        return forward + backward
    warmup = min(stages - stage - 1, microbatches)
    tasks = forward[:warmup]
    for m in range(warmup, microbatches):
        tasks += [forward[m], backward[m - warmup]]
    return tasks + backward[microbatches - warmup:]


def is_backward(node: Node) -> bool:
    """Backward nodes are the ones autodiff made (`grad/...`) and the transfers of their values."""
    if node.op in ("send", "recv"):
        return str(node.attrs["key"]).startswith("grad/")
    return node.name.startswith("grad/")


def check_linear(transfers: list[tuple[str, int, int]]) -> None:
    """Pipelining needs forward tensors to flow to later stages and gradients to earlier ones
    (a layerwise plan); anything else could deadlock under 1F1B."""
    for key, src, dst in transfers:
        backward = key.startswith("grad/")
        if (dst <= src) != backward:
            raise ValueError(f"tensor '{key}' goes from worker {src} to worker {dst}: micro-batch "
                             "pipelining needs a layerwise plan (forward values flow to later "
                             "stages, gradients to earlier ones)")
