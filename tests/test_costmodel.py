"""The cost model: list-scheduling predictions on tiny graphs with injected times, the fallback
estimate, the cache, and a calibration smoke test."""

import json

import numpy as np
import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, Link, signature, tensor_bytes

ROW = 4 * 1000  # bytes of one float32 row of width 1000


def _chain():
    """x -> a -> b -> c, each [N, 1000]."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        c = gf.neg(gf.neg(gf.neg(x, name="a"), name="b"), name="c")
    return g, c


def _fork():
    """x -> a; a -> l1 -> l2; a -> r1 -> r2 (two independent branches after a)."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        a = gf.neg(x, name="a")
        gf.neg(gf.neg(a, name="l1"), name="l2")
        gf.neg(gf.neg(a, name="r1"), name="r2")
    return g


def _model(times, bandwidth=ROW, latency=0.0):
    """Times in seconds per node name; a link that moves one batch-1 tensor per second; no
    CPU time on messages."""
    return CostModel(times=times, link=Link(bandwidth, latency), batch=1, message_cpu_s=0.0)


def test_chain_on_one_worker_is_the_sum_of_times():
    g, _ = _chain()
    cm = _model({"a": 1.0, "b": 2.0, "c": 4.0})
    p = cm.predict(g, dict.fromkeys(["x", "a", "b", "c"], 0))
    assert p.step_seconds == pytest.approx(7.0)
    assert p.busy == [pytest.approx(7.0)] and p.transfers == []


def test_independent_branches_overlap():
    g = _fork()
    cm = _model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    one = cm.predict(g, {n.name: 0 for n in g})
    assert one.step_seconds == pytest.approx(11.0)
    placement = {"x": 0, "a": 0, "l1": 0, "l2": 0, "r1": 1, "r2": 1}
    two = cm.predict(g, placement)
    assert two.step_seconds == pytest.approx(1.0 + max(4.0, 6.0))
    assert two.busy == [pytest.approx(5.0), pytest.approx(6.0)]


def test_contention_slows_only_the_time_two_workers_compute_at_once():
    g = _fork()
    cm = _model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    placement = {"x": 0, "a": 0, "l1": 0, "l2": 0, "r1": 1, "r2": 1}
    # after a (1 s, alone), l1 l2 (4 s) run beside r1 r2 (6 s): the first 4 s of each are
    # shared, so l1 l2 take 1.5x as long and r1 (3 s) too, r2 for 1 of its 3 s
    two = cm.predict(g, placement, contention=1.5)
    assert two.busy == [pytest.approx(1.0 + 6.0), pytest.approx(4.5 + 3.0 * (1 + 0.5 / 3))]
    assert two.step_seconds == pytest.approx(1.0 + 4.5 + 3.5)
    # a chain across workers never computes on two at once: nothing slows down
    chain, _ = _chain()
    cm = _model({"a": 1.0, "b": 1.0, "c": 1.0}, bandwidth=1e18)
    split = {"x": 0, "a": 0, "b": 1, "c": 0}
    assert cm.predict(chain, split, contention=2.0).step_seconds == pytest.approx(3.0)


def test_cut_edge_adds_the_transfer_time():
    g, _ = _chain()
    cm = _model({"a": 1.0, "b": 2.0, "c": 4.0}, latency=0.5)
    p = cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1})
    assert p.step_seconds == pytest.approx(1.0 + 1.5 + 2.0 + 4.0)
    (t,) = p.transfers
    assert (t.tensor, t.src, t.dst, t.nbytes) == ("a", 0, 1, ROW)
    assert t.seconds == pytest.approx(1.5) and t.start == pytest.approx(1.0)
    assert p.bytes_out == [ROW, 0] and p.bytes_in == [0, ROW]


