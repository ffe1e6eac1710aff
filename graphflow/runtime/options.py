"""A Cluster's options (and a PartitionedTrainer's), checked before anything starts: a
ValueError naming the option and the value given, rather than a TypeError from deep inside
the pipeline, or a timeout blamed on a worker.

>>> check_cluster_options("threads", None, 2, 30.0, 10.0)
>>> check_cluster_options("threads", None, 0, 30.0, 10.0)
Traceback (most recent call last):
...
ValueError: microbatches must be an int >= 1, got 0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphflow.errors import count_of
from graphflow.runtime import pipeline

if TYPE_CHECKING:  # (a worker process starts without the partitioners)
    from graphflow.partitioners.plan import Plan

MODES = ("threads", "processes", "remote")


def check_microbatches(value: object, auto: bool = False) -> None:
    """ValueError unless `value` is a whole count >= 1 (or, with `auto`, "auto")."""
    if not (auto and value == "auto"):
        count_of(value, "microbatches", also=" or 'auto'" if auto else "")


def check_mode(mode: object, hosts: Sequence[str] | None) -> None:
    """ValueError for an unknown mode, or remote workers without their addresses."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: {', '.join(MODES[:-1])} or {MODES[-1]}")
    if mode == "remote" and hosts is None:
        raise ValueError("mode='remote' needs hosts=[...], one `graphflow worker --listen` "
                         "address per plan part (or Cluster.from_file)")


def check_seconds(name: str, value: object) -> None:
    """ValueError unless `value` is a finite number of seconds > 0."""
    if (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0):
        return
    raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def check_cluster_options(mode: object, hosts: Sequence[str] | None, microbatches: object,
                          timeout: object, connect_timeout: object, auto: bool = False) -> None:
    """Every check above, on a cluster's options (`auto`: microbatches may be "auto")."""
    check_mode(mode, hosts)
    check_microbatches(microbatches, auto)
    check_seconds("timeout", timeout)
    check_seconds("connect_timeout", connect_timeout)


def check_pipeline(plan: Plan, microbatches: int, schedule: str) -> None:
    """ValueError unless `plan` can run in `microbatches` by `schedule` (one: it can)."""
    if microbatches == 1:
        return
    pipeline.schedule(schedule, 0, plan.parts, microbatches)  # validates the arguments
    pipeline.check_linear([(t.key, t.src, t.dst) for t in plan.transfers])
    fixed = [n.name for n in plan.graph.placeholders() if n.shape and n.shape[0]]
    if fixed:
        raise ValueError(f"micro-batches need a symbolic batch dimension, but placeholder "
                         f"'{fixed[0]}' has a fixed one: build the model with batch=None")
