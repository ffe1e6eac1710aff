"""A user's review of `graphflow show` and `visualize`: estimates that say they are estimates,
options that would be ignored refused (exit 2), idle workers named, every worker of a box
drawn, byte units that fit, a model with nothing to compute named, the page's pan that ends
wherever the pointer is let go. Predictions are --estimate's (nothing timed)."""

from __future__ import annotations

import html
import json
import re
import textwrap

import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, kernels, op_family
from graphflow.modelspec import load_model
from graphflow.ops.registry import node_cost
from graphflow.partitioners import partition
from graphflow.runtime.cores import blas_threads, core_share
from graphflow.viz import build_diagram, visualize
from graphflow.viz.graph import MIN_STRIPE, percent
from tests.test_viz_browser import browse, chromium  # noqa: F401 (a fixture)
from tests.vizparse import parse_svg, svg_groups, text_of

MODELS = textwrap.dedent("""
    import graphflow as gf

    def tiny():
        with gf.Graph() as g:
            x = gf.placeholder("x", (None, 4))
            y = gf.placeholder("y", (None,), dtype="int32")
            loss = gf.softmax_cross_entropy(gf.layers.dense(x, 3, name="fc"), y)
        return g, loss

    def fixed_batch():
        with gf.Graph() as g:
            x = gf.placeholder("x", (8, 20))
            y = gf.placeholder("y", (8,), dtype="int32")
            loss = gf.softmax_cross_entropy(gf.layers.dense(x, 5, name="fc"), y)
        return g, loss

    def empty():
        with gf.Graph() as g:
            pass
        return g

    def inputs_only():
        with gf.Graph() as g:
            gf.placeholder("x", (None, 4))
        return g
""")
NOTE = re.compile(r"(\d+) of (\d+) kernels not timed: estimated from FLOPs and bytes \(run "
                  r"without --estimate to time them\)")


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "small.py"
    path.write_text(MODELS)
    return path


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A kernel-time cache of this test's own, empty at first."""
    path = tmp_path / "costmodel.json"
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(path))
    return path


# -- 1. --estimate says what it did not time ---------------------------------------------------
def test_estimate_says_how_many_kernels_it_priced_by_flops_and_bytes(cli_here, models,
                                                                     own_cache):
    code, _, err = cli_here("show", f"{models}:tiny", "--parts", 2, "--strategy", "layerwise",
                            "--estimate")
    note = NOTE.search(err)
    assert code == 0 and note and note[1] == note[2] and len(err.splitlines()) == 1, err
    _, graph, loss = load_model(f"{models}:tiny")
    plan = partition(graph, 2, "layerwise", loss=loss)
    with blas_threads(core_share(2)):  # one kernel timed, as a worker's thread share times it
        cached = CostModel.builtin(64)
        sig, node = next(iter(kernels(plan.graph, 64).items()))
        flops, read, written = node_cost(node, 64)
        cached.measured[sig] = [1e-3, op_family(node.op), flops, read + written]
        cached.save()
    code, _, err = cli_here("visualize", f"{models}:tiny", "--parts", 2, "--strategy",
                            "layerwise", "--estimate", "-o", own_cache.with_name("p.svg"))
    assert code == 0 and f"{int(note[2]) - 1} of {note[2]} kernels not timed" in err, err


# -- 2. --view spatial draws every compared plan -----------------------------------------------
def test_the_spatial_view_of_each_compared_plan(cli_here, tmp_path, own_cache):
    out = tmp_path / "x.svg"
    code, _, err = cli_here("visualize", "digits-lc", "--parts", 3, "--view", "spatial",
                            "--compare", "spatial,layerwise", "-o", out, "--estimate")
    assert code == 0, err
    root = parse_svg(out.read_text())
    views = {g.get("id") for g in svg_groups(root, "spatial-layer")}
    assert {"p0-spatial-0", "p1-spatial-0"} <= views  # one view a plan, ids apart
    titles = [t for t in text_of(root) if t.startswith("digits-lc: ")]  # each plan's own
    assert titles == ["digits-lc: spatial, 3 workers", "digits-lc: layerwise, 3 workers"], \
        titles


# -- 4. idle workers named ---------------------------------------------------------------------
def test_visualize_names_the_idle_workers_as_show_does(cli_here, tmp_path, own_cache):
    argv = ("digits-lc", "--parts", 3, "--strategy", "manual", "--estimate")
    _, shown, _ = cli_here("show", *argv)
    code, out, err = cli_here("visualize", *argv, "-o", tmp_path / "m.svg")
    idle = "idle: worker(s) 1, 2 got no nodes"
    assert code == 0 and idle in shown and idle in out, (out, err)
    code, out, _ = cli_here("visualize", *argv, "-o", tmp_path / "m.svg", "--json")
    assert json.loads(out)["plans"][0]["idle_workers"] == [1, 2]