def test_a_message_costs_both_ends_cpu_without_delaying_an_idle_receiver():
    # a -> b across workers, the link 0.5 s: the sender spends 0.2 s on the message after a,
    # the receiver 0.2 s before the tensor is there (within the link's time: it was idle)
    g, _ = _chain()
    cm = _model({"a": 1.0, "b": 2.0, "c": 4.0}, bandwidth=1e18, latency=0.5)
    cm.message_cpu_s = 0.2
    p = cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1})
    assert p.step_seconds == pytest.approx(1.0 + 0.5 + 2.0 + 4.0)
    assert p.busy == [pytest.approx(1.2), pytest.approx(6.2)]
    # a message that costs more CPU than the link's time delays its tensor by the difference
    cm.message_cpu_s = 0.7
    assert cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1}).step_seconds == \
        pytest.approx(1.0 + 0.7 + 2.0 + 4.0)


def test_a_busy_receiver_pays_for_a_message_before_the_next_node_on_it():
    # worker 1 computes r1 (3 s) while a's tensor arrives at 1 s: it takes in the message
    # (0.25 s) after r1, then l1 (ready since 1 s) before r2 (ready at 3 s)
    cm = _model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    cm.message_cpu_s = 0.25
    with gf.Graph() as solo:  # r1 needs no input from worker 0: a constant's negation
        c = gf.constant(np.ones((1, 1000), np.float32), name="c")
        a = gf.neg(c, name="a")
        gf.neg(gf.neg(a, name="l1"), name="l2")
        gf.neg(gf.neg(c, name="r1"), name="r2")
    p = cm.predict(solo, {"c": 0, "a": 0, "l1": 1, "l2": 1, "r1": 1, "r2": 1})
    # worker 1: r1 0-3, the receipt 3-3.25, l1 3.25-5.25, r2 5.25-8.25, l2 8.25-10.25;
    # worker 0: a, then its 0.25 s on the send
    assert p.busy == [pytest.approx(1.25), pytest.approx(10.25)]
    assert p.step_seconds == pytest.approx(10.25)


def test_transfer_to_two_consumers_on_one_worker_is_sent_once():
    g = _fork()
    cm = _model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0})
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 1, "r2": 1})
    assert [(t.tensor, t.dst) for t in p.transfers] == [("a", 1)]
    assert p.step_seconds == pytest.approx(1.0 + 1.0 + 10.0)


def test_sends_out_of_one_worker_serialise():
    g = _fork()
    cm = _model({"a": 1.0, "l1": 1.0, "l2": 1.0, "r1": 1.0, "r2": 1.0})
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 2, "r2": 2})
    starts = sorted(t.start for t in p.transfers)
    assert starts == [pytest.approx(1.0), pytest.approx(2.0)]  # second waits for the first
    assert p.step_seconds == pytest.approx(3.0 + 2.0)


def test_sends_in_a_row_serialise_their_bytes_but_overlap_their_latency():
    g = _fork()
    cm = _model({"a": 1.0, "l1": 1.0, "l2": 1.0, "r1": 1.0, "r2": 1.0}, latency=0.5)
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 2, "r2": 2})
    first, second = sorted(p.transfers, key=lambda t: t.start)
    assert (first.start, first.seconds) == (pytest.approx(1.0), pytest.approx(1.5))
    assert (second.start, second.seconds) == (pytest.approx(2.0), pytest.approx(1.5))
    assert p.step_seconds == pytest.approx(3.5 + 2.0)


def test_messages_into_one_worker_queue_on_its_link():
    with gf.Graph() as g:  # workers 1 and 2 each send worker 0 a part at once: a gather
        x = gf.placeholder("x", (None, 1000))
        gf.add(gf.neg(x, name="p1"), gf.exp(x, name="p2"), name="s")
    cm = _model({"p1": 1.0, "p2": 1.0, "s": 1.0}, latency=0.25)
    p = cm.predict(g, {"x": 0, "p1": 1, "p2": 2, "s": 0})
    assert sorted(t.start + t.seconds for t in p.transfers) == [pytest.approx(2.25),
                                                                pytest.approx(3.25)]
    assert p.step_seconds == pytest.approx(3.25 + 1.0)
    assert p.bytes_in == [2 * ROW, 0, 0]


