"""Pipeline schedules as data, tested without processes."""

import pytest

import graphflow as gf
from graphflow.ir import users_of
from graphflow.partitioners import partition
from graphflow.runtime.pipeline import (
    ALL,
    ROW_BLOCK,
    SCHEDULES,
    check_linear,
    deferred_weight_nodes,
    microbatch_rows,
    schedule,
    simulate,
)


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 4), (4, 4), (4, 8), (3, 2)])
def test_every_stage_runs_each_microbatch_forward_then_backward(kind, stages, microbatches):
    for stage in range(stages):
        tasks = schedule(kind, stage, stages, microbatches)
        assert tasks[-1] == ("W", ALL)  # weight gradients once, over all micro-batches
        tasks = tasks[:-1]
        assert sorted(tasks) == sorted([(p, m) for p in "FB" for m in range(microbatches)])
        for m in range(microbatches):
            assert tasks.index(("F", m)) < tasks.index(("B", m))
        # micro-batches keep their order within each phase
        for phase in "FB":
            assert [m for p, m in tasks if p == phase] == list(range(microbatches))


def _alive(tasks):
    """Most micro-batches whose activations are held at once."""
    alive = peak = 0
    for phase, _ in tasks:
        if phase == "W":
            continue
        alive += 1 if phase == "F" else -1
        peak = max(peak, alive)
    return peak


def test_1f1b_holds_at_most_stages_microbatches_gpipe_all():
    stages, microbatches = 4, 8
    for stage in range(stages):
        assert _alive(schedule("gpipe", stage, stages, microbatches)) == microbatches
        assert _alive(schedule("1f1b", stage, stages, microbatches)) == stages - stage
        # twice 1F1B's warm-up: a micro-batch's round trip through the later stages
        assert _alive(schedule("eager", stage, stages, microbatches)) == 2 * (stages - stage) - 1


def test_eager_first_stage_runs_its_forwards_before_the_first_gradient_comes():
    # 2 stages, 3 micro-batches: 1F1B puts F2 after B0, so stage 0 idles while stage 1 runs
    # micro-batch 0 forward and back (speech-mlp: 9.7 ms of a 100-ms step); eager does F2
    assert schedule("1f1b", 0, 2, 3)[:4] == [("F", 0), ("F", 1), ("B", 0), ("F", 2)]
    assert schedule("eager", 0, 2, 3)[:4] == [("F", 0), ("F", 1), ("F", 2), ("B", 0)]
    assert schedule("eager", 1, 2, 3) == schedule("1f1b", 1, 2, 3)  # the last stage alike


def test_last_stage_of_1f1b_alternates():
    assert schedule("1f1b", 2, 3, 3)[:-1] == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                         ("B", 2)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule("zigzag", 0, 2, 2)
    with pytest.raises(ValueError, match="stage 2 of 2"):
        schedule("gpipe", 2, 2, 2)
    with pytest.raises(ValueError, match="worker 1 to worker 0"):
        check_linear([("h->w0", 1, 0)])
    check_linear([("h->w1", 0, 1), ("grad/h->w0", 1, 0)])


@pytest.mark.parametrize("rows", [5, 8, 18, 63, 64, 65, 100])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5])
def test_microbatches_are_whole_row_blocks_as_even_as_they_go(rows, parts):
    sizes = microbatch_rows(rows, parts)
    assert len(sizes) == parts and sum(sizes) == rows and min(sizes) > 0
    if rows // ROW_BLOCK >= parts:  # the gemm kernels' 4-row tiles: no stray rows but the last
        assert all(s % ROW_BLOCK == 0 for s in sizes[:-1])
        blocks = [s // ROW_BLOCK for s in sizes]
        assert max(blocks) - min(blocks) <= 1 and sizes[-1] % ROW_BLOCK == rows % ROW_BLOCK
    else:
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match=f"{rows} rows cannot make {rows + 1}"):
        microbatch_rows(rows, rows + 1)


def _deferred(model, parts=2):
    plan = partition(model.graph, parts, "layerwise", loss=model.loss)
    out = []
    for w in plan.workers:
        order = w.graph.toposort()
        users = users_of(order)
        grads = {w.graph[g] for p, g in plan.grads.items() if g in w.graph}
        out.append((order, deferred_weight_nodes(order, users, grads), grads))
    return out


def test_weight_gradients_are_deferred_but_nothing_a_send_or_input_gradient_needs():
    for order, deferred, grads in _deferred(gf.models.speech_mlp(batch=None)):
        assert grads and grads <= set(deferred)  # every weight and bias gradient
        chosen = set(deferred)
        for n in deferred:
            assert n.name.startswith("grad/") and n.op not in ("send", "recv")
        for n in order:  # nothing outside the W phase reads a deferred value
            if n not in chosen:
                assert not chosen & set(n.inputs), n.name


def _deferred_in(g, grads):
    order = g.toposort()
    users = users_of(order)
    return [n.name for n in deferred_weight_nodes(order, users, set(grads))]


@pytest.mark.parametrize("batch_free_term", [False, True])
def test_a_batch_free_per_microbatch_input_keeps_a_gradient_per_microbatch(batch_free_term):
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        dy = gf.placeholder("dy", (None, 2))
        dw = gf.matmul(gf.transpose(x, (1, 0), name="grad/xt"), dy, name="grad/dw")
        if batch_free_term:  # differs per micro-batch and cannot be joined: nothing deferred
            dw = gf.add(dw, gf.reduce_sum(gf.square(x)), name="grad/w")
    want = [] if batch_free_term else ["grad/xt", "grad/dw"]
    assert _deferred_in(g, [dw]) == want


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 4), (4, 8)])
def test_simulated_bubble_of_equal_stages(kind, stages, microbatches):
    """Every schedule keeps S - 1 idle slots of forward and of backward per stage."""
    ends = simulate(kind, microbatches, [1.0] * stages, [1.0] * stages, [0.0] * stages)
    assert ends[0] == 2 * (microbatches + stages - 1)


def test_simulated_first_stage_runs_weight_gradients_while_a_gradient_is_late():
    # stage 1 (2 s per F or B) is slower than stage 0 (1 s): stage 0 waits 9 - 6 s for the
    # last gradient and does micro-batch 0's W (1 s) then; micro-batch 1's W ends the step
    ends = simulate("1f1b", 2, forward=[1, 2], backward=[1, 2], weights=[1, 0])
    assert ends == [11.0, 9.0]  # without the early W: 12
    # a tensor's hop between the stages delays each dependent task by it
    assert simulate("gpipe", 1, [1, 1], [1, 1], [0, 0], hops=[0.5]) == [5.0, 3.5]

