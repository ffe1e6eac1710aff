"""Each class of bad input raises its own exception naming the node and the user's line."""

import re

import numpy as np
import pytest

import graphflow as gf


def _line_of(marker: str) -> str:
    lines = open(__file__).read().splitlines()
    (n,) = [i + 1 for i, text in enumerate(lines) if marker in text and "_line_of" not in text]
    return f"test_errors.py:{n}"


def test_shape_mismatch_names_node_and_line():
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        a = gf.placeholder("a", (None, 3))
        b = gf.placeholder("b", (4,))
        gf.add(a, b, name="bad_add")  # MARK-shape
    msg = str(e.value)
    assert "add 'bad_add'" in msg and _line_of("MARK-shape") in msg
    assert "(N, 3)" in msg and re.search(r"\(4,?\)", msg)


def test_layer_rank_error_says_expected_layout():
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        x = gf.placeholder("x", (8, 3, 32))
        gf.layers.local2d(x, 4, 3, name="conv1")  # MARK-layer
    msg = str(e.value)
    assert "local2d 'conv1'" in msg and _line_of("MARK-layer") in msg
    assert "input has 3 dims, expected 4 (N, C, H, W)" in msg


def test_matmul_inner_dimension_mismatch():
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        x = gf.placeholder("x", (None, 5))
        w = gf.parameter("w", (4, 2))
        gf.matmul(x, w)  # MARK-matmul
    assert "matmul 'matmul'" in str(e.value) and _line_of("MARK-matmul") in str(e.value)


def test_dtype_mismatch():
    with gf.Graph(), pytest.raises(gf.DTypeError) as e:
        a = gf.placeholder("a", (3,), "float32")
        b = gf.placeholder("b", (3,), "float64")
        gf.mul(a, b)  # MARK-dtype
    msg = str(e.value)
    assert "mul 'mul'" in msg and _line_of("MARK-dtype") in msg and "float64" in msg


def test_int_input_to_float_op():
    with gf.Graph(), pytest.raises(gf.DTypeError, match=r"exp 'exp' .*int32"):
        gf.exp(gf.placeholder("labels", (3,), "int32"))


def test_unknown_op():
    with gf.Graph() as g, pytest.raises(gf.UnknownOpError) as e:
        x = gf.placeholder("x", (3,))
        g.add("frobnicate", [x])  # MARK-unknown
    assert "unknown op 'frobnicate'" in str(e.value) and _line_of("MARK-unknown") in str(e.value)


def test_cycle_is_detected_and_named():
    with gf.Graph() as g:
        x = gf.placeholder("x", (3,))
        a = gf.exp(x, name="a")
        b = gf.neg(a, name="b")
    a.inputs = (b,)  # rewire the IR into a cycle a -> b -> a
    with pytest.raises(gf.CycleError, match=r"'a' .*cycle through a -> b"):
        g.validate()
    with pytest.raises(gf.CycleError):
        gf.Session(g).run(b)


def test_missing_feed_names_placeholder_and_fetch():
    with gf.Graph() as g:
        x = gf.placeholder("images", (None, 3))  # MARK-feed
        y = gf.relu(x, name="act")
    with pytest.raises(gf.MissingFeedError) as e:
        gf.Session(g).run(y)
    msg = str(e.value)
    assert "placeholder 'images'" in msg and _line_of("MARK-feed") in msg and "'act'" in msg


def test_feed_with_wrong_shape():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3, 8, 8))
        y = gf.relu(x)
    expected = re.escape("fed shape (2, 3, 8), expected (N, 3, 8, 8)")
    with pytest.raises(gf.ShapeError, match=expected):
        gf.Session(g).run(y, {x: np.zeros((2, 3, 8), np.float32)})


def test_feed_with_wrong_dtype_kind():
    with gf.Graph() as g:
        y = gf.placeholder("labels", (4,), "int32")
    with pytest.raises(gf.DTypeError, match="labels"):
        gf.Session(g).run(y, {y: np.zeros(4, np.float32)})


