"""The cost model's predictions of a plan's training step on this machine (the driver's
shipping of the inputs, pipelining, and workers that compute at once included), the
micro-batch count a pipelined plan runs fastest with, and the curve over 1 to 64 machines on a
10 Gbit/s network (`graphflow bench speedup`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from graphflow.costmodel import CostModel, Link, kernels
from graphflow.ir import SOURCE_OPS, users_of
from graphflow.models import Model
from graphflow.partitioners import Plan, partition
from graphflow.runtime import batchjoin
from graphflow.runtime.backlog import early_updates, weight_groups
from graphflow.runtime.cores import blas_threads
from graphflow.runtime.gradients import fused_updates
from graphflow.runtime.pipeline import (
    check_linear,
    deferred_weight_nodes,
    is_backward,
    late_nodes,
    microbatch_rows,
    runs_weights_early,
    simulate,
)


def add_estimate_option(p: argparse.ArgumentParser) -> None:
    """`--estimate`, the same on `graphflow show` and `visualize`."""
    p.add_argument("--estimate", action="store_true",
                   help="predict from cached kernel times and FLOP estimates, timing nothing "
                        "(by default the plans' kernels the cache lacks are timed here first)")


def command_cost(plans: list[Plan], batch: int, estimate: bool) -> CostModel:
    """The cost model a command predicts `plans` by (CostModel.timed_for; `--estimate`
    times nothing); says on stderr when it times kernels, and with `estimate` how many it
    prices by the fitted FLOP and byte rates instead: a step of those can come out far above
    a timed one (lc-large on 2 workers: 113 ms against 64), as the cache's memory rate, a
    median over small kernels, prices copies and elementwise kernels at 3-10x their time."""
    def say(text: str) -> None:
        print(text, file=sys.stderr)

    cost = CostModel.timed_for([p.graph for p in plans], batch, plans[0].parts,
                               measure=not estimate, say=say)
    wanted = {sig for p in plans for sig in kernels(p.graph, batch)}
    if estimate and (missing := len(wanted - set(cost.measured))):
        say(f"{missing} of {len(wanted)} kernels not timed: estimated from FLOPs and bytes "
            f"(run without --estimate to time them)")
    return cost


def workers_used(plan: Plan) -> int:
    """How many workers run at least one kernel."""
    return len({plan.placement[n.name] for n in plan.graph.nodes if n.op not in SOURCE_OPS})


def predict(plan: Plan, batch: int, microbatches: int, repeats: int,
            link: Link | None = None, cost: CostModel | None = None,
            contention: float = 1.0, schedule: str = "1f1b") -> float:
    """The cost model's step seconds for `plan` (with `cost`, or kernels of its graph
    calibrated first; the link is the calibrated local one unless given), the driver's
    shipping of the inputs included. With `contention` (see CostModel.predict), what workers
    compute at once runs that much slower. Pipelined: the stages' forward, backward and
    weight-gradient work per micro-batch, run through the worker's `schedule`
    (pipeline.simulate), then each stage's fetch-only nodes (`late_nodes`) and its update;
    the last of `STREAMED` steps of a stream, each stage starting a step when it ended the
    last (as training and the benchmark run them)."""
    mb = largest_microbatch(batch, microbatches)
    cm = cost or CostModel.calibrate(plan.graph, mb, repeats)
    link = link or cm.link
    # the driver ships each worker its inputs and then waits for the replies
    dispatch = max(link.seconds(w.fed_bytes(batch)) for w in plan.workers) + link.latency_s
    if microbatches == 1:
        p = cm.predict(plan.graph, plan.placement, mb, link=link, contention=contention)
        return dispatch + p.step_seconds
    whole = cost or CostModel.calibrate(plan.graph, batch, repeats)
    side_by_side = contention if plan.parts > 1 else 1.0
    work = {phase: [0.0] * plan.parts for phase in "FB"}
    update = [0.0] * plan.parts
    late_work = [0.0] * plan.parts  # fetch-only nodes, run before the update (compute, not memory)
    groups, updated_by_group = _w_phase(plan)
    group_of = {name: (w, i) for w, gs in groups.items() for i, g in enumerate(gs) for name in g}
    w_work = [[0.0] * len(groups[w]) for w in range(plan.parts)]  # per worker and W group
    w_updates = [[0.0] * len(groups[w]) for w in range(plan.parts)]  # run after its last run
    updated_after = {p: (w, i) for w, gs in updated_by_group.items()
                     for i, ps in enumerate(gs) for p in ps}
    early = early_weight_stages(plan)
    order = plan.graph.toposort()
    late = set(late_nodes(order, users_of(order)))
    fused = fused_updates(plan.graph)
    for n in plan.graph.nodes:
        w = plan.placement[n.name]
        if n in late:  # run at the end, over each micro-batch (a fetched loss)
            late_work[w] += side_by_side * microbatches * cm.node_seconds(n, mb)
        elif n.op == "parameter":  # (an early W leaves the last micro-batches' part apart)
            tail = w in early and plan.grads.get(n.name) in group_of
            seconds = cm.update_seconds(n, parts=2 if tail else 1, fused=n in fused)
            if n.name in updated_after:  # (mostly while other stages compute, not update)
                w_updates[w][updated_after[n.name][1]] += seconds
            else:
                update[w] += seconds
        elif n.name in group_of and w in early:  # a micro-batch's W while a gradient is late
            w_work[w][group_of[n.name][1]] += side_by_side * cm.node_seconds(n, mb)
        elif n.name in group_of:  # W runs once over the joined micro-batches
            w_work[w][group_of[n.name][1]] += (side_by_side * whole.node_seconds(n, batch)
                                               / microbatches)
        elif n.op not in SOURCE_OPS:
            work["B" if is_backward(n) else "F"][w] += side_by_side * cm.node_seconds(n, mb)
    hops = [0.0] * (plan.parts - 1)
    for t in plan.transfers:  # a micro-batch's tensors between neighbouring stages
        lo = min(t.src, t.dst)
        hops[lo] = max(hops[lo], link.seconds(t.nbytes(mb)))
        phase = "B" if is_backward(plan.graph[t.tensor]) else "F"
        work[phase][t.src] += cm.message_cpu_s  # each end's CPU on the message
        work[phase][t.dst] += cm.message_cpu_s
    def finish(starts: list[float]) -> list[float]:
        ends = [end + late for end, late in zip(
            simulate(schedule, microbatches, work["F"], work["B"], w_work, hops, w_updates,
                     starts), late_work, strict=True)]
        # the stages share one machine's memory
        ups = cm.concurrent_updates(ends, update) if contention > 1.0 else update
        return [end + u for end, u in zip(ends, ups, strict=True)]

    # a stream of steps (as training and the benchmark run them): a stage starts the next
    # step once it has updated, so the first stage's next forwards fill the last one's tail
    # (lc-large, 2 stages: one step from a common start 65.0 ms, measured 55.9 streamed)
    ends = [finish([0.0] * plan.parts)]
    for _ in range(STREAMED - 1):
        ends.append(finish(ends[-1]))
    return dispatch + max(ends[-1]) - (max(ends[-2]) if len(ends) > 1 else 0.0)


STREAMED = 4  # steps simulated for a pipelined step in a stream (the last one's time)


MICROBATCH_CHOICES = (2, 3, 4, 8)


def largest_microbatch(batch: int, microbatches: int) -> int:
    """The rows of the largest micro-batch (sizes differ by at most a row block): a pipelined
    step is predicted as if every micro-batch had that many."""
    return max(microbatch_rows(batch, microbatches))
# Predictions this close are a tie, and fewer micro-batches win it: each one more costs
# messages and task switches the model leaves out (speech-mlp, batch 64, eager: 2, 3 and 4
# predicted within 5%, measured within 1-2% of each other; 8, 30% slower).
TIE = 0.05


def best_microbatches(plan: Plan, batch: int, repeats: int, schedule: str = "1f1b",
                      unpipelined: bool = False) -> tuple[int, dict[int, float]]:
    """The micro-batch count of a pipelined `plan` with the shortest predicted step, of the
    `MICROBATCH_CHOICES` up to `batch` (kernels timed at each size first), and every
    count's prediction. Small micro-batches shorten the pipeline's fill and drain but run
    slower kernels; which wins depends on the model, the batch and the machine. A plan that
    cannot pipeline (one part, or tensors that do not flow stage to stage) gets 1. With
    `unpipelined`, 1 (the whole batch at once) competes too: where BLAS runs micro-batches
    much slower (a CPU without AVX-512: speech-mlp's 32 rows at 70% of 64's speed) the plain
    step can be the faster."""
    options = [m for m in MICROBATCH_CHOICES if m <= batch]
    if not options or plan.parts == 1:
        return 1, {}
    try:
        check_linear([(t.key, t.src, t.dst) for t in plan.transfers])
        if plan.loss is not None:  # a loss no micro-batch can weigh (batchjoin.py)
            batchjoin.loss_join(plan.graph, batchjoin.kinds(plan.graph), plan.loss)
    except ValueError:
        return 1, {}
    for b in sorted({batch, *(largest_microbatch(batch, m) for m in options)}):
        CostModel.calibrate(plan.graph, b, repeats)
    cost = CostModel.default(batch)
    predicted = {m: predict(plan, batch, m, repeats, cost=cost, schedule=schedule)
                 for m in ([1] if unpipelined else []) + options}
    best = min(predicted.values())
    return min(m for m, s in predicted.items() if s <= best * (1 + TIE)), predicted


def microbatch_rate(plan: Plan, batch: int, microbatches: int, cost: CostModel) -> float:
    """How fast the forward and backward kernels run on micro-batches, as a fraction of their
    speed on the whole batch (a gemm of few rows is slower per row: every micro-batch reads
    the whole weight again)."""
    weights = weight_phase(plan)
    nodes = [n for n in plan.graph.nodes if n.op not in SOURCE_OPS and n.name not in weights]
    whole = sum(cost.node_seconds(n, batch) for n in nodes)
    rows = largest_microbatch(batch, microbatches)
    parts = microbatches * sum(cost.node_seconds(n, rows) for n in nodes)
    return whole / parts if parts > 0 else 1.0


def early_weight_stages(plan: Plan) -> set[int]:
    """The workers that run their W phase a micro-batch at a time (`pipeline.runs_weights_early`:
    the first stage), so their weight gemms run on micro-batches, not on the joined batch: at
    32 rows those of speech-mlp's first stage took 7.3 ms each, against 10.5 ms for 64."""
    return {w.index for w in plan.workers if runs_weights_early(w.graph.nodes)}


