"""The plan API's edges: loading files that are not plans, partition()'s arguments,
visualize()'s first argument, the default cost model (the commands' one) and visualize's
usage errors."""

from __future__ import annotations

import argparse
import json
import re

import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, kernels, op_family
from graphflow.ops.registry import node_cost
from graphflow.partitioners import Plan, PlanError, partition
from graphflow.prediction import command_cost
from graphflow.runtime.cores import blas_threads, core_share
from graphflow.viz import build_diagram, command
from tests.simgraphs import two_workers


@pytest.fixture
def plan() -> Plan:
    g, loss = two_workers()
    return partition(g, 2, "manual", loss=loss)


@pytest.fixture
def saved(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


# -- 1. Plan.load / Plan.from_dict ------------------------------------------------------------
def test_a_saved_plan_loads_back(plan, saved):
    again = Plan.load(saved)
    assert again.transfers == plan.transfers and again.placement == plan.placement
    assert again.loss == "loss" and again.grads == plan.grads


@pytest.mark.parametrize("content,what", [
    (lambda text: text[: len(text) // 2], r"invalid JSON"),
    (lambda text: "", r"empty file"),
    (lambda text: "[1, 2]", r"a JSON array, expected an object"),
    (lambda text: '{"format": "graphflow.plan/1"}', r"no 'strategy', .*'transfers'"),
    (lambda text: '{"format": "graphflow.graph/1"}', r"format 'graphflow.graph/1'"),
    (lambda text: text.replace('"transfers": [', '"transfers": 7, "x": ['),
     r"'transfers' is a number, expected a JSON array"),
])
def test_files_that_are_not_plans_name_the_file(saved, content, what):
    saved.write_text(content(saved.read_text()))
    with pytest.raises(PlanError, match=rf"^{saved}: not a graphflow plan \(.*{what}"):
        Plan.load(saved)


def test_a_binary_file_is_not_a_plan(tmp_path):
    path = tmp_path / "plan.bin"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(gf.GraphflowError, match=rf"^{path}: not a graphflow plan \(binary"):
        Plan.load(path)


def _edited(plan: Plan, edit) -> dict:
    data = json.loads(json.dumps(plan.to_dict()))
    edit(data)
    return data


def _recv_key(data: dict) -> None:
    for node in data["workers"][1]["nodes"]:
        if node["op"] == "recv":
            node["attrs"]["key"] = "other->w1"


@pytest.mark.parametrize("edit,what", [
    (lambda d: d.update(workers=d["workers"][:1]),
     r"on worker 1; the plan has 1 worker \(0..0\)"),
    (lambda d: d.update(workers=[]), r"no workers"),
    (lambda d: d["transfers"][0].update(dst=5), r"transfer '.*' goes from worker \d to 5"),
    (lambda d: d["transfers"][0].update(src=0.5), r"transfers\[0\]: worker index 0.5"),
    (lambda d: d["transfers"][0].pop("key"), r"transfers\[0\]: no 'key'"),
    (_recv_key, r"worker 1 has a recv of 'other->w1', not in the transfers"),
    (lambda d: d["transfers"].pop(), r"worker \d has a send of '.*', not in the transfers"),
    (lambda d: d.update(loss="nope"), r"loss 'nope' is not a node of the graph"),
    (lambda d: d["grads"].update(w="nope"), r"grads: 'w' -> 'nope'"),
    (lambda d: d["placement"].update(h=0), r"worker 1 runs 'h', placed on worker 0"),
    (lambda d: d["placement"].pop("h"), r"placement has no worker for 'h'"),
    (lambda d: d["graph"]["nodes"].pop(0), r"graph: node '.*' uses 'x' before"),
    (lambda d: d.update(feeds={"3": {}}), r"feeds for worker 3"),
])
def test_plans_whose_parts_disagree_are_refused_at_load(plan, saved, edit, what):
    data = _edited(plan, edit)
    with pytest.raises(PlanError, match=rf"^not a graphflow plan \(.*{what}"):
        Plan.from_dict(data)
    saved.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=rf"^{saved}: not a graphflow plan \(.*{what}"):
        Plan.load(saved)


def test_from_dict_checks_without_a_file_name():
    for data in ([1, 2], "plan", None):
        with pytest.raises(PlanError, match=r"^not a graphflow plan \("):
            Plan.from_dict(data)
    assert issubclass(PlanError, gf.GraphflowError) and issubclass(PlanError, ValueError)


def test_a_spatial_plan_with_feeds_round_trips(tmp_path):
    m = gf.models.digits_lc()
    plan = partition(m, 2, "spatial")
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").feeds == plan.feeds


# -- 2. partition()'s arguments ------------------------------------------------------------
@pytest.mark.parametrize("parts,error,what", [
    ("2", TypeError, r"parts must be an int .*got str '2'"),
    (2.0, TypeError, r"parts must be an int .*got float 2.0"),
    (True, TypeError, r"parts must be an int .*got bool True"),
    (0, ValueError, r"parts must be at least 1, got 0"),
])
def test_parts_must_be_a_positive_int(parts, error, what):
    g, loss = two_workers()
    with pytest.raises(error, match=what):
        partition(g, parts, "manual", loss=loss)


def test_the_loss_may_be_named_and_a_model_stands_for_its_graph_and_loss():
    g, loss = two_workers()
    by_node = partition(g, 2, "manual", loss=loss)
    by_name = partition(g, 2, "manual", loss="loss")
    assert by_name.grads == by_node.grads and by_name.transfers == by_node.transfers
    m = gf.models.digits_lc()
    whole = partition(m, 2, "layerwise")
    assert whole.loss == "loss" and whole.grads == partition(m.graph, 2, "layerwise",
                                                              loss=m.loss).grads


def test_bad_arguments_name_the_argument_and_the_value():
    g, loss = two_workers()
    _, copy_loss = two_workers()  # the same model built again: its loss stands for g's
    assert partition(g, 2, "manual", loss=copy_loss).grads == partition(
        g, 2, "manual", loss=loss).grads
    with gf.Graph():  # named alike, another node: refused
        other_loss = gf.reduce_mean(gf.placeholder("x", (None, 3)), name="loss")
    with pytest.raises(gf.GraphError, match=r"loss reduce_mean 'loss' .* of another graph"):
        partition(g, 2, "manual", loss=other_loss)
    with pytest.raises(gf.GraphError, match=r"loss 'nope' is not a node of the graph"):
        partition(g, 2, "manual", loss="nope")
    with pytest.raises(TypeError, match=r"loss must be a Node .* got int 3"):
        partition(g, 2, "manual", loss=3)
    with pytest.raises(TypeError, match=r"cost must be a .*CostModel or None, got str 'foo'"):
        partition(g, 2, "layerwise", loss=loss, cost="foo")
    with pytest.raises(TypeError, match=r"graph must be a gf.Graph .* got int 42"):
        partition(42, 2)
    with pytest.raises(ValueError, match=r"unknown strategy 'foo'; known: layerwise"):
        partition(g, 2, "foo")
    with pytest.raises(ValueError, match=r"unknown strategy \['spatial'\]"):
        partition(g, 2, ["spatial"])


@pytest.mark.parametrize("batch", [-1, 0, True, 2.5, "64"])
def test_report_and_predict_take_a_positive_batch(plan, batch):
    for call in (plan.report, plan.predict, plan.stats):
        with pytest.raises(ValueError, match=rf"batch must be an int >= 1, got "
                                             rf"{batch!r}"):
            call(batch)


# -- 3. visualize()'s first argument ---------------------------------------------------------
def test_visualize_takes_plans(plan, tmp_path):
    g, _ = two_workers()
    with pytest.raises(TypeError, match=r"visualize draws plans .*got Graph"):
        gf.visualize(g, tmp_path / "x.svg")
    with pytest.raises(TypeError, match=r"compare takes plans .*got str"):
        gf.visualize(plan, tmp_path / "x.svg", compare=["spatial"])
    with pytest.raises(ValueError, match=r"no plan to draw"):
        gf.visualize([], tmp_path / "x.svg")
    other = partition(g, 2, "mincut", loss="loss")
    gf.visualize([plan, other], tmp_path / "a.dot")
    gf.visualize(plan, tmp_path / "b.dot", compare=[other])
    gf.visualize(plan, tmp_path / "c.dot", compare=other)
    assert (tmp_path / "a.dot").read_text() == (tmp_path / "b.dot").read_text() \
        == (tmp_path / "c.dot").read_text()


# -- 4. the default cost model: the commands' one ---------------------------------------------
def test_python_predicts_as_the_commands_do(tmp_path, monkeypatch):
    """A kernel cached for a worker's thread share (as `graphflow show` times them) prices the
    plan from Python too, whatever threads the driver has."""
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "costmodel.json"))
    m = gf.models.digits_lc()
    plan = partition(m, 2, "spatial")
    batch = 8
    driver = str(core_share(plan.parts) + 3)  # a thread setup no worker has
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, driver)
    with blas_threads(core_share(plan.parts)):  # "timed" in the workers' setup: 1 s
        cached = CostModel.builtin(batch)
        sig, node = next((s, n) for s, n in kernels(plan.graph, batch).items()
                         if n.op == "local2d")
        flops, read, written = node_cost(node, batch)
        cached.measured[sig] = [1.0, op_family(node.op), flops, read + written]
        cached.save()
    command = plan.predict(batch, command_cost([plan], batch, estimate=True)).step_seconds
    assert command > 1.0
    assert plan.predict(batch).step_seconds == command
    assert f"predicted step: {1e3 * command:.1f} ms" in plan.report(batch)
    assert build_diagram(plan, batch=batch).step_seconds == command


