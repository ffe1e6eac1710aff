"""A user's mistakes at the command line: each is a usage error (exit 2) or an error (exit 1)
on stderr that names what was wrong and where, never a traceback or a silent no-op."""

import argparse
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import graphflow as gf
from graphflow.modelspec import figure_batch
from graphflow.trace.summary import steady


def model_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_model_files_own_mistakes_name_its_file_and_line(cli_here, tmp_path):
    bad = model_file(tmp_path, "syntax.py", "import graphflow as gf\ndef build_model(:\n")
    code, _, err = cli_here("show", bad)
    assert code == 1 and f"syntax error at {bad}:2" in err and "Traceback" not in err, err
    raises = model_file(tmp_path, "raises.py", """\
        def helper():
            raise RuntimeError("no data here")

        def build_model():
            return helper()
        """)
    code, _, err = cli_here("show", raises)
    assert code == 1 and "build_model() raised RuntimeError: no data here" in err, err
    assert f"(at {raises}:2)" in err
    imports = model_file(tmp_path, "imports.py", "import graphflow as gf\nimport no_such_pkg_9\n")
    code, _, err = cli_here("show", imports)
    assert code == 1 and "No module named 'no_such_pkg_9'" in err and f"{imports}:2" in err, err
    code, _, err = cli_here("show", "no_such_pkg_9.models")  # a module that is not there
    assert code == 1 and "no module named 'no_such_pkg_9'" in err, err


def test_options_that_would_do_nothing_are_refused(cli_here):
    for args, named in [(["--sync", "bsp"], "--sync"), (["--compress", "float16"], "--compress"),
                        (["--checkpoint-dir", "ck"], "--checkpoint-dir"),
                        (["--strategy", "layerwise"], "--strategy"),
                        (["--parts", "2", "--microbatches", "2"], "--strategy layerwise"),
                        (["--parts", "2", "--strategy", "layerwise", "--schedule", "gpipe"],
                         "--microbatches")]:
        code, _, err = cli_here("train", "digits-lc", "--steps", "1", *args)
        assert code == 2 and named in err, (args, err)


def test_bad_values_are_usage_errors_naming_the_option(cli_here):
    for value in ("0", "nan", "-1", "inf"):
        code, _, err = cli_here("train", "--lr", value)
        assert code == 2 and "--lr" in err and "must be > 0 and finite" in err, (value, err)
    code, _, err = cli_here("train", "--replicas", "2", "--compress", "topk:2")
    assert code == 2 and "--compress" in err and "0 < F <= 1" in err, err
    code, _, err = cli_here("worker", "--listen", "tcp://127.0.0.1:70000")
    assert code == 2 and "1 to 65535" in err and "70000" in err, err  # zmq would wrap it to 4464


def test_a_fixed_batch_is_the_figures_batch(cli_here, tmp_path):
    with gf.Graph() as g:
        gf.placeholder("x", (8, 20))
    assert figure_batch(g, None) == figure_batch(g, 8) == 8
    with pytest.raises(gf.GraphflowError, match=r"placeholder 'x' \(8, 20\) fixes its batch"):
        figure_batch(g, 64)
    with gf.Graph() as g:
        gf.placeholder("x", (None, 20))
    assert figure_batch(g, None) == 64 and figure_batch(g, 5) == 5
    fixed = model_file(tmp_path, "fixed.py", """\
        import graphflow as gf

        def build_model():
            with gf.Graph() as g:
                x = gf.placeholder("x", (8, 20))
                y = gf.placeholder("y", (8,), dtype="int32")
                loss = gf.softmax_cross_entropy(gf.layers.dense(x, 5, name="fc"), y)
            return g, loss
        """)
    code, out, err = cli_here("show", fixed, "--parts", "2", "--estimate")
    assert code == 0 and "batch 8" in out, (out, err)


def test_the_timeline_summary_leaves_the_compiling_step_out():
    steps = [(0.0, 1000.0), (1000.0, 1100.0), (1100.0, 1200.0), (1200.0, 1300.0)]
    assert steady(steps) == steps[1:]
    assert steady(steps, last=2) == steps[-2:]
    assert steady(steps[:2]) == steps[:2]  # too few to leave one out