def weight_phase(plan: Plan) -> dict[str, int]:
    """node name -> worker, for the nodes a pipelined worker leaves to its W phase."""
    return {name: w for w, groups in weight_groups_by_worker(plan).items()
            for g in groups for name in g}


def weight_groups_by_worker(plan: Plan) -> dict[int, list[list[str]]]:
    """Per worker, the node names of its W phase's groups (runtime/backlog.py), as it runs
    them; a worker's own copies of nodes (recomputed, not in `plan.graph`) left out."""
    return _w_phase(plan)[0]


def _w_phase(plan: Plan) -> tuple[dict[int, list[list[str]]], dict[int, list[list[str]]]]:
    """Per worker, its W groups' node names (`weight_groups_by_worker`) and, per group, the
    parameters it updates right after the group's last run (`backlog.early_updates`)."""
    names: dict[int, list[list[str]]] = {}
    early: dict[int, list[list[str]]] = {}
    for w in plan.workers:
        order = w.graph.toposort()
        grads = {w.graph[g] for g in plan.grads.values() if g in w.graph}
        groups = [g for g in weight_groups(deferred_weight_nodes(order, users_of(order), grads))
                  if any(n.name in plan.graph for n in g)]
        names[w.index] = [[n.name for n in g if n.name in plan.graph] for g in groups]
        early[w.index] = early_updates(groups, plan.grads, order)
    return names, early


