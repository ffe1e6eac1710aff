"""Shared fixtures: the suite's own kernel-time cache (and one with no kernel timed), the gemm
kernels' AVX-512 rules on any CPU (`wide_vectors`) and the command run in this process
(`cli_here`); the kernels compiled beside a whole suite's run, kernel tests first.

The suite's kernel-time cache is its own, empty at the start: plans and predictions that read
the machine's cache (~/.cache/graphflow, which every benchmark run rewrites) came out
differently after a run of `graphflow bench speedup` (the spatial rows of lc-large, then
which reductions a worker recomputes). Worker processes the tests start inherit it."""

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# On a clean checkout Numba compiles every kernel once (190 s of a 630 s suite here). Modules
# whose tests run the kernels in this process come first, and a process of the lowest priority
# compiles them beside the tests (tests/warm_kernels.py) on the core they leave idle: worker
# processes then load them from the cache, where two of them had compiled one at once.
KERNELS_FIRST = ("test_ops.py", "test_layers.py", "test_models.py", "test_gradients_again.py",
                 "test_model_parallel.py")
WARM_FROM = 200  # tests in the session (fewer: a run of some files, too short to gain)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(KERNELS_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: else as found)


@pytest.fixture(autouse=True, scope="session")
def kernels_compiled_beside(request: pytest.FixtureRequest, own_kernel_cache: Path
                            ) -> Iterator[None]:
    if len(request.session.items) < WARM_FROM:
        yield
        return
    root = Path(__file__).resolve().parent.parent
    warm = subprocess.Popen([sys.executable, "-m", "tests.warm_kernels"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield
    warm.kill()
    warm.wait()


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
def no_kernels_timed(own_kernel_cache: Path, tmp_path: Path) -> Path:
    """A kernel-time cache of this test: the suite's with no kernel timed, its link kept (a
    test of timing the kernels it lacks need not time messages for 15 s again)."""
    from graphflow.timing import read_cache, write_cache

    path = tmp_path / "no-kernels.json"
    entries = read_cache(own_kernel_cache)
    if entries:
        write_cache(path, {fp: {**e, "measured": {}} for fp, e in entries.items()})
    return path


@pytest.fixture
def wide_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gemm kernels' rules for AVX-512 CPUs, here and in worker processes started here:
    tests of the kernels' dispatch must take their paths on any CPU (ops/simd.py)."""
    from graphflow.ops import simd

    monkeypatch.setattr(simd, "WIDE", True)
    monkeypatch.setenv("GRAPHFLOW_WIDE_VECTORS", "1")


@pytest.fixture
def cli_here(monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """`graphflow ARGS` run by `cli.main` in this process (no interpreter to start: argparse's
    checks), as (exit code, stdout, stderr)."""
    from graphflow import cli

    monkeypatch.setattr(cli, "keep_freed_memory", lambda: None)  # (this process's malloc)

    def call(*args: object) -> tuple[int, str, str]:
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 2
        out, err = capsys.readouterr()
        return code, out, err
    return call
