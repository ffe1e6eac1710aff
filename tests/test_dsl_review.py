"""A user review of the DSL, the Session and autodiff: each defect it found, fixed."""

import re

import numpy as np
import pytest

import graphflow as gf


def _line_of(marker: str) -> str:
    lines = open(__file__).read().splitlines()
    (n,) = [i + 1 for i, text in enumerate(lines) if marker in text and "_line_of" not in text]
    return f"test_dsl_review.py:{n}"


def _mlp():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 6))
        y = gf.placeholder("y", (None,), "int32")
        logits = gf.layers.dense(gf.relu(gf.layers.dense(x, 8, name="fc1")), 5, name="fc2")
        loss = gf.softmax_cross_entropy(logits, y)
    return gf.models.Model("m", g, x, y, logits, loss)


def test_fetched_parameters_and_constants_are_copies():
    with gf.Graph() as g:
        w = gf.parameter("w", (2, 3))
        c = gf.constant(np.ones(3, np.float32), name="c")
        flat = gf.reshape(w, (-1,))  # a view of the parameter
        y = w * 2.0
    s = gf.Session(g)
    kept = s.params["w"].copy()
    fetched, viewed, const, got, fresh = s.run([w, flat, c, "c", y])
    for a in (fetched, viewed, s.get("w")):
        a[...] = 7.0
    const[...] = 7.0
    got[...] = 7.0
    np.testing.assert_array_equal(s.params["w"], kept)
    np.testing.assert_array_equal(c.attrs["value"], np.ones(3))
    np.testing.assert_array_equal(fresh, kept * 2.0)


def test_a_trainer_step_leaves_a_fetched_parameter_alone():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 5, 8)
    t = gf.Trainer(_mlp(), gf.optim.SGD(0.5))
    before = t.session.run("fc1/W")
    kept = before.copy()
    t.step(x, y.astype(np.int32))
    np.testing.assert_array_equal(before, kept)
    assert not np.array_equal(t.session.params["fc1/W"], kept)


@pytest.mark.parametrize(("init", "options", "says"), [
    ("normal", {"stddev": 1.0}, "initializer 'normal' has no option 'stddev'; its options: "
                                "scale"),
    ("uniform", {"limit": 1.0}, "initializer 'uniform' has no option 'limit'; its options: "
                                "scale"),
    ("zeros", {"valu": 7.0}, "initializer 'zeros' has no option 'valu'; its options: value; "
                             "did you mean 'value'?"),
])
def test_unknown_initializer_options_are_refused(init, options, says):
    with gf.Graph(), pytest.raises(gf.GraphError) as e:
        gf.parameter("w", (100,), init=init, **options)  # MARK-init
    assert str(e.value) == f"parameter 'w' ({_line_of('MARK-init')}): {says}"


def test_known_initializer_options_and_layer_inits_still_work():
    with gf.Graph() as g:
        gf.parameter("z", (3,), init="zeros", value=7.0)
        x = gf.placeholder("x", (None, 1, 6, 6))
        gf.layers.conv2d(x, 2, 3, init="normal", name="c")  # the layer's fans: not for normal
        gf.layers.local2d(x, 2, 3, init="he_normal", name="l")
    s = gf.Session(g)
    np.testing.assert_array_equal(s.get("z"), [7.0, 7.0, 7.0])
    assert 0.0 < s.get("c/W").std() < 0.02


def test_a_numpy_array_on_the_left_makes_one_node():
    arr = np.array([1.0, 2.0, 3.0], np.float32)
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        w = gf.parameter("w", (3, 2))
        outs = [arr + x, arr - x, arr * x, arr / x, np.float32(2.0) * x,
                np.ones((4, 3), np.float32) @ w]
    assert [type(o).__name__ for o in outs] == ["Node"] * 6
    assert [o.op for o in outs] == ["add", "sub", "mul", "div", "mul", "matmul"]
    s = gf.Session(g)
    xv = np.full((2, 3), 4.0, np.float32)
    got = s.run(outs[:4], {x: xv})
    for value, want in zip(got, [arr + xv, arr - xv, arr * xv, arr / xv], strict=True):
        np.testing.assert_allclose(value, want)


def test_a_node_from_another_graph_is_named():
    with gf.Graph() as g1:
        a = gf.placeholder("a", (3,))  # MARK-a
    with gf.Graph() as g2:
        with pytest.raises(gf.GraphError) as relu:
            gf.relu(a)  # MARK-cross-relu
        with pytest.raises(gf.GraphError) as mul:
            a * 2.0  # MARK-mul
    assert len(g1) == 1 and len(g2) == 0
    assert str(relu.value) == (
        f"relu ({_line_of('MARK-cross-relu')}): input placeholder 'a' ({_line_of('MARK-a')}) "
        f"is not a node of this graph, the one open here (made at "
        f"{_line_of('gf.Graph() as g2')}): it belongs to the graph made at "
        f"{_line_of('gf.Graph() as g1')}; build it inside that graph's `with` block")
    assert str(mul.value).startswith(f"mul ({_line_of('MARK-mul')}): input placeholder 'a'")


