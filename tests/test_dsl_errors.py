"""Bad arguments to the DSL's layers and ops are graphflow errors that name the layer or node
and the user's line, never a ZeroDivisionError, IndexError or TypeError from inside."""

import re

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.conv import conv2d as conv2d_op


def _line_of(marker: str) -> str:
    lines = open(__file__).read().splitlines()
    (n,) = [i + 1 for i, text in enumerate(lines) if marker in text and "_line_of" not in text]
    return f"test_dsl_errors.py:{n}"


def _layer_error(layer, **kwargs):
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        x = gf.placeholder("x", (None, 3, 8, 8))
        layer(x, name="c1", **kwargs)  # MARK-layer
    return str(e.value)


WINDOWS = [
    ({"stride": 0}, "stride must be a positive int or a pair of them, got 0"),
    ({"stride": -1}, "stride must be a positive int or a pair of them, got -1"),
    ({"stride": 1.5}, "stride must be a positive int or a pair of them, got 1.5"),
    ({"stride": True}, "stride must be a positive int or a pair of them, got True"),
    ({"stride": (1, 0)}, "stride must be a positive int or a pair of them, got (1, 0)"),
    ({"kernel_size": (3,)}, "kernel_size must be a positive int or a pair of them, got (3,)"),
    ({"kernel_size": 0}, "kernel_size must be a positive int or a pair of them, got 0"),
    ({"kernel_size": "3"}, "kernel_size must be a positive int or a pair of them, got '3'"),
    ({"padding": -1}, "padding must be a non-negative int or a pair of them, got -1"),
    ({"padding": (1, 2, 3)}, "padding must be a non-negative int or a pair of them, got (1, 2, 3)"),
    ({"filters": 0}, "filters must be a positive int, got 0"),
    ({"filters": 2.0}, "filters must be a positive int, got 2.0"),
]


@pytest.mark.parametrize("kind", ["conv2d", "local2d"])
@pytest.mark.parametrize(("bad", "message"), WINDOWS)
def test_windowed_layer_arguments(kind, bad, message):
    kwargs = {"filters": 2, "kernel_size": 3, **bad}
    msg = _layer_error(getattr(gf.layers, kind), **kwargs)
    assert msg == f"{kind} 'c1' ({_line_of('MARK-layer')}): {message}"


def test_a_kernel_too_big_for_the_input_still_says_so():
    msg = _layer_error(gf.layers.conv2d, filters=2, kernel_size=(3, 9))
    assert msg.startswith(f"conv2d 'c1' ({_line_of('MARK-layer')}): kernel 9 with padding 0")


def test_valid_windows_still_build():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3, 8, 8))
        y = gf.layers.conv2d(x, np.int64(2), kernel_size=np.array([3, 3]),
                             stride=(np.int64(1), 2), name="c1")
        z = gf.layers.local2d(x, 2, kernel_size=(3, 2), stride=2, padding=(1, 0), name="l1")
    assert y.shape == (None, 2, 6, 3) and z.shape == (None, 2, 4, 4)
    assert g["c1/W"].shape == (2, 3, 3, 3)


@pytest.mark.parametrize("units", [0, -3, 2.5, True])
def test_dense_units_must_be_a_positive_int(units):
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        x = gf.placeholder("x", (None, 4))
        gf.layers.dense(x, units, name="fc")  # MARK-dense
    assert str(e.value) == (f"dense 'fc' ({_line_of('MARK-dense')}): units must be a positive "
                            f"int, got {units!r}")


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize(("bad", "message"), [
    ({"kernel": 0}, "kernel must be a positive int or a pair of them, got 0"),
    ({"kernel": 2.5}, "kernel must be a positive int or a pair of them, got 2.5"),
    ({"kernel": (2,)}, "kernel must be a positive int or a pair of them, got (2,)"),
    ({"kernel": 2, "stride": 0}, "stride must be a positive int or a pair of them, got 0"),
    ({"kernel": 2, "padding": -1}, "padding must be a non-negative int or a pair of them, got -1"),
])
def test_pool_arguments_name_the_node_and_line(pool, bad, message):
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        img = gf.placeholder("img", (None, 3, 8, 8))
        getattr(gf, pool)(img, **bad)  # MARK-pool
    assert str(e.value) == f"{pool} '{pool}' ({_line_of('MARK-pool')}): {message}"


def test_the_ops_under_the_layers_name_their_node_too():
    with gf.Graph(), pytest.raises(gf.ShapeError) as e:
        x = gf.placeholder("x", (None, 3, 8, 8))
        w = gf.parameter("w", (4, 3, 3, 3))
        conv2d_op(x, w, stride=0, name="raw")  # MARK-op
    assert str(e.value) == (f"conv2d 'raw' ({_line_of('MARK-op')}): stride must be a positive int "
                            "or a pair of them, got 0")


def test_pool_attrs_are_pairs_of_python_ints():
    with gf.Graph():
        y = gf.max_pool2d(gf.placeholder("x", (None, 3, 8, 8)), np.int64(2), padding=[1, 0])
    assert y.attrs == {"kernel": (2, 2), "stride": (2, 2), "padding": (1, 0)}
    assert all(type(v) is int for pair in y.attrs.values() for v in pair)


@pytest.mark.parametrize(("make", "args", "message"), [
    ("placeholder", ("x", 3),
     "placeholder 'x' ({line}): shape must be a tuple of ints (None for the batch dim), got 3"),
    ("parameter", ("W", 3), "parameter 'W' ({line}): shape must be a tuple of ints, got 3"),
    ("parameter", ("W", (None, 3)),
     "parameter 'W' ({line}): parameter shape (None, 3) must be fully known"),
    ("parameter", ("W", (2.5, 3)),
     "parameter 'W' ({line}): shape (2.5, 3) must hold non-negative ints"),
    ("placeholder", (3, (2,)), "placeholder ({line}): a name must be a str, got int 3"),
])
def test_source_arguments(make, args, message):
    with gf.Graph(), pytest.raises(gf.GraphError) as e:
        getattr(gf, make)(*args)  # MARK-source
    assert str(e.value).startswith(message.format(line=_line_of("MARK-source")))


def test_a_shape_of_numpy_ints_is_fine():
    with gf.Graph():
        x = gf.placeholder("x", np.zeros((2, 3)).shape)
        w = gf.parameter("w", (np.int64(3), np.int32(4)))
    assert x.shape == (2, 3) and w.shape == (3, 4) and type(w.shape[0]) is int
    assert re.fullmatch(r"<w: parameter float32\[3, 4\]>", repr(w))


def test_an_nchw_batch_given_as_hwcn_is_named():
    with gf.Graph():
        x = gf.placeholder("x", (None, 3, 8, 8))
        with pytest.raises(gf.ShapeError, match=r"local2d 'hw' \(test_dsl_errors.py:\d+\): "
                                                r"input of shape \(N, 3, 8, 8\) has no size "
                                                r"for H in layout HWCN; only N may be None"):
            gf.layers.local2d(x, 4, 3, name="hw", layout="HWCN")
