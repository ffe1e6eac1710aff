"""Ring and tree allreduce over real Endpoints: results, step separation, missing ranks, bytes,
and ranks in separate processes over ipc."""

import multiprocessing
import random
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from graphflow.replicas.allreduce import AllReduce, LocalGroup, bench_allreduce, rank_name
from graphflow.transport.endpoint import Endpoint, PeerTimeout
from graphflow.transport.frames import FrameError

ALGS = ["ring", "tree"]


def _inputs(rank, step, n, seed=0):
    """Positive values (no cancellation), so float32 sums stay within a few ulps."""
    rng = np.random.default_rng([seed, rank, step])
    return {"w": rng.uniform(1, 2, n).astype(np.float32),
            "b": rng.uniform(1, 2, (3, 2)).astype(np.float32),
            "s": np.float32(rng.uniform(1, 2))}


def _check(outs, inputs, average=True):
    for name in inputs[0]:
        want = np.sum([np.float64(x[name]) for x in inputs], axis=0)
        want = want / len(inputs) if average else want
        for out in outs:
            assert out[name].shape == np.shape(want) and out[name].dtype == np.float32
            np.testing.assert_allclose(out[name], want, rtol=1e-6)
            np.testing.assert_array_equal(out[name], outs[0][name])  # identical on every rank


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_mean_on_every_rank(size, algorithm):
    # totals n + 7 elements: below R, not divisible by R, and large enough to go zero-copy
    with LocalGroup(size, algorithm, timeout=10) as group:
        for step, n in enumerate([0, 1, 2, 10, 30_001]):
            inputs = [_inputs(r, step, n) for r in range(size)]
            _check(group.allreduce(inputs, step), inputs)
        inputs = [_inputs(r, 9, 5) for r in range(size)]
        _check(group.allreduce(inputs, 9, average=False), inputs, average=False)


def test_names_in_any_order_and_dtypes_kept():
    a = {"x": np.ones(5, np.float32), "y": np.full((2, 2), 2.0)}
    b = {"y": np.zeros((2, 2)), "x": np.zeros(5, np.float32)}  # other insertion order
    with LocalGroup(2, "ring") as group:
        outs = group.allreduce([a, b], step=0)
    for out in outs:
        assert out["x"].dtype == np.float32 and out["y"].dtype == np.float64
        np.testing.assert_array_equal(out["x"], np.full(5, 0.5, np.float32))
        np.testing.assert_array_equal(out["y"], np.ones((2, 2)))
    assert not np.shares_memory(outs[0]["x"], a["x"])


@pytest.mark.parametrize("algorithm", ALGS)
def test_consecutive_steps_do_not_mix(algorithm):
    """Each rank runs its steps back to back at its own pace: fast ranks send the next step's
    tensors while slow ones are still on the previous step."""
    steps, size, n = 6, 4, 50_000

    def run(ar):
        pace = random.Random(ar.rank)
        outs = []
        for step in range(steps):
            time.sleep(pace.uniform(0, 0.01) * (ar.rank == 2))
            outs.append(ar.allreduce(_inputs(ar.rank, step, n), step))
        return outs

    with LocalGroup(size, algorithm, timeout=10) as group:
        per_rank = group.run(run)
    for step in range(steps):
        _check([outs[step] for outs in per_rank], [_inputs(r, step, n) for r in range(size)])


@pytest.mark.parametrize("algorithm", ALGS)
def test_a_failed_step_leaves_nothing_for_the_next(algorithm):
    """Step 1 runs without rank 1 and times out, leaving step-1 tensors unread in the inboxes;
    step 2 must not take them for its own."""
    n = 30_001
    with LocalGroup(3, algorithm, timeout=0.5) as group:
        group.allreduce([_inputs(r, 0, n) for r in range(3)], step=0)
        with pytest.raises(PeerTimeout):
            group.run(lambda ar: ar.allreduce(_inputs(ar.rank, 1, n), 1), ranks=[0, 2])
        inputs = [_inputs(r, 2, n) for r in range(3)]
        _check(group.allreduce(inputs, step=2), inputs)


def test_ranks_on_different_steps_time_out():
    with LocalGroup(2, "ring", timeout=0.5) as group:
        start = time.monotonic()
        with pytest.raises(PeerTimeout, match="ar/[34]/rs/0") as err:
            group.run(lambda ar: ar.allreduce({"g": np.ones(4)}, step=3 + ar.rank))
        assert time.monotonic() - start < 3
    assert err.value.peer in ("rank0", "rank1")


