"""A model of the user's own through the commands: `graphflow train`, `show` and `bench speedup`
take MODEL as `graphflow visualize` does (file.py:function, module:function, file.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import graphflow as gf
from graphflow.bench import speedup
from graphflow.datasets import synthetic_for
from graphflow.errors import GraphflowError
from graphflow.modelspec import load_trainable, trainable

MODEL_FILE = textwrap.dedent("""
    import graphflow as gf

    def build_model():  # (graph, loss): the commands find the input, labels and logits
        with gf.Graph(seed=3) as g:
            x = gf.placeholder("x", (None, 20))
            y = gf.placeholder("y", (None,), "int32")
            h = gf.relu(gf.layers.dense(x, 32, name="hidden"))
            h = gf.relu(gf.layers.dense(h, 32, name="hidden2"))
            loss = gf.softmax_cross_entropy(gf.layers.dense(h, 5, name="scores"), y)
        return g, loss

    def regression():
        with gf.Graph(seed=4) as g:
            x = gf.placeholder("x", (None, 6))
            t = gf.placeholder("t", (None, 3))
            h = gf.tanh(gf.layers.dense(x, 16, name="h"))
            return g, gf.mse(gf.layers.dense(h, 3, name="pred"), t)

    def blows_up():  # the log of a layer's outputs, half of them negative: NaN
        with gf.Graph(seed=5) as g:
            x = gf.placeholder("x", (None, 8))
            y = gf.placeholder("y", (None,), "int32")
            h = gf.log(gf.layers.dense(x, 8, name="fc1"))
            return g, gf.softmax_cross_entropy(gf.layers.dense(h, 3, name="fc2"), y)

    def forward_only():
        with gf.Graph() as g:
            gf.layers.dense(gf.placeholder("x", (None, 8)), 4, name="fc")
        return g
