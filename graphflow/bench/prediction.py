"""The cost model's predictions of `graphflow bench speedup`: a plan's step on this machine
(the driver's shipping of the inputs, pipelining, and workers that compute at once included),
and the curve over 1 to 64 machines on a 10 Gbit/s network."""

from __future__ import annotations

import argparse
from typing import Any

from graphflow.costmodel import SOURCE_OPS, CostModel, Link
from graphflow.ir import users_of
from graphflow.models import Model
from graphflow.partitioners import Plan, partition
from graphflow.runtime.pipeline import deferred_weight_nodes


def workers_used(plan: Plan) -> int:
    """How many workers run at least one kernel."""
    return len({plan.placement[n.name] for n in plan.graph.nodes if n.op not in SOURCE_OPS})


def predict(plan: Plan, batch: int, microbatches: int, repeats: int,
            link: Link | None = None, cost: CostModel | None = None,
            contention: float = 1.0) -> float:
    """The cost model's step seconds for `plan` (with `cost`, or kernels of its graph
    calibrated first; the link is the calibrated local one unless given), the driver's
    shipping of the inputs included. Pipelined: one micro-batch's step plus
    (microbatches - 1) times the busiest stage's micro-batch work (fill, then steady state),
    where the weight-gradient work runs once at the end over the whole batch (the W phase,
    stages side by side) rather than once per micro-batch. With `contention` (see
    CostModel.predict), what workers compute at once runs that much slower."""
    mb = batch // microbatches
    cm = cost or CostModel.calibrate(plan.graph, mb, repeats)
    link = link or cm.link
    # the driver ships each worker its inputs and then waits for the replies
    dispatch = max(link.seconds(w.fed_bytes(batch)) for w in plan.workers) + link.latency_s
    p = cm.predict(plan.graph, plan.placement, mb, link=link, contention=contention)
    if microbatches == 1:
        return dispatch + p.step_seconds
    whole = cost or CostModel.calibrate(plan.graph, batch, repeats)
    w_mb, w_whole = [0.0] * plan.parts, [0.0] * plan.parts
    for name, w in weight_phase(plan).items():
        w_mb[w] += cm.node_seconds(plan.graph[name], mb)
        w_whole[w] += whole.node_seconds(plan.graph[name], batch)
    busy = [b - x for b, x in zip(p.busy, w_mb)]
    # in the steady state and the W phase the stages compute side by side
    side_by_side = contention if plan.parts > 1 else 1.0
    return (dispatch + p.step_seconds - max(w_mb)
            + side_by_side * ((microbatches - 1) * max(busy, default=0.0) + max(w_whole)))


def weight_phase(plan: Plan) -> dict[str, int]:
    """node name -> worker, for the nodes a pipelined worker leaves to its W phase."""
    out: dict[str, int] = {}
    for w in plan.workers:
        order = w.graph.toposort()
        grads = {w.graph[g] for g in plan.grads.values() if g in w.graph}
        out.update({n.name: w.index for n in deferred_weight_nodes(order, users_of(order), grads)
                    if n.name in plan.graph})
    return out


def predict_curve(model: Model, strategy: str, microbatches: int, args: argparse.Namespace,
                  cost: CostModel) -> list[dict[str, Any]]:
    """Predicted step time and speedup on 1..64 machines over a 10 Gbit/s network."""
    link, curve = Link.ten_gigabit(), []
    one = None
    for n in args.machines:
        point: dict[str, Any] = {"workers": n}
        try:
            plan = partition(model.graph, n, strategy, loss=model.loss, cost=cost)
            step = predict(plan, args.batch, microbatches if n > 1 else 1, args.repeats, link)
            one = one or step
            used = workers_used(plan)
            point.update(predicted_s=step, speedup=one / step, workers_used=used)
            if used < n:
                point["note"] = f"{used} of {n} workers get work"
        except Exception as e:  # noqa: BLE001 - a strategy that cannot make n parts
            point["note"] = f"no plan for {n}: {type(e).__name__}: {e}"
        curve.append(point)
    return curve