def test_a_link_takes_in_a_message_in_the_first_gap_after_it_arrives():
    from graphflow.stepsim import _Inbox

    inbox = _Inbox()  # messages are simulated out of time order: later ones may come first
    assert inbox.take(5.0, 1.0) == 6.0
    assert inbox.take(0.0, 2.0) == 2.0  # before the first, which it does not delay
    assert inbox.take(1.0, 2.0) == 4.0  # after the second, in the gap before the first
    assert inbox.take(3.0, 2.0) == 8.0  # no gap of 2 s left before 6
    assert inbox.busy == [(0.0, 2.0), (2.0, 4.0), (5.0, 6.0), (6.0, 8.0)]


def test_a_worker_runs_what_a_peer_waits_for_first_as_the_runtime_does():
    with gf.Graph() as g:  # h comes first in graph order, but b on worker 0 waits for a
        x = gf.placeholder("x", (None, 1000))
        gf.neg(x, name="h")
        gf.neg(gf.neg(x, name="a"), name="b")
    cm = _model({"h": 10.0, "a": 1.0, "b": 1.0})
    p = cm.predict(g, {"x": 0, "h": 1, "a": 1, "b": 0})
    assert p.transfers[0].start == pytest.approx(1.0)  # a, then h
    assert p.step_seconds == pytest.approx(1.0 + 10.0)
    assert p.finish == [pytest.approx(3.0), pytest.approx(11.0)]


def test_a_pending_receive_does_not_hold_up_independent_nodes():
    with gf.Graph() as g:  # b waits for a from worker 1; c, after b in graph order, runs first
        x = gf.placeholder("x", (None, 1000))
        a, d = gf.neg(x, name="a"), gf.neg(x, name="d")
        gf.neg(a, name="b")
        gf.neg(d, name="c")
    assert [n.name for n in g.toposort()] == ["x", "a", "d", "b", "c"]
    cm = _model({"a": 5.0, "b": 1.0, "c": 3.0, "d": 0.5})
    p = cm.predict(g, {"x": 0, "a": 1, "b": 0, "c": 0, "d": 0})
    assert p.step_seconds == pytest.approx(5.0 + 1.0 + 1.0)  # a, its transfer, b


def test_placeholders_are_local_and_parameters_are_sent_from_their_owner():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w = gf.parameter("w", (1000,))
        gf.mul(x, w, name="m")
    cm = _model({"m": 1.0})
    p = cm.predict(g, {"x": 0, "w": 0, "m": 1})
    assert [t.tensor for t in p.transfers] == ["w"]
    assert p.step_seconds == pytest.approx(1.0 + 1.0)


def test_each_worker_ends_with_the_update_of_its_parameters_at_the_measured_rate():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w = gf.parameter("w", (1000,))
        gf.mul(x, w, name="m")
    # an update makes three passes over the parameter's 4000 bytes: 12000 bytes a second,
    # after its call (a quarter of a second here)
    cm = CostModel(times={"m": 1.0}, update_Bps=3 * ROW, bandwidth_Bps=1.0, batch=1,
                   update_call_s=0.25)
    p = cm.predict(g, {"x": 0, "w": 0, "m": 0})
    assert p.step_seconds == pytest.approx(1.0 + 0.25 + 1.0)
    assert p.busy == [pytest.approx(2.25)]


