"""Spatial partitioning: the rewritten graph computes the same loss and gradients, weights are
split 1/k per worker, and only the receptive-field halo crosses."""

from collections import Counter
from math import prod

import numpy as np
import pytest

import graphflow as gf
from graphflow.costmodel import CostModel
from graphflow.partitioners import partition
from graphflow.partitioners.rows import SLACK, row_bounds, row_seconds
from graphflow.partitioners.spatial import balanced_rows

WORKLOADS = {"lc-large": (gf.models.lc_large, (3, 64, 64)),
             "digits-lc": (gf.models.digits_lc, (1, 32, 32)),
             "speech-mlp": (gf.models.speech_mlp, (440,))}


def reference(build, x, y):
    m = build(batch=None)
    grads = gf.gradients(m.loss, m.graph.parameters())
    values = gf.Session(m.graph).run([m.loss] + list(grads.values()), {m.x: x, m.y: y})
    return m, values[0], dict(zip(grads, values[1:]))


def check_rewrite(workload, parts, batch, seed):
    """The spatially rewritten graph, run in one session, gives the whole model's loss and
    gradients (blocks of split parameters joined)."""
    build, shape = WORKLOADS[workload]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    model, loss, grads = reference(build, x, y)
    plan = partition(build(batch=None).graph, parts, "spatial", loss=model.loss)
    g = plan.graph
    names = list(plan.grads)
    values = gf.Session(g).run([g[plan.loss]] + [g[plan.grads[n]] for n in names],
                               {"x": x, "y": y})
    assert abs(values[0] - loss) <= 1e-5 * abs(loss)
    got = plan.assemble(dict(zip(names, values[1:])))
    assert set(got) == set(grads)
    for name, want in grads.items():
        scale = np.abs(want).max() + 1e-12
        assert np.abs(got[name] - want).max() <= 1e-5 * scale, name


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_rewritten_graph_matches_single_process(workload, parts):
    check_rewrite(workload, parts, batch=3, seed=parts)


@pytest.mark.parametrize("parts", [2, 4])
def test_local2d_weights_fall_as_one_over_k(parts):
    model = gf.models.lc_large()
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    whole = prod(model.graph["lc2/W"].shape)
    blocks = [n for n in plan.graph.parameters() if n.name.startswith("lc2/W/part")]
    assert len(blocks) == parts
    assert {plan.worker_of(b.name) for b in blocks} == set(range(parts))
    assert sum(prod(b.shape) for b in blocks) == whole
    assert max(prod(b.shape) for b in blocks) <= np.ceil(13 / parts) / 13 * whole


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_only_the_halo_crosses_for_a_split_local2d(parts):
    batch = 64
    model = gf.models.lc_large(batch=batch)
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    # lc2 reads lc1's output rows (29 of them, split like lc1's output) with a 5x5 window,
    # stride 2: block j of lc2's 13 output rows needs input rows [2 lo, 2 (hi - 1) + 5).
    rows = {n.name: b for n, b in balanced_rows(model.graph, parts).items()}
    in_blocks, out_blocks = rows["lc1/local2d"], rows["lc2/local2d"]
    halo_rows = 0
    for j, (lo, hi) in enumerate(out_blocks):
        need = set(range(2 * lo, 2 * (hi - 1) + 5))
        halo_rows += len(need - set(range(*in_blocks[j])))
    row_bytes = 29 * 32 * batch * 4  # one row of the (H, W, C, N) float32 input
    # forward: the halo rows (a slice of a neighbour's block, or a block of rows cut for its
    # neighbours); the rest that crosses is the dense layer's partial sums and the loss
    forward = [t for t in plan.transfers if not t.tensor.startswith(("grad/", "fc/"))]
    # their gradients come back from the consumer (the gradient of its input concat)
    backward = [t for t in plan.transfers if t.tensor.startswith("grad/lc2/local2d/in")]
    assert sum(t.nbytes(batch) for t in forward) == halo_rows * row_bytes
    assert sum(t.nbytes(batch) for t in backward) == halo_rows * row_bytes
    # lc1 reads the (replicated) input: nothing of it crosses
    assert not [t for t in plan.transfers if t.tensor.startswith(("x", "lc1/hwcn"))]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_each_tensor_is_sent_at_most_once_per_destination(workload):
    model = WORKLOADS[workload][0]()
    plan = partition(model.graph, 3, "spatial", loss=model.loss)
    counts = Counter((t.tensor, t.dst) for t in plan.transfers)
    assert counts and max(counts.values()) == 1
    for w in plan.workers:
        keys = [n.attrs["key"] for n in w.graph.nodes if n.op == "recv"]
        assert len(keys) == len(set(keys))


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_no_worker_computes_a_value_nothing_reads(workload, parts):
    """Every forward node a worker runs feeds something (the whole input's layout transpose,
    replaced by each worker's sliced rows, used to stay behind and run every step)."""
    model = WORKLOADS[workload][0]()
    plan = partition(model.graph, parts, "spatial", loss=model.loss)
    for w in plan.workers:
        read = {x.name for n in w.graph.nodes for x in n.inputs}
        unread = [n.name for n in w.graph.nodes if n.name not in read
                  and n.op not in ("send", "placeholder") and not n.name.startswith("grad/")
                  and n.name not in (plan.loss, model.logits.name)]
        assert unread == [], f"worker {w.index}"


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
def test_row_blocks_cover_every_row_within_slack_rows_of_even(parts):
    model = gf.models.lc_large()
    rows = balanced_rows(model.graph, parts)
    assert {n.name for n in rows} == {"lc1/local2d", "lc2/local2d"}
    for node, bounds in rows.items():
        sizes = [hi - lo for lo, hi in bounds]
        assert bounds[0][0] == 0 and bounds[-1][1] == node.shape[0]
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        even = node.shape[0] / parts
        assert min(sizes) >= max(1, np.floor(even) - SLACK)
        assert max(sizes) <= np.ceil(even) + SLACK


