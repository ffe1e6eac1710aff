"""Streamed steps (`Cluster.stream`): the next step waits at the workers while one runs, yet
the steps, losses and parameters are those of `Cluster.step` called on each batch."""

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

import graphflow as gf
from graphflow.partitioners import partition
from graphflow.runtime import Cluster, WorkerFailed
from graphflow.runtime.calls import reply_grace
from graphflow.runtime.worker import Worker
from tests.spies import fail_step

SGD = {"name": "sgd", "lr": 0.05}


def batches(n, size=4):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((size, 1, 32, 32)).astype(np.float32),
             "y": rng.integers(0, 10, size).astype(np.int32)} for _ in range(n)]


def plan_for(strategy):
    model = gf.models.digits_lc(batch=None)
    return partition(model.graph, 2, strategy, loss=model.loss)


def assert_same_run(got, want):
    """Losses and parameters equal; to float32 rounding, as a pipeline's first stage sums its
    weight gradients over the micro-batches in an order that depends on timing (whether the
    last gradient has come when it could start on the others)."""
    (got_loss, got_params), (want_loss, want_params) = got, want
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for name, value in want_params.items():
        scale = float(np.abs(value).max()) + 1e-12
        np.testing.assert_allclose(got_params[name], value, rtol=0, atol=1e-6 * scale,
                                   err_msg=name)


def run_both(plan, data, mode="threads", microbatches=1, ahead=1):
    """(losses, parameters) of step() on each batch, then of one stream over them."""
    out = []
    for streamed in (False, True):
        with Cluster(plan, mode=mode, optimizer=SGD, microbatches=microbatches,
                     timeout=60) as cluster:
            if streamed:
                results = list(cluster.stream(data, ahead=ahead))
            else:
                results = [cluster.step(b) for b in data]
            out.append(([float(r[plan.loss]) for r in results], cluster.params()))
    return out


@pytest.mark.parametrize("strategy, microbatches, ahead",
                         [("spatial", 1, 1), ("layerwise", 2, 1), ("layerwise", 2, 2),
                          ("mincut", 1, 0)])
def test_streamed_steps_equal_stepping_one_by_one(strategy, microbatches, ahead):
    want, got = run_both(plan_for(strategy), batches(4), microbatches=microbatches,
                         ahead=ahead)
    assert len(set(want[0])) == 4, "the batches differ, so the losses should"
    assert_same_run(got, want)


def test_streamed_pipelined_steps_in_processes():
    want, got = run_both(plan_for("layerwise"), batches(3), "processes", 2)
    assert_same_run(got, want)


def test_a_worker_starts_the_next_step_while_its_peer_finishes_this_one(monkeypatch):
    """worker:1 lingers 0.3 s after each step; in a stream worker:0 has already begun the
    next step by then, while step() holds it back until both have answered."""
    spans: dict[tuple[int, int], list[float]] = {}
    lock = threading.Lock()
    run_step = Worker.run_step

    def traced(self, feeds, fetches, step, *args, **kwargs):
        with lock:
            spans[(self.index, step)] = [time.monotonic()]
        out = run_step(self, feeds, fetches, step, *args, **kwargs)
        if self.index == 1:
            time.sleep(0.3)
        with lock:
            spans[(self.index, step)].append(time.monotonic())
        return out

    monkeypatch.setattr(Worker, "run_step", traced)
    data = batches(2)
    with Cluster(plan_for("spatial"), optimizer=SGD, timeout=60) as cluster:
        for b in data:
            cluster.step(b)
        # stepped: worker:0 starts step 1 only after worker:1 has ended step 0
        assert spans[(0, 1)][0] > spans[(1, 0)][1]
        list(cluster.stream(data))
    # streamed (steps 2 and 3): worker:0 starts step 3 while worker:1 lingers after step 2
    assert spans[(0, 3)][0] < spans[(1, 2)][1] - 0.1


def test_a_stream_stopped_early_finishes_the_steps_it_sent():
    plan = plan_for("spatial")
    data = batches(3)
    with Cluster(plan, optimizer=SGD, timeout=60) as want:
        for b in data[:2]:
            want.step(b)
        expected = want.params()
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        for _ in cluster.stream(data):
            break  # step 0 answered; step 1 was sent already, step 2 never
        got = cluster.params()
        assert cluster.step_count == 2
        cluster.step(data[2])  # still in order: the next reply is this step's
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_closed_stream_raises_a_draining_steps_failure_where_it_is_closed(monkeypatch):
    fail_step(monkeypatch)  # worker 1, step 1
    with Cluster(plan_for("spatial"), optimizer=SGD, timeout=60) as cluster:
        with pytest.raises(WorkerFailed, match="step 1 fails") as failure:
            with contextlib.closing(cluster.stream(batches(3))) as steps:
                next(steps)  # step 0 answered, step 1 sent: closing drains it
        assert failure.value.worker == "worker:1"
        assert cluster.step_count == 2  # step 2 was never sent


