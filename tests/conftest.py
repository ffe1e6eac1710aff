"""The suite's kernel-time cache is its own, empty at the start: plans and predictions that read
the machine's cache (~/.cache/graphflow, which every benchmark run rewrites) came out
differently after a run of `graphflow bench speedup` (the spatial rows of lc-large, then
which reductions a worker recomputes). Worker processes the tests start inherit it."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def own_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("costmodel") / "costmodel.json"
    before = os.environ.get("GRAPHFLOW_COSTMODEL")
    os.environ["GRAPHFLOW_COSTMODEL"] = str(path)
    yield path
    if before is None:
        del os.environ["GRAPHFLOW_COSTMODEL"]
    else:
        os.environ["GRAPHFLOW_COSTMODEL"] = before


@pytest.fixture
def wide_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gemm kernels' rules for AVX-512 CPUs, here and in worker processes started here:
    tests of the kernels' dispatch must take their paths on any CPU (ops/simd.py)."""
    from graphflow.ops import simd

    monkeypatch.setattr(simd, "WIDE", True)
    monkeypatch.setenv("GRAPHFLOW_WIDE_VECTORS", "1")
