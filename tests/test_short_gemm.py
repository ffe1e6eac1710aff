"""ops/short_gemm.py: a.T @ b over a few rows (a weight's gradient), each out tile written once."""

import numpy as np
import pytest

import graphflow as gf
import graphflow.ops.matmul as matmul_mod
from graphflow.ops.matmul import matmul_into
from graphflow.ops.short_gemm import CHUNK_BYTES, PANEL, matmul_tn, wins

pytestmark = pytest.mark.usefixtures("wide_vectors")  # (their paths on any CPU)


def _reference(a, b):
    return a.astype(np.float64).T @ b.astype(np.float64)


@pytest.mark.parametrize("k", [1, 16, 37])
@pytest.mark.parametrize("m", [4, 6, 17])
@pytest.mark.parametrize("n", [64, 130, 200])
def test_matches_float64_reference_and_leaves_the_last_partial_panel(k, m, n):
    rng = np.random.default_rng(k * 1000 + m * 10 + n)
    a = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    done = matmul_tn(a, b, out, False)
    assert done == n - n % PANEL
    want = _reference(a, b)
    np.testing.assert_allclose(out[:, :done], want[:, :done], rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
    assert np.isnan(out[:, done:]).all()  # untouched: matmul_into's BLAS call does these


def test_chunks_of_b_add_up_and_accumulate_adds():
    # 256 rows: b goes in chunks of CHUNK_BYTES / (4 * 256) columns, here 3 whole and a panel
    k = 256
    chunk = CHUNK_BYTES // (4 * k)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((k, 10)).astype(np.float32)
    b = rng.standard_normal((k, 3 * chunk + PANEL)).astype(np.float32)
    start = rng.standard_normal((10, b.shape[1])).astype(np.float32)
    out = start.copy()
    assert matmul_tn(a, b, out, True) == b.shape[1]
    want = start + _reference(a, b)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    assert matmul_tn(a, b, out, False) == b.shape[1]  # overwrites: start is gone
    np.testing.assert_allclose(out, want - start, rtol=1e-5, atol=1e-4)


def test_nan_and_inf_keep_their_meaning_and_an_overwritten_nan_is_gone():
    a = np.ones((16, 6), np.float32)
    b = np.ones((16, 64), np.float32)
    a[7, 1], a[0, 3] = np.nan, np.inf
    out = np.full((6, 64), np.nan, np.float32)  # not read without accumulate
    matmul_tn(a, b, out, False)
    assert np.isnan(out[1]).all() and np.isposinf(out[3]).all()
    assert (out[[0, 2, 4, 5]] == 16).all()
    out[0, 5] = np.nan
    matmul_tn(a, b, out, True)
    assert np.isnan(out[0, 5]) and out[0, 4] == 32


def test_wins_only_for_a_short_inner_dimension():
    assert wins(2560, 2560, 16) and wins(2560, 8192, 64) and wins(440, 2560, 256)
    assert not wins(2560, 2560, 257)  # BLAS's blocking pays off from here on
    assert not wins(2560, 10, 64)     # a 10-way classifier's weight: BLAS
    assert not wins(3, 2560, 64)      # not one whole row block
    assert not wins(64, 64, 0)


def test_matmul_into_sends_weight_gradients_here_and_the_rest_to_blas(monkeypatch):
    calls = []

    def spy(*args):
        calls.append((args[2].shape, args[3]))
        return matmul_tn(*args)
    monkeypatch.setattr(matmul_mod, "matmul_tn", spy)
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((16, 40)), rng.standard_normal((16, 70))
    for dtype in (np.float64, np.float32):
        a, b = x.astype(dtype), dy.astype(dtype)
        start = rng.standard_normal((40, 70)).astype(dtype)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        got = matmul_into(a, b, np.full((40, 70), np.nan, dtype), transpose_a=True)
        np.testing.assert_allclose(got, _reference(a, b), rtol=tol, atol=tol)
        got = matmul_into(a, b, start.copy(), transpose_a=True, accumulate=True)
        np.testing.assert_allclose(got, start + _reference(a, b), rtol=tol, atol=tol)
    # float32 only (its vectors' type); the 6 columns past the last panel with BLAS
    assert calls == [((40, 70), False), ((40, 70), True)]


def test_a_dense_layers_weight_gradient_through_it_matches_float64():
    rng = np.random.default_rng(4)
    x0, w0, r = (rng.standard_normal(s) for s in [(16, 300), (300, 130), (16, 130)])
    grads = {}
    for dtype in ("float32", "float64"):
        with gf.Graph(dtype=dtype) as g:
            x = gf.placeholder("x", (16, 300), dtype)
            w = gf.parameter("w", (300, 130))
            loss = gf.reduce_sum(gf.mul(gf.matmul(x, w), gf.constant(r.astype(dtype))))
            dw = gf.gradients(loss, [w])["w"]
        grads[dtype] = gf.Session(g, params={"w": w0.astype(dtype)}).run(dw, {x: x0})
    assert wins(300, 130, 16)
    np.testing.assert_allclose(grads["float32"], x0.T @ r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["float64"], x0.T @ r, rtol=1e-12, atol=1e-12)
