"""`graphflow visualize` as a command (graphflow.viz.command): MODEL forms, --json, errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

import graphflow as gf
from graphflow.errors import GraphflowError
from graphflow.viz import command
from tests.vizparse import parse_dot, parse_svg, svg_groups

MODEL_FILE = textwrap.dedent("""
    import graphflow as gf

    def build_model():
        return gf.models.digits_lc()

    def pair():
        m = gf.models.speech_mlp(batch=None)
        return m.graph, m.loss

    def forward_only():
        with gf.Graph() as g:
            x = gf.placeholder("x", (None, 8))
            gf.layers.dense(x, 4, name="fc")
        return g

    def broken():
        return 42
""")


def run(*argv):
    parser = argparse.ArgumentParser(prog="graphflow visualize")
    command.configure(parser)
    return command.run(parser.parse_args([str(a) for a in argv]))


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "mymodels.py"
    path.write_text(MODEL_FILE)
    return path


def test_reference_workload_to_svg_with_json_summary(tmp_path, capsys):
    out = tmp_path / "plan.svg"
    assert run("lc-large", "--parts", "4", "--strategy", "spatial", "-o", out, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    (p,) = summary["plans"]
    assert summary["model"] == "lc-large" and p["strategy"] == "spatial" and p["parts"] == 4
    # x, y, lc1, relu, lc2, relu_1, to_nchw, flatten, fc, loss: a box per layer
    m = gf.models.lc_large(batch=None)
    plan = gf.partition(m.graph, 4, "spatial", loss=m.loss)
    assert p["layers"] == 10 and p["transfers"] == len(plan.transfers) and len(p["workers"]) == 4
    # per worker, the nodes, sends and receives `graphflow show` reports
    assert [(w["nodes"], w["sends"], w["recvs"]) for w in p["workers"]] == \
        [(s.nodes, s.sends, s.recvs) for s in plan.stats(64)]
    assert p["predicted_step_ms"] > 0
    assert len(svg_groups(parse_svg(out.read_text()), "node")) == 10


def test_model_files_modules_and_the_default_function(tmp_path, model_file, capsys,
                                                      monkeypatch):
    run(model_file, "--parts", "2", "-o", tmp_path / "a.dot")  # build_model by convention
    nodes, _ = parse_dot((tmp_path / "a.dot").read_text())
    assert {"conv1", "lc2", "fc", "loss"} <= set(nodes)
    run(f"{model_file}:pair", "--parts", "3", "--strategy", "layerwise", "--detail", "ops",
        "-o", tmp_path / "b.svg")
    assert "wrote" in capsys.readouterr().out
    monkeypatch.syspath_prepend(str(tmp_path))
    run("mymodels:forward_only", "--parts", "2", "--strategy", "mincut", "-o",
        tmp_path / "c.dot")
    nodes, _ = parse_dot((tmp_path / "c.dot").read_text())
    assert sorted(nodes) == ["fc", "x"]


def test_compare_writes_every_strategy(tmp_path, capsys):
    run("speech-mlp", "--parts", "3", "--compare", "spatial,layerwise,mincut", "-o",
        tmp_path / "cmp.html", "--json")
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert [p["strategy"] for p in plans] == ["spatial", "layerwise", "mincut"]
    assert (tmp_path / "cmp.html").read_text().count('class="panel"') == 3


@pytest.mark.parametrize("model,message", [
    ("no-such-model", "no module named 'no-such-model'"),
    ("missing.py", "no file missing.py"),
    ("{file}:nothing", "has no function 'nothing'"),
    ("{file}:broken", "returned int; expected a model with .graph and .loss"),
    ("json:dumps", r"needs arguments; it is called with none"),
    (":f", "expected a reference workload"),
])
def test_bad_models_name_what_was_wrong(tmp_path, model_file, model, message):
    with pytest.raises(GraphflowError, match=message):
        run(model.format(file=model_file), "-o", tmp_path / "x.svg")


def test_bad_options_are_errors(tmp_path, capsys):
    # usage errors, from the parser (tests/test_plan_api.py has the rest)
    for argv in (["--compare", "spatial,nope"], ["--parts", "0"], ["-o", tmp_path / "x.jpeg"]):
        with pytest.raises(SystemExit) as exit_:
            run("lc-large", "-o", tmp_path / "x.svg", *argv)
        assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown strategy 'nope'" in err and "unknown format '.jpeg'" in err


def test_module_entry_point_exit_codes(tmp_path):
    def main(*argv):
        return subprocess.run([sys.executable, "-m", "graphflow.viz", *argv],
                              capture_output=True, text=True, timeout=300)

    r = main("digits-lc", "--parts", "2", "-o", str(tmp_path / "d.svg"))
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    r = main("nonexistent.py")
    assert r.returncode == 1 and "error: MODEL 'nonexistent.py': no file" in r.stderr
    r = main("--help")
    assert r.returncode == 0 and "MODEL" in r.stdout and "example:" in r.stdout
