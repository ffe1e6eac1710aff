"""partitioners/collectives.py: a dense layer's input in blocks is all-gathered, worker to
worker, and its gradient comes back as a reduce-scatter; nothing goes by way of worker 0."""

from collections import Counter

import numpy as np
import pytest

import graphflow as gf
import graphflow.partitioners.collectives as collectives
from graphflow.partitioners.rows import row_bounds
from graphflow.runtime.cluster import Cluster

HIDDEN = ("sigmoid", "sigmoid_1", "sigmoid_2", "sigmoid_3")  # speech-mlp: 64 x 2560 each


def crossing(plan, prefix):
    """(bytes, messages) into and out of each worker, of the tensors named `prefix`..."""
    into, out, msgs = Counter(), Counter(), Counter()
    for t in plan.transfers:
        if t.tensor.startswith(prefix):
            into[t.dst] += t.nbytes(64)
            out[t.src] += t.nbytes(64)
            msgs[t.dst] += 1
    return into, out, msgs


@pytest.mark.parametrize("parts", [2, 3, 4, 16])
def test_each_worker_receives_the_others_blocks_and_sends_its_own(parts):
    m = gf.models.speech_mlp(batch=None)
    plan = gf.partition(m.graph, parts, "spatial", loss=m.loss)
    whole = 64 * 2560 * 4
    block = [64 * (hi - lo) * 4 for lo, hi in row_bounds(2560, parts)]
    for layer in HIDDEN:
        into, out, msgs = crossing(plan, f"{layer}/")
        for w in range(parts):
            assert into[w] == whole - block[w], (layer, w)
            # directly to each other worker, or in log2 k rounds of recursive doubling
            assert msgs[w] == (parts - 1 if parts <= collectives.DIRECT_BEST else 4), (layer, w)
        # the backward pass: each worker receives only sums of its own block's gradient
        into, _, _ = crossing(plan, f"grad/{layer}/")
        for w in range(parts):
            assert into[w] == (parts - 1) * block[w], (layer, w)
    if parts <= collectives.DIRECT_BEST:
        assert all(out[w] == (parts - 1) * block[w] for w in range(parts))


def test_other_worker_counts_past_the_direct_limit_gather_on_worker_0():
    assert collectives.gathers(range(16), 16) and collectives.gathers(range(12), 12)
    assert collectives.gathers(range(64), 64) and not collectives.gathers(range(24), 24)
    assert not collectives.gathers([0, 0, 1], 2)  # a worker with two blocks


def toy(parts):
    with gf.Graph(seed=5) as g:
        x = gf.placeholder("x", (None, 24))
        y = gf.placeholder("y", (None,), "int32")
        h = gf.tanh(gf.layers.dense(x, 48, name="fc1"))
        h = gf.tanh(gf.layers.dense(h, 48, name="fc2"))
        loss = gf.softmax_cross_entropy(gf.layers.dense(h, 6, name="out"), y)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((16, 24), dtype=np.float32),
             "y": rng.integers(0, 6, 16).astype(np.int32)}
    plan = gf.partition(g, parts, "spatial", loss=loss)  # (before gradients join the graph)
    grads = gf.gradients(loss, g.parameters())
    want = gf.Session(g).run([loss, *grads.values()], {x: feeds["x"], y: feeds["y"]})
    return plan, feeds, {"loss": want[0], **dict(zip(grads, want[1:]))}


@pytest.mark.parametrize("direct", [True, False])
def test_both_routes_give_the_single_process_gradients(monkeypatch, direct):
    if not direct:  # recursive doubling, which the library takes above 8 workers, on 4
        monkeypatch.setattr(collectives, "DIRECT_BEST", 2)
    plan, feeds, want = toy(4)
    rounds = {n.name for n in plan.graph if "/gathered" in n.name and n.op == "concat"}
    assert any("gathered4/" in r for r in rounds) != direct
    with Cluster(plan, mode="threads", timeout=60) as cluster:
        out = cluster.gradients(feeds)
    got = {"loss": out.pop("loss"), **plan.assemble(out)}
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
