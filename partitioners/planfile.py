"""Reading a saved plan: the checks that turn a wrong file into one clear error.

A plan file drives a cluster, so a file that is not one (truncated, binary, another JSON, a
plan edited by hand) is refused at load with what is wrong, instead of failing later inside
`gf.Cluster` (a worker list cut short used to load, then fail with KeyError 'worker:1').

>>> check_fields([1, 2])
Traceback (most recent call last):
...
graphflow.partitioners.planfile.PlanError: not a graphflow plan (a JSON array, expected an object)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphflow.errors import GraphflowError

if TYPE_CHECKING:
    from graphflow.partitioners.plan import Plan

FORMAT = "graphflow.plan/1"
# field -> the JSON type it must have (the optional ones may also be missing)
REQUIRED = {"strategy": str, "graph": dict, "placement": dict, "workers": list,
            "transfers": list}
OPTIONAL = {"loss": (str, type(None)), "grads": dict, "feeds": dict}
JSON_TYPES = {dict: "a JSON object", list: "a JSON array", str: "a string", int: "a number",
              float: "a number", bool: "a boolean", type(None): "null"}
# ops every worker has its own copy of, or that only move tensors (no placement of their own)
UNPLACED = ("placeholder", "constant", "send", "recv")


class PlanError(GraphflowError, ValueError):
    """Not a graphflow plan: a file or dict that is not one, or one whose parts disagree.
    (A ValueError too, as the plain format check raised before.)"""


def refuse(what: str) -> PlanError:
    return PlanError(f"not a graphflow plan ({what})")


def read_json(path: str | Path) -> Any:
    """The JSON data of the file at `path`; PlanError naming the file if it holds none."""
    raw = Path(path).read_bytes()  # (a missing file: the OSError names it)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{path}: {refuse('binary data, not JSON text')}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty file" if not text.strip() else f"invalid JSON: {e}"
        raise PlanError(f"{path}: {refuse(what)}") from None


def check_fields(data: Any) -> None:
    """The top level of a plan's dict: an object of the right format with every field the
    plan needs, each of the JSON type it must be."""
    if not isinstance(data, dict):
        raise refuse(f"{_json_type(data)}, expected an object")
    if data.get("format") != FORMAT:
        raise refuse(f"format {data.get('format')!r}, expected {FORMAT!r}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise refuse(f"no {', '.join(repr(k) for k in missing)}")
    for key, kind in [*REQUIRED.items(), *OPTIONAL.items()]:
        if key in data and not isinstance(data[key], kind):
            expected = " or ".join(dict.fromkeys(
                JSON_TYPES[k] for k in (kind if isinstance(kind, tuple) else (kind,))))
            raise refuse(f"'{key}' is {_json_type(data[key])}, expected {expected}")
    if not data["workers"]:
        raise refuse("no workers")


@contextmanager
def reading(part: str) -> Iterator[None]:
    """Errors while building `part` of a plan from its dict -> PlanError naming the part."""
    try:
        yield
    except PlanError:
        raise
    except KeyError as e:
        raise refuse(f"{part}: no {e.args[0]!r}" if e.args else part) from None
    except (TypeError, ValueError, AttributeError, IndexError, GraphflowError) as e:
        raise refuse(f"{part}: {e}") from None


def check_consistent(plan: Plan) -> None:
    """The parts of a loaded plan agree: placement and transfers within its workers, each
    worker's sends and receives those of the transfers, its nodes those placed on it, loss,
    gradients and feeds naming nodes that exist."""
    parts, graph = plan.parts, plan.graph
    workers = f"the plan has {parts} worker{'s' if parts > 1 else ''} (0..{parts - 1})"
    unplaced = [n.name for n in graph.nodes if n.name not in plan.placement]
    if unplaced:
        raise refuse(f"placement has no worker for '{unplaced[0]}'")
    for name, w in plan.placement.items():
        if name not in graph:
            raise refuse(f"placement names '{name}', not a node of the graph")
        if not 0 <= w < parts:
            raise refuse(f"placement puts '{name}' on worker {w}; {workers}")
    for t in plan.transfers:
        if not (0 <= t.src < parts and 0 <= t.dst < parts) or t.src == t.dst:
            raise refuse(f"transfer '{t.key}' goes from worker {t.src} to {t.dst}; {workers}")
        if t.tensor not in graph:
            raise refuse(f"transfer '{t.key}' carries '{t.tensor}', not a node of the graph")
    for w in plan.workers:
        _check_worker(plan, w.index)
    if plan.loss is not None and plan.loss not in graph:
        raise refuse(f"loss '{plan.loss}' is not a node of the graph")
    for param, grad in plan.grads.items():
        if param not in graph or grad not in graph:
            raise refuse(f"grads: '{param}' -> '{grad}' names a node not in the graph")
    for name, join in plan.joins.items():
        if join.how not in ("concat", "flatten", "sum", "same") or not join.blocks or any(
                b not in graph for b in join.blocks):
            raise refuse(f"joins: '{name}' is joined {join.how!r} from "
                         f"{', '.join(join.blocks) or 'nothing'}, not nodes of the graph")
    for w, cuts in plan.feeds.items():
        if not 0 <= w < parts:
            raise refuse(f"feeds for worker {w}; {workers}")
        if unknown := [k for k in cuts if k not in plan.workers[w].graph]:
            raise refuse(f"feeds: worker {w} has no placeholder '{unknown[0]}'")


def _check_worker(plan: Plan, index: int) -> None:
    """Worker `index`'s subgraph: its send / recv keys those of its transfers, and its other
    nodes placed on it."""
    sub = plan.workers[index].graph
    for op, end in (("send", "src"), ("recv", "dst")):
        have = {n.attrs.get("key") for n in sub.nodes if n.op == op}
        want = {t.key for t in plan.transfers if getattr(t, end) == index}
        if extra := sorted(map(str, have - want)):
            raise refuse(f"worker {index} has a {op} of '{extra[0]}', not in the transfers")
        if missing := sorted(want - have):
            raise refuse(f"worker {index} has no {op} of '{missing[0]}', a transfer's")
    for n in sub.nodes:
        if n.op not in UNPLACED and plan.placement.get(n.name, index) != index:
            raise refuse(f"worker {index} runs '{n.name}', placed on worker "
                         f"{plan.placement[n.name]}")


def _json_type(value: Any) -> str:
    return JSON_TYPES.get(type(value), type(value).__name__)