def test_gradients_take_names_and_refuse_what_gets_none():
    with gf.Graph() as g:
        w = gf.parameter("w", (2, 3))
        y = gf.placeholder("y", (2,), "int32")  # MARK-y
        loss = gf.softmax_cross_entropy(w, y)
        by_name = gf.gradients(loss, ["w"])
        assert gf.gradients(loss, "w")["w"] is by_name["w"]
        with pytest.raises(gf.GraphError) as labels:
            gf.gradients(loss, [y])
        with pytest.raises(gf.GraphError, match=r"no node named 'ww'.*did you mean 'w'\?"):
            gf.gradients(loss, ["ww"])
    assert by_name["w"].shape == (2, 3)
    assert str(labels.value) == (
        f"placeholder 'y' ({_line_of('MARK-y')}): gets no gradient from the loss "
        f"'softmax_cross_entropy': it is int32, and only float values are differentiable")
    assert g.gradients == {"w": by_name["w"].name}


def test_a_session_initialises_parameters_added_after_it():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        h = gf.layers.dense(x, 4, name="fc1")
    s = gf.Session(g)
    with g:
        h2 = gf.layers.dense(h, 2, name="fc2")
    xv = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(s.run(h2, {x: xv}), gf.Session(g).run(h2, {x: xv}))
    np.testing.assert_array_equal(s.get("fc2/W"), gf.Session(g).get("fc2/W"))


def test_dense_needs_a_known_feature_size():
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        gf.layers.dense(gf.placeholder("a", (None, None)), 3)  # MARK-dense
    assert str(e.value) == (f"dense 'dense' ({_line_of('MARK-dense')}): dense needs a known "
                            f"input feature size, got an input of shape (N, N)")


@pytest.mark.parametrize(("build", "says"), [
    (lambda x: gf.concat(x, 1), "xs must be a list of nodes, got Node <x: placeholder"),
    (lambda x: gf.concat([x, x], "1"), "axis must be an int, got str '1'"),
    (lambda x: gf.reduce_sum(x, "1"), "axes must be an int, a list of ints or None, got str"),
    (lambda x: gf.reduce_mean(x, 1.0), "axes must be an int, a list of ints or None, got float"),
])
def test_wrong_argument_types_are_type_errors(build, says):
    with gf.Graph(), pytest.raises(TypeError) as e:
        build(gf.placeholder("x", (None, 3)))
    assert re.fullmatch(r"(concat|reduce_sum|reduce_mean) \(test_dsl_review.py:\d+\): "
                        + re.escape(says) + ".*", str(e.value))  # (the line: the lambda's)


def test_numpy_int_axes_still_work():
    with gf.Graph():
        x = gf.placeholder("x", (None, 3))
        assert gf.reduce_sum(x, np.int64(1)).shape == (None,)
        assert gf.concat([x, x], np.int64(1)).shape == (None, 6)


def test_a_device_must_be_a_name():
    with gf.Graph(), pytest.raises(gf.GraphError) as e:
        with gf.device(1):  # MARK-device
            pass
    assert str(e.value) == (f"device ({_line_of('MARK-device')}): a device is a name "
                            f"'worker:K' (K the worker's index) or None, got int 1")


def test_gradient_nodes_take_their_forward_nodes_line():
    with gf.Graph() as g:
        w = gf.parameter("w", (3,))
        h = gf.relu(w)  # MARK-relu-forward
        loss = gf.reduce_sum(h * h)  # MARK-loss
        gf.gradients(loss, [w])
    grads = {n.name: n.source for n in g.nodes if n.name.startswith("grad/")}
    assert grads["grad/relu/relu_grad"] == _line_of("MARK-relu-forward")
    assert grads["grad/reduce_sum"] == _line_of("MARK-loss")  # the seed
    assert {s for name, s in grads.items() if name.startswith("grad/mul/")} == {
        _line_of("MARK-loss")}


def test_a_graph_dtype_is_checked_where_the_graph_is_made():
    with pytest.raises(gf.DTypeError) as e:
        gf.Graph(dtype="flaot32")  # MARK-dtype
    assert str(e.value).startswith(f"Graph ({_line_of('MARK-dtype')}): dtype 'flaot32' is not "
                                   f"supported, expected one of float32, float64")
    assert "did you mean 'float32'?" in str(e.value)
    assert gf.Graph(dtype="float64").dtype == "float64"
