"""Compile the kernels into Numba's disk cache, in a process of the lowest priority that the
suite starts beside itself (conftest.py): on a clean checkout each kernel is compiled once, on a
core the tests leave idle, and the tests (and their worker processes) load it from the cache.

Order: the op cases last to first (test_ops.py, which runs first, takes them first to last: the
two meet halfway), then training steps of the reference models on worker threads, as the
tests of partitioned runs take them. A kernel both compile at once is only compiled twice."""

import os

import numpy as np

import graphflow as gf
from graphflow.datasets import synthetic_for
from graphflow.ops.registry import REGISTRY
from tests.cases import OpCase, all_cases
from tests.test_ops import _build, _feeds

STRATEGIES = (("spatial", 1), ("layerwise", 1), ("layerwise", 2), ("mincut", 1))


def op_cases() -> None:
    for case in reversed(all_cases()):
        inputs = case.make_inputs(np.random.default_rng(0))
        for dtype in ("float32", "float64"):
            try:
                op_case(case, inputs, dtype)
            except Exception:  # (inputs some gradient rule refuses: the tests tell)
                continue


def op_case(case: OpCase, inputs: list[np.ndarray], dtype: str) -> None:
    """The case's forward and, where its op has a gradient rule, its gradients (test_ops.py's
    graph of the case)."""
    g, phs, out = _build(case, dtype, inputs)
    wrt = [p for i, (p, x) in enumerate(zip(phs, inputs, strict=True))
           if x.dtype.kind == "f" and i not in case.no_grad]
    with g:
        dy = gf.placeholder("dy", out.shape, dtype)
        grads = gf.gradients(out, wrt, dy=dy) if REGISTRY[case.op].grad and wrt else {}
    feeds = _feeds(phs, inputs, dtype)
    gf.Session(g).run([out, *grads.values()], {**feeds, dy: np.ones(out.shape, dtype)})


def model_steps() -> None:
    for build in (gf.models.digits_lc, gf.models.speech_mlp, gf.models.lc_large):
        model = build(batch=None)
        data = synthetic_for(model, 8, seed=0)
        feeds = {model.x.name: data.x_train[:8], model.y.name: data.y_train[:8]}
        for optimizer in ({"name": "sgd", "lr": 0.01}, {"name": "adagrad", "lr": 0.01}):
            for strategy, microbatches in STRATEGIES:
                plan = gf.partition(model.graph, 2, strategy, loss=model.loss)
                with gf.Cluster(plan, optimizer=optimizer, microbatches=microbatches) as c:
                    c.step(feeds)


if __name__ == "__main__":
    os.nice(19)  # (the tests come first)
    op_cases()
    model_steps()
