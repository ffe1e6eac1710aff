"""Acceptance 3 of issue 5: the spatial view of lc-large split 4 ways shows 4 colour blocks per
layer and halos whose area matches the plan's halo bytes (asserted on the drawn data)."""

from __future__ import annotations

import numpy as np
import pytest

import graphflow as gf
from graphflow.viz import spatial_layers, visualize
from graphflow.viz.spatial import REPLICATED_ROW
from tests.vizparse import parse_svg, svg_groups

BATCH = 64


def spatial_plan(name, parts):
    m = gf.models.WORKLOADS[name](batch=None)
    return gf.partition(m.graph, parts, "spatial", loss=m.loss)


def halo_transfers(plan, layer):
    """The plan's halo transfers of a layer: forward, the tensors a worker receives into the
    layer's input rows (`<layer>/local2d/in<j>`); backward, the gradients of those inputs."""
    def read_into_input(t):
        graph = plan.workers[t.dst].graph
        recv = graph[f"recv/{t.tensor}"]
        return any(recv in n.inputs for n in graph.nodes
                   if n.name.startswith(f"{layer}/local2d/in"))

    fwd = [t for t in plan.transfers if not t.tensor.startswith("grad/") and read_into_input(t)]
    bwd = [t for t in plan.transfers if t.tensor.startswith(f"grad/{layer}/local2d/in")]
    return fwd, bwd


def test_lc_large_four_ways_four_blocks_and_halo_bytes(tmp_path):
    plan = spatial_plan("lc-large", 4)
    views = {v.name: v for v in spatial_layers(plan, BATCH)}
    assert sorted(views) == ["lc1", "lc2"]
    for v in views.values():
        workers = v.out_grid[:, 0]
        assert (v.out_grid == workers[:, None]).all()  # blocks of whole rows
        changes = np.flatnonzero(np.diff(workers)) + 1
        blocks = np.split(workers, changes)
        assert [int(b[0]) for b in blocks] == [0, 1, 2, 3]  # 4 contiguous blocks
    lc1, lc2 = views["lc1"], views["lc2"]
    assert lc1.halos == () and halo_transfers(plan, "lc1") == ([], [])  # the image is fed
    # each worker cuts its own rows out of the 64-row image: 7x7 windows, stride 2
    assert len(lc1.in_rows) == 64 and (lc1.in_rows == REPLICATED_ROW).all()
    out_rows = {w: np.flatnonzero(lc1.out_grid[:, 0] == w) for w in range(4)}
    assert lc1.reads == {w: (2 * r[0], 2 * r[-1] + 7) for w, r in out_rows.items()}
    fwd, bwd = halo_transfers(plan, "lc2")
    channels_batch_bytes = 32 * BATCH * 4  # relu(lc1) has 32 channels of float32
    assert lc2.halo_cells * channels_batch_bytes == sum(t.nbytes(BATCH) for t in fwd)
    assert lc2.halo_cells * channels_batch_bytes == sum(t.nbytes(BATCH) for t in bwd)
    assert sorted((h.src, h.dst) for h in lc2.halos) == sorted((t.src, t.dst) for t in fwd)
    assert lc2.halo_mask().sum() <= lc2.halo_cells  # a row may cross to both neighbours

    visualize(plan, tmp_path / "plan.svg", batch=BATCH)
    drawn = {g.get("data-name"): g
             for g in svg_groups(parse_svg((tmp_path / "plan.svg").read_text()),
                                 "spatial-layer")}
    assert sorted(drawn) == ["lc1", "lc2"]
    for g in drawn.values():
        assert sorted(b.get("data-worker") for b in svg_groups(g, "block")) == list("0123")
    halos = svg_groups(drawn["lc2"], "halo")
    cells = sum(int(h.get("data-cells")) for h in halos)
    assert cells * int(drawn["lc2"].get("data-cell-bytes")) == sum(t.nbytes(BATCH) for t in fwd)
    assert not svg_groups(drawn["lc1"], "halo")


@pytest.mark.parametrize("name,parts", [("digits-lc", 3), ("lc-large", 8), ("digits-lc", 8)])
def test_every_halo_is_a_transfer_of_its_bytes(name, parts):
    """Each drawn halo is one of the plan's transfers into that layer: same workers, bytes."""
    plan = spatial_plan(name, parts)
    sent = [(t.src, t.dst, t.nbytes(BATCH)) for t in plan.transfers]
    for v in spatial_layers(plan, BATCH):
        assert len(np.unique(v.out_grid)) == min(parts, v.out_grid.shape[0])
        for h in v.halos:
            assert (h.src, h.dst, h.cells * v.cell_bytes) in sent


def test_no_spatial_view_when_no_layer_is_split(tmp_path):
    m = gf.models.lc_large(batch=None)
    plan = gf.partition(m.graph, 4, "layerwise", loss=m.loss)
    for v in spatial_layers(plan, BATCH):
        assert len(np.unique(v.out_grid)) == 1
    visualize(plan, tmp_path / "plan.svg")
    assert not svg_groups(parse_svg((tmp_path / "plan.svg").read_text()), "spatial-layer")
