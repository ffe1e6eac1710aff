"""How a fit's batches are shared out at its ends: the lockstep modes (bsp, allreduce) run whole
rounds, a failed replica's share goes to the others, ssp holds a replica that is too far ahead
before it takes a batch (graphflow/replicas/feed.py). Small timeouts: a regression fails fast
instead of hanging."""

import threading
import time

import pytest

import graphflow as gf
from graphflow.errors import GraphflowError
from graphflow.optim import SGD
from graphflow.partitioners import partition
from graphflow.replicas.feed import Feed
from graphflow.replicas.manager import ReplicaManager, ReplicaOptions

DEADLINE = 3.0  # s: the bsp barrier's; a replica left waiting for a partner takes this long


@pytest.fixture(scope="module")
def digits():
    return gf.datasets.digits()


def _manager(replicas, mode, **kw):
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    options = ReplicaOptions(mode=mode, timeout=8.0, bsp_deadline=DEADLINE, **kw)
    return ReplicaManager(model, plan, SGD(0.05), replicas, 2, options)


def _batches(data, n=40):
    it = gf.datasets.batches(data.x_train, data.y_train, 16, seed=0)
    return [next(it) for _ in range(n)]


def _timed_fit(rm, batches, steps):
    start = time.perf_counter()
    record = rm.fit(batches, steps)
    return record, time.perf_counter() - start


# -- through a ReplicaManager -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_lockstep_modes_round_an_odd_step_count_up_to_whole_rounds(digits, mode):
    """5 steps on 2 replicas: each runs 3. Before, one replica got the 5th batch alone and
    waited for its partner: bsp dropped it after the deadline, allreduce failed both."""
    with _manager(2, mode) as rm:
        assert rm.steps_to_run(5) == 6
        record, took = _timed_fit(rm, _batches(digits), 5)
        live = [c["live"] for c in rm.client.clocks().values()] if mode == "bsp" else None
        versions = set(rm.client.stats()[0]["versions"].values()) if mode == "bsp" else None
    assert not record.failures
    assert record.steps_done == {0: 3, 1: 3} and record.steps_run == 6
    assert record.notes == [f"{mode} runs its 2 replicas in lockstep: 5 steps rounded up to 6 "
                            "(3 each)"]
    assert took < DEADLINE, took
    if mode == "bsp":
        assert live == [[0, 1], [0, 1]] and versions == {3}  # nobody dropped, 3 updates


def test_a_failed_bsp_replica_leaves_its_share_to_the_others_without_a_stall(digits):
    """Replica 2 of 3 fails on its second step: the shards drop it at once (no deadline), the
    two left run whole rounds until the run has its 8 steps (1 + 2 x 4), every round applied
    once."""
    with _manager(3, "bsp") as rm:
        real, calls = rm.clusters[2].step, []

        def failing_step(feeds):
            calls.append(1)
            if len(calls) == 2:
                raise GraphflowError("injected failure")
            return real(feeds)

        rm.clusters[2].step = failing_step
        record, took = _timed_fit(rm, _batches(digits), 8)
        versions = {s: set(st["versions"].values()) for s, st in rm.client.stats().items()}
    assert len(record.failures) == 1 and "injected failure" in record.failures[0]
    assert record.steps_done == {0: 4, 1: 4, 2: 1} and record.steps_run == 9
    assert record.notes[-1] == "bsp: after replica(s) 2 failed, the 2 left ran 4 steps each, " \
                               "9 in all"
    assert versions == {0: {4}, 1: {4}}  # one update a round: none lost, none waited out
    assert took < DEADLINE, took


def test_ssp_holds_a_replica_too_far_ahead_before_it_takes_a_batch(digits):
    """Replica 1 is slow between steps (its step's push is out, the reply late). Before,
    replica 0 took the last batch, then waited at the shards' clock gate for replica 1, which
    waited for that batch: the gate timed out and replica 0 was dropped."""
    with _manager(2, "ssp", staleness=1) as rm:
        real = rm.clusters[1].step

        def late_reply(feeds):
            out = real(feeds)
            time.sleep(0.3)
            return out

        rm.clusters[1].step = late_reply
        record, took = _timed_fit(rm, _batches(digits), 7)
    assert not record.failures, record.failures
    assert record.steps_run == 7 and record.steps_done[0] <= record.steps_done[1] + 2
    assert took < 3.5, took  # (the link's gate gives up after timeout / 2 = 4 s)


def test_warm_start_is_refused_where_replica_zero_cannot_run_alone():
    for mode in ("bsp", "allreduce"):
        with pytest.raises(ValueError, match=f"cannot run alone in {mode} mode"):
            ReplicaOptions(mode=mode, warm_start=3)
    with pytest.raises(ValueError, match="past staleness 2"):
        ReplicaOptions(mode="ssp", staleness=2, warm_start=4)
    ReplicaOptions(mode="ssp", staleness=2, warm_start=3)  # steps 0..2 alone, then the gate


# -- the feed alone ---------------------------------------------------------------------------

def _blocked(feed, r):
    """Whether feed.next(r) waits (it is left waiting on a daemon thread)."""
    got = []
    t = threading.Thread(target=lambda: got.append(feed.next(r)), daemon=True)
    t.start()
    t.join(0.2)
    return t.is_alive(), got


