"""`graphflow bench speedup`: DistBelief's Fig. 3 (speedup of model parallelism) on this machine.

For each workload and strategy: the median training-step time on 1, 2, ... workers (one
single-threaded process each), the speedup over one worker and, beside each point, the cost
model's predicted step time; then the predicted speedup on 1 to 64 machines over a 10 Gbit/s
network, and the machine's ceiling: the throughput of two independent 1-worker processes at once
over one alone (the best a 2-worker speedup can be here and now).

Every cluster of a workload is started first, then timed in rounds (a few steps of each per
round, streamed as training runs them: `Cluster.stream`), so a busy neighbour slows all alike;
each point has three clusters of its own, timed a round each by turns, and the 1-worker time
rotates over three alike. Freshly started clusters of one plan differ: one in five to eight ran
8-30% slower for as long as we timed it, its compute thread spending that much more CPU time
on the same kernels. With two clusters a point, one slow one moved the median half way; of
three, a slow one has at most 3 of the 8 rounds, and the median is the others'.
speedup = median 1-worker step / median step, and "paired" is the median over rounds of the
round's 1-worker step over the point's step (steadier when the machine's speed drifts between
rounds); "of ceiling" is a 2-worker speedup over the ceiling (what the split itself costs,
apart from the cores' contention, which varies from hour to hour). The cost model's kernels
and the optimizer's update rates are timed again after every round, in that round's lone
1-worker cluster's process (so in three processes by turns), and predictions use their medians:
a shared machine's speed drifts within minutes, and a calibration made once, before the rounds,
missed by 30-40% when it did; a slow process's times stay in the minority (timed in the driver
alone, one run predicted speech-mlp's whole-layer points 23-39% slow). A pipelined
prediction runs the schedule through `graphflow.runtime.pipeline.simulate` with the cost
model's per-stage forward, backward and weight-gradient times. By default the pipelined row runs the
micro-batch count (of 2, 3, 4 and 8, those predicted within 30% of the best) that was fastest
in a short trial of each before the rounds, on three clusters a count, going by each count's
fastest cluster (a fresh cluster now and then runs slow, whatever its count), where it beats
the predicted best count's by more than 5% (else the predicted best: a lucky cluster must not
decide either); the predictions of every count are in the JSON beside those times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from typing import Any

from graphflow.argtypes import count, csv_counts, microbatch_count, non_negative
from graphflow.bench import (
    add_output_options,
    add_trace_option,
    csv_choices,
    csv_names,
    format_curves,
    format_table,
    machine_info,
    machine_notes,
    settle_outputs,
    single_threaded,
    write_outputs,
)
from graphflow.bench.rounds import (
    TRIAL_WITHIN,
    affordable,
    cluster_medians,
    fastest_microbatches,
    start_cluster,
    time_rounds,
    uneven_clusters,
)
from graphflow.bench.speedup_plot import plot
from graphflow.costmodel import CostModel, kernels
from graphflow.datasets import synthetic_for
from graphflow.errors import GraphflowError
from graphflow.ir import Node
from graphflow.models import Model
from graphflow.modelspec import load_trainable
from graphflow.partitioners import STRATEGIES, Plan, partition
from graphflow.prediction import (
    best_microbatches,
    largest_microbatch,
    microbatch_rate,
    predict,
    predict_curve,
    workers_used,
)
from graphflow.progress import Progress
from graphflow.runtime.cluster import Cluster
from graphflow.runtime.pipeline import SCHEDULES
from graphflow.timing import kernel_specs
from graphflow.trace import recording

MACHINES = (1, 2, 4, 8, 16, 32, 64)
TOLERANCE = 0.25  # allowed relative error of the cost model at every measured point
COLUMNS = [("workload", "workload"), ("strategy", "strategy"), ("workers", "P"),
           ("ms", "median ms"), ("speedup", "speedup"), ("paired", "paired"),
           ("of_ceiling", "of ceiling"), ("pred_ms", "pred ms"),
           ("err", "err %"), ("pred_ok", "pred<=25%"), ("target", "target"),
           ("verdict", "target met"), ("note", "note")]


def target(workload: str, strategy: str, workers: int) -> float | None:
    """The speedup the issue asks for at this point, if any."""
    if workers == 2 and (workload, strategy) == ("lc-large", "spatial"):
        return 1.7
    if workers == 2 and workload == "speech-mlp" and strategy.startswith("layerwise+"):
        return 1.5
    return None


def models(text: str) -> list[Model]:
    """An argparse type: comma-separated MODELs (graphflow.modelspec), each built."""
    try:
        return [load_trainable(spec) for spec in csv_names(text)]
    except GraphflowError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphflow bench speedup", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: graphflow bench speedup --workloads lc-large --strategies spatial "
               "--workers 1,2 --steps 9")
    p.add_argument("--workloads", type=models, default="lc-large,speech-mlp",
                   metavar="MODELS",
                   help="comma-separated (default lc-large,speech-mlp): reference workloads "
                        "(also digits-lc) or your own models, as file.py:function, "
                        "module:function or file.py (its build_model()), timed on synthetic "
                        "batches")
    p.add_argument("--strategies", type=csv_choices(STRATEGIES),
                   default=["spatial", "layerwise", "mincut"],
                   help="comma-separated (default spatial,layerwise,mincut)")
    p.add_argument("--workers", type=csv_counts, default=[1, 2],
                   help="worker counts, comma-separated; 1 is always measured (default 1,2)")
    p.add_argument("--steps", type=count, default=None,
                   help="timed rounds per point (8: a median of a few rounds swings by a "
                        "tenth on a shared machine)")
    p.add_argument("--window", type=count, default=None,
                   help="steps per timed stretch: a cluster runs them as one stream, as "
                        "training does (Cluster.stream: a worker starts the next step once "
                        "its part of this one is done), and a step's time is the stretch's "
                        "over the count; 1 times steps one by one (16: a stream's first step "
                        "waits for the whole pipeline, once per stretch, where training pays "
                        "it once per run)")
    p.add_argument("--clusters", type=count, default=None,
                   help="clusters started per point, timed a round each by turns (3: freshly "
                        "started clusters of one plan differ, one in five to eight by 8-30%% "
                        "for as long as we timed it, so the median is of the other two; the "
                        "1-worker time and the ceiling's pair rotate over as many, at least 2; "
                        "a point's second and later start only while a quarter of the "
                        "memory is free)")
    p.add_argument("--warmup", type=non_negative, default=None, help="untimed steps per point (2)")
    p.add_argument("--batch", type=count, default=None, help="mini-batch size (64)")
    p.add_argument("--mode", choices=("processes", "threads"), default="processes",
                   help="one process per worker (default) or one thread per worker")
    p.add_argument("--microbatches", type=microbatch_count, default=None,
                   help="micro-batches of the pipelined layerwise rows: a count (1: no "
                        "pipelined rows) or auto, the count of 2, 3, 4, 8 fastest in a short "
                        "trial of those predicted within 30%% of the best (auto)")
    p.add_argument("--schedule", choices=SCHEDULES, default="eager",
                   help="pipeline schedule of the pipelined layerwise rows (eager)")
    add_output_options(p, "speedup")
    p.add_argument("--cached-calibration", action="store_true",
                   help="reuse cached kernel timings (default: time them again in this run, "
                        "so predictions and measurements see the same machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    add_trace_option(p)
    p.add_argument("--quick", action="store_true",
                   help="tiny settings, for tests: --steps 1 --window 2 --warmup 1 --batch 8 "
                        "--microbatches 2 --clusters 1 unless given, predictions to 4 "
                        "machines, kernels timed once, and no JSON/PNG unless given")
    return p


def _settle(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Fill the defaults that --quick changes and check the numbers."""
    for key, quick, full in (("steps", 1, 8), ("window", 2, 16), ("warmup", 1, 2),
                             ("batch", 8, 64), ("microbatches", 2, "auto"), ("clusters", 1, 3)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.machines = MACHINES[:3] if args.quick else MACHINES
    args.repeats = 1 if args.quick else 3
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        p.error("--steps and --batch must be >= 1, --warmup >= 0")
    if args.microbatches != "auto" and args.microbatches > args.batch:
        p.error(f"--microbatches {args.microbatches} is more than --batch {args.batch} rows")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table, write JSON and PNG. 0 when every point ran, 1 when
    one failed, 2 on a bad argument."""
    p = parser()
    try:
        args = p.parse_args(argv)
        _settle(args, p)
        settle_outputs(args, p, "speedup")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    with single_threaded(), recording(args.trace):
        doc = run(args)
    rows = [_table_row(w, pt) for w, wl in doc["workloads"].items() for pt in wl["points"]]
    print(format_table(rows, COLUMNS, left=("strategy", "note")))
    print(f"\npredicted speedup on N machines (10 Gbit/s):\n{format_curves(doc['workloads'])}")
    print(*[_ceiling_line(name, wl["ceiling"], args.mode, args.quick)
            for name, wl in doc["workloads"].items()], *[f"note: {n}" for n in doc["notes"]],
          sep="\n")
    write_outputs(doc, args.json, args.png, plot)
    return 1 if any("error" in pt for wl in doc["workloads"].values() for pt in wl["points"]) \
        else 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement and prediction, as a JSON-ready dict."""
    doc: dict[str, Any] = {
        "benchmark": "speedup", "machine": machine_info(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "png", "trace")},
        "tolerance": TOLERANCE, "workloads": {},
        "notes": []}
    doc["notes"] += machine_notes(doc["machine"], max(args.workers))
    doc["settings"]["workloads"] = [model.name for model in args.workloads]
    for model in args.workloads:
        name = model.name
        doc["workloads"][name] = measure_workload(model, args)
        for pt in doc["workloads"][name]["points"]:
            if note := uneven_clusters(f"{name} {pt['strategy']} P={pt['workers']}",
                                       pt.get("cluster_medians_s", [])):
                doc["notes"].append(note)
        for label, curve in doc["workloads"][name]["predicted"].items():
            if notes := [c["note"] for c in curve if c.get("note")]:
                doc["notes"].append(f"{name} {label}, predicted: {'; '.join(notes)}")
    doc["machine"]["loadavg_end"] = machine_info()["loadavg"]
    for kind in ("json", "png"):  # (None: --quick wrote none)
        doc["settings"][kind] = getattr(args, kind) and str(getattr(args, kind))
    return doc


