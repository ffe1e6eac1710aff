"""The W phase's backlog: groups of W nodes, each taking the micro-batches it has not taken,
joined; and a worker that fills its waits one group at a time, and hands its last part of a
gradient to the update apart, gives the same gradients and parameters; the loss waits for the
W task."""

import time

import numpy as np
import pytest

import graphflow as gf
from graphflow.ir import users_of
from graphflow.partitioners import partition
from graphflow.runtime.backlog import Backlog, early_updates, weight_groups
from graphflow.runtime.pipeline import deferred_weight_nodes


def _first_stage_weights():
    model = gf.models.speech_mlp(batch=None)
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    w = plan.workers[0]
    order = w.graph.toposort()
    grads = {w.graph[g] for g in plan.grads.values() if g in w.graph}
    return deferred_weight_nodes(order, users_of(order), grads), grads


def test_each_group_ends_in_its_own_gradient():
    weights, grads = _first_stage_weights()
    groups = weight_groups(weights)
    assert sorted(n.name for g in groups for n in g) == sorted(n.name for n in weights)
    ends = [sorted(n.name for n in g if n in grads) for g in groups]
    # fc2-fc4's weight and bias gradients each alone; fc1's two share their sigmoid_grad
    assert sorted(map(len, ends)) == [1] * 6 + [2]
    assert ["grad/fc1/add/sum_to", "grad/fc1/matmul/matmul"] in ends
    for g in groups:  # a group keeps the run order, so its nodes' inputs come first
        seen = set()
        for n in g:
            assert not {x for x in n.inputs if x in set(g)} - seen, n.name
            seen.add(n)


def test_a_group_takes_only_the_micro_batches_it_has_not_taken():
    with gf.Graph():
        x, dy = gf.placeholder("x", (None, 3)), gf.placeholder("dy", (None, 2))
        dw = gf.matmul(x, dy, transpose_a=True, name="grad/w")
        db = gf.reduce_sum(dy, 0, name="grad/b")
    groups = weight_groups([dw, db])
    assert groups == [[dw], [db]]
    backlog = Backlog(groups, [x, dy])
    rng = np.random.default_rng(0)
    mbs = [(rng.standard_normal((r, 3)), rng.standard_normal((r, 2))) for r in (2, 3, 4)]
    backlog.add(list(mbs[0]))
    first = backlog.take(0)  # the weight's group runs early, over micro-batch 0
    np.testing.assert_array_equal(first[x], mbs[0][0])
    assert dy in first and backlog.waiting() == [1]
    backlog.add(list(mbs[1]))
    backlog.add(list(mbs[2]))
    assert backlog.waiting() == [0, 1]
    late = backlog.take(0)  # micro-batches 1 and 2, joined: one gemm over 7 rows
    np.testing.assert_array_equal(late[x], np.concatenate([mbs[1][0], mbs[2][0]]))
    assert backlog.entries[0] is not None  # group 1 has yet to take micro-batch 0
    bias = backlog.take(1)
    np.testing.assert_array_equal(bias[dy], np.concatenate([m[1] for m in mbs]))
    assert x not in bias  # only what the group reads
    assert backlog.entries == [None, None, None] and backlog.waiting() == []


def test_a_weight_read_by_a_later_group_or_sent_is_updated_at_the_end():
    with gf.Graph() as g:
        x, dy = gf.placeholder("x", (None, 3)), gf.placeholder("dy", (None, 2))
        w, v, u = (gf.parameter(name, (3, 2)) for name in "wvu")
        dw = gf.matmul(x, dy, transpose_a=True, name="grad/w")
        dv = gf.matmul(x, dy, transpose_a=True, name="grad/v")
        du = gf.add(gf.matmul(x, dy, transpose_a=True), w, name="grad/u")  # reads w
        g.insert("send", "send/v->w1", [v], {"key": "v", "src": 0, "dst": 1}, (), v.dtype,
                 None, None)
    grads = {"w": dw.name, "v": dv.name, "u": du.name}
    groups = [[dw], [dv], [du.inputs[0], du]]
    assert early_updates(groups, grads, g.toposort()) == [[], [], ["u"]]
    assert early_updates(groups[::-1], grads, []) == [["u"], ["v"], ["w"]]


