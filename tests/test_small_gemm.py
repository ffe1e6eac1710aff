"""ops/small_gemm.py: a few rows of a @ b.T as tiled dot products, in place of BLAS."""

import numpy as np
import pytest

import graphflow as gf
import graphflow.ops.matmul as matmul_mod
from graphflow.ops.lane_gemm import matmul_nt_lanes
from graphflow.ops.matmul import matmul, matmul_into
from graphflow.ops.reduce import reduce_sum
from graphflow.ops.small_gemm import (
    AHEAD,
    BLOCK_ROWS,
    CHUNK_COLS,
    KEEP_ROWS,
    PANEL,
    _later_panel,
    copies,
    matmul_nn,
    matmul_nn_copied,
    matmul_nt,
    wins,
)

pytestmark = pytest.mark.usefixtures("wide_vectors")  # (their paths on any CPU)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, 3, 4, 6, 17])
@pytest.mark.parametrize("n", [64, 66, 71])
def test_matches_float64_reference_with_any_remainder(dtype, m, n):
    rng = np.random.default_rng(m * 100 + n)
    a = rng.standard_normal((m, 300)).astype(dtype)
    b = rng.standard_normal((n, 300)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    matmul_nt(a, b, out, dtype(0))
    want = a.astype(np.float64) @ b.astype(np.float64).T
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("kernel", [matmul_nn, matmul_nn_copied])
@pytest.mark.parametrize("m", [1, 3, 4, 6, 17, KEEP_ROWS + 3])
@pytest.mark.parametrize("n", [64, 130, 200])
def test_nn_matches_float64_reference_and_leaves_the_last_partial_panel(kernel, m, n):
    rng = np.random.default_rng(m * 100 + n)
    a = rng.standard_normal((m, 300)).astype(np.float32)
    b = rng.standard_normal((300, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    done = kernel(a, b, out)
    assert done == n - n % PANEL
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out[:, :done], want[:, :done], rtol=1e-6,
                               atol=1e-6 * np.abs(want).max())
    assert np.isnan(out[:, done:]).all()  # untouched: matmul_into's BLAS call does these


@pytest.mark.parametrize("kernel", [matmul_nn, matmul_nn_copied])
def test_nn_blocks_of_b_add_up(kernel):
    # b passes in blocks of BLOCK_ROWS rows by CHUNK_COLS columns: here 2 whole row blocks and
    # a partial one, 2 whole column chunks and one of a single panel, and 6 rows of a (4 + 2)
    rows, cols = 2 * BLOCK_ROWS + 44, 2 * CHUNK_COLS + PANEL
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, rows)), rng.standard_normal((rows, cols))
    out = np.empty((6, cols), np.float32)
    assert kernel(a.astype(np.float32), b.astype(np.float32), out) == cols
    want = a @ b
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("k, c", [(2 * BLOCK_ROWS + 44, 2 * CHUNK_COLS + PANEL),
                                  (BLOCK_ROWS, 3 * PANEL), (7, PANEL)])
def test_nn_prefetches_the_panel_it_takes_ahead_later(k, c):
    # matmul_nn's visiting order of b's panels, written out: (chunk, row block, panel)
    order = [(j0, k0, j) for j0 in range(0, c, CHUNK_COLS) for k0 in range(0, k, BLOCK_ROWS)
             for j in range(j0, min(c, j0 + CHUNK_COLS), PANEL)]
    for t, (j0, k0, j) in enumerate(order):
        later = order[t + AHEAD] if t + AHEAD < len(order) else (j0, k0, j)  # the last: itself
        assert _later_panel(j0, k0, j, c, k) == later[1:], (t, j0, k0, j)


@pytest.mark.parametrize("kernel", ["nt", "nn"])
def test_nan_and_inf_keep_their_meaning(kernel):
    a = np.ones((5, 256), np.float32)
    b = np.ones((64, 256), np.float32)
    a[1, 7], a[3, 0] = np.nan, np.inf
    out = np.empty((5, 64), np.float32)
    if kernel == "nt":
        matmul_nt(a, b, out, np.float32(0))
    else:
        matmul_nn(a, b.T.copy(), out)
    assert np.isnan(out[1]).all() and np.isposinf(out[3]).all()
    assert (out[[0, 2, 4]] == 256).all()


def test_wins_only_for_few_rows_against_a_wide_deep_b():
    assert wins(16, 2560, 2560) and wins(64, 64, 256)
    assert not wins(65, 2560, 2560)   # BLAS's packing pays off from here
    assert not wins(16, 10, 2560)     # a 10-way classifier's output
    assert not wins(16, 2560, 64)     # short dot products


