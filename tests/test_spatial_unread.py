"""Spatial partitioning of layers whose last (or in-between) output rows nothing reads: a pool
or strided layer after them floors its output size, or steps over rows. Those rows' weights get
no block of their own (the loss would not depend on it); a neighbouring block holds them, so the
plan assembles the whole model's parameters, and their gradient is zero as in one process."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ir import users_of
from graphflow.models import Model
from graphflow.partitioners import partition
from graphflow.partitioners.spatial import balanced_rows
from graphflow.runtime import Cluster


def minimal():
    """The audit's model: 7 rows of local2d, of which avg_pool2d(2) reads rows 0-5."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1, 9, 6))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.layers.local2d(x, filters=2, kernel_size=3, name="lc1")
        h = gf.avg_pool2d(h, 2)
        logits = gf.layers.dense(gf.flatten(h), 3, name="fc")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("minimal", g, x, y, logits, loss)


def cnn():
    """conv, max pool (padded: gathered), lrn, a strided local2d, avg pool dropping its last row."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 2, 19, 17))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.relu(gf.layers.conv2d(x, 4, 3, stride=1, padding=1, name="conv1"))
        h = gf.max_pool2d(h, 3, stride=2, padding=1)
        h = gf.lrn(h, size=3)
        h = gf.tanh(gf.layers.local2d(h, filters=3, kernel_size=(3, 2), stride=(2, 1),
                                      padding=1, name="lc1"))
        h = gf.avg_pool2d(h, 2)
        h = gf.sigmoid(gf.layers.dense(gf.flatten(h), 12, name="fc1"))
        logits = gf.layers.dense(h, 7, name="fc2")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("cnn", g, x, y, logits, loss)


def strided():
    """local2d (8 rows) -> max_pool2d 3/2 reads rows 0-6 -> conv2d 1x1 stride 2 reads pool rows
    0 and 2 (of 3) -> local2d 1x1 stride 3 steps over rows between its windows."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1, 10, 6))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.relu(gf.layers.local2d(x, filters=2, kernel_size=3, name="lc1"))
        h = gf.max_pool2d(h, 3, stride=(2, 1))
        h = gf.layers.conv2d(h, 3, 1, stride=(2, 1), name="conv1")
        a = gf.layers.local2d(x, filters=2, kernel_size=3, name="lc2")  # 8 rows, reads 0, 3, 6
        a = gf.layers.local2d(gf.tanh(a), filters=2, kernel_size=1, stride=(3, 1), name="lc3")
        logits = gf.layers.dense(gf.flatten(h), 4, name="fc1") + gf.layers.dense(
            gf.flatten(a), 4, name="fc2")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("strided", g, x, y, logits, loss)


def hwcn():
    """Stacked HWCN local2d: lc2's 2x2 stride-3 windows read lc1's rows 0-1, 3-4, 6-7 of 9."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1, 11, 8))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.transpose(x, (2, 3, 1, 0))
        h = gf.relu(gf.layers.local2d(h, 3, 3, layout="HWCN", name="lc1"))
        h = gf.layers.local2d(h, 2, 2, stride=3, layout="HWCN", name="lc2")
        h = gf.transpose(h, (3, 2, 0, 1))
        logits = gf.layers.dense(gf.flatten(h), 5, name="fc")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("hwcn", g, x, y, logits, loss)


def flat_concat():
    """Flattened row blocks read whole (by a concat, not a matmul): gathered once, and the
    flatten of the gather named apart from it (both were '<flatten>/gathered')."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1, 8, 6))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = gf.flatten(gf.relu(gf.layers.local2d(x, filters=2, kernel_size=3, name="lc1")))
        feats = gf.concat([h, gf.flatten(x)], axis=1)
        logits = gf.layers.dense(feats, 3, name="fc")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("flat_concat", g, x, y, logits, loss)


MODELS = {f.__name__: f for f in (minimal, cnn, strided, hwcn, flat_concat)}
CLASSES = {"minimal": 3, "cnn": 7, "strided": 4, "hwcn": 5, "flat_concat": 3}


def batch(name, seed=0, n=4):
    model = MODELS[name]()
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, *model.x.shape[1:])).astype(np.float32),
            "y": rng.integers(0, CLASSES[name], n).astype(np.int32)}


def reference(name, feeds):
    model = MODELS[name]()
    grads = gf.gradients(model.loss, model.graph.parameters())
    values = gf.Session(model.graph).run([model.loss, *grads.values()],
                                         {model.x: feeds["x"], model.y: feeds["y"]})
    return values[0], dict(zip(grads, values[1:]))


def assert_close(got, want, what):
    assert np.shape(got) == np.shape(want), what
    scale = float(np.abs(want).max()) + 1e-12
    err = float(np.abs(np.asarray(got) - want).max())
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"