def keeps_contention(args: argparse.Namespace) -> bool:
    """Whether this run's contention is kept for `graphflow show`'s local plans (one process
    a worker): not from thread workers (which also share one interpreter) nor from --quick's
    tiny steps (digits-lc at batch 8 in threads measured 2.0)."""
    return args.mode == "processes" and not args.quick


def variants(args: argparse.Namespace) -> list[tuple[str, str, int | str]]:
    """(row label, strategy, micro-batches or "auto"): layerwise also pipelined when asked."""
    out: list[tuple[str, str, int | str]] = [(s, s, 1) for s in args.strategies]
    if "layerwise" in args.strategies and args.microbatches != 1:
        out.append((f"layerwise+{args.schedule}", "layerwise", args.microbatches))
    return out


def measure_workload(model: Model, args: argparse.Namespace) -> dict[str, Any]:
    """Start every cluster of the workload, then time them in rounds (bench/rounds.py)."""
    data = synthetic_for(model, args.batch, seed=0)
    feeds = {model.x.name: data.x_train, model.y.name: data.y_train}
    plan1 = partition(model.graph, 1, "layerwise", loss=model.loss)
    cost = CostModel.calibrate(plan1.graph, args.batch, args.repeats,
                               refresh=not args.cached_calibration)
    # kernels timed again between the rounds, each signature once: batch -> signature -> node
    retimed: dict[int, dict[str, Node]] = {args.batch: kernels(plan1.graph, args.batch)}
    plans: dict[int, Plan] = {}
    todo = [(v, n) for v in variants(args) for n in args.workers[1:]]
    points = [{"workload": model.name, "strategy": label, "workers": n, "microbatches": mb}
              for (label, _, mb), n in todo]
    with ExitStack() as stack, Progress(len(todo) + args.steps, model.name,
                                        enabled=not args.no_progress) as bar:
        ones = [stack.enter_context(start_cluster(plan1, args, 1, feeds, f"P=1 ({k + 1})"))
                for k in affordable(0, max(2, args.clusters), needed=2)]
        running: dict[int, list[Cluster]] = {}
        for i, ((label, strategy, mb), n) in enumerate(todo):
            bar.label = f"{model.name} started {label} P={n}"
            try:
                plan = plans[i] = partition(model.graph, n, strategy, loss=model.loss,
                                            cost=cost)
                points[i].update(workers_used=workers_used(plan), times_s=[])
                clusters: list[Cluster] = []
                if mb == "auto":
                    bar.label = f"{model.name} choosing micro-batches for {label} P={n}"
                    mb, choices = best_microbatches(plan, args.batch, args.repeats,
                                                    args.schedule)
                    if choices:  # the predictions ranked them: a trial measures the near ones
                        points[i]["microbatch_predicted"] = mb
                        near = [m for m, secs in sorted(choices.items())
                                if secs <= TRIAL_WITHIN * min(choices.values())]
                        mb, trial, times = fastest_microbatches(plan, args, near, feeds,
                                                                f"{label} P={n}", mb)
                        clusters = [stack.enter_context(c) for c in trial]
                        points[i]["microbatch_trials_s"] = times
                    points[i].update(microbatches=mb, microbatch_predictions_s=choices)
                for b in {largest_microbatch(args.batch, mb), args.batch}:
                    CostModel.calibrate(plan.graph, b, args.repeats)  # (new kernel shapes)
                    retimed.setdefault(b, {}).update(kernels(plan.graph, b))
                for k in affordable(len(clusters), args.clusters):  # (see --clusters)
                    name = f"{label} P={n}" + (f" ({k + 1})" if k else "")
                    clusters.append(stack.enter_context(
                        start_cluster(plan, args, mb, feeds, name)))
                running[i] = clusters
                points[i]["clusters"] = len(clusters)
            except Exception as e:  # noqa: BLE001 - one failed point is reported
                points[i]["error"] = f"{type(e).__name__}: {e}"
            bar.update()
        cost = CostModel.default(args.batch)  # every kernel shape of the plans is cached now
        specs = [spec for b, nodes in retimed.items() for spec in kernel_specs(nodes, b)]
        samples: dict[str, list[float]] = {}
        updates: dict[str, list[float]] = {"update_Bps": [], "update_shared_Bps": []}

        def retime(one: Cluster) -> None:  # in this round's lone 1-worker cluster's process
            got = one.call_all("time_kernels", {"kernels": specs})[0]
            for sig, seconds in got["kernel_s"].items():
                samples.setdefault(sig, []).append(seconds)
            for rate, values in updates.items():
                values.append(got[rate])

        ceiling = time_rounds(ones, running, points, feeds, args, bar, retime)
    cost.use_times(samples)
    if updates["update_Bps"]:
        cost.update_Bps = statistics.median(updates["update_Bps"])
        cost.update_shared_Bps = statistics.median(updates["update_shared_Bps"])
    # workers on this machine share its memory and caches: how much slower a step runs beside
    # another, from the ceiling's rounds, slows the time two workers compute at once
    contention = max(1.0, statistics.median(ceiling["together_s"])
                     / statistics.median(ceiling["alone_s"]))
    ceiling["contention"] = contention
    if keeps_contention(args):
        cost.contentions[model.name] = contention
    cost.save()  # (graphflow show and later runs start from these)
    for i, plan in plans.items():
        if "error" not in points[i]:
            points[i]["predicted_s"] = predict(plan, args.batch, points[i]["microbatches"],
                                               args.repeats, cost=cost, contention=contention,
                                               schedule=args.schedule)
            if points[i]["microbatches"] > 1:
                points[i]["microbatch_rate"] = microbatch_rate(
                    plan, args.batch, points[i]["microbatches"], cost)
    for pt in points:
        if pt.get("times_s") and "error" not in pt:
            pt["median_s"] = statistics.median(pt["times_s"])
            pt["cluster_medians_s"] = cluster_medians(pt["times_s"], pt["clusters"])
            pt["speedup"] = statistics.median(ceiling["alone_s"]) / pt["median_s"]
            # each round's 1-worker step over this point's step of the same round: a drift of
            # the machine's speed between rounds cancels out
            pt["paired_speedup"] = statistics.median(
                a / t for a, t in zip(ceiling["alone_s"], pt["times_s"], strict=False))
            if pt["workers"] == 2:  # how near the machine's best a 2-worker step comes
                pt["of_ceiling"] = pt["speedup"] / ceiling["ratio"]
    one = {"workload": model.name, "strategy": "(any)", "workers": 1, "microbatches": 1,
           "times_s": ceiling["alone_s"], "median_s": statistics.median(ceiling["alone_s"]),
           "speedup": 1.0, "paired_speedup": 1.0,
           "predicted_s": predict(plan1, args.batch, 1, args.repeats, cost=cost)}
    # a curve takes the micro-batch count chosen for its row's largest worker count
    chosen = {pt["strategy"]: pt["microbatches"] for pt in points}
    predicted = {}
    for label, strategy, mb in variants(args):
        if (mb := chosen.get(label, mb)) != "auto":  # (not chosen: its plan failed)
            predicted[label] = predict_curve(model, strategy, mb, args, cost)
    return {"points": [one, *points], "ceiling": ceiling, "predicted": predicted,
            "curve_link": "Link.ten_gigabit(): 1.25 GB/s, 100 us",
            "local_link": {"bandwidth_Bps": cost.link.bandwidth_Bps,
                           "latency_s": cost.link.latency_s, "shared": cost.link.shared},
            # what the predictions rest on, to tell a slow calibration from a wrong model
            "calibration": {"update_Bps": cost.update_Bps,
                            "update_shared_Bps": cost.update_shared_Bps,
                            "flop_rates": cost.flop_rates, "bandwidth_Bps": cost.bandwidth_Bps,
                            # round r's samples, of 1-worker cluster r % len(ones)'s process
                            "clusters": len(ones), "kernel_s": samples,
                            **{f"{rate}_samples": v for rate, v in updates.items()}}}


