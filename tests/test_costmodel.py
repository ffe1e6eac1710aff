"""The cost model: node times (measured, estimated, around kernels), the cache, calibration,
and local plans' contention. The step simulator's own tests are in test_stepsim.py."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, Link, signature, tensor_bytes
from tests.simgraphs import chain_graph, timed_model


def test_missing_placement_names_the_nodes():
    g, _ = chain_graph()
    with pytest.raises(KeyError, match="no worker"):
        timed_model({}).predict(g, {"x": 0})


def test_link_presets_and_transfer_seconds():
    ten = Link.ten_gigabit()
    assert ten.bandwidth_Bps == pytest.approx(1.25e9) and ten.latency_s == pytest.approx(1e-4)
    cm = CostModel.builtin()
    assert cm.transfer_seconds(1.2e9) == pytest.approx(1.0 + 300e-6)
    assert cm.transfer_seconds(1.25e9, ten) == pytest.approx(1.0001)
    # a cached link measured before its bytes were the sender's copy is measured again
    assert not cm.link_measured()
    cm.message_cpu_s = 20e-6
    cm.link = Link(24e9, 80e-6)
    assert not cm.link_measured()
    cm.link = Link(12e9, 80e-6, shared=True)
    assert cm.link_measured()


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


def test_time_around_kernels_and_updates_is_measured_positive_and_small():
    from graphflow.timing import time_dispatch, time_update_call

    # (bounds that hold on any machine that runs the suite; the figures are in the notes)
    assert 0.0 <= time_dispatch(1) < 1e-3
    assert 0.0 < time_update_call(1) < 1e-3


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
    cm = timed_model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
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


def test_calibration_smoke_and_cache(no_kernels_timed, monkeypatch):
    # (the suite's link comes along where the suite has timed it: time_messages ran once, in
    # this process or another, and its figures are asserted here; run alone, it runs here)
    from graphflow.timing import fingerprint

    path = no_kernels_timed
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(path))
    m = gf.models.digits_lc()
    gf.gradients(m.loss, m.graph.parameters())
    cm = CostModel.calibrate(m.graph, batch=8, repeats=1)
    computed = [n for n in m.graph if n.op not in ("placeholder", "parameter", "constant")]
    assert all(signature(n, 8) in cm.measured for n in computed)
    assert all(cm.node_seconds(n, 8) > 0 for n in computed)
    assert cm.link.bandwidth_Bps > 0 and cm.link.latency_s > 0
    assert all(rate > 0 for rate in cm.flop_rates.values()) and cm.bandwidth_Bps > 0
    assert fingerprint() in json.loads(path.read_text())["machines"]
    again = CostModel.default(batch=8)
    assert again.measured == cm.measured and again.link == cm.link
    assert cm.update_Bps > 0 and again.update_Bps == cm.update_Bps
    assert cm.message_cpu_s != CostModel().message_cpu_s  # measured, not the built-in's
    # between two worker processes (timing.time_messages; bounds that hold on any machine, a
    # loaded one too: a message's CPU came to 1.6 ms beside two other busy processes)
    assert 0.0 <= cm.message_cpu_s < 1e-2 and 1e-6 < cm.link.latency_s < 2e-2
    assert 1e8 < cm.link.bandwidth_Bps <= 100e9
    assert again.message_cpu_s == cm.message_cpu_s
    assert 0 < cm.update_shared_Bps and again.update_shared_Bps == cm.update_shared_Bps
    n = m.graph["lc2/local2d"]
    assert again.node_seconds(n) == cm.node_seconds(n, 8)


def test_the_link_is_timed_once_per_machine_whatever_the_thread_setup(tmp_path, monkeypatch):
    import graphflow.costmodel as costmodel

    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    timed = CostModel(measured={"a": [1e-3, "matmul", 2e6, 1e3]}, message_cpu_s=25e-6,
                      link=Link(9e9, 70e-6, shared=True))
    timed.save()
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # another thread setup: another entry
    other = CostModel.default()
    assert other.measured == {}  # kernels are timed per thread setup
    assert other.link == timed.link and other.message_cpu_s == 25e-6

    def no_timing(*_):
        raise AssertionError("the link was timed again")
    monkeypatch.setattr(costmodel, "time_messages", no_timing)
    g, _ = chain_graph()
    CostModel.calibrate(g, batch=4, repeats=1)
    assert CostModel.default().link == timed.link
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.setattr(costmodel, "machine_fingerprint", lambda: "another machine")
    assert not CostModel.default().link_measured()


def test_a_refreshed_calibration_times_everything_again(tmp_path, monkeypatch):
    # (`graphflow bench speedup` refreshes, unless --cached-calibration)
    import graphflow.costmodel as costmodel
    from graphflow.bench import speedup

    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    timed = []
    for name, value in (("time_update", 7e9), ("time_dispatch", 4e-6),
                        ("time_update_call", 5e-6), ("time_messages", (25e-6, 90e-6, 9e9))):
        monkeypatch.setattr(costmodel, name, lambda *_, name=name, value=value, **__: (
            timed.append(name), value)[1])
    g, _ = chain_graph()
    first = CostModel.calibrate(g, batch=4, repeats=1)
    assert first.link_measured() and first.measured
    assert sorted(timed) == ["time_dispatch", "time_messages", "time_update", "time_update",
                             "time_update_call"]  # (the update alone, and two at once)
    timed.clear()
    CostModel.calibrate(g, batch=4, repeats=1)
    assert timed == []  # all cached
    monkeypatch.setattr(costmodel, "time_nodes", lambda nodes, *_: (
        timed.append("time_nodes"), dict.fromkeys(nodes, 1e-3))[1])
    CostModel.calibrate(g, batch=4, repeats=1, refresh=True)
    assert sorted(timed) == ["time_dispatch", "time_messages", "time_nodes", "time_update",
                             "time_update", "time_update_call"]
    assert not speedup.parser().parse_args([]).cached_calibration  # the bench's default


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
    # far more FLOPs: the shapes were the shipped ones. The small one is all call and cold
    # caches (each pass times it after other kernels: 250-290 us here, shipped with the large
    # one alone), the large a 512 x 512 x 1024 gemm (4.5-7.3 ms): 16-29x; a 20x bound failed
    assert large > 5 * small
    assert got["update_Bps"] > 0 and got["update_shared_Bps"] > 0


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


def test_a_saved_guess_leaves_what_was_measured(tmp_path, monkeypatch):
    # a process that timed only its kernels saves after another timed the link and updates
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))
    CostModel(update_Bps=7e9, message_cpu_s=25e-6, link=Link(9e9, 70e-6, shared=True)).save()
    CostModel(measured={"a": [1e-3, "matmul", 2e6, 1e3]}, dispatch_s=4e-6).save()
    cached = CostModel.default()
    assert cached.update_Bps == 7e9 and cached.dispatch_s == 4e-6 and "a" in cached.measured
    assert cached.link == Link(9e9, 70e-6, shared=True) and cached.message_cpu_s == 25e-6
    CostModel(message_cpu_s=40e-6, link=Link(8e9, 90e-6, shared=True)).save()  # measured again
    assert CostModel.default().link == Link(8e9, 90e-6, shared=True)


def test_calibrations_saved_at_once_keep_each_others_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "cm.json"))

    def save(who):  # (the cache's lock is a file lock: threads contend for it as processes do)
        for i in range(15):
            CostModel(measured={f"{who}{i}": [1e-3, "matmul", 2e6, 1e3]}).save()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(save, "abcd"))
    assert len(CostModel.default().measured) == 4 * 15


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
