"""Each worker is fed only the rows of the input it reads (partitioners/feeds.py)."""

import numpy as np

import graphflow as gf
from graphflow.partitioners import Plan, partition


def test_spatial_workers_are_fed_their_rows_of_the_image_only(tmp_path):
    m = gf.models.lc_large(batch=None)
    plan = partition(m.graph, 2, "spatial", loss=m.loss)
    # lc1 (7x7, stride 2) output rows 0-11 read image rows 0-28; rows 12-28 read rows 24-62
    assert plan.feeds == {0: {"x": (2, 0, 29)}, 1: {"x": (2, 24, 63)}}
    x = np.random.default_rng(0).standard_normal((4, 3, 64, 64), dtype=np.float32)
    y = np.zeros(4, np.int32)
    fed = [plan.worker_feeds(i, {"x": x, "y": y}) for i in range(2)]
    assert np.array_equal(fed[0]["x"], x[:, :, 0:29]) and fed[0]["x"].flags.c_contiguous
    assert np.array_equal(fed[1]["x"], x[:, :, 24:63])
    # both workers compute the loss from the summed logits (partitioners/recompute.py)
    assert fed[0]["y"] is y and fed[1]["y"] is y
    assert sum(f["x"].nbytes for f in fed) < 1.1 * x.nbytes  # not the whole batch twice
    assert [w.fed_bytes(4) for w in plan.workers] == [sum(v.nbytes for v in f.values())
                                                      for f in fed]
    # worker 0's slice took all it is fed, so it is gone. Worker 1 holds two blocks (the
    # halo rows worker 0 reads, then the rest): it lays out all its 39 rows once, and the
    # blocks take rows 0-14 and 10-38 of that (views: rows of HWCN are contiguous)
    g0, g1 = (w.graph for w in plan.workers)
    assert g0["x"].shape == (None, 3, 29, 64) and "lc1/local2d/in0" not in g0
    assert g1["x"].shape == (None, 3, 39, 64)
    assert not [n for n in g1.nodes if n.op == "slice" and n.inputs[0].name == "x"]
    assert [(n.attrs["begin"][0], n.attrs["end"][0]) for n in g1.nodes
            if n.op == "slice" and n.inputs[0].op == "transpose"] == [(0, 15), (10, 39)]
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).feeds == plan.feeds


def test_inputs_read_whole_are_fed_whole():
    m = gf.models.speech_mlp(batch=None)
    for strategy in ("spatial", "layerwise"):
        plan = partition(m.graph, 2, strategy, loss=m.loss)
        assert plan.feeds == {}
        x = np.ones((2, 440), np.float32)
        assert all(plan.worker_feeds(i, {"x": x}).get("x", x) is x for i in range(2))


def test_partitioned_step_with_cut_feeds_equals_one_process():
    m, whole = gf.models.lc_large(batch=None), gf.models.lc_large(batch=None)
    rng = np.random.default_rng(1)
    batch = {"x": rng.standard_normal((3, 3, 64, 64), dtype=np.float32),
             "y": rng.integers(0, 10, 3).astype(np.int32)}
    grads = gf.gradients(whole.loss, whole.graph.parameters())
    want = gf.Session(whole.graph).run([whole.loss, *grads.values()],
                                       {whole.x: batch["x"], whole.y: batch["y"]})
    plan = partition(m.graph, 2, "spatial", loss=m.loss)
    with gf.runtime.Cluster(plan, mode="threads", timeout=60) as cluster:
        got = cluster.gradients(batch)
    assert abs(got.pop("loss") - want[0]) <= 1e-5 * abs(want[0])
    got = plan.assemble(got)
    for name, value in zip(grads, want[1:], strict=True):
        assert np.allclose(got[name], value, rtol=1e-4, atol=1e-6 * np.abs(value).max()), name


def test_streamed_steps_cut_feeds_into_reused_arrays_without_mixing_steps(monkeypatch):
    """Over processes the driver cuts each worker's rows into arrays it used for a step already
    answered (no fresh pages each step); streamed steps, each on its own batch, still give the
    losses of a run whose every cut is a new array (threads)."""
    from graphflow.runtime.calls import WorkerCalls
    from graphflow.runtime.cluster import Cluster as Driver

    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    rng = np.random.default_rng(3)
    data = [{"x": rng.standard_normal((8, 1, 32, 32), dtype=np.float32),
             "y": rng.integers(0, 10, 8).astype(np.int32)} for _ in range(6)]
    cuts: list[int] = []  # the arrays the workers' rows were cut into, step after step
    send = WorkerCalls.send  # (the driver's calls: runtime/calls.py)

    def spy(self, i, method, args):
        if method == "step":
            cuts.append(id(args["feeds"]["x"]))
        return send(self, i, method, args)

    losses = {}
    for mode in ("threads", "processes"):
        with Driver(plan, mode=mode, optimizer={"name": "sgd", "lr": 0.05}, timeout=60) as c:
            monkeypatch.setattr(WorkerCalls, "send", spy)
            cuts.clear()
            losses[mode] = [out[plan.loss] for out in c.stream(data)]
            monkeypatch.setattr(WorkerCalls, "send", send)
            ids = list(cuts)
    # one step is sent ahead, so two steps' arrays take turns: step 2 reuses step 0's, ...
    steps = [set(ids[k:k + 2]) for k in range(0, len(ids), 2)]
    assert len(set(ids)) == 4 and all(steps[k] == steps[k - 2] for k in range(2, len(steps)))
    np.testing.assert_allclose(losses["processes"], losses["threads"], rtol=1e-6)
