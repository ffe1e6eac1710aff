"""Acceptance 1 of issue 5: for every reference workload, strategy and 1 to 8 parts, the
visualizer writes SVG, DOT, HTML (and PNG for a sample) that parse, with one node per layer
(or op) and the plan's cut edges labelled with the bytes the plan reports."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re

import pytest

import graphflow as gf
from graphflow.partitioners import STRATEGIES
from graphflow.viz import build_diagram, render, visualize
from tests.vizparse import (
    classes,
    inline_svg,
    label_bytes,
    parse_dot,
    parse_svg,
    read_png,
    svg_groups,
    text_of,
)

WORKLOADS = sorted(gf.models.WORKLOADS)
BATCH = 64
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
# what a page needs to ask for anything: an absolute URL, an attribute or CSS that loads one,
# or a script API that sends
NO_REQUEST = re.compile(r"https?:|(?<![\w-])(src|href|action)\s*=|url\((?!#)|@import|"
                        r"fetch\(|XMLHttpRequest|WebSocket|EventSource|sendBeacon")


@functools.cache
def model(name):
    return gf.models.WORKLOADS[name](batch=None)


@functools.cache
def plan(name, strategy, parts):
    m = model(name)
    return gf.partition(m.graph, parts, strategy, loss=m.loss)


def layers(name):
    """The layers of the unpartitioned model: the name scope of each node (else its name)."""
    return {n.name.rsplit("/", 1)[0] if "/" in n.name else n.name for n in model(name).graph}


def check_cuts(cut_elements, p, get):
    """Every transfer of the plan is on exactly one cut edge, whose bytes are its transfers'
    bytes and whose label says so (to the label's three significant digits)."""
    nbytes = {t.key: t.nbytes(BATCH) for t in p.transfers}
    seen = []
    for el in cut_elements:
        keys = get(el, "transfers").split()
        seen += keys
        assert int(get(el, "bytes")) == sum(nbytes[k] for k in keys)
        label = get(el, "label")
        assert label_bytes(label) == pytest.approx(int(get(el, "bytes")), rel=5e-3), label
    assert sorted(seen) == sorted(nbytes), "cut edges and the plan's transfers differ"


def check_svg(root, p, expected_nodes, kind):
    nodes = svg_groups(root, "node")
    assert all(kind in classes(n) for n in nodes)
    assert sorted(n.get("data-name") for n in nodes) == sorted(expected_nodes)
    assert len({n.get("id") for n in nodes}) == len(nodes)
    cuts = svg_groups(root, "cut")
    check_cuts(cuts, p, lambda el, k: el.get(f"data-{k}"))
    for el in cuts:  # the label drawn is the label recorded
        assert el.get("data-label") in text_of(el)
    return nodes


def check_dot(text, p, expected_nodes, kind):
    nodes, edges = parse_dot(text)
    assert sorted(nodes) == sorted(expected_nodes)
    assert all(a["class"] == f"node {kind}" for a in nodes.values())
    cuts = [(a, b, attrs) for a, b, attrs in edges if attrs.get("class", "").startswith("cut")]
    assert all("label" in attrs for _, _, attrs in cuts)
    check_cuts(cuts, p, lambda el, k: el[2][k])
    assert all(a in nodes and b in nodes for a, b, _ in edges)


@pytest.mark.parametrize("parts", range(1, 9))
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", WORKLOADS)
def test_svg_dot_html_hold_the_layers_and_the_cut_bytes(tmp_path, name, strategy, parts):
    p = plan(name, strategy, parts)
    for suffix in ("svg", "dot", "html"):
        visualize(p, tmp_path / f"plan.{suffix}", batch=BATCH)
    svg = (tmp_path / "plan.svg").read_text()
    nodes = check_svg(parse_svg(svg), p, layers(name), "layer")
    check_dot((tmp_path / "plan.dot").read_text(), p, layers(name), "layer")
    html = (tmp_path / "plan.html").read_text()
    assert len(svg_groups(inline_svg(html), "node")) == len(nodes)
    assert not NO_REQUEST.search(html), \
        "the page must not reference anything outside itself"
    workers = {w for n in nodes for w in n.get("data-workers").split()}
    assert workers <= {str(w) for w in range(parts)}


@pytest.mark.parametrize("parts", [3, 8])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", WORKLOADS)
def test_ops_detail_has_one_node_per_op_and_one_cut_per_transfer(tmp_path, name, strategy,
                                                                  parts):
    p = plan(name, strategy, parts)
    render([p], tmp_path / "ops.svg", "ops", BATCH)
    render([p], tmp_path / "ops.dot", "ops", BATCH)
    names = [n.name for n in p.graph.nodes]
    root = parse_svg((tmp_path / "ops.svg").read_text())
    check_svg(root, p, names, "op")
    assert len(svg_groups(root, "cut")) == len(p.transfers)
    check_dot((tmp_path / "ops.dot").read_text(), p, names, "op")


SAMPLE = [(name, strategy, 1 + (3 * i + 2 * j) % 8)  # every strategy and part count at least once
          for i, name in enumerate(WORKLOADS) for j, strategy in enumerate(STRATEGIES)]


@pytest.mark.skipif(not HAVE_MPL, reason="PNG output needs matplotlib, which is not installed")
@pytest.mark.parametrize("name,strategy,parts", SAMPLE)
def test_png_decodes_and_is_drawn(tmp_path, name, strategy, parts):
    path = visualize(plan(name, strategy, parts), tmp_path / "plan.png", batch=BATCH)
    image = read_png(str(path))
    assert image.shape[0] > 300 and image.shape[1] > 500
    colours = {tuple(px) for px in image[::7, ::7, :3].reshape(-1, 3)}
    assert len(colours) > 20, "the image looks blank"


def test_png_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    import sys

    for mod in ("matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        visualize(plan("digits-lc", "spatial", 2), tmp_path / "plan.png")
    assert not (tmp_path / "plan.png").exists()


def test_formats_and_arguments_are_checked(tmp_path):
    p = plan("digits-lc", "layerwise", 2)
    with pytest.raises(ValueError, match=r"unknown format '\.pdf'.*\.svg, \.png, \.dot, \.html"):
        visualize(p, tmp_path / "plan.pdf")
    with pytest.raises(ValueError, match="no suffix"):
        visualize(p, tmp_path / "plan")
    with pytest.raises(ValueError, match="unknown detail 'all'"):
        visualize(p, tmp_path / "plan.svg", detail="all")
    with pytest.raises(TypeError, match="compare takes plans"):
        visualize(p, tmp_path / "plan.svg", compare=["mincut"])
    assert visualize(p, tmp_path / "PLAN.SVG") == tmp_path / "PLAN.SVG"


def test_bars_show_the_plans_figures(tmp_path):
    p = plan("lc-large", "layerwise", 3)
    visualize(p, tmp_path / "plan.svg", batch=32)
    charts = {c.get("data-metric"): [float(b.get("data-value")) for b in svg_groups(c, "bar")]
              for c in svg_groups(parse_svg((tmp_path / "plan.svg").read_text()), "chart")}
    stats, prediction = p.stats(32), p.predict(32)
    assert charts["FLOPs per step"] == [s.flops for s in stats]
    assert charts["parameters"] == [s.param_bytes for s in stats]
    assert charts["bytes in per step"] == [s.bytes_in for s in stats]
    assert charts["bytes out per step"] == [s.bytes_out for s in stats]
    assert charts["predicted busy"] == pytest.approx(prediction.busy)


def test_compare_draws_each_strategy_with_its_predicted_step(tmp_path):
    plans = [plan("lc-large", s, 4) for s in ("spatial", "layerwise", "mincut")]
    for suffix in ("svg", "dot"):
        visualize(plans[0], tmp_path / f"cmp.{suffix}", compare=plans[1:], title="lc-large")
    root = parse_svg((tmp_path / "cmp.svg").read_text())
    panels = svg_groups(root, "panel")
    assert [pn.get("data-strategy") for pn in panels] == ["spatial", "layerwise", "mincut"]
    for pn, p in zip(panels, plans):
        check_svg(pn, p, layers("lc-large"), "layer")
    steps = {b.get("data-strategy"): float(b.get("data-seconds"))
             for b in svg_groups(root, "step-bar")}
    assert steps == pytest.approx({p.strategy: p.predict(BATCH).step_seconds for p in plans})
    nodes, _ = parse_dot((tmp_path / "cmp.dot").read_text())
    assert len(nodes) == 3 * len(layers("lc-large"))
    assert (tmp_path / "cmp.dot").read_text().count("subgraph cluster_") == 3




def test_a_split_layer_shows_every_worker_it_spans():
    d = build_diagram(plan("lc-large", "spatial", 4))
    lc2 = next(b for b in d.boxes if b.label == "lc2")
    assert [w for w, _ in lc2.workers] == [0, 1, 2, 3]
    assert sum(s for _, s in lc2.workers) == pytest.approx(1.0)
    x = next(b for b in d.boxes if b.label == "x")
    assert x.workers == ()  # fed to each worker that reads it
