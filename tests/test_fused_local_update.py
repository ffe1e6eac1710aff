"""A locally connected layer's weight updated in its gradient's own pass
(local.local_grad_weight_update, Optimizer.update_local) is the weight the gradient and then
the update give, bit for bit; workers take that path for every rule, split or not."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.costmodel import CostModel
from graphflow.ir import users_of
from graphflow.models import digits_lc
from graphflow.ops import rules
from graphflow.ops.local import local_grad_weight, local_grad_weight_update
from graphflow.optim import SGD, Adagrad, Momentum, Optimizer
from graphflow.partitioners import partition
from graphflow.runtime import Cluster
from graphflow.runtime.gradients import fused_gradients, fused_updates
from tests.spies import updated_by

ARGS = {rules.SGD: (np.float32(0.05), 0.0, 0.0), rules.MOMENTUM: (0.05, 0.9, 0.0),
        rules.ADAGRAD: (0.05, 0.0, 1e-8)}
# (x HWCN, kernel, stride, padding): strided, padded, a window wider than the stride
GEOMETRIES = [((9, 9, 3, 4), 3, 2, 0), ((8, 7, 2, 5), 3, 1, 1), ((11, 11, 4, 3), 5, 2, 2)]


def out_shape(x_shape, k, s, p, filters=6):
    h, w, c, _ = x_shape
    return ((h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1, filters, k * k * c)


@pytest.mark.parametrize("rule", [rules.SGD, rules.MOMENTUM, rules.ADAGRAD])
@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize(("x_shape", "k", "s", "p"), GEOMETRIES)
def test_kernel_equals_the_gradient_then_the_rule(rule, with_sum, x_shape, k, s, p):
    """State carried over two steps; a sum over earlier micro-batches added or not."""
    rng = np.random.default_rng(sum(x_shape) + k)
    w_shape = out_shape(x_shape, k, s, p)
    x = rng.standard_normal(x_shape).astype(np.float32)
    dy = rng.standard_normal(w_shape[:3] + x_shape[3:]).astype(np.float32)
    y = rng.standard_normal(w_shape).astype(np.float32) if with_sum else np.zeros(0, np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    state = np.full(w_shape, 0.1, np.float32)
    w2, state2 = w.copy(), state.copy()
    scale = np.float32(0.5)
    for _ in range(2):
        g = np.empty(w_shape, np.float32)
        local_grad_weight(x, dy, k, k, s, s, p, p, g)
        rules.run(rule, w.reshape(-1), state.reshape(-1), g.reshape(-1), 0, y.reshape(-1), 0,
                  w.size, *ARGS[rule], scale)
        local_grad_weight_update(x, dy, k, k, s, s, p, p, w2, rule, state2.reshape(-1),
                                 y.reshape(-1), *ARGS[rule], scale)
    assert np.array_equal(w2, w) and np.array_equal(state2, state)


@pytest.mark.parametrize("opt", [SGD(0.1), Momentum(0.1), Adagrad(0.1)], ids=repr)
def test_update_local_equals_update_of_the_gradient(opt):
    x_shape, k, s, p = GEOMETRIES[1]
    rng = np.random.default_rng(2)
    w_shape = out_shape(x_shape, k, s, p)
    x = rng.standard_normal(x_shape).astype(np.float32)
    dy = rng.standard_normal(w_shape[:3] + x_shape[3:]).astype(np.float32)
    also = rng.standard_normal(w_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    want, twin = w.copy(), type(opt)(0.1)
    g = np.empty(w_shape, np.float32)
    local_grad_weight(x, dy, k, k, s, s, p, p, g)
    twin.update("w", want, g, 0.25, also)
    assert opt.update_local("w", w, x, dy, (k, k, s, s, p, p), 0.25, also)
    assert np.array_equal(w, want)


@pytest.mark.parametrize("case", ["float64", "shapes disagree", "empty batch", "not contiguous"])
def test_update_local_declines_and_leaves_the_parameter(case):
    dtype = np.float64 if case == "float64" else np.float32
    n = 0 if case == "empty batch" else 4
    x = np.ones((9, 9, 3, n), dtype)
    dy = np.ones((4, 4, 6, n), dtype)
    w = np.ones((4, 4, 6, 27 if case != "shapes disagree" else 26), dtype)
    if case == "not contiguous":
        x = np.ones((9, 9, 3, 8), dtype)[..., ::2]
    assert not SGD(0.1).update_local("w", w, x, dy, (3, 3, 2, 2, 0, 0))
    assert (w == 1).all()


@pytest.fixture
def fused(monkeypatch) -> list[str]:
    """The parameters Optimizer.update_local updated (workers as threads of this process)."""
    return updated_by(monkeypatch, Optimizer, "update_local")


def batches(steps: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((8, 1, 32, 32)).astype(np.float32),
             "y": rng.integers(0, 10, 8).astype(np.int32)} for _ in range(steps)]


def trained(strategy: str, parts: int, microbatches: int, optimizer: dict) -> dict:
    """digits-lc's parameters after three steps on worker threads."""
    model = digits_lc()
    plan = partition(model.graph, parts, strategy, loss=model.loss)
    with Cluster(plan, optimizer=optimizer, microbatches=microbatches, timeout=60) as cluster:
        for fed in batches(3):
            cluster.step(fed)
        return plan.assemble(cluster.params())


