"""The gemm jitted kernels call: numpy's OpenBLAS where its wheel ships one, else SciPy's."""

import os
import subprocess
import sys

import numpy as np
import pytest

from graphflow.ops import blas

CHECK = """
import numpy as np
from graphflow.ops import blas
from graphflow.ops.matmul import matmul_kernel
rng = np.random.default_rng(0)
worst = 0.0
for dtype in (np.float32, np.float64):
    for ta in (False, True):
        for tb in (False, True):
            m, n, k = 37, 53, 29
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            c0 = rng.standard_normal((m, n)).astype(dtype)
            c = c0.copy()
            matmul_kernel(a.reshape(-1), a.shape[1], b.reshape(-1), b.shape[1], c.reshape(-1),
                          n, m, n, k, ta, tb, 0.5)
            want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b) + 0.5 * c0
            worst = max(worst, float(np.abs(c - want).max() / np.abs(want).max()))
print(blas.BLAS, worst)
"""


def _run(env_value: str | None) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "GRAPHFLOW_NUMPY_BLAS"}
    if env_value is not None:
        env["GRAPHFLOW_NUMPY_BLAS"] = env_value
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    return out[0], float(out[1])


def test_numpys_openblas_is_found_in_its_wheel():
    if blas._numpy_openblas() is None:
        pytest.skip("this numpy ships no OpenBLAS with 64-bit CBLAS (not a PyPI wheel)")
    assert os.environ.get("GRAPHFLOW_NUMPY_BLAS") == "0" or blas.BLAS == "numpy"


@pytest.mark.parametrize("setting", [None, "0"])
def test_either_blas_computes_every_transpose_and_beta(setting):
    """Kernels compiled (and cached) against one binding run against the other: they name
    only the symbol, which each process points at its BLAS on import."""
    which, worst = _run(setting)
    assert which == ("scipy" if setting == "0" or blas._numpy_openblas() is None else "numpy")
    assert worst < 1e-6


def test_gemm_outside_a_kernel_says_where_it_runs():
    with pytest.raises(TypeError, match="inside @njit kernels"):
        blas.gemm(blas.NT, blas.NT, 1, 1, 1, np.ones(1), 1, np.ones(1), 1, np.zeros(1),
                  np.ones(1), 1)


def test_calibrations_are_kept_apart_by_the_blas(monkeypatch):
    """Kernel times taken with one BLAS do not steer plans run with the other."""
    from graphflow import timing

    now = timing.fingerprint()
    monkeypatch.setattr(blas, "BLAS", "scipy" if blas.BLAS == "numpy" else "numpy")
    assert timing.fingerprint() != now