def test_a_stage_updates_a_weight_as_soon_as_its_last_gradient_run_is_done(monkeypatch):
    """In the W task each weight's update follows its gradient's last gemm, before the next
    group's gemm (it streams memory while the other stage computes, not beside the other
    stage's update); the parameters after a few steps are one process's."""
    from graphflow.optim import SGD, Optimizer
    from graphflow.runtime import worker

    events = []
    update, run_kernel = Optimizer.update, worker.run_kernel

    def spy_update(self, name, param, grad, scale=1.0, also=None):
        events.append(name)
        update(self, name, param, grad, scale, also)

    def spy_kernel(node, inputs, check_numerics=False):
        events.append(node.name)
        return run_kernel(node, inputs, check_numerics)

    model = _light_first_stage(light_layers=2)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((32, 16), dtype=np.float32),
                "y": rng.integers(0, 10, 32).astype(np.int32)} for _ in range(3)]
    trainer = gf.Trainer(model, SGD(0.05))
    for b in batches:
        trainer.step(b["x"], b["y"])
    model = _light_first_stage(light_layers=2)
    plan = partition(model.graph, 2, "manual", loss=model.loss)
    monkeypatch.setattr(Optimizer, "update", spy_update)
    monkeypatch.setattr(worker, "run_kernel", spy_kernel)
    with gf.Cluster(plan, mode="threads", optimizer={"name": "sgd", "lr": 0.05},
                    microbatches=2, timeout=60) as c:
        for b in batches:
            c.step(b)
        got = plan.assemble(c.params())
    fc2_gemm, fc1_gemm = plan.grads["fc2/W"], plan.grads["fc1/W"]
    mine = [e for e in events if e.startswith(("fc", "grad/fc"))]  # (not worker 1's)
    last = len(mine) - 1 - mine[::-1].index(fc2_gemm)  # the last step's W task
    after = mine[last + 1:]
    assert fc1_gemm in after, after  # an earlier layer's group runs after fc2's
    assert after.index("fc2/W") < after.index(fc1_gemm), after
    for name, want in trainer.session.params.items():
        _assert_close(got[name], want, f"parameter {name} after 3 steps")


@pytest.mark.parametrize("schedule", ["1f1b", "eager"])
@pytest.mark.parametrize("microbatches", [3, 4])
def test_pipelined_step_with_early_weight_groups_equals_single_process(schedule, microbatches):
    # speech-mlp's first stage fills its waits a weight gradient at a time, so each gradient
    # is summed over a different split of the micro-batches; the sums must still be the batch's
    model = gf.models.speech_mlp(batch=None)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 440)).astype(np.float32),
             "y": rng.integers(0, 10, 8).astype(np.int32)}
    grads = gf.gradients(model.loss, model.graph.parameters())
    want = gf.Session(model.graph).run([model.loss, *grads.values()],
                                       {model.x: feeds["x"], model.y: feeds["y"]})
    plan = partition(gf.models.speech_mlp(batch=None).graph, 2, "layerwise", loss=model.loss)
    with gf.Cluster(plan, microbatches=microbatches, schedule=schedule, timeout=60) as cluster:
        out = cluster.gradients(feeds)
    assert abs(float(out.pop("loss")) - float(want[0])) <= 1e-5 * abs(float(want[0]))
    got = plan.assemble(out)
    for name, value in zip(grads, want[1:], strict=True):
        scale = float(np.abs(value).max())
        assert float(np.abs(got[name] - value).max()) <= 1e-5 * scale, name


@pytest.mark.parametrize("spec", [{"name": "sgd", "lr": 0.05},
                                  {"name": "adagrad", "lr": 0.05, "initial_accumulator": 0.1}],
                         ids=lambda s: s["name"])
def test_first_stage_update_adds_its_last_weight_gradient_part(spec, monkeypatch):
    """A light first stage before a heavy second one runs micro-batch 0's weight gradients
    while it waits, and leaves micro-batch 1's as a part of its own that the update adds; the
    parameters after a few steps are one process's."""
    from graphflow.optim import Optimizer
    from graphflow.runtime import worker

    parts = []
    update, run_kernel = Optimizer.update, worker.run_kernel

    def spy(self, name, param, grad, scale=1.0, also=None):
        parts.append((name, also is not None))
        update(self, name, param, grad, scale, also)

    def late(node, inputs, check_numerics=False):  # worker 1's gradients come late, surely
        if node.name.startswith("grad/big"):
            time.sleep(0.005)
        return run_kernel(node, inputs, check_numerics)

    monkeypatch.setattr(Optimizer, "update", spy)
    monkeypatch.setattr(worker, "run_kernel", late)
    model = _light_first_stage()
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((32, 16), dtype=np.float32),
                "y": rng.integers(0, 10, 32).astype(np.int32)} for _ in range(3)]
    trainer = gf.Trainer(model, gf.optim.OPTIMIZERS[spec["name"]](
        **{k: v for k, v in spec.items() if k != "name"}))
    for b in batches:
        trainer.step(b["x"], b["y"])
    parts.clear()
    model = _light_first_stage()  # (a graph of its own: the trainer's has gradient nodes)
    plan = partition(model.graph, 2, "manual", loss=model.loss)
    with gf.Cluster(plan, mode="threads", optimizer=spec, microbatches=2, timeout=60) as c:
        for b in batches:
            c.step(b)
        got = plan.assemble(c.params())
    assert ("fc1/W", True) in parts, parts
    for name, want in trainer.session.params.items():
        _assert_close(got[name], want, f"parameter {name} after 3 steps")