# -- 5. visualize's usage errors ---------------------------------------------------------------
def parse(*argv):
    parser = argparse.ArgumentParser(prog="graphflow visualize")
    command.configure(parser)
    args = parser.parse_args([str(a) for a in argv])
    return command.run(args)


@pytest.mark.parametrize("argv,message", [
    (["-o", "x.txt"], r"argument -o/--output: 'x.txt': unknown format '.txt'"),
    (["-o", "plan"], r"unknown format '\(no suffix\)'"),
    (["--compare", "spatial,foo"], r"argument --compare: unknown strategy 'foo'"),
    (["--compare", ","], r"argument --compare: unknown strategy ''"),
    (["--strategy", "foo"], r"argument --strategy: invalid choice: 'foo'"),
])  # (options that do not go together: tests/test_viz_review.py)
def test_bad_option_values_are_usage_errors(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        parse("digits-lc", *argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: graphflow visualize") and re.search(message, err)
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_report_counts_a_small_cut_in_bytes():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        y = gf.placeholder("y", (None,), dtype="int32")
        loss = gf.softmax_cross_entropy(gf.layers.dense(x, 3, name="fc"), y)
    plan = partition(g, 2, "layerwise", loss=loss)
    total = sum(t.nbytes(8) for t in plan.transfers)
    assert 0 < total < 1000
    head = plan.report(8, CostModel.builtin(batch=8)).splitlines()[0]
    assert head.endswith(f"{len(plan.transfers)} transfers of {total} B per step"), head
