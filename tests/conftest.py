"""Shared fixtures: the suite's own kernel-time cache (and one with no kernel timed), the gemm
kernels' AVX-512 rules on any CPU (`wide_vectors`) and the command run in this process
(`cli_here`); kernel tests first; under pytest-xdist, tests marked `alone` with no other test
beside them.

The suite's kernel-time cache is its own (one for all its test processes), empty at the
start: plans and predictions that read the machine's cache (~/.cache/graphflow, which every
benchmark run rewrites) came out differently after a run of `graphflow bench speedup` (the
spatial rows of lc-large, then which reductions a worker recomputes). Worker processes the
tests start inherit it."""

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# On a clean checkout Numba compiles every kernel once (190 s of a 630 s serial suite here).
# Modules whose tests run the kernels in the test process come first: under xdist they are
# spread over the test processes and compile side by side, and worker processes started later
# load the kernels from the cache instead of two of them compiling one at once.
KERNELS_FIRST = ("test_ops.py", "test_layers.py", "test_models.py", "test_gradients_again.py",
                 "test_model_parallel.py")
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under pytest -n


def pytest_xdist_auto_num_workers() -> int:
    """`-n auto`: a test process a core, up to 4 (tests start clusters of up to 4 worker
    processes of their own)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 4))


@pytest.fixture(autouse=True)
def cores_shared(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked `alone` runs while no other test process runs one: its checks time
    something against the machine (a trace's spans against the step's time) or read what
    every process shares (the files in /dev/shm)."""
    if XDIST_WORKER is None:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with _holding_the_cores(tmp_path_factory.getbasetemp().parent, alone):
        yield


@contextmanager
def _holding_the_cores(shared: Path, alone: bool) -> Iterator[None]:
    """A readers-writer lock between the test processes (files in their shared temp folder):
    tests hold it shared, `alone` tests exclusively. Each passes a turnstile first, so a test
    waiting to run alone goes next instead of waiting for a moment when nothing runs."""
    with open(shared / "turnstile.lock", "a") as turnstile, \
            open(shared / "cores.lock", "a") as cores:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(cores, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # (closing the files lets go)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(KERNELS_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: else as found)


@pytest.fixture(autouse=True, scope="session")
def own_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # (one for all test processes under xdist: a link or a kernel timed by one serves all)
    folder = tmp_path_factory.getbasetemp().parent if XDIST_WORKER else \
        tmp_path_factory.mktemp("costmodel")
    path = folder / "costmodel.json"
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
