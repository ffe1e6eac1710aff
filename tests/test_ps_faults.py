"""A parameter-server shard in its own process: SIGKILLed and restarted from its checkpoint,
while a client with retries keeps pushing."""

import os
import signal
import threading
import time

import numpy as np
import pytest

from graphflow.ps import Layout, PSClient, ShardStartError, start_shard_process
from graphflow.ps import checkpoint as ckpt

N = 1000


def test_killed_shard_restarts_from_its_checkpoint_and_the_client_retries(tmp_path):
    address, ckpt_dir = f"ipc://{tmp_path}/ps0", tmp_path / "ckpt"
    proc = start_shard_process(address, 0, 1, checkpoint_dir=ckpt_dir, checkpoint_every=4,
                               timeout=30.0)
    layout = Layout.build({"w": (N,)}, 1)
    client = PSClient([proc.address], layout, timeout=0.5, retry_for=30.0)
    restarted = None
    try:
        client.init({"w": np.zeros(N, np.float32)}, {"name": "sgd", "lr": 1.0}, [0])
        for step in range(8):  # an automatic checkpoint after 4 and after 8 updates
            client.push(0, step, {"w": np.full(N, 1.0, np.float32)})
        client.fetch()  # the loop ticks (and checkpoints) before answering this
        assert client.stats()[0]["checkpoints"] == 3  # at init, after 4 and 8 updates
        saved = client.checkpoint()[0]  # forced: the same state, a newer file
        assert len(ckpt.checkpoints(ckpt_dir, 0)) == 2
        client.push(0, 8, {"w": np.full(N, 100.0, np.float32)})  # after the checkpoint: lost
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(10)

        result = {}
        pusher = threading.Thread(target=lambda: result.update(
            client.push(0, 9, {"w": np.full(N, 2.0, np.float32)})))
        pusher.start()  # the shard is down: this push times out and is retried
        time.sleep(1.2)
        assert pusher.is_alive() and client.retries >= 1
        restarted = start_shard_process(address, 0, 1, checkpoint_dir=ckpt_dir,
                                        checkpoint_every=4, timeout=30.0)
        pusher.join(35.0)
        # applied by one attempt; a later attempt (if the reply came late) was a duplicate
        assert not pusher.is_alive() and (result["applied"] or result["duplicate"])

        stats = client.stats()[0]
        assert stats["restored"] == saved
        assert stats["versions"] == {"w[0:1000]": 9}  # 8 checkpointed + the retried one
        np.testing.assert_array_equal(client.fetch()["w"], np.full(N, -10.0))
        assert client.push(0, 9, {"w": np.ones(N, np.float32)})["duplicate"]
        assert "restored" in restarted.log_tail()
    finally:
        client.close()
        for p in (proc, restarted):
            if p is not None:
                p.stop()


def test_a_shard_that_cannot_start_is_reported_with_its_log(tmp_path):
    with pytest.raises(ShardStartError, match="(?s)exited with code 1.*cannot bind"):
        start_shard_process("tcp://256.0.0.1:1", 0, 1, log_path=tmp_path / "ps.log",
                            timeout=30.0)


def test_bench_ps_quick_run_writes_json(tmp_path, capsys):
    import json

    from graphflow.bench import ps as bench

    out = tmp_path / "ps.json"
    assert bench.main(["--quick", "--shards", "1", "--no-progress", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    whats = [(p["what"], p["shards"]) for p in doc["points"]]
    assert whats == [("bare pyzmq round trip", 1), ("ps push (adagrad)", 1), ("ps push", 1)]
    assert all(p["median_pushes_per_s"] > 0 and len(p["pushes_per_s"]) == 2
               for p in doc["points"])
    assert doc["ratio"] > 0 and doc["met"] == (doc["ratio"] >= 0.6)
    assert "ps push (adagrad)" in capsys.readouterr().out
    assert bench.main(["--shards", "x"]) == 2