def test_updates_of_workers_on_one_machine_share_its_memory():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w0, w1 = gf.parameter("w0", (1000,)), gf.parameter("w1", (1000,))
        gf.mul(x, w0, name="m0")
        gf.mul(x, w1, name="m1")
    place = {"x": 0, "w0": 0, "m0": 0, "w1": 1, "m1": 1}
    # alone an update takes 1 s; two at once go at half the rate each
    cm = CostModel(times={"m0": 1.0, "m1": 1.0}, update_Bps=3 * ROW,
                   update_shared_Bps=1.5 * ROW, bandwidth_Bps=1.0, batch=1, update_call_s=0)
    assert cm.predict(g, place, contention=1.5).busy == [pytest.approx(1.5 + 2.0)] * 2
    # on two machines (no contention) each update runs alone
    assert cm.predict(g, place).busy == [pytest.approx(2.0)] * 2
    # staggered: only the overlapping half of each update is slowed
    cm.times["m1"] = 1.5
    assert cm.predict(g, place, contention=1.0 + 1e-9).busy == [
        pytest.approx(1.0 + 1.5), pytest.approx(1.5 + 1.5)]
    # a shared rate measured above the lone one (noise) never shortens an update
    noisy = CostModel(update_Bps=20e9, update_shared_Bps=30e9)
    assert noisy.concurrent_updates([0.0, 0.0], [1.0, 1.0]) == [1.0, 1.0]


def test_missing_placement_names_the_nodes():
    g, _ = _chain()
    with pytest.raises(KeyError, match="no worker"):
        _model({}).predict(g, {"x": 0})


def test_link_presets_and_transfer_seconds():
    ten = Link.ten_gigabit()
    assert ten.bandwidth_Bps == pytest.approx(1.25e9) and ten.latency_s == pytest.approx(1e-4)
    cm = CostModel.builtin()
    assert cm.transfer_seconds(1.2e9) == pytest.approx(1.0 + 300e-6)
    assert cm.transfer_seconds(1.25e9, ten) == pytest.approx(1.0001)


def test_fallback_estimate_uses_flops_and_bytes():
    m = gf.models.speech_mlp(batch=None)
    cm = CostModel(flop_rates={"*": 1e9}, bandwidth_Bps=1e9, overhead_s=0.0, dispatch_s=0.0)
    matmul = m.graph["fc2/matmul"]
    assert cm.node_seconds(matmul) == pytest.approx(2 * 64 * 2560 * 2560 / 1e9)
    sig = cm.node_seconds(m.graph["sigmoid_1"])
    assert sig == pytest.approx(2 * tensor_bytes(m.graph["sigmoid_1"], 64) / 1e9, rel=0.5)
    assert cm.node_seconds(m.graph["fc2/W"]) == 0.0
    assert cm.node_seconds(matmul, batch=128) == pytest.approx(2 * cm.node_seconds(matmul))


def test_a_worker_s_time_around_each_kernel_is_added_to_every_kernel_but_not_to_sources():
    m = gf.models.speech_mlp(batch=None)
    matmul, sig = m.graph["fc2/matmul"], signature(m.graph["fc2/matmul"], 64)
    bare = CostModel(measured={sig: [0.25, "matmul", 1, 1]}, dispatch_s=0.0)
    cm = CostModel(measured={sig: [0.25, "matmul", 1, 1]}, dispatch_s=0.5)
    assert cm.node_seconds(matmul) == pytest.approx(0.75)  # a measured kernel
    sigmoid = m.graph["sigmoid_1"]  # the fallback estimate
    assert cm.node_seconds(sigmoid) == pytest.approx(bare.node_seconds(sigmoid) + 0.5)
    assert cm.node_seconds(m.graph["fc2/W"]) == cm.node_seconds(m.graph["x"]) == 0.0


def test_time_around_kernels_updates_and_messages_is_measured_positive_and_small():
    from graphflow.timing import time_dispatch, time_messages, time_update_call

    # (bounds that hold on any machine that runs the suite; the figures are in the notes)
    assert 0.0 <= time_dispatch(1) < 1e-3
    assert 0.0 < time_update_call(1) < 1e-3
    cpu, hop = time_messages(1)  # between two worker processes
    assert 0.0 <= cpu < 1e-3 and 1e-6 < hop < 5e-3


