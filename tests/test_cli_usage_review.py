"""A review of the data-parallel command line: a bad combination of options is a usage error
(exit 2, `graphflow CMD: error: ...`) found before any work starts (no model loaded, no
shard served, nothing written), and names the options and values at fault."""

import argparse

import numpy as np
import pytest

from graphflow import modelspec, train_command
from graphflow.ps import Shard
from graphflow.ps import __main__ as ps_main

SGD_SPEC = {"name": "sgd", "lr": 0.1}


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or serving a shard fails the test: a usage error comes before both.
    Returns the keyword arguments a shard would have been served with (a list, once)."""
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the usage error")

    served = []
    monkeypatch.setattr(modelspec, "load_trainable", load)
    monkeypatch.setattr(ps_main, "serve_shard", lambda *a, **kw: served.append(kw))
    monkeypatch.setattr(ps_main.signal, "signal", lambda *a: None)  # (this process's)
    return served


def cluster_file(tmp_path, workers):
    path = tmp_path / "c.toml"
    listed = ", ".join(f'"tcp://127.0.0.1:{45900 + i}"' for i in range(workers))
    path.write_text(f'workers = [{listed}]\nps_host = "127.0.0.1"\n')
    return str(path)


def test_ssp_warm_start_past_the_staleness_is_a_usage_error(cli_here, no_work):
    code, _, err = cli_here("train", "--replicas", "2", "--sync", "ssp", "--warm-start", "5",
                            "--steps", "10")
    assert code == 2 and err.startswith("graphflow train: error: --warm-start 5"), err
    assert "--staleness 2 + 1" in err


@pytest.mark.parametrize("options, workers, message", [
    (["--replicas", "2"], 3, "lists 3 worker(s): not a multiple of --replicas 2"),
    (["--replicas", "2", "--parts", "3"], 4,
     "--parts 3, but {file} lists 4 workers: 2 for each of --replicas 2"),
    (["--parts", "2"], 3, "--parts 2, but {file} lists 3 workers, one a part")])
def test_a_cluster_file_of_the_wrong_size_is_a_usage_error(cli_here, no_work, tmp_path,
                                                           options, workers, message):
    hosts = cluster_file(tmp_path, workers)
    code, _, err = cli_here("train", "--cluster", hosts, *options, "--steps", "2")
    assert code == 2 and "graphflow train: error: " in err, err
    assert message.format(file=hosts) in err, err


@pytest.mark.parametrize("options, message", [
    (["--mode", "processes"], "--mode processes places the workers of a split model"),
    (["--parts", "2", "--mode", "processes", "--cluster", "{file}"],
     "--mode processes places local workers: --cluster FILE's are remote")])
def test_a_mode_that_would_place_nothing_is_a_usage_error(cli_here, no_work, tmp_path,
                                                          options, message):
    hosts = cluster_file(tmp_path, 2)
    code, _, err = cli_here("train", *[o.format(file=hosts) for o in options])
    assert code == 2 and message in err, err


@pytest.mark.parametrize("address", ["foo", "tcp://:5555", "tcp://127.0.0.1", "ipc://",
                                     "inproc://ps0"])
def test_a_malformed_listen_address_is_a_usage_error(cli_here, no_work, address):
    code, _, err = cli_here("ps", "--listen", address)
    assert code == 2 and "graphflow ps: error: argument --listen" in err, err
    assert f"'{address}'" in err and not no_work


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf", "soon"])
def test_checkpoint_seconds_must_be_a_finite_number_not_below_zero(cli_here, no_work,
                                                                   tmp_path, value):
    code, _, err = cli_here("ps", "--listen", "tcp://127.0.0.1:*", "--checkpoint-dir",
                            tmp_path, f"--checkpoint-seconds={value}")
    assert code == 2 and "argument --checkpoint-seconds" in err and value in err, err
    assert not no_work


def test_checkpoint_seconds_zero_is_never_and_needs_a_directory(cli_here, no_work, tmp_path):
    code, _, err = cli_here("ps", "--listen", "tcp://127.0.0.1:*", "--checkpoint-seconds", "5")
    assert code == 2 and "--checkpoint-seconds" in err and "--checkpoint-dir" in err, err
    code, _, err = cli_here("ps", "--listen", "tcp://127.0.0.1:*", "--checkpoint-dir",
                            tmp_path, "--checkpoint-seconds", "0")
    assert code == 0 and no_work[0]["checkpoint_seconds"] == 0.0, err
    with pytest.raises(ValueError, match="checkpoint_seconds must be >= 0"):
        Shard(0, checkpoint_dir=tmp_path, checkpoint_seconds=float("nan"))


@pytest.mark.parametrize("options, message", [
    (["--warm-start", "20", "--steps", "20"], "--warm-start 20 is not less than --steps 20:"),
    (["--warm-start", "1500"],
     "--warm-start 1500 is not less than --steps 1500 (the default for digits-lc)")])
def test_a_warm_start_as_long_as_the_run_is_a_usage_error(cli_here, no_work, options,
                                                          message):
    code, _, err = cli_here("train", "digits-lc", "--replicas", "2", *options)
    assert code == 2 and message in err, err


@pytest.mark.parametrize("command", [["train", "--replicas", "2"],
                                     ["ps", "--listen", "tcp://127.0.0.1:*"]])
def test_a_checkpoint_dir_that_is_a_file_is_a_usage_error(cli_here, no_work, tmp_path,
                                                          command):
    plain = tmp_path / "ckpt"
    plain.write_text("not a directory")
    code, _, err = cli_here(*command, "--checkpoint-dir", plain)
    assert code == 2 and f"'{plain}' is a file, not a directory" in err, err
    assert "Errno" not in err and not no_work


def checkpoints_of(directory, slices_by_shard):
    """Checkpoints of len(slices_by_shard) shards in `directory`, as a run leaves them."""
    for i, slices in enumerate(slices_by_shard):
        values = {key: np.zeros(n, np.float32) for key, n in slices.items()}
        Shard(i, len(slices_by_shard), checkpoint_dir=directory).init(values, SGD_SPEC, [0, 1])
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


@pytest.mark.parametrize("held, options, message", [
    ([{"other/W[0:10]": 10}, {"other/W[10:20]": 10}], [],
     "holds the checkpoints of another model, or of another --parts / --strategy split of "
     "it (parameter "),
    ([{"a[0:1]": 1}, {"a[1:2]": 1}, {"a[2:3]": 1}], [],
     "holds the checkpoints of 3 shards, not of --ps-shards 2: --ps-shards 3 resumes them"),
    ([{"a[0:1]": 1}, {"a[1:2]": 1}], ["--ps-shards", "3"],
     "holds the checkpoints of 2 shards, not of --ps-shards 3")])
def test_a_refused_resume_writes_nothing_and_says_why(cli_here, tmp_path, held, options,
                                                      message):
    directory = tmp_path / "ckpt"
    before = checkpoints_of(directory, held)
    code, _, err = cli_here("train", "digits-lc", "--replicas", "2", "--steps", "2",
                            "--no-progress", "--checkpoint-dir", directory, *options)
    assert code == 2, err
    assert f"graphflow train: error: --checkpoint-dir {directory} {message}" in err, err
    after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}
    assert after == before  # no log, no new checkpoint, no old one pruned


def test_a_shard_served_on_another_shard_counts_checkpoints_is_refused(cli_here, no_work,
                                                                       tmp_path):
    checkpoints_of(tmp_path, [{"a[0:1]": 1}, {"a[1:2]": 1}])
    code, _, err = cli_here("ps", "--listen", "tcp://127.0.0.1:*", "--checkpoint-dir",
                            tmp_path, "--shards", "1")
    assert code == 2 and f"--checkpoint-dir {tmp_path} holds checkpoints of shard 1" in err
    assert "--shards 1" in err and not no_work
    code, _, err = cli_here("ps", "--listen", "tcp://127.0.0.1:*", "--checkpoint-dir",
                            tmp_path, "--shards", "2", "--index", "1")
    assert code == 0 and len(no_work) == 1, err


def test_a_resume_of_the_same_model_is_not_refused(tmp_path):
    """The check before the run refuses only what the shards would refuse."""
    from graphflow.models import digits_lc
    from graphflow.ps.layout import Layout

    model = digits_lc(batch=None)
    shapes = {p.name: p.shape for p in model.graph.parameters()}
    layout = Layout.build(shapes, 2)
    checkpoints_of(tmp_path, [{k: layout.slice(k).size for k in layout.keys_on(s)}
                              for s in range(2)])
    parser = argparse.ArgumentParser()
    train_command.configure(parser.add_subparsers())
    args = parser.parse_args(["train", "--replicas", "2", "--checkpoint-dir", str(tmp_path)])
    train_command._check_resume(args, model, 1)  # (no UsageError)


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--quick"]])
def test_bench_without_a_suite_lists_the_suites(cli_here, argv):
    code, _, err = cli_here(*argv)
    assert code == 2, err
    assert "graphflow bench: error: choose a suite: speedup, convergence, ps, sync" in err, err
    code, out, _ = cli_here("bench", "--help")
    assert code == 0 and "speedup" in out and "sync" in out
