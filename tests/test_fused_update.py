"""The SGD update run in the weight gradient's own gemm (short_gemm.matmul_tn_update,
Optimizer.update_product) gives the parameters the gemm and then the update give, bit for bit;
workers take that path where nothing of the step reads the weight any more."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.models import Model
from graphflow.ops import rules
from graphflow.ops.short_gemm import matmul_tn, matmul_tn_update
from graphflow.optim import SGD, Adagrad, Momentum, Optimizer
from graphflow.partitioners import partition
from graphflow.runtime import Cluster
from tests.spies import updated_by

pytestmark = pytest.mark.usefixtures("wide_vectors")  # (their paths on any CPU)

ARGS = {rules.SGD: (np.float32(0.05), 0.0, 0.0), rules.MOMENTUM: (0.05, 0.9, 0.0),
        rules.ADAGRAD: (0.05, 0.0, 1e-8)}


@pytest.mark.parametrize("rule", [rules.SGD, rules.MOMENTUM, rules.ADAGRAD])
@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize(("k", "m", "n"), [(3, 8, 64), (256, 10, 320), (31, 6, 192)])
def test_kernel_equals_the_product_then_the_rule(rule, with_sum, k, m, n):
    """Rows past the last whole 4 (m = 10, 6), several column chunks (k = 256: 128 columns a
    chunk), a running sum added or not, state carried over two steps."""
    rng = np.random.default_rng(k + m + n)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((k, m), (k, n)))
    y = rng.standard_normal((m, n)).astype(np.float32) if with_sum else np.zeros(0, np.float32)
    p = rng.standard_normal((m, n)).astype(np.float32)
    s = np.full((m, n), 0.1, np.float32)
    p2, s2 = p.copy(), s.copy()
    scale = np.float32(0.5)
    for _ in range(2):
        g = np.empty((m, n), np.float32)
        assert matmul_tn(a, b, g, False) == n
        rules.run(rule, p.reshape(-1), s.reshape(-1), g.reshape(-1), 0, y.reshape(-1), 0,
                  p.size, *ARGS[rule], scale)
        matmul_tn_update(a, b, p2, rule, s2, y, *ARGS[rule], scale)
    assert np.array_equal(p2, p) and np.array_equal(s2, s)


def test_kernel_refuses_a_partial_panel():
    a, b = np.ones((2, 4), np.float32), np.ones((2, 100), np.float32)
    with pytest.raises(ValueError, match="no tiles"):
        matmul_tn_update(a, b, np.ones((4, 100), np.float32), rules.SGD, a[:0], a[:0],
                         0.1, 0.0, 0.0, 1.0)


@pytest.mark.parametrize("with_sum", [False, True])
def test_sgd_update_product_equals_update_of_the_product(with_sum):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 12), (16, 128)))
    also = rng.standard_normal((12, 128)).astype(np.float32) if with_sum else None
    p = rng.standard_normal((12, 128)).astype(np.float32)
    want = p.copy()
    SGD(0.1).update("w", want, a.T @ b if also is None else also, 0.25,
                    None if also is None else a.T @ b)
    assert SGD(0.1).update_product("w", p, a, b, 0.25, also)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-6)  # (numpy's a.T @ b sums otherwise)


@pytest.mark.parametrize("case", ["momentum", "adagrad", "float64", "partial panel",
                                  "shapes disagree"])
def test_update_product_declines_and_leaves_the_parameter(case):
    """Momentum's and Adagrad's rules cost more in the gemm than the pass they save."""
    opt: Optimizer = {"momentum": Momentum(0.1), "adagrad": Adagrad(0.1)}.get(case, SGD(0.1))
    dtype = np.float64 if case == "float64" else np.float32
    n = 100 if case == "partial panel" else 128
    a = np.ones((4, 12 if case != "shapes disagree" else 8), dtype)
    b, p = np.ones((4, n), dtype), np.ones((12, n), dtype)
    assert not opt.update_product("w", p, a, b)
    assert (p == 1).all()


def mlp() -> Model:
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 40))
        y = gf.placeholder("y", (None,), "int32")
        h = gf.sigmoid(gf.layers.dense(x, 128, name="fc1"))
        h = gf.sigmoid(gf.layers.dense(h, 64, name="fc2"))
        logits = gf.layers.dense(h, 64, name="out")
        loss = gf.softmax_cross_entropy(logits, y, name="loss")
    return Model("mlp", g, x, y, logits, loss)


@pytest.fixture
def fused(monkeypatch) -> list[str]:
    """The parameters SGD.update_product updated (workers as threads of this process)."""
    return updated_by(monkeypatch, SGD, "update_product")


def mlp_batches(seed: int, steps: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 40)).astype(np.float32),
             "y": rng.integers(0, 64, 8).astype(np.int32)} for _ in range(steps)]


def assert_trains_as_one_process(got: dict[str, np.ndarray],
                                 batches: list[dict[str, np.ndarray]]) -> None:
    """`got` (parameters by name) are the Trainer's after SGD(0.5) steps on `batches`."""
    trainer = gf.Trainer(mlp(), SGD(0.5))
    for fed in batches:
        trainer.step(fed["x"], fed["y"])
    for name, want in trainer.session.params.items():
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(("parts", "microbatches"), [(1, 1), (2, 1), (2, 2)])
def test_workers_update_in_the_gemm_and_train_as_one_process(parts, microbatches, fused):
    """One worker, two (a whole step each), two pipelined: each weight is updated in its
    gradient's gemm every step, and the parameters after three steps are the Trainer's."""
    batches = mlp_batches(0, 3)
    model = mlp()
    plan = partition(model.graph, parts, "layerwise", loss=model.loss)
    with Cluster(plan, optimizer={"name": "sgd", "lr": 0.5}, microbatches=microbatches,
                 timeout=60) as cluster:
        for fed in batches:
            cluster.step(fed)
        got = plan.assemble(cluster.params())
    assert sorted(fused) == sorted(["fc1/W", "fc2/W", "out/W"] * 3)
    assert_trains_as_one_process(got, batches)


def test_a_fetched_gradient_is_computed_not_fused(fused):
    """A step that fetches out/W's gradient gets it whole (the update still runs, apart);
    the other weights are updated in their gemms."""
    fed = mlp_batches(3, 1)[0]
    reference = mlp()
    want_grad = gf.Session(reference.graph).run(
        gf.gradients(reference.loss, [reference.graph["out/W"]])["out/W"],
        {reference.x: fed["x"], reference.y: fed["y"]})
    model = mlp()
    plan = partition(model.graph, 1, "layerwise", loss=model.loss)
    with Cluster(plan, optimizer={"name": "sgd", "lr": 0.5}, timeout=60) as cluster:
        got = cluster.run(fed, [plan.grads["out/W"]], train=True)[plan.grads["out/W"]]
        params = plan.assemble(cluster.params())
    assert sorted(fused) == ["fc1/W", "fc2/W"]
    np.testing.assert_allclose(got, want_grad, rtol=0, atol=1e-6)
    assert_trains_as_one_process(params, [fed])


def test_pipelined_worker_processes_train_as_one_process():
    batches = mlp_batches(4, 3)
    model = mlp()
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    with Cluster(plan, mode="processes", optimizer={"name": "sgd", "lr": 0.5},
                 microbatches=2, timeout=60) as cluster:
        for out in cluster.stream(batches):
            assert np.isfinite(out[model.loss.name])
        got = plan.assemble(cluster.params())
    assert_trains_as_one_process(got, batches)
