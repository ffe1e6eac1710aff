"""Recompute instead of receive (partitioners/recompute.py): a cheap value that would reach a
worker by way of another is computed again where it is read, and only then."""

import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, Link
from graphflow.partitioners import Plan, partition, split
from graphflow.partitioners.recompute import original_name, recompute_relays

MS = 1e-3


def reduction(tail_user_on_0=True):
    """Each worker makes a part (p0, p1); worker 0 sums them (s) and takes a cheap tail (t),
    which both workers read (u0 on worker 0, u1 on worker 1): worker 1's t is a round trip."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 8))
        p0, p1 = gf.relu(x, name="p0"), gf.exp(x, name="p1")
        t = gf.neg(gf.add(p0, p1, name="s"), name="t")
        if tail_user_on_0:
            gf.relu(t, name="u0")
        gf.mul(t, p1, name="u1")
    placement = {"x": 0, "p0": 0, "p1": 1, "s": 0, "t": 0, "u0": 0, "u1": 1}
    return g, {k: v for k, v in placement.items() if k in g}


def model(**times):
    """Parts and readers take 1 ms, the sum and tail 1 us; a hop takes 1 ms."""
    base = {"p0": MS, "p1": MS, "s": 1e-6, "t": 1e-6, "u0": MS, "u1": MS}
    return CostModel(times={**base, **times}, link=Link(1e18, MS), batch=1, message_cpu_s=0.0)


def test_a_round_trip_becomes_a_copy_of_the_cheap_nodes_on_the_reader():
    g, placement = reduction()
    cost = model()
    before = cost.stream_seconds(g, placement)
    where = recompute_relays(g, placement, cost)
    assert {n: w for n, w in where.items() if n not in placement} == {"s@w1": 1, "t@w1": 1}
    assert g["u1"].inputs == (g["t@w1"], g["p1"]) and g["t@w1"].inputs == (g["s@w1"],)
    assert g["s@w1"].inputs == (g["p0"], g["p1"])  # the same sum, in the same order
    assert cost.stream_seconds(g, where) < before
    plan = split(g, where)
    assert sorted((t.tensor, t.src, t.dst) for t in plan.transfers) == [
        ("p0", 0, 1), ("p1", 1, 0)]  # each part crosses once; t no longer does


def test_no_copy_when_the_sender_only_relays_or_the_nodes_are_dear():
    g, placement = reduction(tail_user_on_0=False)  # worker 0 would do t for worker 1 only
    assert recompute_relays(g, placement, model()) == placement
    g, placement = reduction()
    assert recompute_relays(g, placement, model(s=0.5 * MS)) == placement  # over 1% of a step
    assert len(g) == 7


def test_no_copy_that_would_receive_more_than_twice_what_it_saves():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 8))
        p0, p1 = gf.relu(x, name="p0"), gf.exp(x, name="p1")
        t = gf.reduce_sum(gf.add(p0, p1, name="s"), 1, name="t")  # 8x smaller than p0
        gf.relu(t, name="u0")
        gf.mul(t, gf.reduce_sum(p1, 1, name="q"), name="u1")
    placement = {"x": 0, "p0": 0, "p1": 1, "s": 0, "t": 0, "u0": 0, "q": 1, "u1": 1}
    assert recompute_relays(g, placement, model(q=1e-6)) == placement


def test_spatial_lc_large_computes_the_loss_on_both_workers():
    m = gf.models.lc_large(batch=None)
    plan = partition(m.graph, 2, "spatial", loss=m.loss)
    copies = sorted(n.name for n in plan.workers[1].graph if n.name != original_name(n.name))
    # (the loss itself stays on worker 0: the backward pass starts from a constant)
    assert copies == ["fc/add@w1", "fc/matmul/sum1@w1", "grad/loss/softmax_cross_entropy_grad@w1"]
    keys = {t.key for t in plan.transfers}
    assert not any(k.startswith("grad/loss") for k in keys)  # no round trip for the gradient
    assert {"fc/matmul/part0->w1", "fc/matmul/part1->w0", "fc/b->w1"} <= keys
    assert plan.worker_of("loss") == 0 and plan.loss == "loss"  # the fetched loss is worker 0's
    assert ("recomputed instead of received: fc/matmul/sum1@w1, fc/add@w1, "
            "grad/loss/softmax_cross_entropy_grad@w1") in str(plan)
    again = Plan.from_dict(plan.to_dict())  # copies come after their inputs in a saved plan
    assert [n.name for n in again.graph] == [n.name for n in plan.graph]


def test_user_names_cannot_look_like_copies():
    with gf.Graph():
        x = gf.placeholder("x", (None, 4))
        with pytest.raises(gf.GraphError, match="'a@w1'.*may not hold '@'"):
            gf.relu(x, name="a@w1")


@pytest.mark.parametrize("strategy", ["layerwise", "mincut"])
def test_other_strategies_keep_their_placement(strategy):
    m = gf.models.lc_large(batch=None)
    plan = partition(m.graph, 3, strategy, loss=m.loss)
    assert all(n.name == original_name(n.name) for n in plan.graph)


def test_the_search_simulates_a_bounded_number_of_plan_nodes(monkeypatch):
    import graphflow.partitioners.recompute as recompute

    priced = []  # nodes of each plan simulated: the step without copies, then each candidate
    real = CostModel.stream_seconds

    def counting(self, graph, *args, **kwargs):
        priced.append(len(graph.nodes))
        return real(self, graph, *args, **kwargs)
    monkeypatch.setattr(CostModel, "stream_seconds", counting)
    m = gf.models.lc_large(batch=None)
    partition(m.graph, 8, "spatial", loss=m.loss)
    unbounded = list(priced)
    assert len(unbounded) > 4
    priced.clear()
    monkeypatch.setattr(recompute, "MAX_PRICED_NODES", 3 * unbounded[0] + 10)
    partition(m.graph, 8, "spatial", loss=m.loss)
    assert 2 < len(priced) < len(unbounded)
    assert sum(priced[1:]) <= recompute.MAX_PRICED_NODES < sum(unbounded[1:])
