"""A pipelined step's fetches and gradients are the whole batch's, however the value reads the
batch (runtime/batchjoin.py): a sum loss trains as without micro-batches, a batch sum or max
and a per-row gradient come out whole, and what cannot be joined from parts is refused."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.partitioners import partition
from graphflow.prediction import best_microbatches
from graphflow.runtime import Cluster
from graphflow.runtime.batchjoin import MIXED, kinds

SGD = {"name": "sgd", "lr": 0.01}


def regression(loss_of):
    """x -> tanh(dense) -> dense; the loss is `loss_of(prediction, target)`."""
    with gf.Graph(seed=4) as g:
        x, t = gf.placeholder("x", (None, 6)), gf.placeholder("t", (None, 3))
        h = gf.tanh(gf.layers.dense(x, 16, name="h"))
        pred = gf.layers.dense(h, 3, name="pred")
        loss = loss_of(pred, t)
    return g, loss


def batch(rows, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 6)).astype(np.float32),
            "t": rng.standard_normal((rows, 3)).astype(np.float32)}


def sum_loss(pred, t):
    d = pred - t
    return gf.reduce_sum(d * d, name="sse")


def test_every_node_is_classified_by_how_it_reads_the_batch():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        w = gf.layers.dense(x, 2, name="fc")
        c = gf.constant(np.float32(2.0))
        total = gf.reduce_sum(w, name="total")
        gf.reduce_sum(w, axes=1, name="per_row")
        cases = {
            "fc/W": "same", "x": "rows", "per_row": "rows", "total": "sum",
            gf.reduce_mean(w, name="avg").name: "mean",
            gf.reduce_max(w, name="top").name: "max",
            gf.mul(total, c, name="sum_times_c").name: "sum",
            gf.add(total, c, name="sum_plus_c").name: MIXED,  # c would be added M times
            gf.add(gf.reduce_mean(w), c, name="mean_plus_c").name: "mean",
            gf.sub(c, gf.reduce_max(w), name="c_minus_max").name: MIXED,  # a min
            gf.add(total, total, name="two_sums").name: "sum",
            gf.mul(total, total, name="sum_squared").name: MIXED,
            gf.square(total, name="square_of_sum").name: MIXED,
            gf.exp(gf.reduce_sum(g["fc/W"]), name="of_params").name: "same",
            # a row that reads a batch statistic: each micro-batch's statistic differs
            gf.sub(w, gf.reduce_mean(w, 0, keepdims=True), name="centred").name: MIXED,
            gf.relu(g["centred"], name="after_centred").name: MIXED,
            gf.softmax(gf.transpose(w, (1, 0)), name="softmax_over_rows").name: MIXED,
            gf.softmax(w, name="softmax_per_row").name: "rows",
        }
        loss = gf.softmax_cross_entropy(w, gf.placeholder("y", (None,), "int32"), name="xent")
        grads = gf.gradients(loss, [g["fc/W"], x])
    got = kinds(g)
    assert {name: got[name] for name in cases} == cases
    assert got["xent"] == "mean"
    assert got[grads["fc/W"].name] == "grad" and got[grads["x"].name] == "grad_rows"


@pytest.mark.parametrize("rows", [8, 7])  # (7: micro-batches of 4 and 3 rows)
def test_a_sum_loss_with_micro_batches_gives_the_whole_batchs_loss_and_gradients(rows):
    g, loss = regression(sum_loss)
    plan = partition(g, 2, "layerwise", loss=loss)
    feeds = batch(rows)
    with Cluster(plan, timeout=30) as whole, Cluster(plan, timeout=30, microbatches=2) as piped:
        want, got = whole.gradients(feeds), piped.gradients(feeds)
    assert sorted(got) == sorted(want) == ["h/W", "h/b", "loss", "pred/W", "pred/b"]
    for name in want:  # (with micro-batches weighed as a mean's, each was about half)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_training_a_sum_loss_with_micro_batches_gives_the_same_parameters():
    g, loss = regression(sum_loss)
    plan = partition(g, 2, "layerwise", loss=loss)
    with Cluster(plan, optimizer=SGD, timeout=30) as whole, \
            Cluster(plan, optimizer=SGD, timeout=30, microbatches=3, schedule="gpipe") as piped:
        for s in range(3):
            a, b = whole.step(batch(9, s)), piped.step(batch(9, s))
            np.testing.assert_allclose(b["sse"], a["sse"], rtol=1e-5)
        want, got = whole.params(), piped.params()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_fetched_batch_sums_maxes_and_per_row_gradients_come_out_whole():
    def loss_of(pred, t):
        gf.reduce_sum(pred, name="pred_sum")
        gf.reduce_max(pred, name="pred_max")
        return gf.mse(pred, t, name="mse")

    g, loss = regression(loss_of)
    plan = partition(g, 2, "layerwise", loss=loss)
    per_row = [n.name for n in plan.graph.nodes if n.name.startswith("grad/") and None in n.shape]
    fetches = ["pred_sum", "pred_max", "mse", *per_row]
    feeds = batch(7)
    with Cluster(plan, timeout=30) as whole, Cluster(plan, timeout=30, microbatches=2) as piped:
        want, got = whole.run(feeds, fetches), piped.run(feeds, fetches)
    assert per_row, "the regression has gradients with a batch axis"
    for name in fetches:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_what_cannot_be_joined_from_micro_batches_is_refused_naming_it():
    def loss_of(pred, t):
        gf.square(gf.reduce_sum(pred), name="square_of_sum")
        return gf.mse(pred, t)

    g, loss = regression(loss_of)
    plan = partition(g, 2, "layerwise", loss=loss)
    with Cluster(plan, timeout=30, microbatches=2) as piped:
        with pytest.raises(gf.GraphflowError, match=r"square 'square_of_sum' \(.*test_batchjoin"
                                                    r".*cannot be fetched with micro-batches"):
            piped.run(batch(4), "square_of_sum")
        assert piped.run(batch(4), "pred/add")  # the cluster is unharmed


def test_a_loss_that_is_no_mean_or_sum_cannot_train_with_micro_batches():
    g, loss = regression(lambda pred, t: gf.reduce_max(gf.square(pred - t), name="worst"))
    plan = partition(g, 2, "layerwise", loss=loss)
    with pytest.raises(ValueError, match="reduce_max 'worst' .* is a max: its gradients cannot "
                                         "be made from the micro-batches'"):
        Cluster(plan, timeout=30, microbatches=2)
    assert best_microbatches(plan, 64, repeats=1) == (1, {})
    with Cluster(plan, optimizer=SGD, timeout=30) as whole:  # without micro-batches it trains
        assert np.isfinite(whole.step(batch(4))["worst"])


def test_a_model_with_batch_statistics_cannot_train_with_micro_batches():
    def centred(pred, t):  # each micro-batch would be centred on its own mean
        return gf.mse(pred - gf.reduce_mean(pred, 0, keepdims=True), t, name="centred_mse")

    g, loss = regression(centred)
    plan = partition(g, 2, "layerwise", loss=loss)
    with pytest.raises(ValueError, match="mse 'centred_mse' .* is neither"):
        Cluster(plan, timeout=30, microbatches=2)
    assert best_microbatches(plan, 64, repeats=1) == (1, {})
