"""`graphflow bench speedup` end to end with tiny settings: digits-lc, thread workers, 1 step."""

import json

import pytest

from graphflow import prediction
from graphflow.bench import rounds, single_threaded, speedup
from graphflow.bench.rounds import TRIAL_WITHIN
from graphflow.costmodel import CostModel
from graphflow.models import digits_lc, lc_large, speech_mlp
from graphflow.partitioners import partition
from graphflow.prediction import (
    TIE,
    best_microbatches,
    early_weight_stages,
    microbatch_rate,
    predict,
    weight_phase,
)


def test_quick_run_writes_points_json_and_png(tmp_path, capsys):
    out_json, out_png = tmp_path / "speedup.json", tmp_path / "speedup.png"
    with single_threaded():  # (the cache of the bench's thread setup, one a worker)
        contentions = CostModel.default().contentions
    code = speedup.main(["--quick", "--workloads", "digits-lc", "--mode", "threads",
                         "--workers", "1,2", "--steps", "1", "--no-progress",
                         "--cached-calibration", "--json", str(out_json), "--png", str(out_png)])
    assert code == 0
    doc = json.loads(out_json.read_text())
    wl = doc["workloads"]["digits-lc"]
    points = {(p["strategy"], p["workers"]): p for p in wl["points"]}
    expected = {("(any)", 1), ("spatial", 2), ("layerwise", 2), ("mincut", 2),
                ("layerwise+eager", 2)}
    assert set(points) == expected
    for key, p in points.items():
        if "pipelining unavailable" in p.get("note", ""):
            continue
        assert "error" not in p, (key, p.get("error"))
        assert p["times_s"] and all(t > 0 for t in p["times_s"]), key
        assert p["median_s"] > 0 and p["speedup"] > 0 and p["predicted_s"] > 0, key
        # paired: the round's 1-worker step over the point's step of the same round
        alone = wl["ceiling"]["alone_s"][0]
        assert p["paired_speedup"] == pytest.approx(alone / p["times_s"][0]), key
        if key != ("(any)", 1):  # one round, so each cluster's median is its one time
            assert p["cluster_medians_s"] == p["times_s"][:p["clusters"]], key
            # the share of the machine's ceiling (two independent 1-worker clusters) it reaches
            assert p["of_ceiling"] == pytest.approx(p["speedup"] / wl["ceiling"]["ratio"]), key
    assert wl["ceiling"]["ratio"] > 0
    # the predicted curve is printed too, a row a strategy, as the JSON has it
    printed = capsys.readouterr().out
    _, curves = printed.split("predicted speedup on N machines (10 Gbit/s):\n")
    for label, curve in wl["predicted"].items():
        row = next(line for line in curves.splitlines()
                   if line.split()[:2] == ["digits-lc", label])
        assert row.split()[2:] == [f"{p['speedup']:.2f}x" for p in curve], label
    # the contention `graphflow show` predicts local plans by comes from full runs of worker
    # processes only: not kept from this one
    assert wl["ceiling"]["contention"] >= 1.0
    with single_threaded():
        assert CostModel.default().contentions == contentions
    assert speedup.keeps_contention(speedup.parser().parse_args(["--mode", "processes"]))
    assert not speedup.keeps_contention(speedup.parser().parse_args(["--quick"]))
    # the calibration the predictions used: one retimed sample a kernel signature a round
    cal = wl["calibration"]
    assert cal["update_Bps"] > 0 and cal["flop_rates"]["*"] > 0 and cal["kernel_s"]
    assert all(len(t) == 1 for t in cal["kernel_s"].values())
    # ... and of the update rates, timed in the round's 1-worker cluster; their medians used
    assert cal["update_Bps_samples"] == [cal["update_Bps"]]
    assert cal["update_shared_Bps_samples"] == [cal["update_shared_Bps"]]
    # the pipelined point says how fast its micro-batches' kernels run (timed at batch 8 here,
    # so only its presence is checked; its arithmetic is test_microbatch_rate's)
    assert points["layerwise+eager", 2]["microbatch_rate"] > 0
    assert set(wl["predicted"]) == {"spatial", "layerwise", "mincut", "layerwise+eager"}
    for curve in wl["predicted"].values():
        assert [c["workers"] for c in curve] == [1, 2, 4]
        assert curve[0]["speedup"] == pytest.approx(1.0)
    assert doc["machine"]["cpu_count"] >= 1
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "machine ceiling (digits-lc)" in printed and "spatial" in printed
    assert "of ceiling" in printed


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--workloads", "nope"],
                                 ["--strategies", "spatial,bogus"], ["--steps", "0"],
                                 ["--batch", "3", "--microbatches", "4"],
                                 ["--microbatches", "some"]])