def test_feed_lockstep_rounds_and_a_failure_adds_rounds():
    feed = Feed(iter(range(100)), steps=8, replicas=[0, 1, 2], mode="bsp")
    assert (feed.rounds, feed.planned) == (3, 9)
    for r in (0, 1, 2):
        assert feed.next(r) == r
        feed.finished(r)
    assert [feed.next(r) for r in (0, 1, 2)] == [3, 4, 5]
    feed.failed(2, 5)  # on its second batch: 8 - 1 steps left for 2 replicas
    assert (feed.rounds, feed.planned, feed.live) == (4, 9, {0, 1})
    feed.finished(0)
    feed.finished(1)
    assert feed.next(0) == 5  # the batch given back
    assert feed.next(1) == 6


def test_feed_lockstep_a_done_replica_waits_while_another_may_fail():
    feed = Feed(iter(range(100)), steps=2, replicas=[0, 1], mode="allreduce")
    feed.next(0), feed.next(1)
    feed.finished(0)
    blocked, _ = _blocked(feed, 0)  # replica 1's step may fail: then 0 runs one more
    assert blocked
    feed.finished(1)
    assert feed.next(1) is None


def test_feed_ssp_holds_a_replica_too_far_ahead_without_a_batch():
    feed = Feed(iter(range(100)), steps=4, replicas=[0, 1], mode="ssp", staleness=1)
    for _ in range(2):
        feed.next(0)
        feed.finished(0)
    blocked, got = _blocked(feed, 0)  # 2 steps ahead of replica 1: holds no batch
    assert blocked and feed.taken == 2
    assert feed.next(1) == 2  # replica 1 gets it, and replica 0 goes on once it is done
    feed.finished(1)
    time.sleep(0.1)
    assert got == [3]


@pytest.mark.parametrize("mode", ["downpour", "bsp", "allreduce"])
def test_batches_that_run_out_end_the_run_there(digits, mode):
    """5 batches for 8 steps: the run ends at them (lockstep: at whole rounds, the last
    batch shared out among the replicas, none used twice), noted, no replica thread dying of
    StopIteration."""
    with _manager(2, mode) as rm:
        record, took = _timed_fit(rm, iter(_batches(digits, 5)), 8)
        ran = 6 if mode != "downpour" else 5
        assert record.steps_run == ran and sum(record.steps_done.values()) == ran
        assert record.notes[-1] == f"the batches ran out after {ran} of 8 steps"
        assert rm.fit(iter([]), 2).steps_run == 0  # none at all
    assert not record.failures and took < DEADLINE, (record.failures, took)


def test_counts_and_fixed_batch_evaluation_are_checked(digits):
    with _manager(2, "downpour") as rm:
        for steps in (0, -1, 2.5, None):
            with pytest.raises(ValueError, match=f"steps must be an int >= 1, got {steps}"):
                rm.fit(iter(_batches(digits, 2)), steps)
        with pytest.raises(ValueError, match="10 inputs but 3 labels"):
            rm.evaluate(digits.x_test[:10], digits.y_test[:3])
    model = gf.models.digits_lc(batch=16)  # a fixed batch: evaluated 16 rows a run, padded
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    with ReplicaManager(model, plan, SGD(0.05), 2, 1, ReplicaOptions(timeout=8.0)) as rm:
        assert 0.0 <= rm.evaluate(digits.x_test[:10], digits.y_test[:10]) <= 1.0


def test_sandblaster_stops_where_its_batches_run_out_and_says_so(digits):
    rm = _manager(2, "sandblaster")
    try:
        record = rm.fit(iter(_batches(digits, 2)), 5)  # (a list would be cycled)
    finally:
        rm.close()
    assert 0 < record.steps_run < 5  # (a replica's steps are its gradient portions)
    assert sum(record.steps_done.values()) >= record.steps_run
    assert f"the batches ran out after {record.steps_run} of 5 steps" in record.notes


def test_a_second_fit_reports_only_its_own_losses(digits):
    from graphflow.train import DataParallelTrainer

    trainer = DataParallelTrainer(gf.models.digits_lc(batch=None), SGD(0.05), replicas=2,
                                  options=ReplicaOptions(mode="bsp", timeout=8.0))
    try:
        trainer.fit(_batches(digits, 8), 8, progress=False, log_every=1)
        seen = {r: len(v) for r, v in trainer.manager.record.losses.items()}
        again = trainer.fit(_batches(digits, 4), 4, progress=False, log_every=1)
    finally:
        trainer.close()
    # a lockstep run reports a round's mean loss (deterministic, whichever replica ends last)
    assert again.steps == [2, 4] and trainer.step_count == 12
    new = {r: v[seen.get(r, 0):] for r, v in trainer.manager.record.losses.items()}
    assert sum(map(len, new.values())) == 4
    assert again.losses[-1] == pytest.approx(sum(v[-1][2] for v in new.values()) / 2)


@pytest.mark.parametrize("mode", ["downpour", "bsp"])
def test_a_bad_batch_is_named_and_the_replicas_go_on(digits, mode):
    good = _batches(digits, 6)
    x, y = good[1]
    rm = _manager(2, mode)
    try:
        with pytest.raises(ValueError, match="batch 1: placeholder 'x' .*fed shape "
                                             r"\(16, 1, 16, 32\), expected \(N, 1, 32, 32\)"):
            rm.fit([good[0], (x[:, :, :16], y), *good[2:]], 4)
        assert not rm.record.failures  # no replica was blamed, nor dropped
        with pytest.raises(ValueError, match="batch 0 has no rows"):
            rm.fit([(x[:0], y[:0])], 2)
        record = rm.fit(good, 4)
        assert record.steps_run == 4 and not record.failures
    finally:
        rm.close()