# -- 5. every worker of a box shows ------------------------------------------------------------
def test_a_workers_sliver_of_a_layer_gets_a_stripe_and_not_0_percent(tmp_path):
    m = gf.models.lc_large(batch=None)
    plan = gf.partition(m.graph, 4, "layerwise", loss=m.loss)
    visualize(plan, tmp_path / "plan.svg")
    nodes = {g.get("data-name"): g for g in svg_groups(parse_svg(
        (tmp_path / "plan.svg").read_text()), "node")}
    lc1 = nodes["lc1"]  # worker 1 holds its bias: 0.2% of its FLOPs
    stripes = {r.get("data-worker"): float(r.get("width")) for r in svg_groups(lc1, "stripe")}
    assert sorted(stripes) == ["0", "1"] and stripes["1"] >= MIN_STRIPE - 0.05
    assert sum(stripes.values()) == pytest.approx(180, abs=0.2)  # the box's width
    assert "w1 <1%" in lc1.get("data-info") and " 0%" not in lc1.get("data-info")
    assert [percent(s) for s in (0.0, 0.004, 0.5, 0.999, 1.0)] == \
        ["<1%", "<1%", "50%", ">99%", "100%"]


def test_a_worker_holding_only_a_layers_parameter_is_one_of_its_workers():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 4))
        with gf.name_scope("fc"):
            w = gf.parameter("W", (4, 3))
            with gf.device("worker:1"):
                b = gf.parameter("b", (3,))
            gf.matmul(x, w) + b
    (fc,) = [b for b in build_diagram(gf.partition(g, 2, "manual")).boxes if b.label == "fc"]
    assert fc.workers == ((0, 1.0), (1, 0.0))  # worker 1 has no FLOPs of it, but its bias


# -- 6. options that would be ignored ----------------------------------------------------------
@pytest.mark.parametrize("argv,named", [
    (["show", "digits-lc", "--strategy", "spatial"], "--strategy"),
    (["show", "digits-lc", "--batch", "16"], "--batch"),
    (["show", "digits-lc", "--estimate"], "--estimate"),
    (["show", "digits-lc", "--parts", "2", "--backward"], "--backward"),
    (["visualize", "digits-lc", "--compare", "spatial", "--strategy", "layerwise"],
     "--strategy layerwise is ignored with --compare"),
    (["visualize", "digits-lc", "--detail", "ops", "--view", "spatial"], "--detail"),
    (["visualize", "digits-lc", "--view", "spatial", "-o", "x.dot"],
     "--view spatial is a picture"),
])
def test_options_that_would_be_ignored_are_usage_errors(cli_here, tmp_path, monkeypatch, argv,
                                                        named):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_here(*argv)
    assert code == 2 and named in err, err
    assert err.startswith(f"graphflow {argv[0]}: error: ") and len(err.splitlines()) == 1
    assert out == "" and not list(tmp_path.iterdir())  # nothing done


def test_show_parts_1_prints_the_one_worker_plan(cli_here, own_cache):
    code, out, err = cli_here("show", "digits-lc", "--parts", 1, "--estimate")
    assert code == 0 and out.startswith("plan: spatial, 1 worker(s), batch 64"), (out, err)


# -- 7. a model that computes nothing ----------------------------------------------------------
def test_a_model_with_nothing_to_compute_is_named(cli_here, models, tmp_path):
    for command in (["visualize", "--estimate", "-o", tmp_path / "e.svg"],
                    ["show", "--parts", "2"], ["show"]):
        code, out, err = cli_here(command[0], f"{models}:empty", *command[1:])
        assert code == 1 and f"MODEL '{models}:empty': the graph has no nodes" in err, err
        assert out == "" and "max()" not in err
    code, _, err = cli_here("show", f"{models}:inputs_only", "--parts", 2)
    assert code == 1 and "the graph computes nothing" in err and "(x)" in err, err


# -- 8. / 10. outputs and batches --------------------------------------------------------------
def test_visualize_makes_the_folders_of_its_output_as_timeline_does(cli_here, models,
                                                                    tmp_path, own_cache):
    out = tmp_path / "new" / "dir" / "plan.svg"
    code, _, err = cli_here("visualize", f"{models}:tiny", "--estimate", "-o", out)
    assert code == 0 and "<svg" in out.read_text(), err
    (tmp_path / "file").write_text("")
    code, _, err = cli_here("visualize", f"{models}:tiny", "-o", tmp_path / "file" / "p.svg")
    assert code == 2 and "is not a directory" in err, err  # argtypes.output_file, as timeline


