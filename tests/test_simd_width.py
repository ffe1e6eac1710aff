"""ops/simd.py's WIDE: without AVX-512 the gemm kernels' tiles spill, and BLAS takes every
product but a weight gradient over a few rows (the rules' figures were measured on an AVX2-only
znver3, against numpy's OpenBLAS)."""

import os
import subprocess
import sys

import pytest

from graphflow.ops import lane_gemm, short_gemm, simd, small_gemm


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simd, "WIDE", False)


def test_the_forward_kernel_leaves_every_row_to_blas(narrow):
    assert small_gemm.row_limit() == small_gemm.NARROW_ROWS == 0
    assert not small_gemm.wins(4, 2560, 2560) and not small_gemm.wins(8, 2560, 2560)
    assert not small_gemm.wins(0, 2560, 2560)  # (asked with the row limit: packs nothing)


def test_the_input_gradient_kernel_leaves_every_row_to_blas(narrow):
    assert not lane_gemm.wins(4, 2560, 2560) and not lane_gemm.wins(16, 2560, 2560)
    assert not lane_gemm.wins(64, 8192, 2560)


def test_the_weight_gradient_kernel_takes_a_few_rows_into_a_large_out(narrow):
    assert short_gemm.wins(2560, 2560, 8) and short_gemm.wins(2560, 8192, 4)
    assert not short_gemm.wins(2560, 2560, 16) and not short_gemm.wins(2560, 2560, 64)
    assert not short_gemm.wins(440, 2560, 8)  # 1.1M elements of out: BLAS


def test_wide_rules_keep_64_rows(monkeypatch):
    monkeypatch.setattr(simd, "WIDE", True)
    assert small_gemm.row_limit() == small_gemm.MAX_ROWS
    assert small_gemm.wins(64, 2560, 2560) and lane_gemm.wins(64, 2560, 2560)
    assert short_gemm.wins(2560, 2560, 64) and short_gemm.wins(440, 2560, 8)


@pytest.mark.parametrize("forced", ["0", "1"])
def test_the_environment_overrides_the_cpu(forced):
    env = {**os.environ, "GRAPHFLOW_WIDE_VECTORS": forced}
    out = subprocess.run([sys.executable, "-c", "from graphflow.ops import simd; print(simd.WIDE)"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == str(forced == "1")


def test_without_an_override_it_asks_the_cpu_numba_compiles_for():
    from numba.core.codegen import get_host_cpu_features

    env = {k: v for k, v in os.environ.items() if k != "GRAPHFLOW_WIDE_VECTORS"}
    out = subprocess.run([sys.executable, "-c", "from graphflow.ops import simd; print(simd.WIDE)"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == str("+avx512f" in get_host_cpu_features().split(","))
