"""The shard's bsp barrier: one averaged update a step, late replicas dropped at the deadline,
and a shard restarted from a checkpoint meeting replicas that have moved on."""

import logging

import numpy as np
import pytest

from graphflow.optim import Adagrad
from graphflow.ps import Layout, PSClient, Shard, ShardThread
from tests.ps_helpers import make_shard


def test_bsp_applies_one_averaged_update_per_step_and_drops_late_replicas(caplog):
    shard, local = make_shard(), Adagrad(0.1)
    expected = np.arange(6, dtype=np.float32)
    rng = np.random.default_rng(2)
    for step in range(3):
        grads = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
        for r in (2, 0):
            assert shard.push(r, step, {"w[0:6]": grads[r]}, mode="bsp")["applied"] is False
        assert shard.push(2, step, {"w[0:6]": grads[2]}, mode="bsp")["duplicate"] is True
        assert shard.versions["w[0:6]"] == step
        assert shard.push(1, step, {"w[0:6]": grads[1]}, mode="bsp")["applied"] is True
        local.update("w", expected, (grads[0] + grads[1] + grads[2]) / np.float32(3))
        np.testing.assert_allclose(shard.params["w[0:6]"], expected, rtol=1e-6)
        assert shard.versions["w[0:6]"] == step + 1
    g = np.ones(6, np.float32)
    shard.push(0, 3, {"w[0:6]": g}, mode="bsp")
    shard.push(1, 3, {"w[0:6]": 3 * g}, mode="bsp")
    started = shard.pending[3].started
    shard.tick(now=started + 4.0)  # not late yet
    assert shard.versions["w[0:6]"] == 3 and shard.live == {0, 1, 2}
    with caplog.at_level(logging.WARNING, logger="graphflow.ps"):
        shard.tick(now=started + 5.5)
    assert "shard 0: bsp step 3: dropped replica 2 (no push within 5s)" in caplog.text
    assert shard.live == {0, 1} and shard.versions["w[0:6]"] == 4
    local.update("w", expected, 2 * g)
    np.testing.assert_allclose(shard.params["w[0:6]"], expected, rtol=1e-6)
    assert shard.push(2, 3, {"w[0:6]": g}, mode="bsp") == {
        "applied": False, "duplicate": False, "dropped": True}
    shard.push(0, 4, {"w[0:6]": g}, mode="bsp")
    assert shard.push(1, 4, {"w[0:6]": g}, mode="bsp")["applied"]  # two live replicas now
    assert shard.versions["w[0:6]"] == 5 and not shard.pending


def test_bsp_after_a_restart_jumps_to_the_replicas_version_and_forgets_lost_steps(tmp_path):
    """Restored from a checkpoint taken at step 1 (step 0 of replica 1 held), the shard meets
    replicas already at step 4: the held step is dropped, not waited for, and step 4 brings the
    slice to the version the replicas wait for."""
    shard = make_shard(replicas=(0, 1), checkpoint_dir=tmp_path)
    g = np.ones(6, np.float32)
    shard.push(0, 0, {"w[0:6]": g}, mode="bsp", version=1)
    shard.checkpoint()  # step 0: replica 0 pushed, replica 1 not yet
    back = Shard(0, checkpoint_dir=tmp_path)
    assert sorted(back.pending) == [0] and back.pending[0].version == 1
    for r in (0, 1):  # step 0 ran and was lost; they are at step 4 now
        back.push(r, 4, {"w[0:6]": g}, mode="bsp", version=5)
    assert back.versions["w[0:6]"] == 5 and not back.pending
    assert back.push(1, 4, {"w[0:6]": g}, mode="bsp", version=5)["duplicate"]  # a repeat


@pytest.mark.parametrize("order", ["behind first", "ahead first"])
def test_bsp_after_a_restart_between_two_replicas_fetches_reaches_both_versions(order):
    """The crash fell after replica 0 fetched step 4's update and before replica 1 did: the
    restarted shard (still at version 2) hears step 4 from replica 1 and step 5 from replica
    0, in either order. Replica 1 must get version 5 at once (step 4 was applied and lost)
    and step 5 must complete with both replicas' gradients, with no deadline involved."""
    shard = make_shard(replicas=(0, 1))
    shard.versions["w[0:6]"] = 2
    before = shard.params["w[0:6]"].copy()
    g = np.ones(6, np.float32)
    pushes = [(1, 4, 5, g), (0, 5, 6, g)]
    for r, step, version, grad in pushes if order == "behind first" else pushes[::-1]:
        assert not shard.push(r, step, {"w[0:6]": grad}, mode="bsp", version=version)["applied"]
    assert shard.versions["w[0:6]"] == 5  # replica 1 fetches and goes on to step 5
    np.testing.assert_array_equal(shard.params["w[0:6]"], before)
    assert shard.push(1, 4, {"w[0:6]": g}, mode="bsp", version=5)["duplicate"]  # a repeat
    assert shard.push(1, 5, {"w[0:6]": 3 * g}, mode="bsp", version=6)["applied"]
    assert shard.versions["w[0:6]"] == 6 and not shard.pending and shard.live == {0, 1}
    Adagrad(0.1).update("w", before, 2 * g)  # the average of g and 3g, once
    np.testing.assert_allclose(shard.params["w[0:6]"], before, rtol=1e-6)


def test_bsp_deadline_runs_in_the_server_loop_without_requests(tmp_path):
    with ShardThread(f"ipc://{tmp_path}/ps0", 0) as t:
        client = PSClient([t.address], Layout.build({"w": (6,)}, 1), timeout=5.0)
        client.init({"w": np.zeros(6, np.float32)}, {"name": "sgd", "lr": 1.0}, [0, 1, 2],
                    bsp_deadline=0.2)
        client.push(0, 0, {"w": np.ones(6, np.float32)}, mode="bsp")
        client.push(1, 0, {"w": 3 * np.ones(6, np.float32)}, mode="bsp")
        got = client.fetch(min_version=1, wait=3.0)  # only the loop's tick can complete it
        np.testing.assert_array_equal(got["w"], -2 * np.ones(6))
        assert client.clocks()[0]["live"] == [0, 1]
        client.close()
