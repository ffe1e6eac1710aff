"""Top-k pushes with error feedback, applied by sharded Adagrad: the same parameters as a plain
numpy reference, Adagrad's step bounded by lr however large the released residual, and
"topk:1" (every element) the same payload as no compression, not twice its bytes."""

import math

import numpy as np
import pytest

from graphflow.ps.layout import Layout
from graphflow.ps.shard import Shard
from graphflow.replicas.compress import decode, make_codec
from graphflow.transport.frames import decode_message, encode_message

SHAPES = {"b": (37,), "w": (23, 41), "z": (5, 7)}  # over 2 shards, "w" is cut in two
LR = 0.03


def _wire(grads):
    """The push's grads as a shard gets them: through real frames (read-only views)."""
    frames = encode_message({"grads": grads})
    return decode_message([bytes(memoryview(f)) for f in frames])["grads"]


def _gradients(steps, seed=0):
    rng = np.random.default_rng(seed)
    scale = {"b": 1.0, "w": 0.01, "z": 100.0}  # magnitudes far apart
    return [{n: (rng.standard_normal(s) * scale[n]).astype(np.float32)
             for n, s in SHAPES.items()} for _ in range(steps)]


def _through_shards(init, grads_seq, spec, shards=2):
    layout = Layout.build(SHAPES, shards)
    ps = [Shard(s, shards) for s in range(shards)]
    split = layout.split(init)
    for s, shard in enumerate(ps):
        shard.init({k: v.copy() for k, v in split.get(s, {}).items()},
                   {"name": "adagrad", "lr": LR}, [0])
    codec = make_codec(spec)
    for step, grads in enumerate(grads_seq):
        for s, part in layout.split(grads).items():
            ps[s].push(0, step, _wire({k: codec.encode(k, g) for k, g in part.items()}))
    got = layout.join({k: v for shard in ps for k, v in shard.fetch()["values"].items()})
    return {n: v.reshape(-1) for n, v in got.items()}, layout


def _reference(init, grads_seq, fraction, layout, eps=1e-8):
    """numpy: per slice, residual += g, send the k largest |residual| and keep the rest;
    Adagrad (zero accumulators) on the decoded gradient, only where it is nonzero."""
    p = {n: v.reshape(-1).astype(np.float64) for n, v in init.items()}
    acc = {n: np.zeros_like(v) for n, v in p.items()}
    res: dict[str, np.ndarray] = {}
    for grads in grads_seq:
        for n in SHAPES:
            g, sent = grads[n].reshape(-1), np.zeros(p[n].size)
            for sl in layout.slices_of(n):
                r = res.setdefault(sl.key, np.zeros(sl.size, np.float32))
                r += g[sl.lo:sl.hi]
                k = min(sl.size, max(1, math.ceil(fraction * sl.size)))
                top = np.argsort(-np.abs(r), kind="stable")[:k]
                sent[sl.lo + top] = r[top]
                r[top] = 0
            nz = sent != 0
            acc[n][nz] += sent[nz] ** 2
            p[n][nz] -= LR * sent[nz] / (np.sqrt(acc[n][nz]) + eps)
    return p


@pytest.mark.parametrize("fraction", [1.0, 0.1, 0.01])
def test_sharded_topk_adagrad_matches_numpy_reference(fraction):
    grads_seq = _gradients(40)
    rng = np.random.default_rng(1)
    init = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    got, layout = _through_shards(init, grads_seq, f"topk:{fraction:g}")
    assert [sl.key for sl in layout.slices_of("w")] == ["w[0:470]", "w[470:943]"]
    want = _reference(init, grads_seq, fraction, layout)
    for n in SHAPES:
        # (float32 against float64 rounding: about 1e-6 after 40 pushes; a step is 0.03)
        np.testing.assert_allclose(got[n], want[n], rtol=0, atol=1e-5, err_msg=n)
        # Adagrad moves an element at most lr a push, a released residual included
        assert np.abs(got[n] - init[n].reshape(-1)).max() <= LR * len(grads_seq) + 1e-6


def test_released_residual_moves_adagrad_by_at_most_lr():
    """The first push of an element holds 50 steps of residual, 50x the gradient; Adagrad
    divides it by its own root square: the step is lr, not 50 lr (SGD's would be)."""
    codec, size = make_codec("topk:0.01"), 100  # k = 1 a push
    g = np.full(size, 1.0, np.float32)
    g[0] = 1000.0  # element 0 wins every push until the others' residual passes it
    shard = Shard(0)
    shard.init({"w[0:100]": np.zeros(size, np.float32)}, {"name": "adagrad", "lr": LR}, [0])
    before = np.zeros(size, np.float32)
    moved = []
    for step in range(1100):
        shard.push(0, step, _wire({"w[0:100]": codec.encode("w[0:100]", g)}))
        now = shard.fetch()["values"]["w[0:100]"].copy()
        moved.append(np.abs(now - before).max())
        before = now
    # element 1's first push carried a residual of about 1000 (its gradient summed)
    assert max(moved) <= LR * (1 + 1e-6)
    assert np.count_nonzero(before) > 1


def test_topk_1_is_the_dense_gradient_not_twice_its_bytes():
    """"topk:1" sends every element: before, as indices and values (2x the bytes of no
    compression, and an index gather / scatter each push); now dense, as "none" does."""
    g = np.random.default_rng(3).standard_normal((64, 33)).astype(np.float32)
    none, top = make_codec("none"), make_codec("topk:1")
    for _ in range(3):
        a, b = none.encode("w", g), top.encode("w", g)
        np.testing.assert_array_equal(decode(_wire({"w": b})["w"], g.shape, np.float32), g)
        assert b["kind"] == "none"
        np.testing.assert_array_equal(b["data"], a["data"])
    assert top.bytes_sent == none.bytes_sent == top.bytes_raw
    assert top.residual_norm() == 0.0


def test_topk_above_half_goes_dense_with_the_same_decoded_gradient():
    rng = np.random.default_rng(4)
    dense, sparse = make_codec("topk:0.75"), make_codec("topk:0.25")
    for _ in range(4):
        g = rng.standard_normal(1000).astype(np.float32)
        want = np.zeros_like(g)
        r = dense.residual.get("w", np.zeros_like(g)) + g
        top = np.argsort(-np.abs(r))[:750]
        want[top] = r[top]
        p = dense.encode("w", g)
        assert p["kind"] == "none"
        np.testing.assert_array_equal(decode(_wire({"w": p})["w"], g.shape, np.float32), want)
        np.testing.assert_allclose(dense.residual["w"] + want, r)
        assert sparse.encode("w", g)["kind"] == "topk"
    assert dense.bytes_sent == dense.bytes_raw  # (sparse: 750 x 8 bytes against 1000 x 4)
