"""A run that does not train computes only what its fetches depend on (runtime/prune.py): the
logits of a partitioned model need no labels and run no backward node, on any strategy, in
threads or processes, pipelined or not, and training steps around such runs are unchanged."""

import json

import numpy as np
import pytest

import graphflow as gf
from graphflow.errors import MissingFeedError
from graphflow.optim import SGD as SGD_RULE
from graphflow.partitioners import partition
from graphflow.runtime import Cluster
from graphflow.runtime.prune import needed_nodes
from graphflow.trace import read, recording
from graphflow.trace.chrome import events

SGD = {"name": "sgd", "lr": 0.05}


@pytest.fixture(scope="module")
def model():
    return gf.models.digits_lc(batch=None)


def images(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, 1, 32, 32)).astype(np.float32)


def labels(rows, seed=0):
    return np.random.default_rng(seed).integers(0, 10, rows).astype(np.int32)


@pytest.mark.parametrize("strategy,parts,mode", [
    ("spatial", 2, "threads"), ("spatial", 3, "processes"), ("layerwise", 2, "threads"),
    ("mincut", 2, "processes")])
def test_logits_without_labels_equal_the_single_process_run(model, strategy, parts, mode):
    plan = partition(model.graph, parts, strategy, loss=model.loss)
    x = images(6)
    want = gf.Session(model.graph).run(model.logits, {model.x: x})
    with Cluster(plan, mode=mode, timeout=60) as cluster:
        got = cluster.run({"x": x}, model.logits)
    assert list(got) == [model.logits.name]
    np.testing.assert_allclose(got[model.logits.name], want, rtol=1e-5, atol=1e-5)


def test_a_pipelined_plan_runs_the_forward_a_micro_batch_at_a_time(model):
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    x = images(7)  # micro-batches of 4 and 3 rows
    want = gf.Session(model.graph).run(model.logits, {model.x: x})
    with Cluster(plan, timeout=60, microbatches=2, schedule="1f1b") as cluster:
        got = cluster.run({"x": x}, [model.logits])[model.logits.name]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_forward_fetch_runs_no_backward_node_and_no_loss(model, tmp_path):
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    with Cluster(plan, timeout=60) as cluster, recording(tmp_path / "t.json"):
        cluster.run({"x": images(4)}, model.logits)
    kernels = [e.name for e in events(read(tmp_path / "t.json"))
               if e.thread == "executor" and e.cat in ("kernel", "send")]
    assert any(k.startswith("lc2/") for k in kernels)  # (the trace did record the forward)
    assert not [k for k in kernels if "grad/" in k or k.startswith("loss")]


def test_training_steps_around_forward_runs_match_a_session():
    model = gf.models.digits_lc(batch=None)  # (its own: the local trainer adds gradients)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    local = gf.Trainer(model, SGD_RULE(lr=SGD["lr"]))
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        for step in range(3):
            x, y = images(4, step), labels(4, step)
            cluster.step({"x": x, "y": y})
            local.step(x, y)
            later = images(5, 10 + step)
            got = cluster.run({"x": later}, model.logits)[model.logits.name]
            want = local.session.run(model.logits, {model.x: later})
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        trained = plan.assemble(cluster.params())
    for name, value in trained.items():
        np.testing.assert_allclose(value, local.session.params[name], rtol=1e-4, atol=1e-6)


def test_a_missing_feed_names_the_fetch_that_needs_it(model):
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        with pytest.raises(MissingFeedError, match=r"placeholder 'y' .*is not fed, but 'loss' "
                                                   r"needs it; expected an int32 array"):
            cluster.run({"x": images(4)}, [model.logits, model.loss])
        with pytest.raises(MissingFeedError, match=r"'y' .*a training step runs each one's "
                                                   r"whole subgraph"):
            cluster.step({"x": images(4)})
        assert cluster.step_count == 0  # no worker was asked
        out = cluster.run({"x": images(4), "y": labels(4)}, [model.logits, model.loss])
    assert set(out) == {model.logits.name, model.loss.name}


def test_needed_nodes_follow_each_recv_to_its_send(model):
    plan = partition(model.graph, 3, "spatial", loss=model.loss)
    needed = needed_nodes(plan, [model.logits.name])
    sends = {n.attrs["key"]: (i, n.name) for i, w in enumerate(plan.workers)
             for n in w.graph.nodes if n.op == "send"}
    recvs = [(i, n) for i, w in enumerate(plan.workers) for n in w.graph.nodes
             if n.op == "recv" and n.name in needed[i]]
    assert recvs  # the logits cross workers
    for _, r in recvs:
        src, name = sends[r.attrs["key"]]
        assert name in needed[src]
    # every needed send feeds a needed recv: nothing is sent that no one reads
    wanted = {r.attrs["key"] for _, r in recvs}
    for i, w in enumerate(plan.workers):
        for n in w.graph.nodes:
            if n.op == "send" and n.name in needed[i]:
                assert n.attrs["key"] in wanted
    # the loss's gradient of a parameter needs the labels; the logits do not
    grad = next(iter(plan.grads.values()))
    assert not any("y" in names for names in needed)
    assert any("y" in names for names in needed_nodes(plan, [grad]))


