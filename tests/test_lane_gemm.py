"""ops/lane_gemm.py: a @ b.T for a few rows of a, the rows in a vector's lanes."""

import numpy as np
import pytest

from graphflow.ops.lane_gemm import MAX_ROWS, matmul_nt_lanes
from graphflow.ops.matmul import matmul_into


# rows: one vector (1-16), two (17-32), three padded to four (33-48), four (49-64), and passes
# of 64 rows over b with a short one after;
# b rows: whole tiles of 8 or 4 and the rows short of one; k: not a whole number of vectors
@pytest.mark.parametrize("m", [1, 3, 16, 17, 32, 33, 48, 63, MAX_ROWS, 2 * MAX_ROWS + 5])
@pytest.mark.parametrize("n", [8, 13, 70])
def test_matches_float64_reference(m, n):
    rng = np.random.default_rng(m * 100 + n)
    a = rng.standard_normal((m, 301)).astype(np.float32)
    b = rng.standard_normal((n, 301)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    matmul_nt_lanes(a, b, out)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


def test_a_micro_batchs_rows_come_out_as_in_the_whole_batch():
    # each output is one sum down k in the same order at any row count: pipelined and whole
    # batch steps agree bit for bit on dx = dy @ w.T
    rng = np.random.default_rng(7)
    dy = rng.standard_normal((64, 520)).astype(np.float32)
    w = rng.standard_normal((100, 520)).astype(np.float32)
    whole = np.empty((64, 100), np.float32)
    matmul_nt_lanes(dy, w, whole)
    for lo, hi in [(0, 16), (16, 40), (40, 64), (60, 61)]:
        part = np.empty((hi - lo, 100), np.float32)
        matmul_nt_lanes(dy[lo:hi].copy(), w, part)
        assert (part == whole[lo:hi]).all(), (lo, hi)


def test_nan_and_inf_keep_their_meaning():
    a = np.ones((5, 256), np.float32)
    b = np.ones((64, 256), np.float32)
    a[1, 7], a[3, 0] = np.nan, np.inf
    out = np.empty((5, 64), np.float32)
    matmul_nt_lanes(a, b, out)
    assert np.isnan(out[1]).all() and np.isposinf(out[3]).all()
    assert (out[[0, 2, 4]] == 256).all()


def test_matmul_into_takes_it_for_float32_and_accumulates_through_it():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((24, 512)).astype(np.float32)
    b = rng.standard_normal((130, 512)).astype(np.float32)
    start = rng.standard_normal((24, 130)).astype(np.float32)
    out = start.copy()
    matmul_into(a, b, out, transpose_b=True, accumulate=True)
    want = start + a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