def test_a_killed_worker_in_a_stream_is_named_within_the_timeout():
    plan, timeout = plan_for("spatial"), 3.0
    data = batches(1)[0]
    with Cluster(plan, timeout=60) as warm:  # compile the kernels into Numba's disk cache
        warm.step(data)
    # the first step of fresh processes loads every kernel: slow on a busy machine, so
    # given a minute; the driver's wait on the later ones is `timeout`'s
    with Cluster(plan, mode="processes", optimizer=SGD, timeout=60) as cluster:
        cluster.step(data)
        for client in cluster.clients:
            client.timeout = timeout + reply_grace(timeout)
        killed = {}

        def feed():
            for i in range(20):
                if i == 3:
                    os.kill(cluster._procs[1].pid, signal.SIGKILL)
                    cluster._procs[1].wait(5.0)
                    killed["at"] = time.monotonic()
                yield data

        with pytest.raises(WorkerFailed) as failure:
            for _ in cluster.stream(feed()):
                pass
        assert failure.value.worker == "worker:1", failure.value
        assert "worker:1 was killed by SIGKILL before answering 'step'" in str(failure.value)
        assert time.monotonic() - killed["at"] < timeout + 2 * 1.0 + 3.0


def test_stream_refuses_a_negative_lookahead():
    with Cluster(plan_for("spatial"), timeout=60) as cluster:
        with pytest.raises(ValueError, match="ahead must be >= 0"):
            next(cluster.stream(batches(1), ahead=-1))


def test_partitioned_trainer_streams_the_same_training_as_one_process():
    data = batches(3)
    pairs = [(b["x"], b["y"]) for b in data]
    one = gf.Trainer(gf.models.digits_lc(batch=None), gf.optim.SGD(0.05))
    want = one.fit(pairs, steps=3, progress=False, log_every=1)
    split = gf.train.PartitionedTrainer(gf.models.digits_lc(batch=None), gf.optim.SGD(0.05),
                                        parts=2, strategy="spatial")
    try:
        got = split.fit(iter(pairs), steps=3, progress=False, log_every=1)
        params = split.plan.assemble(split.cluster.params())
    finally:
        split.close()
    assert got.steps == want.steps == [1, 2, 3] and split.step_count == 3
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-5)
    for name, value in one.session.params.items():
        np.testing.assert_allclose(params[name], value, rtol=0,
                                   atol=1e-5 * float(np.abs(value).max()), err_msg=name)


@pytest.mark.parametrize("split", [False, True], ids=["one process", "two workers"])
def test_fit_logs_the_last_step_when_the_batches_run_out(split):
    pairs = [(b["x"], b["y"]) for b in batches(2)]
    model, sgd = gf.models.digits_lc(batch=None), gf.optim.SGD(0.05)
    trainer = (gf.train.PartitionedTrainer(model, sgd, parts=2) if split
               else gf.Trainer(model, sgd))
    try:
        history = trainer.fit(iter(pairs), steps=5, progress=False, log_every=10)
    finally:
        if split:
            trainer.close()
    assert trainer.step_count == 2 and history.steps == [2] and len(history.losses) == 1


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("culprit", ["worker:0", "worker:2"])
def test_a_failed_step_is_abandoned_by_its_peers_at_once(mode, culprit):
    """A 3-stage pipeline. worker:0 fails on NaN input (check_numerics) before it sends
    anything, or worker:2 on a label out of range while worker:0 waits for a gradient that
    worker:1 waits for. The failing worker tells its peers (and they theirs), so they stop
    waiting: the next step runs at once, not after the 20 s receive timeout; the driver names
    the culprit, not the peers."""
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 3, "layerwise", loss=model.loss)
    good = batches(1)[0]
    bad = ({**good, "x": np.full_like(good["x"], np.nan)} if culprit == "worker:0"
           else {**good, "y": np.full_like(good["y"], 99)})
    with Cluster(plan, mode=mode, optimizer=SGD, timeout=20.0) as cluster:
        cluster.step(good)  # compiled and connected
        t0 = time.monotonic()
        with pytest.raises(WorkerFailed, match="NonFiniteError|label 99") as failure:
            cluster.run(bad, [plan.loss], train=True, check_numerics=True)
        assert failure.value.worker == culprit
        loss = cluster.step(good)[plan.loss]
        assert np.isfinite(loss) and time.monotonic() - t0 < 5.0
