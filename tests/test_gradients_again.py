"""A graph whose builder already took its gradients (the README's DSL example does) trains and
partitions like one that did not; trainers may share a model."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.models import Model
from graphflow.train import PartitionedTrainer


def mlp(with_gradients: bool) -> Model:
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 12))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.relu(gf.layers.dense(x, 16, name="fc1"))
        with gf.device("worker:1"):
            logits = gf.layers.dense(h, 5, name="fc2")
        loss = gf.softmax_cross_entropy(logits, y)
        if with_gradients:
            gf.gradients(loss, g.parameters())
    return Model("mlp", g, x, y, logits, loss)


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((8, 12), dtype=np.float32),
            rng.integers(0, 5, 8).astype(np.int32))


def test_asking_again_returns_the_same_nodes():
    model = mlp(with_gradients=True)
    g, params = model.graph, model.graph.parameters()
    size = len(g.nodes)
    again = gf.gradients(model.loss, params)
    assert len(g.nodes) == size
    assert {k: v.name for k, v in again.items()} == g.gradients


def test_more_parameters_than_before_get_a_second_backward_pass():
    with gf.Graph() as g:
        w = gf.parameter("w", (3,))
        v = gf.parameter("v", (3,))
        loss = gf.reduce_sum(w * w * v)
        first = gf.gradients(loss, [w])
        both = gf.gradients(loss, [w, v])  # its seed may not reuse the first one's name
    assert both["w"] is not first["w"]
    sess = gf.Session(g)
    a, b = sess.run([first["w"], both["w"]], {})
    np.testing.assert_allclose(a, b)


@pytest.mark.parametrize("strategy", ["manual", "layerwise", "spatial", "mincut"])
def test_partitioned_training_of_a_graph_with_its_gradients(strategy):
    x, y = batch()
    plain = gf.Trainer(mlp(with_gradients=False), gf.optim.SGD(0.1))
    split = PartitionedTrainer(mlp(with_gradients=True), gf.optim.SGD(0.1), 2, strategy)
    try:
        for _ in range(2):
            np.testing.assert_allclose(split.step(x, y), plain.step(x, y), rtol=1e-5)
    finally:
        split.close()


def test_trainers_may_share_a_model():
    x, y = batch()
    model = mlp(with_gradients=False)
    first = gf.Trainer(model, gf.optim.SGD(0.1))
    loss = first.step(x, y)
    second = gf.Trainer(model, gf.optim.SGD(0.1))  # fresh parameters, the same graph
    split = PartitionedTrainer(model, gf.optim.SGD(0.1), 2, "spatial")
    try:
        np.testing.assert_allclose(second.step(x, y), loss, rtol=1e-5)
        np.testing.assert_allclose(split.step(x, y), loss, rtol=1e-5)
    finally:
        split.close()
