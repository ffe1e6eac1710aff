"""What a cluster's caller passes, in its plan's terms: a step's feeds and fetches (nodes or
node names, as `gf.Session` takes them) and parameter values, checked against the plan
before any worker is asked, so that a mistake is named as the caller made it rather than as
a worker's failure.

>>> import numpy as np, graphflow as gf
>>> model = gf.models.digits_lc(batch=None)
>>> args = PlanArgs(gf.partition(model.graph, 2, "layerwise", loss=model.loss))
>>> args.fetches([model.loss, "loss"])
['loss']
>>> args.feeds({model.x: np.zeros((2, 1, 32, 32), np.float32)})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
graphflow.errors.MissingFeedError: placeholder 'y' (...): is not fed, ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from graphflow.errors import GraphError, described, did_you_mean, located
from graphflow.executor import checked_value, missing_feed
from graphflow.init import block_of
from graphflow.ir import Node, twin_of, user_source_line
from graphflow.runtime import batchjoin, pipeline
from graphflow.runtime.prune import needed_nodes

if TYPE_CHECKING:  # (a worker process starts without the partitioners)
    from graphflow.partitioners.plan import Plan

Feeds = Mapping[Node | str, Any]
Fetches = Node | str | Iterable[Node | str]


class PlanArgs:
    """Turns a step's `feeds` and `fetches` into the plan's node names, refusing what the
    plan cannot run: an unknown name (with the names it may have meant), a node of another
    graph, a value of the wrong shape or dtype, a placeholder left unfed. `parameters`
    splits parameter values among the workers that hold them."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.placeholders = {n.name: n for n in plan.graph.placeholders()}
        # a training step runs every worker's whole subgraph: all it holds must be fed
        self.required = [n for name, n in self.placeholders.items()
                         if any(name in w.graph for w in plan.workers)]
        self._needed: dict[frozenset[str], list[frozenset[str]]] = {}

    def needed(self, fetches: list[str]) -> list[frozenset[str]]:
        """Per worker, the names of the nodes a run that does not train computes for
        `fetches` (runtime/prune.py)."""
        key = frozenset(fetches)
        if key not in self._needed:
            if len(self._needed) >= 16:  # (a few fetch lists recur, step after step)
                self._needed.clear()
            self._needed[key] = needed_nodes(self.plan, key)
        return self._needed[key]

    def fetches(self, fetches: Fetches) -> list[str]:
        """The names of `fetches` (one node or name, or several), each once, in order: nodes
        of the plan, or original nodes it holds in pieces (`Plan.joins`, see `pieces`)."""
        if isinstance(fetches, Node | str):
            fetches = [fetches]
        elif not isinstance(fetches, Iterable):
            raise GraphError(f"Cluster ({user_source_line()}): fetches must be nodes or node "
                             f"names, got {described(fetches)}")
        names = [self._name(f, "fetch") for f in fetches]
        for name in names:
            if not self.held(name) and name not in self.plan.joins:
                raise self._not_held(name)
        return list(dict.fromkeys(names))

    def held(self, name: str) -> bool:
        """Whether a worker computes node `name` (a plan may place a node it then dropped)."""
        worker = self.plan.placement.get(name)
        return worker is not None and name in self.plan.workers[worker].graph

    def pieces(self, names: list[str]) -> list[str]:
        """The plan's nodes that `names` (of `fetches`; not placeholders: the driver has those)
        are, or are joined from."""
        return list(dict.fromkeys(b for name in names if name not in self.placeholders for b in (
            (name,) if self.held(name) else self.plan.joins[name].blocks)))

    def feeds(self, feeds: Feeds, fetches: list[str] | None = None) -> dict[str, np.ndarray]:
        """The feeds by placeholder name, each checked against the whole model's placeholder
        (before the rows are cut: a worker would name the shape of its cut, not the one the
        caller fed) and cast to its dtype. Every placeholder a worker holds must be fed, or
        with `fetches` (a run that does not train), those the fetches depend on."""
        if not isinstance(feeds, Mapping):
            raise GraphError(f"Cluster ({user_source_line()}): feeds must be a dict from "
                             f"placeholders or their names to arrays, got {described(feeds)}")
        out = {}
        for key, value in feeds.items():
            name = self._name(key, "feed")
            if name not in self.placeholders:
                raise self._not_a_placeholder(name)
            out[name] = checked_value(self.placeholders[name], value)
        if fetches is None:
            for node in self.required:
                if node.name not in out:
                    raise missing_feed(node, "the plan's workers read it (a training step runs "
                                             "each one's whole subgraph)")
            return out
        needed = set().union(*self.needed(self.pieces(fetches)), fetches)
        for node in self.required:
            if node.name not in out and node.name in needed:
                if node.name in fetches:
                    raise missing_feed(node, "it is fetched")
                users = [f for f in fetches if any(
                    node.name in names for names in needed_nodes(self.plan, self.pieces([f])))]
                raise missing_feed(node, f"{', '.join(map(repr, users))} "
                                         f"need{'s' * (len(users) == 1)} it")
        return out

    def rows(self, feeds: Mapping[str, np.ndarray], microbatches: int) -> int | None:
        """The batch's rows, when it is cut into `microbatches` (each weighs its rows); a
        ValueError here, before any worker is asked, if it has fewer rows than micro-batches."""
        if microbatches == 1:
            return None
        batched = [name for name, n in self.placeholders.items() if name in feeds and n.shape]
        if not batched:
            return None
        rows = len(np.asarray(feeds[batched[0]]))
        pipeline.microbatch_rows(rows, microbatches)
        return rows

    @cached_property
    def kinds(self) -> dict[str, str]:
        """How each node of the plan's graph reads the batch (runtime/batchjoin.py)."""
        return batchjoin.kinds(self.plan.graph)

    def joins(self, names: Iterable[str]) -> dict[str, str]:
        """How each of `names`, fetched with micro-batches, joins over them; GraphflowError,
        naming it, for one that cannot."""
        return batchjoin.joins(self.plan.graph, self.kinds, names)

    def loss_join(self) -> str:
        """How the loss weighs each micro-batch's gradients: "mean" or "sum" (ValueError for
        another loss: it cannot train with micro-batches)."""
        if self.plan.loss is None:
            return "mean"
        return batchjoin.loss_join(self.plan.graph, self.kinds, self.plan.loss)

    def parameters(self, values: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each worker's part of `values`, by `Cluster.params()`'s names or the model's: a
        parameter the plan split into blocks is split alike. KeyError for an unknown name,
        ValueError for a wrong shape."""
        homes: dict[str, list[tuple[int, Node]]] = {}  # a name -> (worker, parameter node)
        for i, w in enumerate(self.plan.workers):
            for p in w.graph.parameters():
                homes.setdefault(p.name, []).append((i, p))
                if "block" in p.attrs:  # and under the name of the whole it is a block of
                    homes.setdefault(p.attrs["block"]["of"], []).append((i, p))
        if unknown := sorted(set(values) - set(homes)):
            raise KeyError(f"set_params: the plan has no parameter {', '.join(unknown)}; it has "
                           f"{', '.join(sorted(homes)[:12])}{', ...' * (len(homes) > 12)}")
        each: list[dict[str, np.ndarray]] = [{} for _ in self.plan.workers]
        for name, value in values.items():
            for i, p in homes[name]:
                block = p.attrs["block"] if p.name != name else None  # (of the whole `name`)
                shape = tuple(block["attrs"]["shape"]) if block else tuple(p.shape)
                if np.shape(value) != shape:
                    raise ValueError(f"set_params: parameter '{name}' has shape {shape}, the "
                                     f"value given has shape {np.shape(value)}")
                part = block_of(np.asarray(value), block) if block else value
                each[i][p.name] = np.ascontiguousarray(part)
        return each

    def _name(self, key: object, role: str) -> str:
        """The plan's name for `key`, a node or a node's name (`role`: fetch or feed)."""
        if isinstance(key, str):
            return key
        if not isinstance(key, Node):
            expected = ("fetches must be nodes or node names" if role == "fetch" else
                        "feeds must be keyed by placeholders or their names")
            raise GraphError(f"Cluster ({user_source_line()}): {expected}, got {described(key)}")
        # The plan holds a copy of the model's graph: its node of the same name stands for it
        # (or, where the strategy holds it in pieces, their join).
        if twin_of(self.plan.graph, key) is None and key.name not in self.plan.joins:
            if any(n.attrs.get("block", {}).get("of") == key.name
                   for n in self.plan.graph.parameters()):
                raise self._not_held(key.name)
            namesake = self.plan.graph[key.name] if key.name in self.plan.graph else None
            has = (f"no node '{key.name}': the node is of another graph (or the plan's "
                   f"'{self.plan.strategy}' strategy rewrote it)" if namesake is None else
                   f"a different node of that name, {namesake!r}: the node is of another "
                   f"graph")
            raise GraphError(located(key, f"is a {role}, but the plan has {has}"))
        return key.name

    def _not_held(self, name: str) -> GraphError:
        where = f"Cluster ({user_source_line()})"
        blocks = [n.name for n in self.plan.graph.parameters()
                  if n.attrs.get("block", {}).get("of") == name]
        if blocks:
            return GraphError(f"{where}: the plan holds parameter '{name}' in blocks "
                              f"({', '.join(blocks)}); plan.assemble(cluster.params()) joins "
                              f"them")
        if name in self.plan.placement:
            return GraphError(f"{where}: no worker computes '{name}': the plan's "
                              f"'{self.plan.strategy}' strategy left it out (its readers take "
                              f"its parts directly)")
        known = [*self.plan.placement, *self.plan.joins]
        return GraphError(f"{where}: no node named '{name}' in the plan to fetch"
                          f"{did_you_mean(name, known)}")

    def _not_a_placeholder(self, name: str) -> GraphError:
        where = f"Cluster ({user_source_line()})"
        known = ", ".join(f"'{p}'" for p in self.placeholders)
        if name in self.plan.graph:
            return GraphError(f"{where}: cannot feed '{name}': it is a "
                              f"{self.plan.graph[name].op}, and a cluster's workers are fed "
                              f"placeholders only ({known})")
        return GraphError(f"{where}: no placeholder named '{name}' in the plan to feed (its "
                          f"placeholders: {known}){did_you_mean(name, self.placeholders)}")