def test_first_stage_fills_its_cooldown_waits_with_weight_gradients(tmp_path, monkeypatch):
    """A light first stage before a heavy second one: while it waits for a late micro-batch's
    gradient, the first stage already runs the weight-gradient (W) work of the micro-batches
    done so far, in more than one W run; a later run's weight gemm adds into the gradient's
    sum in place; the gradients still equal one process's."""
    from graphflow.runtime import worker

    accumulated = []

    def spy(node, inputs, out, check_numerics=False):
        accumulated.append(node.name)
        return accumulate_kernel(node, inputs, out, check_numerics)

    accumulate_kernel = worker.accumulate_kernel
    monkeypatch.setattr(worker, "accumulate_kernel", spy)

    model = _light_first_stage(heavy_layers=2)
    g, x, y, loss = model.graph, model.x, model.y, model.loss
    feeds = _feeds()
    plan = partition(g, 2, "manual", loss=loss)
    out, spans = _traced_step(plan, feeds, 4, "worker 0", tmp_path)
    assert spans.count("grad/fc1/matmul/matmul") >= 2, spans  # one W run at the end before
    assert "grad/fc1/matmul/matmul" in accumulated

    grads = gf.gradients(loss, g.parameters())
    values = gf.Session(g).run([loss, *grads.values()], {x: feeds["x"], y: feeds["y"]})
    _assert_close(out.pop("loss"), values[0], "loss")
    got = plan.assemble(out)
    for name, want in zip(grads, values[1:], strict=True):
        _assert_close(got[name], want, f"gradient of {name}")


def test_last_stage_computes_the_loss_once_every_gradient_is_sent(tmp_path):
    """The backward pass starts from a constant 1, not from the loss value, so a pipelined
    last stage leaves each micro-batch's loss (only fetched) to its W task: no gradient the
    first stage waits for queues behind it. The loss is still the whole batch's."""

    model = _light_first_stage()
    plan = partition(model.graph, 2, "manual", loss=model.loss)
    seed = plan.workers[1].graph[f"grad/{model.loss.name}"]
    assert seed.op == "constant" and not seed.inputs
    feeds = _feeds()
    out, spans = _traced_step(plan, feeds, 3, "worker 1", tmp_path)
    sends = [i for i, name in enumerate(spans) if name.startswith("send/grad/")]
    losses = [i for i, name in enumerate(spans) if name == model.loss.name]
    assert len(sends) == 3 and len(losses) == 3, spans
    assert max(sends) < min(losses), spans
    want = gf.Session(model.graph).run([model.loss], {model.x: feeds["x"], model.y: feeds["y"]})
    _assert_close(out["loss"], want[0], "loss")


def _feeds():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((64, 16), dtype=np.float32),
            "y": rng.integers(0, 10, 64).astype(np.int32)}


def _traced_step(plan, feeds, microbatches, worker, tmp_path):
    """A pipelined (1F1B) step's gradients after a warm-up step, and the names of the spans
    `worker`'s executor ran in it, in order."""
    from graphflow.trace import read, recording
    from graphflow.trace.chrome import events

    with gf.Cluster(plan, microbatches=microbatches, schedule="1f1b", timeout=60) as cluster:
        cluster.gradients(feeds)
        with recording(tmp_path / "step.json"):
            out = cluster.gradients(feeds)
    return out, [e.name for e in events(read(tmp_path / "step.json"))
                 if e.process == worker and e.thread == "executor"]


def _light_first_stage(heavy_layers=1, light_layers=1):
    """A 2-worker model whose first stage is light and second heavy: the first one's
    gradients come late."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 16))
        y = gf.placeholder("y", (None,), dtype="int32")
        h = x
        for i in range(light_layers):
            h = gf.sigmoid(gf.layers.dense(h, 32, name=f"fc{i + 1}"))
        with gf.device("worker:1"):
            for i in range(heavy_layers):
                h = gf.sigmoid(gf.layers.dense(h, 1536, name=f"big{i + 1}"))
            logits = gf.layers.dense(h, 10, name="out")
            loss = gf.softmax_cross_entropy(logits, y)
    return gf.models.Model("light-first", g, x, y, logits, loss)


def _assert_close(got, want, what):
    scale = float(np.abs(want).max()) + 1e-12
    err = float(np.abs(np.asarray(got) - want).max())
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"