def test_a_batch_the_model_fixes_otherwise_is_a_usage_error(cli_here, models, tmp_path):
    for argv in (["show", "--parts", "2"], ["visualize", "-o", tmp_path / "f.svg"]):
        code, _, err = cli_here(argv[0], f"{models}:fixed_batch", "--batch", 16, *argv[1:],
                                "--estimate")
        assert code == 2 and "--batch 16: the model's placeholder" in err, (argv, err)
        assert "fixes its batch at 8" in err and len(err.splitlines()) == 1


# -- 11. / 12. what the commands print ---------------------------------------------------------
def test_small_cuts_print_in_bytes_and_kilobytes(cli_here, models, tmp_path, own_cache):
    code, out, _ = cli_here("show", f"{models}:tiny", "--parts", 2, "--strategy", "all",
                            "--estimate")
    assert code == 0 and "0.00 MB" not in out
    assert re.search(r"layerwise +cut +[\d.]+ (B|KB)/step", out), out
    code, out, _ = cli_here("visualize", f"{models}:tiny", "--parts", 2, "--strategy",
                            "layerwise", "--estimate", "-o", tmp_path / "t.svg")
    assert code == 0 and "0.00 MB" not in out
    assert re.search(r"transfers of [\d.]+ (B|KB) per step", out), out


def test_visualize_json_counts_layers_and_each_workers_nodes(cli_here, tmp_path, own_cache):
    code, out, _ = cli_here("visualize", "digits-lc", "--parts", 2, "--strategy", "layerwise",
                            "--estimate", "--json", "-o", tmp_path / "p.svg")
    (p,) = json.loads(out)["plans"]
    m = gf.models.digits_lc(batch=None)
    plan = gf.partition(m.graph, 2, "layerwise", loss=m.loss)
    assert "nodes" not in p and p["layers"] == len(build_diagram(plan).boxes)
    assert [(w["nodes"], w["sends"], w["recvs"]) for w in p["workers"]] == \
        [(s.nodes, s.sends, s.recvs) for s in plan.stats(64)]
    code, out, _ = cli_here("visualize", "digits-lc", "--parts", 2, "--detail", "ops",
                            "--estimate", "--json", "-o", tmp_path / "p.svg")
    (p,) = json.loads(out)["plans"]
    assert p["detail"] == "ops" and p["ops"] > p.get("layers", 0)


# -- 13. the page's pan ------------------------------------------------------------------------
PAN_PROBE = """<script>
const svg = document.getElementById('plan');
const move = (x, y) =>
  window.dispatchEvent(new PointerEvent('pointermove', {clientX: x, clientY: y}));
const before = svg.getAttribute('viewBox');
svg.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true, clientX: 300, clientY: 300}));
move(340, 340);
const panned = svg.getAttribute('viewBox');
// let go outside the SVG (over the bar above it): no click on the SVG follows
document.getElementById('bar').dispatchEvent(
  new PointerEvent('pointerup', {bubbles: true, clientX: 340, clientY: 5}));
move(500, 500);
const after = svg.getAttribute('viewBox');
svg.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true, clientX: 10, clientY: 10}));
window.dispatchEvent(new PointerEvent('pointercancel', {}));
move(600, 600);
const cancelled = svg.getAttribute('viewBox');
const legend = svg.querySelector('g.legend-item[data-worker="1"]');
for (const type of ['pointerdown', 'pointerup'])
  legend.dispatchEvent(new PointerEvent(type, {bubbles: true, clientX: 50, clientY: 50}));
legend.dispatchEvent(new MouseEvent('click', {bubbles: true}));
document.body.dataset.probe = JSON.stringify({before, panned, after, cancelled,
  dragging: svg.classList.contains('dragging'), focus: svg.classList.contains('focus')});
</script>
</body>"""


def test_a_drag_that_ends_outside_the_plan_stops_panning(chromium, tmp_path):  # noqa: F811
    m = gf.models.digits_lc(batch=None)
    page = visualize(gf.partition(m.graph, 2, "spatial", loss=m.loss), tmp_path / "p.html")
    page.write_text(page.read_text().replace("</body>", PAN_PROBE))
    dom, _ = browse(chromium, tmp_path, page, "--dump-dom")
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    assert probe["panned"] != probe["before"]  # the drag panned
    assert probe["after"] == probe["panned"] and probe["cancelled"] == probe["panned"]
    assert not probe["dragging"] and probe["focus"]  # and a click after it still clicks
