"""A review of the data-parallel side: options checked when made, steps credited to the replica
that ran them and only once the shards took them, shard restarts in the record and the JSON,
each batch of a lockstep run used once. A softmax regression keeps the runs short."""

import json
import os
import signal
import textwrap
import time
from collections import Counter

import numpy as np
import pytest

import graphflow as gf
from graphflow.models import Model
from graphflow.optim import SGD
from graphflow.partitioners import partition
from graphflow.ps.client import PSClient, PSError
from graphflow.replicas import sandblaster
from graphflow.replicas.feed import Feed
from graphflow.replicas.manager import ReplicaManager, ReplicaOptions

D, C = 6, 3  # features, classes


def logreg() -> Model:
    with gf.Graph("float32", 0) as g:
        x = gf.placeholder("x", (None, D))
        y = gf.placeholder("y", (None,), "int32")
        logits = gf.layers.dense(x, C, name="fc")
        loss = gf.softmax_cross_entropy(logits, y, name="loss")
    return Model("logreg", g, x, y, logits, loss)


def batches(n, rows=4):
    """n batches; column 0 of x numbers the rows (100 k + i in batch k)."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        x = rng.standard_normal((rows, D)).astype(np.float32)
        x[:, 0] = 100 * k + np.arange(rows)
        out.append((x, (np.arange(rows) % C).astype(np.int32)))
    return out


def manager(replicas=2, shards=2, **kw):
    model = logreg()
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    return ReplicaManager(model, plan, SGD(0.01), replicas, shards,
                          ReplicaOptions(timeout=8.0, **kw))


# -- 1. options are checked when made ----------------------------------------------------------

@pytest.mark.parametrize(("kw", "message"), [
    ({"n_fetch": 0}, "n_fetch must be an int >= 1, got 0"),
    ({"n_push": -1}, "n_push must be an int >= 1, got -1"),
    ({"staleness": -1}, "staleness must be an int >= 0, got -1"),
    ({"warm_start": -2}, "warm_start must be an int >= 0, got -2"),
    ({"portions": 0}, "portions must be an int >= 1, got 0"),
    ({"mode": "hogwild"}, "unknown mode 'hogwild'"),
    ({"compress": "topk:2"}, "compress 'topk:2': bad top-k codec"),
    ({"compress": "zip"}, "compress 'zip': unknown gradient codec"),
    ({"placement": "cloud"}, "placement must be threads or processes .*got 'cloud'"),
    ({"shard_placement": "cloud"}, "shard_placement must be threads or processes, got 'cloud'"),
    ({"timeout": 0}, "timeout must be a number of seconds > 0, got 0"),
    ({"ps_timeout": -1.0}, "ps_timeout must be a number of seconds > 0, got -1.0"),
    ({"checkpoint_every": -5}, "checkpoint_every must be an int >= 0, got -5"),
    ({"slow": {0: -1}}, r"slow\[0\] must be a number of seconds >= 0, got -1"),
])
def test_bad_options_are_refused_when_made_naming_the_field(kw, message):
    """Before, only the mode was checked: n_fetch=0 or compress="zip" failed later, in a
    worker's ps_attach."""
    with pytest.raises(ValueError, match=message):
        ReplicaOptions(**kw)


@pytest.mark.parametrize(("replicas", "shards", "message"), [
    (0, 2, "replicas must be an int >= 1, got 0"),
    (2, 0, "shards must be an int >= 1, got 0"),
    (2.5, 2, "replicas must be an int >= 1, got 2.5")])
def test_replica_and_shard_counts_are_named(replicas, shards, message):
    model = logreg()
    plan = partition(model.graph, 1, "spatial", loss=model.loss)
    with pytest.raises(ValueError, match=message):
        ReplicaManager(model, plan, SGD(0.01), replicas, shards)


# -- 2. sandblaster credits the replica that ran each gradient portion --------------------------

def test_sandblaster_steps_are_credited_to_the_replicas_that_ran_them(monkeypatch):
    """Before, every step was recorded under replica 0 whoever computed it."""
    logs = []
    close = sandblaster.Sandblaster.close

    def keep_log(self):
        logs.append(self.log)
        close(self)

    monkeypatch.setattr(sandblaster.Sandblaster, "close", keep_log)
    with manager(mode="sandblaster", portions=4) as rm:
        record = rm.fit(batches(3, rows=8), 3)
    won = Counter(e["replica"] for e in logs[0] if e["won"])
    assert record.steps_run == 3
    assert record.steps_done == {0: won[0], 1: won[1]}, (record.steps_done, won)
    assert sum(record.steps_done.values()) >= 3 * 4  # every portion of every evaluation
    assert any(n.startswith("sandblaster: a replica's steps are the gradient portions")
               for n in record.notes)


# -- 3. a shard restart reaches the record and the JSON -----------------------------------------

MODEL_FILE = textwrap.dedent("""
    import graphflow as gf

    def build_model():
        with gf.Graph(seed=0) as g:
            x = gf.placeholder("x", (None, 6))
            y = gf.placeholder("y", (None,), "int32")
            loss = gf.softmax_cross_entropy(gf.layers.dense(x, 3, name="fc"), y)
        return g, loss
    """)