""")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "my_models.py"
    path.write_text(MODEL_FILE)
    return path


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "graphflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def train_json(*args):
    r = cli("train", *args, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_a_graph_and_loss_become_a_model(model_file):
    m = load_trainable(str(model_file))
    assert (m.name, m.x.name, m.y.name, m.logits.name) == ("my_models", "x", "y", "scores/add")
    data = synthetic_for(m, n=40, seed=1)
    assert data.x_train.shape == (40, 20) and data.y_train.dtype.name == "int32"
    assert 0 <= data.y_train.min() and data.y_train.max() < 5 and data.classes == 5
    r = load_trainable(f"{model_file}:regression")
    assert (r.name, r.x.name, r.y.name, r.logits.name) == ("my_models:regression", "x", "t",
                                                            "pred/add")
    data = synthetic_for(r, n=8)
    assert data.y_train.shape == (8, 3) and data.y_train.dtype.name == "float32"


def _no_loss():
    with gf.Graph() as g:
        gf.layers.dense(gf.placeholder("x", (None, 4)), 2, name="fc")
    return g, None


def _other_loss():
    with gf.Graph() as g:
        out = gf.layers.dense(gf.placeholder("x", (None, 4)), 2, name="fc")
        return g, gf.reduce_sum(out)


def _computed_labels():
    with gf.Graph() as g:
        x, t = gf.placeholder("x", (None, 4)), gf.placeholder("t", (None, 2))
        return g, gf.mse(gf.layers.dense(x, 2, name="fc"), gf.relu(t, name="clipped"))


def _two_inputs():
    with gf.Graph() as g:
        a, b = gf.placeholder("a", (None, 4)), gf.placeholder("b", (None, 4))
        y = gf.placeholder("y", (None,), "int32")
        return g, gf.softmax_cross_entropy(gf.layers.dense(gf.add(a, b), 3, name="fc"), y)


def _open_width():
    with gf.Graph() as g:
        x, t = gf.placeholder("x", (None, None)), gf.placeholder("t", (None, 1))
        return g, gf.mse(gf.reduce_sum(x, 1, keepdims=True), t)


@pytest.mark.parametrize("build, expected", [
    (_no_loss, "has no loss"),
    (_other_loss, "is a reduce_sum"),
    (_computed_labels, "are 'clipped' (relu), not a placeholder"),
    (_two_inputs, "has 2 input placeholders besides the labels 'y' (a, b)"),
    (_open_width, "placeholder 'x' (None, None) has a size other than the batch's left open"),
])
def test_what_training_cannot_feed_is_named(build, expected):
    graph, loss = build()
    with pytest.raises(GraphflowError, match="MODEL 'm.py'") as e:
        trainable("m", graph, loss, "m.py")
    assert expected in str(e.value)


def test_train_split_in_two_equals_one_process_and_learns(model_file):
    common = ("--steps", 25, "--batch", 16, "--optimizer", "sgd", "--lr", 0.1)
    alone = train_json(model_file, *common)
    split = train_json(model_file, *common, "--parts", 2, "--strategy", "layerwise")
    assert alone["workload"] == str(model_file) and alone["steps"] == 25
    assert split["final_loss"] == pytest.approx(alone["final_loss"], rel=1e-5, abs=1e-6)
    first = train_json(model_file, "--steps", 1, "--batch", 16, "--optimizer", "sgd",
                       "--lr", 0.1)
    # 64 random samples, seen six times over: a net that trains fits them
    assert alone["final_loss"] < 0.8 * first["final_loss"]


def test_train_a_regression_with_its_own_defaults(model_file):
    result = train_json(f"{model_file}:regression")
    assert result["steps"] == 20 and result["batch"] == 64
    first = train_json(f"{model_file}:regression", "--steps", 1)
    assert 0 < result["final_loss"] < first["final_loss"]


def test_show_prints_an_own_models_graph_and_plan(model_file):
    r = cli("show", model_file)
    assert r.returncode == 0 and "hidden2" in r.stdout and "# " in r.stdout
    r = cli("show", model_file, "--parts", 2, "--strategy", "all")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("my_models on 2 workers, batch 64:")
    assert all(s in r.stdout for s in ("spatial", "layerwise", "mincut"))
    r = cli("show", f"{model_file}:forward_only", "--backward")
    assert r.returncode == 1 and "has no loss to differentiate" in r.stderr


def test_train_names_a_model_it_cannot_find(model_file):
    r = cli("train", "no-such-model")
    assert r.returncode == 1
    assert "no module named 'no-such-model'" in r.stderr and "digits-lc" in r.stderr
    r = cli("train", f"{model_file}:forward_only")
    assert r.returncode == 1 and "has no loss" in r.stderr


def test_bench_speedup_times_an_own_model(model_file, tmp_path, capsys):
    out = tmp_path / "speedup.json"
    code = speedup.main(["--quick", "--workloads", f"{model_file}:build_model", "--mode",
                         "threads", "--strategies", "layerwise", "--microbatches", "1",
                         "--no-progress", "--cached-calibration", "--json", str(out),
                         "--png", str(tmp_path / "s.png")])
    assert code == 0
    points = json.loads(out.read_text())["workloads"]["my_models"]["points"]
    assert [(p["strategy"], p["workers"]) for p in points] == [("(any)", 1), ("layerwise", 2)]
    assert all(p["median_s"] > 0 and p["predicted_s"] > 0 for p in points)
    assert "machine ceiling (my_models)" in capsys.readouterr().out
    assert speedup.main(["--workloads", f"{model_file}:forward_only"]) == 2
    assert "has no loss" in capsys.readouterr().err


def test_show_and_visualize_time_the_kernels_they_predict_by_once(model_file, tmp_path,
                                                                   no_kernels_timed):
    from graphflow.costmodel import kernels
    from graphflow.modelspec import load_model
    from graphflow.partitioners import partition

    env = {"GRAPHFLOW_COSTMODEL": str(no_kernels_timed)}
    r = cli("show", model_file, "--parts", 2, "--strategy", "layerwise", env=env)
    assert r.returncode == 0 and "kernels on this machine" in r.stderr, r.stderr
    _, graph, loss = load_model(str(model_file))
    plan = partition(graph, 2, "layerwise", loss=loss)
    cached = {sig for entry in json.loads(no_kernels_timed.read_text())["machines"].values()
              for sig in entry["measured"]}
    assert set(kernels(plan.graph, 64)) <= cached
    r = cli("visualize", model_file, "--parts", 2, "--strategy", "layerwise", "-o",
            tmp_path / "p.svg", env=env)
    assert r.returncode == 0 and "kernels on this machine" not in r.stderr  # timed already
    timed = cli("show", model_file, "--parts", 2, "--strategy", "layerwise", env=env)
    # --estimate reads the same cache (the workers' thread setup's), and times nothing
    estimated = cli("show", model_file, "--parts", 2, "--strategy", "layerwise", "--estimate",
                    env=env)
    assert estimated.stdout == timed.stdout and estimated.stderr == ""
    fresh = {"GRAPHFLOW_COSTMODEL": str(tmp_path / "none.json")}
    r = cli("show", model_file, "--parts", 2, "--estimate", env=fresh)
    assert r.returncode == 0 and not (tmp_path / "none.json").exists()
    # ... and says it priced every kernel by FLOPs and bytes
    (note,) = r.stderr.splitlines()
    assert note.endswith("kernels not timed: estimated from FLOPs and bytes (run without "
                         "--estimate to time them)"), r.stderr


def test_options_that_would_be_ignored_are_refused(model_file, tmp_path, cli_here):
    for args, expected in ((("--microbatches", "2"), "--microbatches pipelines one model"),
                           (("--parts", "2", "--replicas", "2", "--microbatches", "2"),
                            "and no --replicas"),
                           (("--check-numerics", "--replicas", "2"), "--check-numerics checks"),
                           (("--timeout", "5"), "--timeout is for workers: it needs --parts N"),
                           (("--parts", "2", "--connect-timeout", "5"), "needs --cluster FILE"),
                           (("--parts", "2", "--timeout", "0"),
                            "must be > 0 seconds and finite, got 0")):
        code, _, err = cli_here("train", model_file, *args, "--no-progress")
        assert code == 2 and expected in err, (args, err[-500:])
    hosts = tmp_path / "two.toml"
    hosts.write_text('workers = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]\n')
    r = cli("train", model_file, "--parts", "3", "--cluster", hosts, "--no-progress")
    assert r.returncode == 2 and "--parts 3, but" in r.stderr and "lists 2 workers" in r.stderr


def test_manual_placement_without_scopes_names_the_idle_worker(model_file):
    r = cli("train", model_file, "--parts", "2", "--strategy", "manual", "--steps", "1",
            "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: worker(s) 1 got no nodes from the manual strategy" in r.stderr


def test_check_numerics_stops_a_split_model_at_the_node(model_file):
    args = ("train", f"{model_file}:blows_up", "--parts", "2", "--strategy", "layerwise",
            "--steps", "2", "--no-progress")
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]  # NaN losses, unchecked
    r = cli(*args, "--check-numerics")
    assert r.returncode == 1 and "log" in r.stderr and "NaN" in r.stderr, r.stderr[-2000:]


def test_connect_timeout_reaches_a_cluster_files_workers(model_file, tmp_path):
    with socket.socket() as s:  # a port nobody serves
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts = tmp_path / "nobody.toml"
    hosts.write_text(f'workers = ["tcp://127.0.0.1:{port}", "tcp://127.0.0.1:{port + 1}"]\n')
    start = time.monotonic()
    r = cli("train", model_file, "--cluster", hosts, "--connect-timeout", "1", "--timeout", "30",
            "--no-progress")
    assert r.returncode == 1 and "did not answer within 1s" in r.stderr, r.stderr[-1000:]
    assert f"127.0.0.1:{port}" in r.stderr and time.monotonic() - start < 60


def test_a_split_trainer_hands_its_timeouts_to_the_cluster(model_file):
    trainer = gf.train.PartitionedTrainer(load_trainable(str(model_file)), gf.optim.SGD(0.1), 2,
                                          timeout=7.0, connect_timeout=3.0)
    try:
        assert trainer.cluster.timeout == 7.0 and trainer.cluster.connect_timeout == 3.0
    finally:
        trainer.close()


def test_a_module_of_the_current_folder_is_found_as_python_m_finds_it(tmp_path):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""\
        import graphflow as gf

        def build():
            with gf.Graph() as g:
                x = gf.placeholder("x", (None, 4))
                gf.relu(x, name="h")
            return g
        """))
    # the `graphflow` script's sys.path has its own folder first, not the current one
    code = ("import os, sys; sys.path = [p for p in sys.path if p not in ('', os.getcwd())]; "
            "from graphflow.cli import main; sys.exit(main(['show', 'my_models:build']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "h: float32[N, 4] = relu(x)" in r.stdout, r.stderr