def _table_row(workload: str, pt: dict[str, Any]) -> dict[str, Any]:
    note = pt.get("note") or pt.get("error")
    row: dict[str, Any] = {"workload": workload, "strategy": pt["strategy"],
                           "workers": pt["workers"], "note": note and note[:60]}
    if "median_s" in pt:
        row.update(ms=1e3 * pt["median_s"], speedup=f"{pt['speedup']:.2f}x",
                   paired=f"{pt['paired_speedup']:.2f}x",
                   of_ceiling=f"{pt['of_ceiling']:.0%}" if "of_ceiling" in pt else "-")
        err = pt["predicted_s"] / pt["median_s"] - 1
        row.update(pred_ms=1e3 * pt["predicted_s"], err=f"{100 * err:+.0f}",
                   pred_ok="PASS" if abs(err) <= TOLERANCE else "FAIL")
        if pt.get("workers_used", pt["workers"]) < pt["workers"]:
            row["note"] = f"only {pt['workers_used']} workers get work"
        if "microbatch_rate" in pt:  # how many, and how fast their kernels run (why it loses)
            how = " (auto)" if "microbatch_trials_s" in pt else ""
            row["note"] = (f"{pt['microbatches']} micro-batches{how}, kernels at "
                           f"{pt['microbatch_rate']:.0%} of full-batch speed")
    goal = target(workload, pt["strategy"], pt["workers"])
    if goal is not None:
        row["target"] = f">={goal}x"
        row["verdict"] = "PASS" if pt.get("speedup", 0.0) >= goal else "FAIL"
    return row


def _ceiling_line(name: str, c: dict[str, Any], mode: str, quick: bool = False) -> str:
    what = "processes" if mode == "processes" else "thread clusters"
    # --quick's few rounds of tiny steps give ratios no machine has (0.24x, 2.70x on 2 cores)
    caveat = (f" -- {len(c['alone_s'])} quick round(s) of tiny steps: noise, not a measure"
              if quick else "")
    return (f"machine ceiling ({name}): two independent 1-worker {what} at once give "
            f"{c['ratio']:.2f}x the throughput of one (a step alone "
            f"{1e3 * statistics.median(c['alone_s']):.1f} ms, both together "
            f"{1e3 * statistics.median(c['together_s']):.1f} ms){caveat}")


if __name__ == "__main__":
    sys.exit(main())