@pytest.mark.parametrize("batch,microbatches", [(None, 2), (8, 1)])
def test_a_partitioned_trainer_predicts_on_its_workers(batch, microbatches):
    local = gf.Trainer(gf.models.digits_lc(batch=batch), SGD_RULE(lr=0.05))
    split = gf.train.PartitionedTrainer(gf.models.digits_lc(batch=batch), SGD_RULE(lr=0.05),
                                        parts=2, strategy="layerwise",
                                        microbatches=microbatches)
    try:
        for step in range(2):
            x, y = images(8, step), labels(8, step)
            split.step(x, y)
            local.step(x, y)
        assert not hasattr(split, "session")  # (no local copy of the parameters to go stale)
        x, y = images(13, 7), labels(13, 7)  # chunks of 4: the last of 1 row, padded
        np.testing.assert_array_equal(split.predict(x, batch_size=4), local.predict(x))
        assert split.accuracy(x, y) == local.accuracy(x, y)
    finally:
        split.close()


def test_a_worker_with_no_nodes_needs_no_feed():
    model = gf.models.digits_lc(batch=None)  # no device scopes: "manual" leaves worker 1 idle
    plan = partition(model.graph, 2, "manual", loss=model.loss)
    assert plan.idle_workers() == [1]
    x = images(3)
    with Cluster(plan, timeout=60) as cluster:
        got = cluster.run({"x": x}, model.logits)[model.logits.name]
    np.testing.assert_allclose(got, gf.Session(model.graph).run(model.logits, {model.x: x}),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workload,parts,shape", [("digits-lc", 3, (1, 32, 32)),
                                                  ("speech-mlp", 2, (440,))])
def test_every_forward_node_of_a_spatial_plan_is_fetched_whole(workload, parts, shape):
    """Nodes the strategy holds in pieces (speech-mlp's logits, split by units; the loss,
    combined from per-block statistics) are joined at the driver (`Plan.joins`)."""
    model = gf.models.WORKLOADS[workload](batch=None)
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    nodes = [n for n in model.graph.nodes if n.op not in ("placeholder", "parameter", "constant")]
    assert any(n.name in plan.joins for n in nodes)
    x = np.random.default_rng(0).standard_normal((4, *shape)).astype(np.float32)
    feeds = {"x": x, "y": labels(4)}
    want = gf.Session(model.graph).run(nodes, {model.x: x, model.y: feeds["y"]})
    with Cluster(plan, timeout=60) as cluster:
        got = cluster.run(feeds, nodes)
        assert list(got) == [n.name for n in nodes]
        for n, value in zip(nodes, want, strict=True):
            np.testing.assert_allclose(got[n.name], value, rtol=1e-4, atol=1e-5, err_msg=n.name)


