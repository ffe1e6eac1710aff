"""Gradient codecs: float16 error bound, top-k selection and error feedback, hostile payloads."""

import numpy as np
import pytest

from graphflow.replicas.compress import Codec, Float16Codec, TopKCodec, decode, make_codec
from graphflow.transport.frames import decode_message, encode_message


def _wire(payload):
    """The payload as the shard gets it: through real frames, arrays read-only views."""
    frames = encode_message({"grads": {"w[0:8]": payload}})
    return decode_message([bytes(memoryview(f)) for f in frames])["grads"]["w[0:8]"]


def test_make_codec_specs():
    assert type(make_codec(None)) is Codec and type(make_codec("none")) is Codec
    assert isinstance(make_codec("float16"), Float16Codec)
    c = make_codec("topk:0.01")
    assert isinstance(c, TopKCodec) and c.fraction == 0.01 and c.feedback
    assert not make_codec("topk:0.5:nofeedback").feedback
    assert make_codec(c) is c and make_codec(c.spec()).spec() == "topk:0.01"
    for bad in ("topk", "topk:0", "topk:1.5", "topk:x", "topk:0.1:what", "gzip", ""):
        with pytest.raises(ValueError, match="codec"):
            make_codec(bad)


@pytest.mark.parametrize("spec", ["none", "float16", "topk:0.25"])
def test_payloads_cross_the_transport(spec):
    g = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    out = decode(_wire(make_codec(spec).encode("w[0:8]", g)), (2, 4), np.float32)
    assert out.shape == (2, 4) and out.dtype == np.float32 and out.flags.writeable
    if spec != "topk:0.25":
        np.testing.assert_allclose(out, g, rtol=1e-3)


@pytest.mark.parametrize("magnitude", [1e-6, 1.0, 1e5, 1e20])
def test_float16_round_trip_error_bound(magnitude):
    rng = np.random.default_rng(1)
    g = (rng.standard_normal(10_000) * magnitude).astype(np.float32)
    codec = Float16Codec()
    payload = codec.encode("w", g)
    out = decode(payload, g.shape, np.float32)
    top = np.abs(g).max()
    assert np.all(np.isfinite(out))
    # float16 keeps 11 significant bits; values far below the largest reach subnormals
    assert np.all(np.abs(out - g) <= 2.0**-11 * np.abs(g) + top * 2.0**-38)
    assert codec.bytes_sent * 2 == codec.bytes_raw == g.nbytes


def test_float16_zero_and_empty():
    np.testing.assert_array_equal(decode(Float16Codec().encode("z", np.zeros(3)), (3,),
                                         np.float64), np.zeros(3))
    assert decode(Float16Codec().encode("e", np.zeros(0)), (0,), np.float32).size == 0


def test_topk_sends_exactly_k_and_decode_places_them():
    rng = np.random.default_rng(2)
    g = rng.standard_normal((40, 25)).astype(np.float32)
    codec = make_codec("topk:0.01")
    payload = codec.encode("w", g)
    assert codec.k_of(g.size) == 10
    assert payload["idx"].size == payload["val"].size == 10 and payload["size"] == 1000
    assert payload["idx"].dtype == np.int32 and payload["val"].dtype == np.float32
    largest = np.sort(np.argsort(-np.abs(g.ravel()))[:10])
    np.testing.assert_array_equal(payload["idx"], largest)
    out = decode(_wire(payload), g.shape, np.float32)
    assert np.count_nonzero(out) == 10
    np.testing.assert_array_equal(out.ravel()[largest], g.ravel()[largest])
    # what was sent left the residual; the rest stays for the next push
    r = codec.residual["w"]
    assert np.all(r[largest] == 0) and np.allclose(r + out.ravel(), g.ravel())


def test_topk_k_bounds():
    c = TopKCodec(0.001)
    assert c.k_of(0) == 0 and c.k_of(1) == 1 and c.k_of(999) == 1 and c.k_of(2001) == 3
    assert TopKCodec(1.0).k_of(7) == 7
    p = c.encode("scalar", np.float32(3.0))
    assert decode(p, (), np.float32) == 3.0