def test_predict_is_fast_on_a_training_graph():
    import time

    m = gf.models.speech_mlp(batch=64)
    gf.gradients(m.loss, m.graph.parameters())
    cm = CostModel.builtin()
    placement = {n.name: i % 4 for i, n in enumerate(m.graph)}
    cm.predict(m.graph, placement)
    t0 = time.perf_counter()
    p = cm.predict(m.graph, placement)
    assert time.perf_counter() - t0 < 0.05
    assert p.step_seconds >= max(p.busy) > 0 and len(p.busy) == 4


def test_default_without_cache_is_builtin(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "none.json"))
    cm = CostModel.default()
    assert cm.measured == {} and cm.link == Link.builtin()


def test_local_plans_are_predicted_with_the_contention_the_bench_measured(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    with gf.Graph() as g:  # two branches side by side, one a worker
        a = gf.neg(gf.placeholder("x", (None, 1000)), name="a")
        gf.neg(gf.neg(a, name="l1"), name="l2")
        with gf.device("worker:1"):
            gf.neg(gf.neg(a, name="r1"), name="r2")
    plan = gf.partition(g, 2, "manual")
    cm = _model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    alone = plan.predict(1, cm).step_seconds
    cm.contentions = {"lc-large": 1.5, "speech-mlp": 1.3, "mine": 1.1}
    cm.save()
    assert CostModel.default().contention == pytest.approx(1.3)  # the median
    slower = cm.predict(plan.graph, plan.placement, 1, contention=1.3).step_seconds
    assert plan.predict(1, cm).step_seconds == pytest.approx(slower) and slower > alone
    assert plan.predict(1, cm, link=Link(1e18, 0.0)).step_seconds == alone  # other machines
    assert "slow each other 1.30x" in plan.report(1, cm)
    # a later run's measure replaces its workload's; the others stay
    again = CostModel(batch=1)
    again.contentions = {"mine": 1.2}
    again.save()
    assert CostModel.default().contentions == {"lc-large": 1.5, "speech-mlp": 1.3, "mine": 1.2}


def test_calibration_smoke_and_cache(tmp_path, monkeypatch):
    path = tmp_path / "cm.json"
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(path))
    m = gf.models.digits_lc()
    gf.gradients(m.loss, m.graph.parameters())
    cm = CostModel.calibrate(m.graph, batch=8, repeats=1)
    computed = [n for n in m.graph if n.op not in ("placeholder", "parameter", "constant")]
    assert all(signature(n, 8) in cm.measured for n in computed)
    assert all(cm.node_seconds(n, 8) > 0 for n in computed)
    assert cm.link.bandwidth_Bps > 0 and cm.link.latency_s > 0
    assert all(rate > 0 for rate in cm.flop_rates.values()) and cm.bandwidth_Bps > 0
    assert len(json.loads(path.read_text())["machines"]) == 1
    again = CostModel.default(batch=8)
    assert again.measured == cm.measured and again.link == cm.link
    assert cm.update_Bps > 0 and again.update_Bps == cm.update_Bps
    assert cm.message_cpu_s != CostModel().message_cpu_s  # measured, not the built-in's
    assert again.message_cpu_s == cm.message_cpu_s
    assert 0 < cm.update_shared_Bps and again.update_shared_Bps == cm.update_shared_Bps
    n = m.graph["lc2/local2d"]
    assert again.node_seconds(n) == cm.node_seconds(n, 8)