def check_gradients(name, parts, run):
    feeds = batch(name)
    loss, grads = reference(name, feeds)
    model = MODELS[name]()
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    got_loss, got = run(plan, feeds)
    assert_close(got_loss, loss, "loss")
    got = plan.assemble(got)
    assert set(got) == set(grads)
    for param, want in grads.items():
        assert_close(got[param], want, f"gradient of {param}")
    return grads


def in_one_session(plan, feeds):
    g, names = plan.graph, list(plan.grads)
    values = gf.Session(g).run([g[plan.loss]] + [g[plan.grads[n]] for n in names], feeds)
    return values[0], dict(zip(names, values[1:]))


def on_cluster(mode):
    def run(plan, feeds):
        with Cluster(plan, mode=mode, timeout=60) as cluster:
            out = cluster.gradients(feeds)
        return out.pop("loss"), out
    return run


@pytest.mark.parametrize("parts", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_rewritten_graph_matches_single_process(name, parts):
    check_gradients(name, parts, in_one_session)


def test_the_unread_rows_weights_have_zero_gradient_and_a_block():
    """lc1's row 6 is not read: its gradient is zero in one process, and on 4 workers its
    weights share a block with rows 4-5 (no block of row 6 alone that nothing depends on)."""
    grads = check_gradients("minimal", 4, in_one_session)
    assert not grads["lc1/W"][6].any() and grads["lc1/W"][:6].any()
    model = minimal()
    plan = partition(model.graph, 4, "spatial", loss=model.loss)
    blocks = sorted((n.attrs["block"]["lo"], n.attrs["block"]["hi"]) for n in plan.graph.nodes
                    if n.op == "parameter" and n.name.startswith("lc1/W/part"))
    assert blocks[-1][1] == 7 and blocks[-1][0] < 6
    assert [lo for lo, _ in blocks[1:]] == [hi for _, hi in blocks[:-1]]


@pytest.mark.parametrize("parts", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_row_block_holds_a_row_something_reads(name, parts):
    from graphflow.partitioners.rows import halo_first, read_rows

    graph = MODELS[name]().graph
    users = users_of(graph.nodes)
    for rows in (balanced_rows(graph, parts), halo_first(graph, balanced_rows(graph, parts))[0]):
        for node, bounds in rows.items():
            read = read_rows(node, users)
            assert bounds[0][0] == 0 and bounds[-1][1] == len(read), node.name
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), node.name
            assert all(read[lo:hi].any() for lo, hi in bounds), (node.name, bounds)


def test_read_rows_follow_each_readers_windows():
    from graphflow.partitioners.rows import read_rows

    graph = strided().graph
    users = users_of(graph.nodes)
    read = {n.name: np.flatnonzero(read_rows(n, users)).tolist() for n in graph.nodes
            if n.op in ("local2d", "max_pool2d", "conv2d")}
    assert read == {"lc1/local2d": list(range(7)), "max_pool2d": [0, 2],
                    "conv1/conv2d": [0, 1], "lc2/local2d": [0, 3, 6],
                    "lc3/local2d": [0, 1, 2]}  # flattened: every row


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
@pytest.mark.parametrize("name", ["cnn", "minimal"])
def test_threads_steps_equal_single_process(name, parts):
    """Gradients, then the parameters after 2 SGD steps, on worker threads."""
    check_gradients(name, parts, on_cluster("threads"))
    lr, batches = 0.1, [batch(name, seed) for seed in (1, 2)]
    model = MODELS[name]()
    trainer = gf.Trainer(model, gf.optim.SGD(lr))
    for b in batches:
        trainer.step(b["x"], b["y"])
    plan = partition(MODELS[name]().graph, parts, "spatial", loss=model.loss)
    with Cluster(plan, mode="threads", optimizer={"name": "sgd", "lr": lr}, timeout=60) as c:
        for b in batches:
            c.step(b)
        got = plan.assemble(c.params())
    assert set(got) == set(trainer.session.params)
    for param, want in trainer.session.params.items():
        assert_close(got[param], want, f"parameter {param} after {len(batches)} steps")


def test_processes_step_equals_single_process():
    check_gradients("minimal", 4, on_cluster("processes"))


def test_partitioned_nodes_keep_the_users_source_line():
    """An error about a block parameter names the model's line, not the partitioner's."""
    model = minimal()
    plan = partition(model.graph, 4, "spatial", loss=model.loss)
    line = model.graph["lc1/W"].source
    assert line.startswith("test_spatial_unread.py:")
    assert {n.source for n in plan.graph.nodes if n.name.startswith("lc1/W/part")} == {line}
    assert not [n.name for n in plan.graph.nodes
                if n.source.startswith(("spatial.py", "collectives.py", "rows.py"))]