def test_matmul_into_sends_small_products_here_and_the_rest_to_blas(monkeypatch):
    calls = []

    def spy(kernel, name):
        def call(*args):
            calls.append((name, args[2].shape, args[2].dtype.name))
            return kernel(*args)
        return call
    monkeypatch.setattr(matmul_mod, "matmul_nt", spy(matmul_nt, "nt"))
    monkeypatch.setattr(matmul_mod, "matmul_nt_lanes", spy(matmul_nt_lanes, "nt lanes"))
    monkeypatch.setattr(matmul_mod, "matmul_nn", spy(matmul_nn, "nn"))
    rng = np.random.default_rng(0)
    a, b, big = (rng.standard_normal(s) for s in [(8, 512), (130, 512), (128, 512)])
    for dtype in (np.float64, np.float32):
        a, b, big = a.astype(dtype), b.astype(dtype), big.astype(dtype)
        tol = 1e-12 if dtype == np.float64 else 1e-4
        for got, want in [
                (matmul_into(a, b, np.empty((8, 130), dtype), transpose_b=True), a @ b.T),
                (matmul_into(big, b, np.empty((128, 130), dtype), transpose_b=True), big @ b.T),
                (matmul_into(a, b.T.copy(), np.empty((8, 130), dtype)), a @ b.T),
                (matmul_into(big, b.T.copy(), np.empty((128, 130), dtype)), big @ b.T)]:
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    # a @ b.T of either dtype, float32 with the rows in lanes; a @ b in float32 only, its
    # last 2 columns with BLAS
    assert calls == [("nt", (8, 130), "float64"), ("nt lanes", (8, 130), "float32"),
                     ("nn", (8, 130), "float32")]


def test_a_panel_is_copied_only_for_many_rows_against_rows_a_multiple_of_4_kb_apart(
        monkeypatch):
    assert copies(KEEP_ROWS, 8192) and copies(KEEP_ROWS, 1024)
    assert not copies(KEEP_ROWS - 1, 8192) and not copies(KEEP_ROWS, 2560)
    used = []
    monkeypatch.setattr(matmul_mod, "matmul_nn_copied",
                        lambda *args: used.append("copied") or matmul_nn_copied(*args))
    monkeypatch.setattr(matmul_mod, "matmul_nn",
                        lambda *args: used.append("nn") or matmul_nn(*args))
    rng = np.random.default_rng(1)
    for n in (1024, 1000):
        a = rng.standard_normal((KEEP_ROWS, 512)).astype(np.float32)
        b = rng.standard_normal((512, n)).astype(np.float32)
        got = matmul_into(a, b, np.empty((KEEP_ROWS, n), np.float32))
        want = a.astype(np.float64) @ b
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert used == ["copied", "nn"]


def test_the_vector_intrinsics_take_only_flat_float32_arrays():
    from numba import njit
    from numba.core.errors import TypingError

    from graphflow.ops.simd import vload

    @njit
    def first16(x):
        return vload(x, 0)
    with pytest.raises(TypingError, match="contiguous 1-D float32"):
        first16(np.zeros(16))


def test_a_dense_layers_input_gradient_through_it_matches_finite_differences():
    # dx = dy @ w.T has 6 rows against a 70 x 260 weight: the small-gemm path
    rng = np.random.default_rng(2)
    x0, w0, r = rng.standard_normal((6, 70)), rng.standard_normal((70, 260)), \
        rng.standard_normal((6, 260))
    with gf.Graph(dtype="float64") as g:
        x = gf.placeholder("x", (6, 70), "float64")
        w = gf.parameter("w", (70, 260))
        loss = reduce_sum(gf.mul(matmul(x, w), gf.constant(r)))
        dx = gf.gradients(loss, [x])["x"]
    assert wins(6, 70, 260)
    sess = gf.Session(g, params={"w": w0})
    analytic = sess.run(dx, {x: x0})
    numeric = np.zeros_like(x0)
    eps = 1e-6
    for idx in np.ndindex(x0.shape):
        up, down = x0.copy(), x0.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (sess.run(loss, {x: up}) - sess.run(loss, {x: down})) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,k,n", [(8, 300, 128), (200, 40, 70), (3, 0, 5)])
def test_matmul_into_accumulates_on_every_path(ta, tb, m, k, n):
    """out += op(a) @ op(b): BLAS with beta = 1, and the few-rows kernels (which overwrite
    their out) through a temporary; an empty inner dimension adds nothing."""
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    start = rng.standard_normal((m, n)).astype(np.float32)
    out = start.copy()
    assert matmul_into(a, b, out, ta, tb, accumulate=True) is out
    op = lambda x, t: x.T if t else x  # noqa: E731
    want = start + op(a, ta).astype(np.float64) @ op(b, tb).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_into_writes_blas_products_in_place_for_either_transpose(ta, tb, dtype):
    """Products BLAS takes whole land in the caller's out, read through the transposes."""
    rng = np.random.default_rng(7)
    m, k, n = 200, 40, 70  # many rows: no few-rows kernel takes it
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    assert matmul_into(a, b, out, ta, tb) is out
    op = lambda x, t: x.T if t else x  # noqa: E731
    want = op(a, ta).astype(np.float64) @ op(b, tb).astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())