@pytest.mark.parametrize("optimizer", [{"name": "sgd", "lr": 0.05},
                                       {"name": "adagrad", "lr": 0.05}], ids=["sgd", "adagrad"])
@pytest.mark.parametrize(("parts", "strategy", "microbatches"),
                         [(1, "layerwise", 1), (2, "spatial", 1), (2, "layerwise", 2)])
def test_workers_update_in_the_kernel_as_they_would_apart(optimizer, parts, strategy,
                                                          microbatches, fused, monkeypatch):
    """digits-lc's local2d weight (split in two, spatially) is updated in its gradient's pass
    every step: the parameters after three steps are those of the gradient and then the
    update (bit for bit in a whole step), and with SGD the Trainer's (Adagrad amplifies the
    rounding of a gradient summed over micro-batches: 5e-5 apart, fused or not)."""
    got = trained(strategy, parts, microbatches, optimizer)
    local_weights = sorted(set(fused))
    assert local_weights and all(name.startswith("lc2/W") for name in local_weights)
    assert len(fused) == 3 * len(local_weights)
    monkeypatch.setattr(Optimizer, "update_local", lambda *args, **kwargs: False)
    apart = trained(strategy, parts, microbatches, optimizer)
    # (a pipelined step joins micro-batches in the W phase as its waits fall: rounding varies)
    atol = 0.0 if microbatches == 1 else 1e-4 if optimizer["name"] == "adagrad" else 1e-6
    for name, want in apart.items():
        np.testing.assert_allclose(got[name], want, rtol=0, atol=atol, err_msg=name)
    if optimizer["name"] == "sgd":
        trainer = gf.Trainer(digits_lc(), SGD(optimizer["lr"]))
        for fed in batches(3):
            trainer.step(fed["x"], fed["y"])
        for name, want in trainer.session.params.items():
            np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("parts", "strategy"), [(1, "layerwise"), (2, "spatial"),
                                                 (2, "layerwise")])
def test_the_cost_model_counts_the_updates_the_workers_fuse(parts, strategy):
    """fused_updates finds, by the graph's structure alone, the local weights the runtime
    updates in their gradients' kernels (which it knows from the plan), and charges their
    updates a pass less."""
    model = digits_lc()
    plan = partition(model.graph, parts, strategy, loss=model.loss)
    runtime = fused_gradients(plan.graph, plan.grads, users_of(plan.graph.toposort()))
    want = {plan.graph[p] for g, p in runtime.items() if g.op == "local2d_grad_weight"}
    assert want and fused_updates(plan.graph) == want
    cm = CostModel.builtin()
    for w in want:
        assert cm.update_seconds(w, fused=True) < cm.update_seconds(w)