def test_bad_arguments_exit_2(bad, capsys):
    assert speedup.main(bad) == 2
    assert "error" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert speedup.main(["--help"]) == 0
    assert "example: graphflow bench speedup" in capsys.readouterr().out


class _CallOverhead:
    """A kernel costs `fixed` seconds a call plus `per_row` a row (as a gemm that packs its
    whole weight for every call)."""

    def __init__(self, fixed: float, per_row: float) -> None:
        self.fixed, self.per_row = fixed, per_row

    def node_seconds(self, node, batch):
        return self.fixed + self.per_row * batch


def test_microbatch_rate():
    m = speech_mlp(batch=None)
    plan = partition(m.graph, 2, "layerwise", loss=m.loss)
    assert weight_phase(plan)  # the weight gradients are left out of the rate
    # no fixed cost: micro-batches run as fast as the whole batch
    assert microbatch_rate(plan, 64, 4, _CallOverhead(0.0, 1e-6)) == pytest.approx(1.0)
    # a fixed cost as large as 16 rows' work: (f + 64 r) / (4 f + 64 r) with f = 16 r
    assert microbatch_rate(plan, 64, 4, _CallOverhead(16e-6, 1e-6)) == pytest.approx(80 / 128)


def test_the_first_stage_weight_gemms_are_predicted_a_micro_batch_at_a_time(monkeypatch):
    m = speech_mlp(batch=None)
    for parts in (2, 3):  # only the first stage receives gradients and sends none
        assert early_weight_stages(partition(m.graph, parts, "layerwise", loss=m.loss)) == {0}
    assert early_weight_stages(partition(m.graph, 1, "layerwise", loss=m.loss)) == set()
    plan = partition(m.graph, 2, "layerwise", loss=m.loss)
    seen = {}

    def simulate(kind, microbatches, forward, backward, weights, hops=(), updates=(), starts=()):
        seen[microbatches] = list(weights)
        seen["updates"] = [list(u) for u in updates]
        return [0.0] * len(forward)
    monkeypatch.setattr(prediction, "simulate", simulate)
    # kernels that cost a fixed 10 ms a call: W work a micro-batch is 10 ms a weight gemm
    calls = CostModel(flop_rates={"*": 1e15}, bandwidth_Bps=1e15, overhead_s=0.01)
    for mb in (2, 4):
        predict(plan, 64, mb, 1, cost=calls)
    first, last = (len([n for n, w in weight_phase(plan).items() if w == s]) for s in (0, 1))
    # the first stage's W runs a micro-batch at a time; the last's once over all of them
    assert sum(seen[2][0]) == pytest.approx(first * 0.01, rel=1e-3)
    assert sum(seen[4][0]) == pytest.approx(first * 0.01, rel=1e-3)
    assert sum(seen[2][1]) == pytest.approx(last * 0.01 / 2, rel=1e-3)
    assert sum(seen[4][1]) == pytest.approx(last * 0.01 / 4, rel=1e-3)
    # a group per gradient, as the worker fills its waits (fc1's two share a node: 3 of them)
    assert sorted(seen[2][0]) == pytest.approx([0.01] * 6 + [0.03], rel=1e-3)
    # each parameter's update follows its group's last run (in the W task), as the worker's
    for stage, groups in enumerate(seen["updates"]):
        held = [n for n in plan.graph.parameters() if plan.placement[n.name] == stage]
        assert len(groups) == len(seen[2][stage]) and all(u > 0 for u in groups)
        tail = 2 if stage == 0 else 1  # (the first stage's last part is added as it reads)
        assert sum(groups) == pytest.approx(sum(calls.update_seconds(n, parts=tail)
                                                for n in held), rel=1e-6)


