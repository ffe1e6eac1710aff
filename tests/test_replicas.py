"""Replicas sharing a sharded parameter server: Downpour, BSP, SSP (threads; see
test_replica_faults.py for killed processes)."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.optim import SGD, Adagrad
from graphflow.partitioners import partition
from graphflow.replicas.manager import ReplicaManager, ReplicaOptions


@pytest.fixture(scope="module")
def digits():
    return gf.datasets.digits()


def _manager(model, replicas, mode, optimizer, parts=1, shards=2, **kw):
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    return ReplicaManager(model, plan, optimizer, replicas, shards,
                          ReplicaOptions(mode=mode, timeout=20, **kw))


def _batches(data, n, size=16, seed=0):
    it = gf.datasets.batches(data.x_train, data.y_train, size, seed=seed)
    return [next(it) for _ in range(n)]


def test_bsp_applies_one_averaged_update_per_step(digits):
    """Two replicas in BSP take batches 2k and 2k+1 at step k and the shards apply the mean of
    their gradients once: the same as one model on the joined batch."""
    steps, lr = 4, 0.05
    batches = _batches(digits, 2 * steps)
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 2, "bsp", SGD(lr), parts=2) as rm:
        rm.fit(batches, 2 * steps)
        got = rm.params()
        versions = rm.client.versions  # of the fetch just made
    ref = gf.Trainer(gf.models.digits_lc(batch=None), SGD(lr))
    for k in range(steps):
        (x0, y0), (x1, y1) = batches[2 * k], batches[2 * k + 1]
        ref.step(np.concatenate([x0, x1]), np.concatenate([y0, y1]))
    for name, want in ref.session.params.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    assert set(versions.values()) == {steps}  # one update per step on every slice


def test_a_replica_dropped_at_a_bsp_deadline_stops_and_says_so(digits):
    """Replica 1 sleeps past the barrier's deadline before its first step: the shards drop it,
    its next push is refused, and it stops with an error naming the shards instead of going on
    with pushes that are ignored. Replica 0 runs every step."""
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 2, "bsp", SGD(0.05), bsp_deadline=0.3, slow={1: 1.5}) as rm:
        record = rm.fit(_batches(digits, 6), 6)
        live = [c["live"] for c in rm.client.clocks().values()]
    assert live == [[0], [0]]
    assert len(record.failures) == 1, record.failures
    assert "replica 1: step 0 refused, dropped by ps:0 at" in record.failures[0], record.failures
    assert record.steps_done.get(1, 0) == 0 and record.steps_done[0] == 6


def test_downpour_with_adagrad_learns(digits):
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 2, "downpour", Adagrad(0.03)) as rm:
        before = rm.evaluate(digits.x_test, digits.y_test)
        record = rm.fit(gf.datasets.batches(digits.x_train, digits.y_train, 32, shift=2), 300)
        after = rm.evaluate(digits.x_test, digits.y_test)
    assert after > 0.85 > before
    assert all(record.steps_done[r] > 50 for r in (0, 1))  # both replicas did work


def test_downpour_fit_ends_with_every_step_on_the_shards(digits):
    """Pushes go out on the replicas' own threads; fit returns once they have reached the
    shards. With n_push above the run's length nothing is pushed while it runs: what fit
    leaves behind is one push per replica, equal to one model's SGD on all the batches (the
    gradients of the same parameters, summed). Before, they reached the shards only at close.
    """
    lr, steps = 0.05, 6
    batches = _batches(digits, steps)
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 1, "downpour", SGD(lr), n_push=1000, n_fetch=1000) as rm:
        start = rm.params()
        rm.fit(batches, steps)
        versions = rm.client.stats()[0]["versions"]
        got = rm.params()
    assert set(versions.values()) == {1}  # the one push, flushed
    ref = gf.models.digits_lc(batch=None)
    grads = gf.gradients(ref.loss, ref.graph.parameters())
    session = gf.Session(ref.graph)
    session.params.update(start)
    total = {name: 0 for name in grads}
    for x, y in batches:  # every step ran on the start parameters (no fetch in between)
        values = session.run(list(grads.values()), {ref.x: x, ref.y: y})
        total = {name: total[name] + v for name, v in zip(grads, values, strict=True)}
    for name, g in total.items():
        np.testing.assert_allclose(got[name], start[name] - lr * g, rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_ssp_keeps_every_replica_within_s_clocks_of_the_slowest(digits):
    s = 2
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 2, "ssp", SGD(0.02), staleness=s, slow={1: 0.08}) as rm:
        record = rm.fit(_batches(digits, 40), 40)
        log = rm.client.clocks()[0]["log"]  # shard 0 sees every clock_ok call
    fast = record.steps_done[0]
    assert fast > record.steps_done[1]  # replica 0 is faster ...
    # ... every step it ran passed the gate within s clocks of the slowest ...
    passed = {clock for _, r, clock, low in log if r == 0 and clock - low <= s}
    assert passed >= set(range(fast))
    # ... and it was held (by the feed, holding no batch: see test_replica_lockstep.py):
    # step k began once replica 1 had finished k - s steps
    slow_ends = sorted(t for t, _, _ in record.losses[1])
    for t, k, _ in record.losses[0]:
        assert sum(end < t for end in slow_ends) >= k - s, (k, t, slow_ends)
    assert fast <= record.steps_done[1] + s + 1


def test_warm_start_runs_replica_zero_alone_first(digits):
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 2, "downpour", Adagrad(0.03), warm_start=10) as rm:
        record = rm.fit(_batches(digits, 30), 30)
    first_other = min(t for t, _, _ in record.losses[1])
    tenth = sorted(t for t, _, _ in record.losses[0])[9]
    assert first_other >= tenth


def test_compressed_pushes_still_learn(digits):
    model = gf.models.digits_lc(batch=None)
    # bsp: the same batches meet at each step, so the result does not depend on timing
    with _manager(model, 2, "bsp", Adagrad(0.03), compress="topk:0.1") as rm:
        rm.fit(gf.datasets.batches(digits.x_train, digits.y_train, 32, shift=2), 300)
        assert rm.evaluate(digits.x_test, digits.y_test) > 0.9  # from ~0.1; sends 10%


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="unknown mode 'hogwild'"):
        ReplicaOptions(mode="hogwild")


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_allreduce_replicas_equal_one_model_on_the_joined_batch(digits, algorithm):
    """Synchronous data parallelism without a PS: the same update as BSP."""
    steps, lr = 3, 0.05
    batches = _batches(digits, 3 * steps)
    model = gf.models.digits_lc(batch=None)
    with _manager(model, 3, "allreduce", SGD(lr), parts=2, algorithm=algorithm) as rm:
        rm.fit(batches, 3 * steps)
        got = [rm.plan.assemble(c.params()) for c in rm.clusters]
    ref = gf.Trainer(gf.models.digits_lc(batch=None), SGD(lr))
    for k in range(steps):
        xs, ys = zip(*batches[3 * k:3 * k + 3], strict=True)
        ref.step(np.concatenate(xs), np.concatenate(ys))
    for name, want in ref.session.params.items():
        for r in range(3):  # every replica holds the same parameters
            np.testing.assert_allclose(got[r][name], want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} on replica {r}")
