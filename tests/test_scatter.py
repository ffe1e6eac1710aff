"""partitioners/scatter.py: a sum of partials read in slices is summed per slice, where read."""

from __future__ import annotations

import numpy as np
import pytest

import graphflow as gf
import graphflow.partitioners as partitioners
from graphflow.runtime.cluster import Cluster


def without_scatter(monkeypatch, model, parts):
    monkeypatch.setattr(partitioners, "scatter_sums", lambda graph, placement, keep: placement)
    plan = gf.partition(model.graph, parts, "spatial", loss=model.loss)
    monkeypatch.undo()
    return plan


def test_each_worker_sends_the_other_only_its_columns_of_a_partial(monkeypatch):
    m = gf.models.speech_mlp(batch=None)
    plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
    before = without_scatter(monkeypatch, m, 2)
    half = 64 * 1280 * 4
    for layer in ("sigmoid", "sigmoid_1", "sigmoid_2", "sigmoid_3"):
        now = [(t.src, t.dst, t.nbytes(64)) for t in plan.transfers
               if t.tensor.startswith(f"grad/{layer}/")]
        assert sorted(now) == [(0, 1, half), (1, 0, half)], layer
    # four layers, each a whole partial one way and a half back before: one half less each
    saved = sum(t.nbytes(64) for t in before.transfers) - sum(t.nbytes(64) for t in plan.transfers)
    assert saved == 4 * half
    # no worker sums a whole partial any more: every add reads values of its own worker
    for w in plan.workers:
        recvd = {n for n in w.graph.nodes if n.op == "recv"}
        assert not [n.name for n in w.graph.nodes if n.op == "add" and n.shape == (None, 2560)
                    and any(x in recvd for x in n.inputs)]


def test_a_plan_without_such_sums_is_unchanged(monkeypatch):
    m = gf.models.lc_large(batch=None)  # its dense layer's partials are summed whole, then read
    plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
    before = without_scatter(monkeypatch, m, 2)
    assert [(t.tensor, t.src, t.dst) for t in plan.transfers] == \
        [(t.tensor, t.src, t.dst) for t in before.transfers]


@pytest.mark.parametrize("parts", [2, 3])
def test_the_gradients_are_the_same_bit_for_bit(monkeypatch, parts):
    with gf.Graph(seed=5) as g:
        x = gf.placeholder("x", (None, 24))
        y = gf.placeholder("y", (None,), "int32")
        h = gf.tanh(gf.layers.dense(x, 48, name="fc1"))
        h = gf.tanh(gf.layers.dense(h, 48, name="fc2"))
        loss = gf.softmax_cross_entropy(gf.layers.dense(h, 6, name="out"), y)
    model = gf.models.Model("toy", g, x, y, loss.inputs[0], loss)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((16, 24), dtype=np.float32),
             "y": rng.integers(0, 6, 16).astype(np.int32)}
    plans = [gf.partition(g, parts, "spatial", loss=loss),
             without_scatter(monkeypatch, model, parts)]
    assert ({t.tensor for t in plans[0].transfers} != {t.tensor for t in plans[1].transfers})
    grads = []
    for plan in plans:
        with Cluster(plan, mode="threads", timeout=60) as cluster:
            grads.append(cluster.gradients(feeds))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        np.testing.assert_array_equal(grads[0][name], grads[1][name], err_msg=name)
