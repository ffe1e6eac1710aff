"""The parameter server in one process: layout, shard rules (dedup, ssp clocks, vector ops),
checkpoints, and the RPC path through shards served by threads (bsp: test_ps_bsp.py)."""

import logging
import os
import time

import msgpack
import numpy as np
import pytest

from graphflow.optim import Adagrad
from graphflow.ps import Layout, PSClient, PSError, Shard, ShardError, ShardThread
from graphflow.ps import checkpoint as ckpt
from graphflow.transport import RemoteError
from tests.ps_helpers import make_shard

SHAPES = {"w1": (37, 11), "b1": (11,), "w2": (11, 3), "b2": (3,), "empty": (0, 4)}


def _values(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


@pytest.fixture
def two_shards(tmp_path):
    threads = [ShardThread(f"ipc://{tmp_path}/ps{i}", i, 2) for i in range(2)]
    yield threads
    for t in threads:
        t.stop()


# -- layout ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
def test_layout_balances_bytes_and_round_trips(shards):
    layout = Layout.build(SHAPES, shards)
    sizes = [layout.bytes_on(s) for s in range(shards)]
    assert max(sizes) - min(sizes) <= layout.itemsize  # at most one element's worth apart
    assert sum(sizes) == 4 * sum(int(np.prod(s)) for s in SHAPES.values())
    for name in SHAPES:
        parts = layout.slices_of(name)
        assert parts[0].lo == 0 and parts[-1].hi == int(np.prod(SHAPES[name]))
        assert all(a.hi == b.lo for a, b in zip(parts, parts[1:]))
        assert [p.shard for p in parts] == sorted({p.shard for p in parts})
    values = _values(SHAPES)
    split = layout.split(values)
    assert set(split) <= set(range(shards))
    for s, slices in split.items():
        assert set(slices) == set(layout.keys_on(s))
        assert all(v.base is not None for v in slices.values())  # views, not copies
    joined = layout.join({k: v for d in split.values() for k, v in d.items()})
    assert set(joined) == set(SHAPES)
    for name, v in values.items():
        np.testing.assert_array_equal(joined[name], v)
    wire = msgpack.unpackb(msgpack.packb(layout.to_dict()), raw=False)
    assert Layout.from_dict(wire) == layout


def test_layout_cuts_and_errors():
    layout = Layout.build({"b": (4,), "w": (2, 3)}, 2)
    assert [(s.key, s.shard) for s in layout.slices] == [
        ("b[0:4]", 0), ("w[0:1]", 0), ("w[1:6]", 1)]
    assert layout.shards_of(["b"]) == [0] and layout.shards_of(["w"]) == [0, 1]
    with pytest.raises(KeyError, match="missing"):
        layout.join({"w[0:1]": np.zeros(1)})
    with pytest.raises(ValueError, match="7 elements"):
        layout.split({"w": np.zeros(7)})
    with pytest.raises(ValueError, match="not a layout"):
        Layout.from_dict({"shapes": {"w": [-1]}, "shards": 1})
    tiny = Layout.build({"a": (2,)}, 4)  # more shards than elements: some hold nothing
    assert sorted(tiny.bytes_on(s) for s in range(4)) == [0, 0, 4, 4]


# -- updates over RPC -----------------------------------------------------------------------

def test_adagrad_on_two_shards_equals_local_adagrad(two_shards):
    layout = Layout.build(SHAPES, 2)
    values = _values(SHAPES)
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    spec = {"name": "adagrad", "lr": 0.05, "eps": 1e-8, "initial_accumulator": 0.1}
    assert client.init(values, spec, [0]) == {"restored": False, "versions": {
        sl.key: 0 for sl in layout.slices}, "resumed": {}}
    local, expected = Adagrad(0.05, 1e-8, 0.1), {n: v.copy() for n, v in values.items()}
    rng = np.random.default_rng(1)
    for step in range(5):
        grads = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
        assert client.push(0, step, grads)["applied"] is not False
        for n, g in grads.items():
            local.update(n, expected[n], g)
    got = client.fetch(min_version=5)
    for n in SHAPES:
        np.testing.assert_array_equal(got[n], expected[n])
    assert set(client.versions.values()) == {5}
    state = {k: v["sum_sq"] for t in two_shards for k, v in t.shard.optimizer.state.items()}
    for n, acc in layout.join(state).items():
        np.testing.assert_array_equal(acc, local.state[n]["sum_sq"])
    client.close()


def test_duplicate_push_is_applied_once(two_shards):
    layout = Layout.build(SHAPES, 2)
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    client.init(_values(SHAPES), {"name": "sgd", "lr": 0.5}, [0, 1])
    grads = {n: np.ones(s, np.float32) for n, s in SHAPES.items()}
    fresh, again = {"applied": True, "duplicate": False}, {"applied": False, "duplicate": True}
    assert client.push(0, 0, grads) == {**fresh, "dropped": []}
    assert client.push(0, 0, grads) == {**again, "dropped": []}
    assert client.push(1, 0, grads) == {**fresh, "dropped": []}  # other replica
    got = client.fetch()
    for n, v in _values(SHAPES).items():
        np.testing.assert_allclose(got[n], v - 1.0, rtol=0, atol=1e-6)
    assert set(client.versions.values()) == {2}
    stats = client.stats()
    assert sum(s["updates"] for s in stats.values()) == 2 * len(layout.slices)
    assert sum(s["duplicates"] for s in stats.values()) == len(layout.slices)
    client.close()


def test_compressed_pushes_are_decoded_on_themake_shard(two_shards):
    from graphflow.replicas.compress import make_codec

    shapes = {"a": (10,), "b": (7,)}
    layout = Layout.build(shapes, 2)
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    client.init({n: np.zeros(s, np.float32) for n, s in shapes.items()},
                {"name": "sgd", "lr": 1.0}, [0])
    grads = _values(shapes, 4)
    client.push(0, 0, grads, codec=make_codec("float16"))
    got = client.fetch()
    for n in shapes:
        np.testing.assert_allclose(got[n], -grads[n], rtol=1e-3)
    client.push(0, 1, grads, codec=make_codec("topk:0.5"))
    changed = {n: np.flatnonzero(client.fetch()[n] != got[n]) for n in shapes}
    sent = sum(int(np.ceil(0.5 * sl.size)) for sl in layout.slices)  # k per slice
    assert sum(c.size for c in changed.values()) == sent
    for n, where in changed.items():
        np.testing.assert_allclose(client.fetch()[n][where], -2 * grads[n][where], rtol=1e-3)
    with pytest.raises(RemoteError, match="gradient of 'a\\[0:8\\]'.*topk payload"):
        client.push(0, 2, {"a": grads["a"]}, codec=_BadTopK())
    client.close()


class _BadTopK:
    kind = "topk"

    def encode(self, key, g):
        return {"kind": "topk", "idx": np.array([99], np.int32), "val": np.ones(1, np.float32),
                "size": g.size}


def test_errors_name_the_shard_and_the_key(two_shards, tmp_path):
    layout = Layout.build({"w": (4,)}, 2)
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    with pytest.raises(RemoteError, match="push before init"):
        client.push(0, 0, {"w": np.ones(4, np.float32)})
    client.init({"w": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 0.1}, [0])
    with pytest.raises(RemoteError, match="ps:0 .*'push' failed.*gradient of 'w\\[0:2\\]'"):
        client._call(0, "push", replica=0, step=0, grads={"w[0:2]": np.ones(3, np.float32)})
    with pytest.raises(RemoteError, match="no slice 'nope'"):
        client._call(1, "fetch", keys=["nope"])
    with pytest.raises(PSError, match="older than version 1"):
        client.fetch(min_version=1, wait=0.1)
    client.close()
    silent = PSClient([f"ipc://{tmp_path}/nobody"], Layout.build({"w": (4,)}, 1), timeout=0.1,
                      retry_for=0.25)
    with pytest.raises(PSError, match=r"ps:0 at ipc://.*nobody: no reply to 'stats'"):
        silent.stats()
    assert silent.retries >= 1
    silent.close()


# -- bsp and ssp --------------------------------------------------------------------------------

def test_clock_ok_is_ssp(two_shards):
    shard = make_shard()
    assert shard.clock_ok(0, 2, staleness=2) and not shard.clock_ok(0, 3, staleness=2)
    for r in (0, 1):
        shard.push(r, 2, {"w[0:6]": np.zeros(6, np.float32)})  # clocks 0, 1 -> 3
    assert not shard.clock_ok(0, 3, staleness=2)  # replica 2 is still at clock 0
    shard.push(2, 0, {"w[0:6]": np.zeros(6, np.float32)})
    assert shard.clock_ok(0, 3, staleness=2) and not shard.clock_ok(0, 4, staleness=2)
    shard.drop(2, "test")
    assert shard.clock_ok(0, 5, staleness=2) and not shard.clock_ok(0, 6, staleness=2)
    log = shard.clocks()["log"]
    assert [row[1:] for row in log[-2:]] == [[0, 5, 3], [0, 6, 3]]
    assert shard.clocks()["clocks"] == [(0, 6), (1, 3), (2, 1)]  # 0 asked at 6: it ran 6
    layout = Layout.build({"a": (4,), "b": (4,)}, 2)  # the client: every shard must agree
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    client.init(_values({"a": (4,), "b": (4,)}), {"name": "sgd", "lr": 1.0}, [0, 1])
    client._call(1, "push", replica=0, step=4, grads={"b[0:4]": np.zeros(4, np.float32)})
    client._call(1, "push", replica=1, step=0, grads={"b[0:4]": np.zeros(4, np.float32)})
    assert client.clock_ok(0, 2, 1) is False  # shard 0: clocks 0, 0; shard 1: 5, 1
    assert client.clock_ok(1, 1, 1) is True
    client.drop(0, "test")
    assert all(c["live"] == [1] for c in client.clocks().values())
    client.close()


# -- Sandblaster vector operations -----------------------------------------------------------

def test_vector_ops_over_two_shards(two_shards):
    shapes = {"a": (40,), "b": (5, 7)}
    layout = Layout.build(shapes, 2)
    assert layout.shards_of() == [0, 1] and len(layout.slices) == 3
    client = PSClient([t.address for t in two_shards], layout, timeout=5.0)
    p, x, y = _values(shapes, 0), _values(shapes, 1), _values(shapes, 2)
    flat = lambda d: np.concatenate([d[n].reshape(-1) for n in sorted(d)]).astype(np.float64)  # noqa: E731
    client.init(p, {"name": "sgd", "lr": 1.0}, [0])
    assert client.vec_dot("param", "param") == pytest.approx(flat(p) @ flat(p), rel=1e-6)
    assert client.accumulate("x", "t0", x) == {"accepted": True, "shards": {0: True, 1: True}}
    assert client.accumulate("x", "t0", y)["accepted"] is False  # a backup's duplicate
    client.accumulate("y", "t0", y, weight=0.5)
    assert client.vec_dot("x", "y") == pytest.approx(0.5 * flat(x) @ flat(y), rel=1e-5)
    client.vec_axpy(2.0, "x", "y")      # y = 0.5 y0 + 2 x
    client.vec_scale(-1.0, "y")         # y = -(0.5 y0 + 2 x)
    client.vec_copy("y", "param")
    got = client.fetch()
    for n in shapes:
        np.testing.assert_allclose(got[n], -(0.5 * y[n] + 2 * x[n]), rtol=1e-6)
    assert set(client.versions.values()) == {1}  # writing "param" is a new version
    client.vec_zero("x")
    assert client.vec_dot("x", "x") == 0.0
    assert client.accumulate("x", "t0", x)["accepted"]  # zeroing forgets the accepted tasks
    client.vec_drop("x")
    assert client.vec_dot("x", "param") == 0.0  # a fresh vector is zero
    client.close()


def test_a_retried_axpy_is_done_once(tmp_path, monkeypatch):
    """The first axpy's reply comes after the client gave up on it, so the client sends it
    again; the shard runs both requests but adds alpha * x only once."""
    slow_once = []
    axpy = Shard.vec_axpy

    def late_axpy(self, *args, **kwargs):
        if not slow_once:
            slow_once.append(1)
            time.sleep(0.6)
        return axpy(self, *args, **kwargs)

    monkeypatch.setattr(Shard, "vec_axpy", late_axpy)
    with ShardThread(f"ipc://{tmp_path}/ps0", 0) as t:
        client = PSClient([t.address], Layout.build({"w": (3,)}, 1), timeout=0.3, retry_for=5)
        client.init({"w": np.zeros(3, np.float32)}, {"name": "sgd", "lr": 1.0}, [0])
        client.accumulate("g", "t0", {"w": np.ones(3, np.float32)})
        client.vec_axpy(2.0, "g", "param")
        assert client.retries >= 1
        np.testing.assert_array_equal(client.fetch()["w"], [2, 2, 2])  # not 4
        client.vec_axpy(2.0, "g", "param")  # a new call is a new write
        np.testing.assert_array_equal(client.fetch()["w"], [4, 4, 4])
        client.close()


def test_a_replica_is_not_gated_on_its_own_clock_a_restored_shard_lost():
    """A shard restored from an older checkpoint holds clocks from then: a replica that asks
    at its real clock is not held back by its own old one (it would wait for a push it never
    makes: test_replica_faults saw replica 1 wait 30 s and be dropped), nor are two replicas
    both behind there held back by each other."""
    shard = make_shard(replicas=(0, 1))
    for step in range(5):
        shard.push(0, step, {"w[0:6]": np.zeros(6, np.float32)})
    for step in range(2):
        shard.push(1, step, {"w[0:6]": np.zeros(6, np.float32)})  # its pushes 2-4 were lost
    assert shard.clock_ok(1, 5, staleness=2)  # clocks 5 and 5: it ran steps 0-4
    both = make_shard(replicas=(0, 1))  # restored with both replicas at clock 0, both at the gate
    assert not both.clock_ok(0, 7, staleness=1)  # replica 1 is at 0 as far as it knows
    assert both.clock_ok(1, 6, staleness=1) and both.clock_ok(0, 7, staleness=1)


# -- checkpoints ----------------------------------------------------------------------------------

def test_checkpoint_round_trip_restores_everything(tmp_path):
    shard = make_shard(checkpoint_dir=tmp_path, opt={"name": "adagrad", "lr": 0.1})
    rng = np.random.default_rng(3)
    for step in range(3):
        shard.push(0, step, {"w[0:6]": rng.standard_normal(6).astype(np.float32)})
    shard.push(1, 0, {"w[0:6]": np.ones(6, np.float32)}, mode="bsp")  # held
    shard.accumulate("sb/g", "task-1", {"w[0:6]": np.ones(6, np.float32)})
    shard.drop(2, "test")
    shard.clock_ok(0, 3, 2)
    paths = [shard.checkpoint() for _ in range(3)]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(p) for p in paths[1:]]  # keep 2
    back = Shard(0, checkpoint_dir=tmp_path)
    assert str(back.restored_from) == paths[-1]
    np.testing.assert_array_equal(back.params["w[0:6]"], shard.params["w[0:6]"])
    np.testing.assert_array_equal(back.optimizer.state["w[0:6]"]["sum_sq"],
                                  shard.optimizer.state["w[0:6]"]["sum_sq"])
    assert back.optimizer.spec() == shard.optimizer.spec()
    assert back.versions == shard.versions == {"w[0:6]": 3}
    assert (back.last_step, back.clock, back.live) == (shard.last_step, shard.clock, shard.live)
    assert back.accepted == {"sb/g": {"task-1"}}
    np.testing.assert_array_equal(back.vectors["sb/g"]["w[0:6]"], np.ones(6))
    assert back.pending[0].pushed == {"w[0:6]": {1}}
    assert back.push(0, 2, {"w[0:6]": np.ones(6, np.float32)})["duplicate"]  # still applied
    init = back.init({"w[0:6]": np.zeros(6, np.float32)}, {"name": "sgd", "lr": 1.0}, [0, 1, 2])
    assert init == {"restored": True, "versions": {"w[0:6]": 3},  # the checkpoint's values win
                    "resumed": {"path": paths[-1], "dir": str(tmp_path), "updates": 3,
                                "optimizer": shard.optimizer.spec()}}  # (sgd was asked for)
    np.testing.assert_array_equal(back.params["w[0:6]"], shard.params["w[0:6]"])