def test_auto_picks_the_fewest_micro_batches_predicted_within_a_tie_of_the_best():
    m = digits_lc(batch=None)
    plan = partition(m.graph, 2, "layerwise", loss=m.loss)
    chosen, predicted = best_microbatches(plan, 8, repeats=1)
    assert set(predicted) == {2, 3, 4, 8}
    best = min(predicted.values())
    assert predicted[chosen] <= best * (1 + TIE)
    assert all(predicted[c] > best * (1 + TIE) for c in predicted if c < chosen)
    # a batch need not divide evenly (6 rows in 4: 2, 2, 1, 1); there must be a row each
    assert best_microbatches(plan, 6, repeats=1)[1].keys() == {2, 3, 4}
    assert best_microbatches(plan, 3, repeats=1)[1].keys() == {2, 3}
    assert best_microbatches(plan, 1, repeats=1) == (1, {})
    spatial = partition(m.graph, 2, "spatial", loss=m.loss)  # halos flow both ways
    assert best_microbatches(spatial, 8, repeats=1) == (1, {})


def test_auto_for_training_pipelines_only_where_that_is_predicted_faster(monkeypatch):
    from graphflow import prediction

    m = digits_lc(batch=None)
    plan = partition(m.graph, 2, "layerwise", loss=m.loss)
    chosen, predicted = best_microbatches(plan, 8, repeats=1, unpipelined=True)
    best = min(predicted.values())
    assert set(predicted) == {1, 2, 3, 4, 8} and predicted[chosen] <= best * (1 + TIE)
    assert all(predicted[c] > best * (1 + TIE) for c in predicted if c < chosen)
    assert predicted[1] == pytest.approx(prediction.predict(plan, 8, 1, 1), rel=1e-9)
    # the whole batch at once wins a tie, and loses to a pipeline more than a tie faster
    for piped, want in ((1.0 - TIE / 2, 1), (1.0 - 2 * TIE, 2)):
        monkeypatch.setattr(prediction, "predict", lambda plan, batch, mb, *a, piped=piped,
                            **k: 1.0 if mb == 1 else piped + 0.01 * mb)
        assert best_microbatches(plan, 8, repeats=1, unpipelined=True)[0] == want
        assert best_microbatches(plan, 8, repeats=1)[0] == 2  # the bench's pipelined row


def test_quick_run_with_auto_micro_batches_says_which_it_chose(tmp_path, capsys):
    out_json = tmp_path / "speedup.json"
    code = speedup.main(["--quick", "--workloads", "digits-lc", "--mode", "threads",
                         "--strategies", "layerwise", "--microbatches", "auto", "--no-progress",
                         "--cached-calibration", "--json", str(out_json),
                         "--png", str(tmp_path / "s.png")])
    assert code == 0
    points = json.loads(out_json.read_text())["workloads"]["digits-lc"]["points"]
    piped = next(p for p in points if p["strategy"] == "layerwise+eager")
    # every count predicted, those near the best tried; the fastest in the trial was measured
    predicted = piped["microbatch_predictions_s"]
    assert set(predicted) == {"2", "3", "4", "8"}
    near = {m for m, secs in predicted.items()
            if secs <= TRIAL_WITHIN * min(predicted.values())}
    trials = piped["microbatch_trials_s"]
    assert set(trials) == near
    # the fastest, or the predicted best where nothing beat it by more than the margin
    chosen, fastest = trials[str(piped["microbatches"])], min(trials.values())
    assert chosen == fastest or (piped["microbatches"] == piped["microbatch_predicted"]
                                 and fastest > (1 - rounds.TRIAL_MARGIN) * chosen)
    assert f"{piped['microbatches']} micro-batches (auto)" in capsys.readouterr().out