def test_a_restarted_shard_is_in_the_record_and_the_json(cli_here, tmp_path, monkeypatch):
    """Shard 0 is SIGKILLed at replica 0's 4th step (which waits for its restart): `graphflow
    train --json` says which shard, at which step, and the checkpoint it resumed from.
    Before, only the log said so."""
    fit = ReplicaManager.fit

    def fit_with_a_crash(self, *args, **kw):
        cluster, real = self.clusters[0], self.clusters[0].step
        calls = []

        def step(feeds):
            calls.append(1)
            if len(calls) == 4:
                os.kill(self.shards.pids[0], signal.SIGKILL)
                end = time.monotonic() + 30
                while not self.record.shard_restarts and time.monotonic() < end:
                    time.sleep(0.02)
            return real(feeds)

        cluster.step = step
        return fit(self, *args, **kw)

    monkeypatch.setattr(ReplicaManager, "fit", fit_with_a_crash)
    model = tmp_path / "tiny.py"
    model.write_text(MODEL_FILE)
    ckpt = tmp_path / "ckpt"
    code, out, err = cli_here("train", model, "--replicas", "2", "--checkpoint-dir", ckpt,
                              "--steps", "12", "--batch", "8", "--json", "--no-progress")
    assert code == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    [event] = result["shard_restarts"]
    assert event["shard"] == 0 and event["ended"] == "was killed by SIGKILL", event
    assert event["new_pid"] != event["pid"] and event["step"] >= 3, event
    assert event["checkpoint"].startswith(str(ckpt / "shard0-")), event
    note = [n for n in result["notes"] if n.startswith(f"shard 0 (pid {event['pid']})")]
    assert note and f"at step {event['step']}" in note[0], result["notes"]
    assert f"restarted as pid {event['new_pid']} from {event['checkpoint']}" in note[0]


# -- 4. downpour counts a step once the shards took its push ------------------------------------

def test_a_downpour_step_whose_push_never_reached_the_shards_is_not_counted(monkeypatch):
    """Replica 1's pushes fail from its step 3 on: it is dropped having run 4 or more steps,
    of which the shards took 3. Before, all it ran were counted (and the run was short of
    steps on the shards); now 3 are, and replica 0 runs the rest."""
    push = PSClient.push

    def losing_push(self, replica, step, *args, **kw):
        if replica == 1 and step >= 3:
            raise PSError("injected: push lost")
        return push(self, replica, step, *args, **kw)

    monkeypatch.setattr(PSClient, "push", losing_push)
    with manager(mode="downpour", slow={1: 0.01}) as rm:
        record = rm.fit(batches(60), 30)
        clocks = [dict(c["clocks"]) for c in rm.client.clocks().values()]
    assert len(record.failures) == 1 and "injected: push lost" in record.failures[0]
    assert record.steps_done[1] == 3, record.steps_done
    assert record.steps_run == sum(record.steps_done.values()) == 30, record.steps_done
    assert all(c == {0: record.steps_done[0], 1: 3} for c in clocks), clocks  # as the shards say
    assert any(n.startswith("replica 1: ") and "never reached the parameter server" in n
               for n in record.notes), record.notes


def test_the_last_downpour_push_is_numbered_as_the_last_step_run():
    """The gradients summed since the last push go out as the last step run: the shards' clock
    of a replica is then its steps (what counting accepted steps reads), and the next fit's
    first push is not taken for a repeat. Before, they went out as one step further on."""
    with manager(replicas=1, mode="downpour", n_push=2) as rm:
        rm.fit(batches(3), 3)  # pushes at step 1, then the rest (step 2) at the end
        after_one = [dict(c["clocks"]) for c in rm.client.clocks().values()]
        rm.fit(batches(2), 2)  # step 3 (summed), 4: one push
        after_two = [dict(c["clocks"]) for c in rm.client.clocks().values()]
    assert after_one == [{0: 3}, {0: 3}] and after_two == [{0: 5}, {0: 5}]


# -- 5. a lockstep run uses each batch once -----------------------------------------------------

@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_a_lockstep_run_whose_batches_run_out_uses_each_once(mode):
    """5 batches for 8 steps on 2 replicas: rounds (0, 1), (2, 3), then batch 4 shared out
    between the two (each runs half its rows). Before, both ran all of batch 4."""
    with manager(mode=mode) as rm:
        rows = []
        for cluster in rm.clusters:
            def step(feeds, real=cluster.step):
                rows.extend(feeds["x"][:, 0].astype(int).tolist())
                return real(feeds)
            cluster.step = step
        record = rm.fit(iter(batches(5)), 8)
        versions = set(rm.client.stats()[0]["versions"].values()) if mode == "bsp" else None
    assert sorted(rows) == sorted(100 * k + i for k in range(5) for i in range(4)), rows
    assert record.steps_run == 6 and not record.failures
    assert record.notes[-1] == "the batches ran out after 6 of 8 steps"
    if mode == "bsp":
        assert versions == {3}  # one update a round


def test_a_feed_without_a_split_leaves_a_short_round_out_and_repeats_nothing():
    feed = Feed(iter(range(5)), steps=8, replicas=[0, 1], mode="bsp")
    handed = []
    for _ in range(4):
        got = [feed.next(r) for r in (0, 1)]
        if None in got:
            break
        handed += got
        feed.finished(0)
        feed.finished(1)
    assert handed == [0, 1, 2, 3] and got == [None, None]
    assert feed.unused == 1 and feed.total_done == 4