def worker_loads(graph, rows, parts):
    cost = CostModel.default()
    load = np.zeros(parts)
    for node, bounds in rows.items():
        for j, (lo, hi) in enumerate(bounds):
            load[j] += (hi - lo) * row_seconds(node, cost)
    return load


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
def test_row_blocks_balance_each_workers_total_better_than_even_layers(parts):
    """Each layer split as evenly as rows allow leaves the odd rows' work where it falls;
    moving rows of the cheaper layer evens the workers' totals."""
    graph = gf.models.lc_large().graph
    rows = balanced_rows(graph, parts)
    even = {n: row_bounds(n.shape[0], parts) for n in rows}
    got, was = worker_loads(graph, rows, parts), worker_loads(graph, even, parts)
    assert got.max() <= was.max()
    assert got.max() - got.min() < 1.2 * max(row_seconds(n, CostModel.default()) for n in rows)
    if parts == 2:  # lc2's odd row is on worker 0, so worker 1 takes more of lc1's rows
        assert [rows[graph[n]] for n in ("lc2/local2d", "lc1/local2d")] == [
            [(0, 7), (7, 13)], [(0, 12), (12, 29)]]
        assert got.max() < was.max()


@pytest.mark.parametrize("workload,parts", [("lc-large", 16), ("digits-lc", 8)])
def test_layers_with_fewer_rows_than_workers_use_one_row_per_worker(workload, parts):
    check_rewrite(workload, parts, batch=2, seed=0)
    build = WORKLOADS[workload][0]
    rows = balanced_rows(build().graph, parts)
    assert any(len(b) < parts for b in rows.values())  # some layer has fewer rows than workers
    assert all(hi - lo >= 1 for b in rows.values() for lo, hi in b)


def test_a_worker_sends_its_halo_rows_before_computing_the_rest_of_its_block(tmp_path):
    """lc-large on 2 workers: worker 0 reads lc1's rows 12-16 from worker 1 (lc2's 5x5 stride-2
    window). Worker 1's lc1 block is cut there, and it computes and sends those rows first."""
    from graphflow.runtime import Cluster
    from graphflow.trace import read, recording
    from graphflow.trace.chrome import events

    model = gf.models.lc_large(batch=None)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    blocks = [(n.name, plan.worker_of(n.name), n.shape[0]) for n in plan.graph.nodes
              if n.op == "local2d" and n.name.startswith("lc1/")]
    assert blocks == [("lc1/local2d/part0", 0, 12), ("lc1/local2d/part1", 1, 5),
                      ("lc1/local2d/part2", 1, 12)]
    halo = [t for t in plan.transfers if t.src == 1 and not t.tensor.startswith(("grad/", "fc/"))]
    # the block itself (lc1's activation, in local2d's layout), no slice
    assert [t.tensor for t in halo] == ["relu/part1"]
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((8, 3, 64, 64), dtype=np.float32),
             "y": rng.integers(0, 10, 8).astype(np.int32)}
    with Cluster(plan, mode="threads", timeout=60) as cluster:
        cluster.gradients(batch)
        with recording(tmp_path / "step.json"):
            cluster.gradients(batch)
    spans = {e.name: e for e in events(read(tmp_path / "step.json"))
             if e.process == "worker 1" and e.thread == "executor"}
    sent = spans[f"send/{halo[0].tensor}->w0"]
    assert sent.ts < spans["lc1/local2d/part2"].ts, "the halo left after the rest of the block"