def test_rounds_time_a_points_clusters_and_the_one_worker_clusters_by_turns():
    # clusters of one plan differ, so a point's time is not one cluster's: each has three
    from argparse import Namespace

    from graphflow.bench.rounds import time_rounds
    from graphflow.progress import Progress

    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def stream(self, feeds):
            for _ in feeds:
                calls.append(self.name)
                yield {}

    ones = [Fake(n) for n in ("one1", "one2", "one3")]
    a, b, c = (Fake(n) for n in "abc")
    points = [{"workload": "w", "times_s": []}]
    with Progress(6, "w", enabled=False) as bar:
        ceiling = time_rounds(ones, {0: [a, b, c]}, points, {}, Namespace(steps=6, window=1),
                              bar)
    # a round: one 1-worker cluster alone, it and the next at once (either order), the point
    assert calls[0::4] == ["one1", "one2", "one3"] * 2
    pairs = [set(calls[k + 1:k + 3]) for k in range(0, len(calls), 4)]
    assert pairs == [{"one1", "one2"}, {"one2", "one3"}, {"one3", "one1"}] * 2
    assert calls[3::4] == ["a", "b", "c"] * 2
    assert len(points[0]["times_s"]) == len(ceiling["alone_s"]) == 6


def test_memory_to_spare_reads_meminfo(tmp_path, monkeypatch):
    import graphflow.bench as bench

    real = bench.Path
    info = tmp_path / "meminfo"
    monkeypatch.setattr(bench, "Path", lambda p: info if p == "/proc/meminfo" else real(p))
    info.write_text("MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:    7000000 kB\n")
    assert bench.memory_to_spare()  # 29% free
    info.write_text("MemTotal:       24000000 kB\nMemAvailable:    5000000 kB\n")
    assert not bench.memory_to_spare()  # 21%
    info.write_text("MemTotal: 24000000 kB\n")  # no MemAvailable (an old kernel): no limit
    assert bench.memory_to_spare()


def test_a_point_starts_its_extra_clusters_only_with_memory_to_spare(tmp_path, monkeypatch):
    from graphflow.bench import rounds

    monkeypatch.setattr(rounds, "memory_to_spare", lambda: False)
    out_json = tmp_path / "speedup.json"
    code = speedup.main(["--quick", "--workloads", "digits-lc", "--mode", "threads",
                         "--strategies", "spatial,layerwise", "--microbatches", "auto",
                         "--clusters", "3", "--no-progress",
                         "--cached-calibration", "--json", str(out_json),
                         "--png", str(tmp_path / "s.png")])
    assert code == 0
    points = json.loads(out_json.read_text())["workloads"]["digits-lc"]["points"]
    started = {p["strategy"]: p.get("clusters") for p in points if p["workers"] == 2}
    assert started == {"spatial": 1, "layerwise": 1, "layerwise+eager": 1}


def test_the_trial_goes_by_each_counts_fastest_cluster(monkeypatch):
    """A slow cluster (whatever its count) must not decide the count: 2 micro-batches whose
    clusters run 70, 95 and 84 ms beat 4 whose clusters run 79-81, though 2's median is 84;
    the losers' clusters are closed, the winner's handed over."""
    speeds = {2: [0.070, 0.095, 0.084], 4: [0.080, 0.081, 0.079]}
    started, closed = [], []

    class Fake:
        def __init__(self, m, k):
            self.m, self.k = m, k

        def close(self):
            closed.append((self.m, self.k))

    def start(plan, args, m, feeds, label):
        started.append(Fake(m, sum(c.m == m for c in started)))
        return started[-1]

    monkeypatch.setattr(rounds, "start_cluster", start)
    monkeypatch.setattr(rounds, "timed", lambda c, feeds, window: speeds[c.m][c.k])
    monkeypatch.setattr(rounds, "memory_to_spare", lambda: True)
    args = type("Args", (), {"clusters": 3, "window": 16})()
    best, kept, times = rounds.fastest_microbatches(None, args, [2, 4], {}, "x", predicted=4)
    assert best == 2 and [c.k for c in kept] == [0, 1, 2]
    assert times == {2: 0.070, 4: 0.079}
    assert sorted(closed) == [(4, 0), (4, 1), (4, 2)]


@pytest.mark.parametrize("trial, chosen", [({2: 0.0694, 4: 0.0682}, 2),
                                           ({2: 0.0694, 4: 0.0650}, 4)])