def test_checkpoints_are_written_automatically(tmp_path):
    shard = make_shard(checkpoint_dir=tmp_path, checkpoint_every=3, checkpoint_seconds=60)
    newest = lambda: ckpt.checkpoints(tmp_path, 0)[-1].name  # noqa: E731
    assert newest() == "shard0-0000000001.npz"  # written by init
    for step in range(2):
        shard.push(0, step, {"w[0:6]": np.ones(6, np.float32)})
        shard.tick()
    assert newest() == "shard0-0000000001.npz"
    shard.push(0, 2, {"w[0:6]": np.ones(6, np.float32)})
    shard.tick()
    assert newest() == "shard0-0000000002.npz"
    shard.push(0, 3, {"w[0:6]": np.ones(6, np.float32)})
    shard.tick(now=shard._last_checkpoint + 30)
    assert newest() == "shard0-0000000002.npz"
    shard.tick(now=shard._last_checkpoint + 61)  # the timer, one change since the last
    assert newest() == "shard0-0000000003.npz"
    assert Shard(0, checkpoint_dir=tmp_path).versions == {"w[0:6]": 4}


def test_unusable_checkpoints_are_skipped(tmp_path, caplog):
    shard = make_shard(checkpoint_dir=tmp_path)
    shard.push(0, 0, {"w[0:6]": np.ones(6, np.float32)})
    good = shard.checkpoint()
    (tmp_path / "shard0-0000000009.npz").write_bytes(b"PK\x03\x04 not really a zip")
    np.savez(tmp_path / "shard0-0000000010.npz", meta=np.zeros(3, np.uint8),
             a0=np.array([{"evil": 1}], dtype=object))  # a pickle: refused unread
    (tmp_path / ".shard0-abc.tmp").write_bytes(b"half a checkpoint")
    with caplog.at_level(logging.WARNING, logger="graphflow.ps"):
        back = Shard(0, checkpoint_dir=tmp_path)
    assert str(back.restored_from) == good and back.versions == {"w[0:6]": 1}
    assert "shard0-0000000010.npz" in caplog.text and "shard0-0000000009.npz" in caplog.text
    assert not (tmp_path / ".shard0-abc.tmp").exists()
    assert Shard(1, checkpoint_dir=tmp_path).restored_from is None  # another index's files
    with pytest.raises(ShardError, match="no checkpoint directory"):
        make_shard().checkpoint()
