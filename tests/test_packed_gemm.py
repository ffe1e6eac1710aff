"""ops/packed_gemm.py: the forward's x @ w against a packed copy of w, and the worker packing
its weights while it waits."""

import json

import numpy as np
import pytest

import graphflow as gf
from graphflow.models import Model
from graphflow.ops.packed_gemm import PackedWeights, matmul_nn_packed, pack_chunk
from graphflow.ops.small_gemm import BLOCK_ROWS, CHUNK_COLS, PANEL, matmul_nn, matmul_nn_copied
from graphflow.partitioners import partition
from graphflow.runtime import Cluster
from graphflow.trace import recording
from graphflow.trace.chrome import events

pytestmark = pytest.mark.usefixtures("wide_vectors")  # (their paths on any CPU)

# two whole row blocks and a partial one; two whole column chunks, a short one and a partial
# panel (left to BLAS); rows in blocks of 4 and the rest one at a time
K, N = 2 * BLOCK_ROWS + 44, 2 * CHUNK_COLS + 3 * PANEL + 5


def packed_copy(w):
    out = np.empty(w.shape[0] * (w.shape[1] - w.shape[1] % PANEL), np.float32)
    for j0 in range(0, w.shape[1] - w.shape[1] % PANEL, CHUNK_COLS):
        pack_chunk(w, out, j0)
    return out


@pytest.mark.parametrize("m", [1, 4, 7, 16, 33, 64])
def test_the_packed_product_is_matmul_nns_bit_for_bit(m):
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    want, got = np.full((m, N), np.nan, np.float32), np.full((m, N), np.nan, np.float32)
    done = matmul_nn(x, w, want)
    assert matmul_nn_packed(x, packed_copy(w), got) == done == N - N % PANEL
    assert (got[:, :done] == want[:, :done]).all()
    copied = np.full((m, N), np.nan, np.float32)  # a panel at a time, the same sums
    assert matmul_nn_copied(x, w, copied) == done and (copied[:, :done] == want[:, :done]).all()
    assert np.isnan(got[:, done:]).all()  # the last partial panel: matmul_into's BLAS call


def forward_of(pw, x, w):
    out = np.full((len(x), w.shape[1]), np.nan, np.float32)
    return pw.forward(x, w, out), out


def test_weights_are_packed_a_chunk_at_a_time_and_used_once_whole():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)).astype(np.float32)
    x = rng.standard_normal((2, K)).astype(np.float32)
    want = np.empty((2, N), np.float32)
    c = matmul_nn(x, w, want)
    pw = PackedWeights({"w": w})
    pw.begin_step({"w": w}, forwards=4)
    assert forward_of(pw, x, w)[0] is None  # stale: the caller runs matmul_nn
    chunks = 0
    while pw.pack_next():
        chunks += 1
        if chunks == 1:
            assert forward_of(pw, x, w)[0] is None  # half packed is not packed
    assert chunks == 3 and pw.chunks_packed == 3 and not pw.pending()
    done, got = forward_of(pw, x, w)
    assert done == c and (got[:, :c] == want[:, :c]).all()
    assert forward_of(pw, x, np.array(w))[0] is None  # another array, though equal


def test_a_weight_whose_forwards_have_all_run_is_not_packed():
    w = np.ones((256, 64), np.float32)
    pw = PackedWeights({"w": w})
    pw.begin_step({"w": w}, forwards=1)
    assert pw.pending()
    forward_of(pw, np.ones((1, 256), np.float32), w)  # the step's one forward, unpacked
    assert not pw.pending() and not pw.pack_next()
    pw.begin_step({"w": w}, forwards=0)  # (rows beyond small_gemm's: BLAS runs the forwards)
    assert not pw.pending()


def three_dense_layers():
    with gf.Graph("float32", seed=0) as g:
        x = gf.placeholder("x", (None, 300))
        y = gf.placeholder("y", (None,), "int32")
        h = gf.sigmoid(gf.layers.dense(x, 1200, name="fc1"))
        h = gf.sigmoid(gf.layers.dense(h, 1200, name="fc2"))
        logits = gf.layers.dense(h, 512, name="out")
        loss = gf.softmax_cross_entropy(logits, y)
    return Model("dense3", g, x, y, logits, loss)


def test_a_later_stage_packs_while_it_waits_and_computes_the_same(tmp_path):
    model = three_dense_layers()
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    assert plan.placement["out/W"] == 1
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((32, 300)).astype(np.float32),
             "y": rng.integers(0, 512, 32).astype(np.int32)}
    path = tmp_path / "run.json"
    with Cluster(plan, mode="threads", optimizer={"name": "sgd", "lr": 0.1}, microbatches=2,
                 timeout=60) as cluster:
        cluster.step(batch)
        with recording(path):
            losses = [float(cluster.step(batch)[plan.loss]) for _ in range(2)]
        params = cluster.params()
    packs = [e for e in events(json.loads(path.read_text())) if e.name == "pack weights"]
    assert packs and {e.process for e in packs} == {"worker 1"}
    trainer = gf.Trainer(three_dense_layers(), gf.optim.SGD(0.1))  # one process, unpacked
    want = [trainer.step(batch["x"], batch["y"]) for _ in range(3)]
    np.testing.assert_allclose(losses, want[1:], rtol=1e-5)
    for name, value in params.items():
        np.testing.assert_allclose(value, trainer.session.params[name], rtol=0, atol=1e-5,
                                   err_msg=name)