def test_a_worker_process_times_the_kernels_a_driver_ships_it():
    # `graphflow bench speedup` times kernels where its steps run, not in the driver
    from graphflow.costmodel import kernels
    from graphflow.partitioners import partition
    from graphflow.timing import kernel_specs

    m = gf.models.digits_lc(batch=None)
    plan = partition(m.graph, 1, "layerwise", loss=m.loss)
    with gf.Graph() as g:  # a kernel the worker's own plan does not have, small and large
        gf.matmul(gf.placeholder("a", (8, 16)), gf.placeholder("b", (16, 16)), name="small")
        gf.matmul(gf.placeholder("c", (512, 512)), gf.placeholder("d", (512, 1024)),
                  name="large")
    shipped = {**kernels(plan.graph, 8), **kernels(g, 8)}
    with gf.Cluster(plan, mode="processes", timeout=60) as cluster:
        got = cluster.call_all("time_kernels", {"kernels": kernel_specs(shipped, 8)})[0]
    assert set(got["kernel_s"]) == set(shipped)  # local2d's tuple attrs went through msgpack
    assert all(t > 0 for t in got["kernel_s"].values())
    small, large = (got["kernel_s"][signature(g[n], 8)] for n in ("small", "large"))
    # far more FLOPs: the shapes were the shipped ones (the small one is mostly the call,
    # 30-60 us in a worker process; beside a 256 x 512 x 512 gemm's 0.65 ms it sat near 1/20)
    assert large > 20 * small
    assert got["update_Bps"] > 0 and got["update_shared_Bps"] > 0


def test_a_stream_of_steps_overlaps_them_each_worker_starting_when_its_own_step_ends():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        gf.add(gf.neg(x, name="a"), gf.neg(x, name="c"), name="d")
    cm = _model({"a": 1.0, "c": 3.0, "d": 1.0}, bandwidth=1e18)
    placement = {"x": 0, "a": 0, "c": 1, "d": 0}
    # one step: worker 0 runs a, waits for c (3 s) and runs d: 4 s. In a stream, worker 1
    # starts its next c as soon as it has sent this one, so a step takes its 3 s
    assert cm.predict(g, placement).step_seconds == pytest.approx(4.0)
    assert cm.stream_seconds(g, placement) == pytest.approx(3.0)
    assert cm.stream_seconds(g, dict.fromkeys(placement, 0)) == pytest.approx(5.0)


def test_a_saved_kernel_keeps_its_faster_time_and_the_other_kernels(tmp_path, monkeypatch):
    # a calibration taken while the machine is busy must not slow the cache that plans read
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    CostModel(measured={"a": [1e-3, "matmul", 2e6, 1e3], "b": [2e-3, "matmul", 4e6, 1e3]}).save()
    CostModel(measured={"a": [3e-3, "matmul", 2e6, 1e3], "c": [1e-4, "add", 0, 1e5]}).save()
    cached = CostModel.default()
    assert {s: v[0] for s, v in cached.measured.items()} == {"a": 1e-3, "b": 2e-3, "c": 1e-4}
    assert cached.flop_rates["matmul"] == pytest.approx(2e6 / (1e-3 - cached.overhead_s))
    CostModel(measured={"a": [5e-4, "matmul", 2e6, 1e3]}).save()  # faster now: taken
    assert CostModel.default().measured["a"][0] == 5e-4


def test_the_cache_is_kept_per_kernel_code(tmp_path, monkeypatch):
    import graphflow.timing as timing

    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    CostModel(measured={"a": [1e-3, "matmul", 2e6, 1e3]}).save()
    monkeypatch.setattr(timing, "kernels_digest", lambda: "other kernels")
    assert CostModel.default().measured == {}  # timings of other kernels are not reused


def test_rates_are_fitted_only_from_kernels_long_enough_to_show_one():
    tiny = [8e-6, "matmul", 4096.0, 2048]  # all call: 4096 FLOPs in 8 us
    cm = CostModel(measured={"a": tiny, "b": [2e-6, "add", 0.0, 96]})
    cm._fit()
    assert cm.overhead_s == 2e-6
    assert cm.flop_rates == CostModel().flop_rates  # the built-in's, not 1.2 GFLOP/s for gemms
    assert cm.bandwidth_Bps == CostModel().bandwidth_Bps
    cm.measured["c"] = [1e-3, "matmul", 1e8, 1e6]  # 1 ms: 100 GFLOP/s, less the overhead
    cm._fit()
    assert cm.flop_rates["matmul"] == pytest.approx(1e8 / (1e-3 - 2e-6))