def test_the_trial_keeps_the_predicted_best_count_unless_another_beats_it_clearly(
        monkeypatch, trial, chosen):
    # 4 micro-batches' fastest cluster 1.7% ahead of 2's (the predicted best) is within the
    # trial's noise (it then ran 73-93 ms a step where 2 runs 64-72); 6% ahead is not
    class Fake:
        def __init__(self, m):
            self.m = m

        def close(self):
            pass

    monkeypatch.setattr(rounds, "start_cluster", lambda plan, args, m, feeds, label: Fake(m))
    monkeypatch.setattr(rounds, "timed", lambda c, feeds, window: trial[c.m])
    monkeypatch.setattr(rounds, "memory_to_spare", lambda: True)
    args = type("Args", (), {"clusters": 1, "window": 16})()
    best, kept, _ = rounds.fastest_microbatches(None, args, [2, 4], {}, "x", predicted=2)
    assert best == chosen and [c.m for c in kept] == [chosen]


def test_a_point_whose_clusters_ran_at_different_speeds_gets_a_note(monkeypatch):
    fast, slow = 0.070, 0.091
    point = {"strategy": "spatial", "workers": 2, "clusters": 3,
             "cluster_medians_s": [fast, slow, fast]}
    even = {"strategy": "layerwise", "workers": 2, "clusters": 3,
            "cluster_medians_s": [fast, fast * 1.1, fast]}
    monkeypatch.setattr(speedup, "measure_workload",
                        lambda model, args: {"points": [point, even], "predicted": {}})
    machine = speedup.machine_info  # two cores and AVX-512, whatever runs this: no machine notes
    monkeypatch.setattr(speedup, "machine_info",
                        lambda: {**machine(), "cpu_count": 2, "wide_vectors": True})
    args = speedup.parser().parse_args(["--workloads", "digits-lc", "--no-progress"])
    notes = speedup.run(args)["notes"]
    assert notes == ["digits-lc spatial P=2: its clusters ran 70.0 / 91.0 / 70.0 ms a step "
                     "(medians): 1.30x apart"]


def test_a_pipelined_step_is_predicted_as_a_stream_runs_it(monkeypatch):
    """The first stage starts the next step's forwards while the last one still runs its
    weight gradients and updates: a step of the stream takes less than one from a common
    start (lc-large's two stages: 58.0 against 65.5 ms; measured 55.9 streamed)."""
    m = lc_large(batch=None)
    plan = partition(m.graph, 2, "layerwise", loss=m.loss)
    cost = CostModel(flop_rates={"*": 50e9}, bandwidth_Bps=10e9)
    streamed = predict(plan, 64, 2, 1, cost=cost, schedule="eager")
    monkeypatch.setattr(prediction, "STREAMED", 1)
    alone = predict(plan, 64, 2, 1, cost=cost, schedule="eager")
    assert streamed < 0.95 * alone


def test_the_curve_times_its_plans_kernels_single_threaded_first():
    import argparse

    from graphflow.costmodel import kernels

    m = digits_lc(batch=None)
    cost = CostModel()  # nothing timed: every kernel of the curve's plans is missing
    args = argparse.Namespace(machines=[1, 4], batch=8, repeats=1, schedule="eager")
    curve = prediction.predict_curve(m, "spatial", 1, args, cost)
    assert [p["workers"] for p in curve] == [1, 4] and all("predicted_s" in p for p in curve)
    four = partition(m.graph, 4, "spatial", loss=m.loss, cost=cost)
    assert set(kernels(four.graph, 8)) <= set(cost.measured)


def test_the_notes_say_what_of_the_machine_bears_on_the_figures():
    from graphflow.bench import machine_notes

    assert machine_notes({"cpu_count": 2, "wide_vectors": True}, 2) == []
    assert machine_notes({"cpu_count": 2, "wide_vectors": True}, 4) == [
        "4 workers on 2 cores: oversubscribed"]
    narrow = machine_notes({"cpu_count": 2, "wide_vectors": False}, 2)
    assert len(narrow) == 1 and "no AVX-512" in narrow[0] and "pipelining" in narrow[0]