def test_nan_in_loss_stops_at_the_producing_node():
    with gf.Graph() as g:
        x = gf.placeholder("x", (3,))
        h = gf.log(x, name="logx")  # MARK-nan
        loss = gf.reduce_sum(h)
    s = gf.Session(g, check_numerics=True)
    with pytest.raises(gf.NonFiniteError) as e:
        s.run(loss, {x: np.array([1.0, -1.0, 2.0], np.float32)})
    msg = str(e.value)
    assert "log 'logx'" in msg and _line_of("MARK-nan") in msg and "1 NaN" in msg
    assert np.isnan(gf.Session(g).run(loss, {x: np.array([-1.0, 1, 1], np.float32)}))


def test_nodes_from_two_graphs_do_not_mix():
    with gf.Graph():
        x = gf.placeholder("x", (3,))
    with gf.Graph():
        y = gf.placeholder("y", (3,))
        with pytest.raises(gf.GraphError, match="not a node of this graph"):
            gf.add(x, y)


def test_building_outside_a_graph():
    with pytest.raises(gf.GraphError, match="no graph is open"):
        gf.placeholder("x", (3,))


def test_missing_feed_message_reads_right():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        labels = gf.placeholder("labels", (None,), "int32")  # MARK-labels
        logits = gf.layers.dense(x, 3, name="fc")
        loss = gf.softmax_cross_entropy(logits, labels, name="xent")
    feeds = {x: np.ones((2, 4), np.float32)}
    with pytest.raises(gf.MissingFeedError) as e:
        gf.Session(g).run(loss, feeds)
    assert str(e.value) == (f"placeholder 'labels' ({_line_of('MARK-labels')}): is not fed, but "
                            "'xent' needs it; expected an int32 array of shape (N,)")
    with pytest.raises(gf.MissingFeedError, match=r"'xent', 'fc/add' need it; expected an int32"):
        gf.Session(g).run([loss, logits], feeds)
    with pytest.raises(gf.MissingFeedError, match=r"expected a float32 array of shape \(N, 4\)"):
        gf.Session(g).run(logits)


def test_one_dim_shapes_print_as_tuples():
    with gf.Graph() as g:
        y = gf.placeholder("y", (8,), "int32")
    with pytest.raises(gf.ShapeError, match=re.escape("fed shape (16,), expected (8,)")):
        gf.Session(g).run(y, {y: np.zeros(16, np.int32)})


def _fc_graph():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        h = gf.layers.dense(x, 3, name="fc")
    return g, h, {"x": np.ones((2, 4), np.float32)}


def test_fetches_by_name():
    g, h, feeds = _fc_graph()
    sess = gf.Session(g)
    want = sess.run(h, feeds)
    np.testing.assert_array_equal(sess.run("fc/add", feeds), want)
    a, b = sess.run(("fc/add", h), feeds)
    np.testing.assert_array_equal(a, b)
    got = sess.run({"logits": "fc/add", "w": g["fc/W"]}, feeds)
    assert set(got) == {"logits", "w"} and got["w"].shape == (4, 3)
    np.testing.assert_array_equal(got["logits"], want)


@pytest.mark.parametrize(("fetches", "feeds", "message"), [
    ("fc/addd", None, "no node named 'fc/addd' in the graph to fetch; did you mean 'fc/add'?"),
    ("nothing", None, "no node named 'nothing' in the graph to fetch"),
    (42, None, "fetches must be nodes or node names, got int 42"),
    (["fc/add", 4.5], None, "fetches must be nodes or node names, got float 4.5"),
    ("fc/add", {"xx": 0}, "no node named 'xx' in the graph to feed; did you mean 'x'?"),
    ("fc/add", {7: 0}, "feeds must be keyed by nodes or node names, got int 7"),
    ("fc/add", [1.0], "feeds must be a dict from nodes or node names to arrays, got list [1.0]"),
])
def test_bad_fetches_and_feeds_are_graph_errors(fetches, feeds, message):
    g, h, good = _fc_graph()
    sess = gf.Session(g)
    with pytest.raises(gf.GraphError) as e:
        sess.run(fetches, feeds or good)  # MARK-run
    assert str(e.value) == f"Session.run ({_line_of('MARK-run')}): {message}"


def test_fetch_from_another_graph():
    g, h, feeds = _fc_graph()
    other, h2, _ = _fc_graph()
    with pytest.raises(gf.GraphError, match=r"add 'fc/add' .*is a fetch but belongs to another"):
        gf.Session(g).run(h2, feeds)