# Plans made for a curve's point, at most: each time the kernels it has that were not timed
# yet are timed and the rows balanced again (from nothing timed, lc-large on 8 machines timed
# 78 kernels, then 7, then none; every other point of the reference workloads settles in two).
REPLANS = 3


def predict_curve(model: Model, strategy: str, microbatches: int, args: argparse.Namespace,
                  cost: CostModel) -> list[dict[str, Any]]:
    """Predicted step time and speedup on 1..64 machines over a 10 Gbit/s network. Kernels of
    the plans that `cost` has no time for (a spatial plan's smaller blocks) are timed here
    first, single-threaded as a benchmark's workers run, and the plan made again by them
    (else they were priced by whatever the cache held: FLOP estimates for shapes never
    timed, the fastest time of many runs for others)."""
    link, curve = Link.ten_gigabit(), []
    one = None
    for n in args.machines:
        point: dict[str, Any] = {"workers": n}
        try:
            for _ in range(REPLANS):
                plan = partition(model.graph, n, strategy, loss=model.loss, cost=cost)
                with blas_threads(1):
                    if not cost.time_missing(plan.graph, args.batch, args.repeats):
                        break
            step = predict(plan, args.batch, microbatches if n > 1 else 1, args.repeats, link,
                           schedule=args.schedule)
            one = one or step
            used = workers_used(plan)
            point.update(predicted_s=step, speedup=one / step, workers_used=used)
            if used < n:
                point["note"] = f"{used} of {n} workers get work"
        except Exception as e:  # noqa: BLE001 - a strategy that cannot make n parts
            point["note"] = f"no plan for {n}: {type(e).__name__}: {e}"
        curve.append(point)
    return curve