def _partial_group(size, absent, algorithm, timeout, tmp_path):
    """Endpoints for all ranks but `absent`, whose address nobody binds."""
    peers = {r: f"ipc://{tmp_path}/r{r}" for r in range(size)}
    eps = {r: Endpoint(rank_name(r), peers[r], timeout=timeout)
           for r in range(size) if r != absent}
    return [AllReduce(r, size, ep, peers, algorithm, timeout) for r, ep in eps.items()]


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("absent", [0, 2])
def test_rank_that_never_joins_is_named(algorithm, absent, tmp_path):
    ranks = _partial_group(3, absent, algorithm, 1.0, tmp_path)
    start = time.monotonic()
    with ThreadPoolExecutor(len(ranks)) as pool:
        futures = [pool.submit(ar.allreduce, {"g": np.ones(10, np.float32)}, 0) for ar in ranks]
        errors = [f.exception(timeout=10) for f in futures]
    elapsed = time.monotonic() - start
    assert elapsed < 5
    for e in errors:
        assert isinstance(e, PeerTimeout), e
        assert e.peer == f"rank{absent}" and e.key.startswith("ar/join")
        assert f"rank{absent}" in str(e)
    # the missing rank comes after all: joining again works
    late = Endpoint(rank_name(absent), f"ipc://{tmp_path}/r{absent}", timeout=5.0)
    ranks.append(AllReduce(absent, 3, late, ranks[0].peers, algorithm, 5.0))
    with ThreadPoolExecutor(len(ranks)) as pool:
        outs = list(pool.map(lambda ar: ar.allreduce({"g": np.full(4, ar.rank, np.float32)}, 1),
                             ranks))
    for ar in ranks:
        ar.close()
    for out in outs:
        np.testing.assert_array_equal(out["g"], np.ones(4, np.float32))


@pytest.mark.parametrize("size, n", [(4, 4000), (4, 1001), (3, 2), (2, 7)])
def test_ring_sends_2_r_minus_1_over_r_of_the_vector(size, n):
    with LocalGroup(size, "ring") as group:
        sent = group.run(lambda ar: (ar.allreduce({"g": np.ones(n, np.float32)}, 0),
                                     ar.last_bytes_sent, ar.rank)[1:])
    cuts = [c * n // size for c in range(size + 1)]
    chunk = [cuts[c + 1] - cuts[c] for c in range(size)]
    for nbytes, r in sent:
        # every chunk but r+1 in reduce-scatter, every chunk but r+2 in all-gather
        assert nbytes == 4 * (2 * n - chunk[(r + 1) % size] - chunk[(r + 2) % size])
        assert abs(nbytes - 2 * (size - 1) / size * 4 * n) <= 4 * 2
    if n % size == 0:
        assert {b for b, _ in sent} == {2 * (size - 1) * 4 * n // size}


def test_shape_mismatch_names_the_peer():
    with LocalGroup(2, "tree", timeout=1.0) as group, pytest.raises(FrameError,
                                                                    match="from rank1"):
        group.run(lambda ar: ar.allreduce({"g": np.ones(4 + ar.rank, np.float32)}, 0))


def test_bad_arguments():
    ep = Endpoint("rank1", "inproc://ar-test-bad")
    try:
        with pytest.raises(ValueError, match="unknown allreduce algorithm 'star'"):
            AllReduce(1, 2, ep, {0: "x"}, "star")
        with pytest.raises(ValueError, match="rank 1 is not in a group of 1"):
            AllReduce(1, 1, ep, {})
        with pytest.raises(ValueError, match="named 'rank1', expected 'rank0'"):
            AllReduce(0, 2, ep, {1: "x"})
        with pytest.raises(ValueError, match=r"sends to ranks \[0\]"):
            AllReduce(1, 2, ep, {})
        with pytest.raises(ValueError, match="w: int32"):
            AllReduce(1, 2, ep, {0: "x"}).allreduce({"w": np.ones(3, np.int32)}, 0)
    finally:
        ep.close()


def test_bench_reports_medians():
    res = bench_allreduce([4096, 1 << 18], ranks=2, algorithm="tree", repeats=3)
    assert res["algorithm"] == "tree" and res["ranks"] == 2
    assert [r["bytes"] for r in res["results"]] == [4096, 1 << 18]
    for row in res["results"]:
        assert len(row["times_s"]) == 3 and 0 < row["median_s"] < 1


# ---- ranks in separate processes over ipc ------------------------------------------------------

def _rank_process(rank, size, addresses, results):
    for algorithm, addrs in addresses.items():
        ep = Endpoint(rank_name(rank), addrs[rank], timeout=30)
        ar = AllReduce(rank, size, ep, dict(enumerate(addrs)), algorithm, timeout=30)
        try:
            outs = [ar.allreduce(_inputs(rank, step, 100_003), step) for step in range(2)]
            results.put((algorithm, rank, outs))
        finally:
            ar.close()


def test_across_processes_over_ipc(tmp_path):
    size = 3
    addresses = {alg: [f"ipc://{tmp_path}/{alg}{r}" for r in range(size)] for alg in ALGS}
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_process, args=(r, size, addresses, results))
             for r in range(size)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in range(len(ALGS) * size)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for alg in ALGS:
        per_rank = sorted((rank, outs) for a, rank, outs in got if a == alg)
        assert [rank for rank, _ in per_rank] == list(range(size))
        for step in range(2):
            _check([outs[step] for _, outs in per_rank],
                   [_inputs(r, step, 100_003) for r in range(size)])
