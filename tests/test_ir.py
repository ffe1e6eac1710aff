"""Graph IR and DSL: names, scopes, placement, source lines, toposort, validate, networkx."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.errors import GraphError


def test_names_are_unique_stable_and_scoped():
    def build():
        with gf.Graph() as g:
            x = gf.placeholder("x", (None, 4))
            with gf.name_scope("fc"):
                w = gf.parameter("W", (4, 3))
                b = gf.parameter("b", (3,), init="zeros")
            y = gf.relu(gf.relu(x @ w + b))
        return g, y
    g1, y1 = build()
    g2, _ = build()
    assert [n.name for n in g1] == [n.name for n in g2]
    assert g1["fc/W"].op == "parameter" and g1["fc/b"].shape == (3,)
    assert y1.name == "relu_1"
    with g1, pytest.raises(gf.GraphError, match="already used"):
        gf.placeholder("x", (2,))


def test_device_scope_and_source_line_are_recorded():
    with gf.Graph():
        x = gf.placeholder("x", (2,))
        with gf.device("worker:1"):
            y = gf.exp(x)  # this line is recorded
        z = gf.neg(y)
    assert x.device is None and y.device == "worker:1" and z.device is None
    assert y.source.startswith("test_ir.py:")
    line = int(y.source.split(":")[1])
    assert "this line is recorded" in open(__file__).read().splitlines()[line - 1]


def test_gradient_nodes_follow_the_forward_device():
    with gf.Graph() as g:
        x = gf.placeholder("x", (2,))
        with gf.device("worker:1"):
            w = gf.parameter("w", (2,))
            y = gf.sigmoid(x * w)
        loss = gf.reduce_sum(y)
        grads = gf.gradients(loss, [w])
    assert grads["w"].device == "worker:1"
    assert g[grads["w"].inputs[0].name].device == "worker:1"


def test_toposort_validate_and_networkx():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        a = gf.exp(x)
        b = gf.log(a)
        c = a + b
    order = g.toposort()
    assert order.index(x) < order.index(a) < order.index(b) < order.index(c)
    g.validate()
    nxg = g.to_networkx()
    assert set(nxg.edges) == {("x", "exp"), ("exp", "log"), ("exp", "add"), ("log", "add")}
    assert nxg.nodes["add"]["shape"] == (None, 3)


def test_remove_drops_unread_nodes_and_refuses_read_ones():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        a = gf.exp(x)
        b = gf.log(a)
    with pytest.raises(GraphError, match="log.*still reads a node being removed"):
        g.remove([a])
    g.remove([b, a])
    assert [n.name for n in g] == ["x"] and "exp" not in g
    g.validate()


def test_symbolic_batch_dimension_runs_with_any_batch():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        w = gf.parameter("w", (3, 2))
        y = gf.matmul(x, w)
    s = gf.Session(g)
    for n in (1, 5):
        xv = np.ones((n, 3), np.float32)
        np.testing.assert_allclose(s.run(y, {x: xv}), xv @ s.get("w"), rtol=1e-6)


def test_initializers_depend_only_on_name_and_seed():
    def value(seed, extra):
        with gf.Graph(seed=seed) as g:
            if extra:
                gf.parameter("other", (3,))
            gf.parameter("w", (4, 4))
        return gf.Session(g).get("w")
    np.testing.assert_array_equal(value(0, False), value(0, True))
    assert not np.array_equal(value(0, False), value(1, False))


def test_executor_frees_each_intermediate_after_its_last_use():
    from graphflow.executor import schedule
    with gf.Graph() as g:
        x = gf.placeholder("x", (4,))
        a = gf.exp(x)
        b = gf.neg(a)
        c = gf.tanh(b)
        d = c + a
    plan = schedule(g, [d], {x})
    freed_after = {n.name: plan.order[i].name for i, dead in enumerate(plan.frees) for n in dead}
    assert freed_after == {"x": "exp", "neg": "tanh", "exp": "add", "tanh": "add"}


def test_session_get_set_checks_shape():
    with gf.Graph() as g:
        gf.parameter("w", (2, 3))
    s = gf.Session(g)
    s.set("w", np.ones((2, 3)))
    assert s.get("w").dtype == np.float32
    with pytest.raises(gf.ShapeError, match="'w'"):
        s.set("w", np.ones((3, 2)))


def test_autodiff_sums_multiple_uses_and_reduces_broadcasts():
    with gf.Graph(dtype="float64") as g:
        x = gf.placeholder("x", (None, 3))
        b = gf.parameter("b", (3,), init="normal", scale=1.0)
        y = gf.reduce_sum(gf.square(x + b) + b * b)
        grads = gf.gradients(y, [b, x])
    s = gf.Session(g)
    xv = np.random.default_rng(0).standard_normal((5, 3))
    gb, gx = s.run([grads["b"], grads["x"]], {x: xv})
    bv = s.get("b")
    np.testing.assert_allclose(gb, (2 * (xv + bv)).sum(0) + 2 * len(xv) * bv)  # b*b broadcasts
    np.testing.assert_allclose(gx, 2 * (xv + bv))


def test_backward_pass_is_part_of_the_graph():
    with gf.Graph() as g:
        x = gf.placeholder("x", (2, 3))
        w = gf.parameter("w", (3, 4))
        loss = gf.reduce_sum(gf.relu(x @ w))
        n_forward = len(g)
        grads = gf.gradients(loss, [w])
    assert len(g) > n_forward
    assert grads["w"].name.startswith("grad/")
    assert any(n.op == "relu_grad" for n in g)
    g.validate()