def test_a_plan_keeps_its_joins_and_refuses_a_join_of_nothing(tmp_path):
    model = gf.models.speech_mlp(batch=None)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    plan.save(tmp_path / "plan.json")
    assert gf.Plan.load(tmp_path / "plan.json").joins == plan.joins
    data = plan.to_dict()
    data["joins"][model.logits.name]["blocks"] = ["out/add/part7"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(gf.partitioners.PlanError,
                       match=r"joins: 'out/add' is joined 'concat' from out/add/part7, not "
                             r"nodes of the graph"):
        gf.Plan.load(tmp_path / "bad.json")


def test_a_misspelt_fetch_is_matched_against_the_joined_nodes_too():
    from graphflow.errors import GraphError
    from graphflow.runtime.planargs import PlanArgs

    model = gf.models.speech_mlp(batch=None)
    args = PlanArgs(partition(model.graph, 2, "spatial", loss=model.loss))
    assert args.pieces(args.fetches([model.logits])) == ["out/add/part0", "out/add/part1"]
    with pytest.raises(GraphError, match=r"no node named 'out/ad' .*did you mean 'out/add'"):
        args.fetches(["out/ad"])


def _session_with(model, plan, cluster):
    session = gf.Session(model.graph)
    session.params.update(plan.assemble(cluster.params()))
    return session


def test_a_gradient_of_one_stage_with_micro_batches_matches_the_session():
    """Only some workers are needed: every worker then runs its micro-batches one after
    another (a worker on the pipeline's schedule would wait for its peers in another order)."""
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 3, "layerwise", loss=model.loss)
    feeds = {"x": images(6), "y": labels(6)}
    grads = gf.gradients(model.loss, [model.graph["conv1/W"]])
    with Cluster(plan, microbatches=2, timeout=20) as cluster:
        got = cluster.run(feeds, plan.grads["conv1/W"])[plan.grads["conv1/W"]]
        want = _session_with(model, plan, cluster).run(grads["conv1/W"],
                                                       {model.x: feeds["x"], model.y: feeds["y"]})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_micro_batches_join_on_the_batch_axis_and_a_parameter_comes_once():
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    x = images(7)  # micro-batches of 4 and 3 rows
    names = ["lc2/local2d", "fc/W", "loss"]  # (H, W, C, N): the batch is the last axis
    assert model.graph["lc2/local2d"].shape[-1] is None
    with Cluster(plan, microbatches=2, timeout=60) as cluster:
        got = cluster.run({"x": x, "y": labels(7)}, names)
        want = _session_with(model, plan, cluster).run(names, {model.x: x, model.y: labels(7)})
    for name, value in zip(names, want, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_fetched_placeholder_is_what_was_fed_and_unheld_nodes_say_why(model):
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    x = images(5)
    with Cluster(plan, timeout=60) as cluster:
        np.testing.assert_array_equal(cluster.run({"x": x}, "x")["x"], x)  # (not a cut)
        with pytest.raises(MissingFeedError, match="placeholder 'y' .*is not fed, but it is "
                                                   "fetched"):
            cluster.run({"x": x}, ["y"])
        with pytest.raises(gf.GraphflowError, match=r"holds parameter 'lc2/W' in blocks "
                                                    r"\(lc2/W/part0, lc2/W/part1\); "
                                                    r"plan.assemble\(cluster.params\(\)\)"):
            cluster.run({"x": x}, model.graph["lc2/W"])
        left_out = next(n for n in plan.placement if not any(n in w.graph
                                                             for w in plan.workers))
        with pytest.raises(gf.GraphflowError, match=f"no worker computes '{left_out}': the "
                                                    f"plan's 'spatial' strategy left it out"):
            cluster.run({"x": x}, left_out)


def test_a_missing_feed_names_the_joined_node_not_its_pieces():
    from graphflow.runtime.planargs import PlanArgs

    model = gf.models.speech_mlp(batch=None)
    args = PlanArgs(partition(model.graph, 2, "spatial", loss=model.loss))
    with pytest.raises(MissingFeedError, match=r"'x' .*is not fed, but 'out/add' needs it"):
        args.feeds({}, [model.logits.name])


def test_calls_between_a_streams_steps_see_the_steps_sent_before_them(model):
    """A run, params() and stats() while a stream's next step is in flight get their own
    replies, and the stream its own: they come after the steps already sent. (After the
    second step the next reply wakes the stream; after the third, none would.)"""
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    data = [{"x": images(4, s), "y": labels(4, s)} for s in range(4)]
    held_out = images(5, seed=9)
    with Cluster(plan, optimizer=SGD, timeout=20) as cluster, \
            Cluster(plan, optimizer=SGD, timeout=20) as stepped:
        losses, between = [], []
        for out in cluster.stream(data, ahead=1):
            losses.append(float(out["loss"]))
            if len(losses) in (2, 3):  # steps up to len(losses) sent
                between.append({"logits": cluster.run({"x": held_out}, model.logits),
                                "params": cluster.params(), "stats": cluster.stats()})
        want = []
        for batch, seen in zip(data, [None, None, *between], strict=True):
            want.append(float(stepped.step(batch)["loss"]))
            if seen is None:
                continue
            np.testing.assert_allclose(
                seen["logits"][model.logits.name],
                stepped.run({"x": held_out}, model.logits)[model.logits.name],
                rtol=1e-5, atol=1e-6)
            for name, value in stepped.params().items():
                np.testing.assert_allclose(seen["params"][name], value, rtol=1e-5, atol=1e-6)
            assert len(seen["stats"]) == 2
        np.testing.assert_allclose(losses, want, rtol=1e-5)  # the stream was not disturbed


def test_a_spatial_plans_gradients_assemble_into_the_models_with_the_loss_kept():
    with gf.Graph(seed=2) as g:  # (its loss is not named "loss", the gradients' key)
        x, y = gf.placeholder("x", (None, 12)), gf.placeholder("y", (None,), "int32")
        h = gf.relu(gf.layers.dense(x, 16, name="fc1"))
        xent = gf.softmax_cross_entropy(gf.layers.dense(h, 6, name="fc2"), y, name="xent")
    plan = partition(g, 2, "spatial", loss=xent)
    assert any("block" in n.attrs for n in plan.graph.parameters()), "split parameters"
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 12)).astype(np.float32),
             "y": rng.integers(0, 6, 4).astype(np.int32)}
    with Cluster(plan, timeout=60) as cluster:
        got = plan.assemble(cluster.gradients(feeds))
    grads = gf.gradients(xent, g.parameters())
    want = gf.Session(g).run([xent, *grads.values()], feeds)
    assert sorted(got) == sorted(["loss", *grads])
    np.testing.assert_allclose(got["loss"], want[0], rtol=1e-5)
    for (name, _), value in zip(grads.items(), want[1:], strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_gradients_refuse_a_parameter_named_like_the_loss_key():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        w = gf.parameter("loss", (3, 2))
        total = gf.reduce_mean(gf.matmul(x, w), name="total")
    with Cluster(partition(g, 2, "layerwise", loss=total), timeout=30) as cluster:
        with pytest.raises(gf.GraphflowError, match="a parameter is named 'loss'"):
            cluster.gradients({"x": np.ones((2, 3), np.float32)})