def _run_topk(codec, steps=2000, n=1000, seed=3):
    """Push `steps` gradients of a constant drift plus noise; the sums and residual norms."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.5, 1.5, n).astype(np.float32)
    raw, got, norms = np.zeros(n), np.zeros(n), []
    for _ in range(steps):
        g = mu + 0.5 * rng.standard_normal(n).astype(np.float32)
        raw += g
        got += decode(codec.encode("w", g), (n,), np.float32)
        norms.append(codec.residual_norm())
    return raw, got, np.array(norms)


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def test_topk_error_feedback_loses_nothing_over_time():
    codec = TopKCodec(0.01)
    raw, got, norms = _run_topk(codec)
    # nothing is lost: what the shard summed plus what waits is exactly what was pushed
    assert np.linalg.norm(got - raw) == pytest.approx(norms[-1], rel=1e-3)
    # the residual stays bounded while the sums grow, so they converge
    assert norms[1000:].max() <= 1.2 * norms[400:1000].max()
    assert _rel(got, raw) < 0.05


def test_topk_without_feedback_does_not_converge():
    raw, got, _ = _run_topk(TopKCodec(0.01, feedback=False))
    assert _rel(got, raw) > 0.9  # ~1% of each gradient arrives, the rest is gone


def test_topk_residual_per_name():
    c = TopKCodec(0.5)
    c.encode("a", np.array([1.0, 0.5], np.float32))
    c.encode("b", np.array([0.0, 0.3, 2.0, 0.1], np.float32))
    np.testing.assert_array_equal(c.residual["a"], [0.0, 0.5])
    np.testing.assert_array_equal(c.residual["b"], np.float32([0, 0, 0, 0.1]))
    with pytest.raises(ValueError, match="'a'.*3 float32.*residual has 2"):
        c.encode("a", np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="int32"):
        c.encode("c", np.zeros(3, np.int32))
    c.reset()
    assert c.residual_norm() == 0.0


def _topk(idx, val, size=8):
    return {"kind": "topk", "idx": np.asarray(idx, np.int32),
            "val": np.asarray(val, np.float32), "size": size}


@pytest.mark.parametrize("payload, match", [
    ([1, 2], "must be a dict"),
    ({"kind": "gzip", "data": np.zeros(8)}, "unknown gradient payload kind 'gzip'"),
    ({"data": np.zeros(8)}, "unknown gradient payload kind None"),
    ({"kind": "none", "data": np.zeros(7)}, "7 elements, expected 8"),
    ({"kind": "none", "data": [0.0] * 8}, "'data' must be a 1-d array, got list"),
    ({"kind": "float16", "data": np.zeros(15, np.uint8)}, "15 bytes of uint8, expected 16"),
    ({"kind": "float16", "data": np.zeros(4, np.float32)}, "16 bytes of float32"),
    ({"kind": "float16", "data": np.zeros(16, np.uint8), "scale": 3.0}, "power of two"),
    ({"kind": "float16", "data": np.zeros(16, np.uint8), "scale": 2.0**200}, "power of two"),
    (_topk([0, 9], [1, 2]), r"out of range \[0, 8\).*max 9"),
    (_topk([-1, 2], [1, 2]), r"out of range \[0, 8\).*min -1"),
    (_topk([0, 1], [1, 2], size=9), "size 9, expected 8"),
    (_topk([0, 1], [1, 2], size=8.0), "size 8.0, expected 8"),
    (_topk([0, 1, 2], [1, 2]), "3 indices but 2 values"),
    (_topk([3, 3], [1, 2]), "indices repeated or out of order"),
    (_topk([4, 3], [1, 2]), "indices repeated or out of order"),
    (_topk(list(range(8)) * 2, [1] * 16), "16 elements for a gradient of 8"),
    ({"kind": "topk", "idx": np.zeros(2), "val": np.zeros(2), "size": 8}, "float64"),
    ({"kind": "topk", "idx": np.zeros((1, 2), np.int32), "val": np.zeros(2), "size": 8},
     r"'idx' must be a 1-d array, got shape \(1, 2\)"),
])
def test_bad_payloads_raise_naming_the_problem(payload, match):
    with pytest.raises(ValueError, match=match):
        decode(payload, (2, 4), np.float32)
