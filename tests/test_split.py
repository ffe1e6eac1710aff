"""split() golden tests: the exact per-worker subgraphs with their Send/Recv nodes (the way
TensorFlow tests graph_partition), and plans as data (print, save, load)."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.partitioners import Plan, partition, split
from tests.simgraphs import two_workers


def listing(plan):
    return [[f"{n.name} = {n.op}({', '.join(x.name for x in n.inputs)})"
             + (f" [{n.attrs['key']}]" if n.op in ("send", "recv") else "")
             for n in w.graph.nodes] for w in plan.workers]


def diamond():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        a = gf.relu(x, name="a")
        b = gf.exp(a, name="b")
        c = gf.neg(a, name="c")
        gf.add(b, c, name="d")
    return g


def test_golden_two_workers_one_receive_for_two_consumers():
    plan = split(diamond(), {"x": 0, "a": 0, "b": 1, "c": 1, "d": 0})
    assert listing(plan) == [
        ["x = placeholder()", "a = relu(x)", "send/a->w1 = send(a) [a->w1]",
         "recv/b = recv() [b->w0]", "recv/c = recv() [c->w0]", "d = add(recv/b, recv/c)"],
        ["recv/a = recv() [a->w1]", "b = exp(recv/a)", "c = neg(recv/a)",
         "send/b->w0 = send(b) [b->w0]", "send/c->w0 = send(c) [c->w0]"],
    ]
    assert [(t.tensor, t.src, t.dst) for t in plan.transfers] == [
        ("a", 0, 1), ("b", 1, 0), ("c", 1, 0)]


def test_golden_placeholder_is_replicated_not_sent():
    plan = split(diamond(), {"x": 0, "a": 1, "b": 1, "c": 1, "d": 1}, parts=2)
    assert listing(plan) == [
        [],
        ["x = placeholder()", "a = relu(x)", "b = exp(a)", "c = neg(a)", "d = add(b, c)"],
    ]
    assert plan.transfers == []


def test_golden_backward_crosses_back():
    g, loss = two_workers()  # x -> h on worker 1 -> loss on worker 0
    plan = partition(g, 2, "manual", loss=loss)
    assert [(t.tensor, t.src, t.dst) for t in plan.transfers] == [
        ("h", 1, 0), ("grad/sq/mul_1", 0, 1)]
    assert plan.worker_of(plan.grads["w"]) == plan.worker_of("w") == 1


def test_plan_saves_loads_and_prints(tmp_path):
    model = gf.models.digits_lc()
    plan = partition(model.graph, 3, "spatial", loss=model.loss)
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert listing(again) == listing(plan)
    assert again.transfers == plan.transfers and again.grads == plan.grads
    assert str(again.graph) == str(plan.graph)
    text = plan.report(batch=32)
    # the title, the table's head, a row per worker, the recomputed nodes and the prediction
    assert "predicted step" in text and len(text.splitlines()) == 2 + 3 + 2
    assert text.splitlines()[-2].startswith("recomputed instead of received: ")
    with pytest.raises(ValueError, match="not a graphflow plan"):
        Plan.from_dict({"format": "something else"})


def test_report_shows_workers_that_got_no_nodes():
    # manual placement of a graph without device scopes: everything on worker 0 of 3
    plan = partition(diamond(), 3, "manual")
    lines = plan.report(batch=8).splitlines()
    rows = [line.split() for line in lines[2:5]]
    assert [r[:2] for r in rows] == [["0", "5"], ["1", "0"], ["2", "0"]]
    assert rows[1][-1] == rows[2][-1] == "0.0"  # busy ms
    assert "idle: worker(s) 1, 2 got no nodes" in lines


def test_split_refuses_unplaced_nodes():
    with pytest.raises(gf.GraphError, match="has no worker"):
        split(diamond(), {"x": 0, "a": 0})


def test_partition_leaves_the_users_graph_alone():
    model = gf.models.digits_lc()
    before = str(model.graph)
    partition(model.graph, 2, "layerwise", loss=model.loss)
    assert str(model.graph) == before
    with pytest.raises(ValueError, match="unknown strategy"):
        partition(model.graph, 2, "random", loss=model.loss)
    np.testing.assert_equal(len(model.graph.parameters()), 6)
