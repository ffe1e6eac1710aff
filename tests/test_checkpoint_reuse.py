"""A checkpoint directory used again: a shard resumes only the slices it is asked for, says so,
and a new run on its parameters counts its steps afresh (graphflow/ps/shard.py, Shard.init)."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.optim import SGD
from graphflow.partitioners import partition
from graphflow.ps import Shard, ShardError
from graphflow.ps import checkpoint as ckpt
from graphflow.replicas.manager import ReplicaManager, ReplicaOptions
from graphflow.transport.rpc import RemoteError

SGD_SPEC = {"name": "sgd", "lr": 1.0}


def _values(**sizes):
    return {key: np.zeros(n, np.float32) for key, n in sizes.items()}


def test_a_restored_shard_refuses_other_slices_instead_of_mixing_them(tmp_path):
    Shard(0, checkpoint_dir=tmp_path).init({"fc1/W[210:320]": np.ones(110, np.float32)},
                                           SGD_SPEC, [0, 1])  # (checkpointed at init)
    back = Shard(0, checkpoint_dir=tmp_path)
    with pytest.raises(ShardError) as e:
        back.init({"fc1/W[418:640]": np.zeros(222, np.float32)}, SGD_SPEC, [0, 1], run="b")
    message = str(e.value)
    assert message.startswith("shard 0: the slices from its checkpoint ")
    assert str(tmp_path) in message and str(back.restored_from) in message
    assert "parameter 'fc1/W': fc1/W[210:320] held, fc1/W[418:640] asked for" in message
    assert list(back.params) == ["fc1/W[210:320]"]  # nothing mixed in
    with pytest.raises(ShardError, match="parameter 'b': none held, b\\[0:4\\] asked for"):
        back.init({"fc1/W[210:320]": np.zeros(110, np.float32), "b[0:4]": np.zeros(4)},
                  SGD_SPEC, [0, 1])


def test_a_new_run_resumes_the_values_and_counts_its_steps_afresh(tmp_path):
    """Before, the restored shard took the new run's first pushes for repeats of the old
    run's steps and ignored them (downpour trained nothing; bsp never completed a step)."""
    first = Shard(0, checkpoint_dir=tmp_path)
    first.init(_values(**{"w[0:3]": 3}), SGD_SPEC, [0, 1], run="a")
    for step in range(3):
        first.push(0, step, {"w[0:3]": np.ones(3, np.float32)})
    first.push(1, 0, {"w[0:3]": np.ones(3, np.float32)}, mode="bsp")  # held
    saved = first.checkpoint()

    back = Shard(0, checkpoint_dir=tmp_path)
    reply = back.init(_values(**{"w[0:3]": 3}), SGD_SPEC, [0, 1], run="b")
    assert reply["resumed"] == {"path": saved, "dir": str(tmp_path), "updates": 3}
    assert back.pending == {} and back.clock == {0: 0, 1: 0}
    assert back.push(0, 0, {"w[0:3]": np.ones(3, np.float32)})["applied"]
    for r in (0, 1):
        back.push(r, 1, {"w[0:3]": np.ones(3, np.float32)}, mode="bsp")
    assert back.versions == {"w[0:3]": 5}
    np.testing.assert_array_equal(back.fetch()["values"]["w[0:3]"], np.full(3, -5.0))

    back.checkpoint()
    restarted = Shard(0, checkpoint_dir=tmp_path)  # the same run's shard, restarted: no init
    assert restarted.push(0, 0, {"w[0:3]": np.ones(3, np.float32)})["duplicate"]
    again = restarted.init(_values(**{"w[0:3]": 3}), SGD_SPEC, [0, 1], run="b")  # a retry
    assert again["versions"] == {"w[0:3]": 5} and restarted.last_step["w[0:3]"] == {0: 1, 1: 1}


@pytest.fixture(scope="module")
def digits():
    return gf.datasets.digits()


def _manager(ckpt_dir, shards=2):
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    options = ReplicaOptions(mode="bsp", timeout=8.0, bsp_deadline=3.0,
                             checkpoint_dir=str(ckpt_dir), checkpoint_every=1)
    return ReplicaManager(model, plan, SGD(0.05), 2, shards, options)


def test_a_reused_checkpoint_dir_resumes_visibly_or_refuses_another_layout(digits, tmp_path):
    batches = gf.datasets.batches(digits.x_train, digits.y_train, 16, seed=0)
    with _manager(tmp_path) as rm:
        assert rm.resumed == {} and rm.record.notes == []
        rm.fit(batches, 4)
    newest = [ckpt.checkpoints(tmp_path, s)[-1] for s in (0, 1)]

    with _manager(tmp_path) as rm:
        assert sorted(rm.resumed) == [0, 1]
        assert rm.record.notes == [f"resuming shard {s} from {newest[s]} (2 updates)"
                                   for s in (0, 1)]
        record = rm.fit(batches, 4)
        stats = rm.client.stats()
    assert not record.failures and record.steps_done == {0: 2, 1: 2}
    assert {v for st in stats.values() for v in st["versions"].values()} == {4}
    assert sum(st["duplicates"] for st in stats.values()) == 0

    with pytest.raises(RemoteError) as e:
        _manager(tmp_path, shards=3)  # another layout of the same parameters
    assert "shard 0: the slices from its checkpoint" in str(e.value)
    assert str(tmp_path) in str(e.value) and "parameter '" in str(e.value)


def test_a_shard_stopped_cleanly_checkpoints_its_last_updates(tmp_path):
    from graphflow.ps.server import ShardThread

    with ShardThread(f"ipc://{tmp_path}/ps0", checkpoint_dir=tmp_path) as served:
        shard = served.shard  # checkpoints at init only (no checkpoint_every / _seconds)
        shard.init(_values(**{"w[0:3]": 3}), SGD_SPEC, [0], run="a")
        at_init = ckpt.checkpoints(tmp_path, 0)
        shard.push(0, 0, {"w[0:3]": np.ones(3, np.float32)})
    newest = ckpt.checkpoints(tmp_path, 0)[-1]
    assert newest not in at_init  # written at the stop, with the update
    assert Shard(0, checkpoint_dir=tmp_path).versions == {"w[0:3]": 1}