def test_output_cut_short_by_a_closed_pipe_is_no_error():
    r, w = os.pipe()
    os.close(r)  # like `graphflow ops | head -1` once head has gone
    try:
        p = subprocess.run([sys.executable, "-m", "graphflow.cli", "ops"], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_a_cluster_names_the_shape_the_caller_fed_not_a_workers_cut():
    m = gf.models.digits_lc(batch=None)
    plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
    x = np.zeros((4, 1, 32, 32), np.float32)
    y = np.zeros(4, np.int32)
    with gf.Cluster(plan) as cluster:
        with pytest.raises(gf.ShapeError, match=r"fed shape \(4, 1, 5, 32\), expected "
                                                r"\(N, 1, 32, 32\)"):
            cluster.step({"x": x[:, :, :5], "y": y})
        assert np.isfinite(cluster.step({"x": x, "y": y})["loss"])  # and it still steps


def test_a_lockstep_run_says_it_rounded_its_steps_up(cli_here):
    r = subprocess.run([sys.executable, "-m", "graphflow.cli", "train", "digits-lc",
                        "--replicas", "2", "--sync", "allreduce", "--steps", "3", "--json",
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    note = "allreduce runs its 2 replicas in lockstep: 3 steps rounded up to 4 (2 each)"
    assert f"graphflow train: note: {note}" in r.stderr
    result = json.loads(r.stdout)
    assert result["steps"] == 4 and result["replica_steps"] == {"0": 2, "1": 2}
    assert result["notes"] == [note] and result["failures"] == []
    code, _, err = cli_here("train", "--replicas", "2", "--sync", "bsp", "--warm-start", "3")
    assert code == 2 and "--warm-start" in err and "bsp" in err, err


def test_replicas_on_remote_workers_take_the_connect_timeout(cli_here, tmp_path):
    hosts = tmp_path / "c.toml"  # (nobody listens on these loopback ports)
    hosts.write_text('workers = ["tcp://127.0.0.1:45901", "tcp://127.0.0.1:45902"]\n'
                     'ps_host = "127.0.0.1"\n')
    code, _, err = cli_here("train", "digits-lc", "--cluster", hosts, "--replicas", "2",
                            "--connect-timeout", "0.5", "--steps", "1", "--no-progress")
    assert code == 1 and "tcp://127.0.0.1:45901 did not answer within 0.5s" in err, err


def test_a_window_with_nothing_to_draw_is_refused(cli_here, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    code, _, err = cli_here("timeline", trace, "--no-png", "--window", "100:200")
    assert code == 2 and "--window picks what to draw" in err and "--last-steps" in err, err


@pytest.mark.parametrize("args, message", [
    (["--sync", "allreduce", "--ps-shards", "3"],
     "--ps-shards does nothing with --sync allreduce: it is for --sync downpour or bsp or ssp "
     "or sandblaster"),
    (["--sync", "bsp", "--n-push", "3"], "--n-push does nothing with --sync bsp"),
    (["--sync", "ssp", "--n-fetch", "2"], "--n-fetch does nothing with --sync ssp"),
    (["--allreduce", "tree"], "--allreduce does nothing with --sync downpour"),
    (["--staleness", "5"], "--staleness does nothing with --sync downpour: it is for --sync ssp"),
    (["--sync", "allreduce", "--compress", "float16"], "--compress does nothing"),
    (["--sync", "sandblaster", "--lr", "0.1"], "--optimizer and --lr do nothing with --sync "
                                               "sandblaster")])
def test_a_replica_option_its_sync_mode_ignores_is_refused(args, message):
    from graphflow.train_command import configure, conflict

    parser = argparse.ArgumentParser()
    configure(parser.add_subparsers())

    def why(*extra):
        return conflict(parser.parse_args(["train", "digits-lc", "--replicas", "2", *extra]))

    assert message in why(*args)
    assert why("--sync", "ssp", "--staleness", "5", "--compress", "float16") is None
