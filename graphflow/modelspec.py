"""MODEL, as the commands name it (`graphflow train`, `show`, `visualize`, `bench speedup`):

- a reference workload: `lc-large`, `speech-mlp`, `digits-lc` (built with a symbolic batch,
  so `--batch` sets the figures' batch size);
- `package.module:function` (imported) or `path/to/file.py:function` (loaded from the file);
- `path/to/file.py` or `package.module` alone: its function named `build_model`.

The function is called with no arguments and returns a model (anything with `.graph` and
`.loss`, like `graphflow.models.Model`), a `(graph, loss)` pair, or a Graph alone (then the
plan has no backward pass). To train one, or time its steps, graphflow feeds it synthetic
batches (`load_trainable`): its loss must be `softmax_cross_entropy` or `mse` of a labels
placeholder, and it must have one other placeholder, the input.

>>> name, graph, loss = load_model("digits-lc")
>>> name, loss.name
('digits-lc', 'loss')
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from graphflow.errors import GraphflowError
from graphflow.ir import Graph, Node
from graphflow.models import WORKLOADS, Model

CONVENTION = "build_model"  # the function a MODEL without `:function` names


def load_model(spec: str) -> tuple[str, Graph, Node | None]:
    """(a short name, the graph, its loss or None) for a MODEL string."""
    if spec in WORKLOADS:
        model = WORKLOADS[spec](batch=None)
        return spec, model.graph, model.loss
    target, _, func = spec.partition(":")
    if not target:
        raise GraphflowError(f"MODEL '{spec}': expected a reference workload "
                             f"({', '.join(WORKLOADS)}), module:function or file.py:function")
    module = _load(target, spec, WORKLOADS)
    name = func or CONVENTION
    build = getattr(module, name, None)
    if not callable(build):
        what = "no function" if build is None else "a non-callable"
        raise GraphflowError(f"MODEL '{spec}': {target} has {what} '{name}'"
                             + ("" if func else f" (a MODEL without :function names "
                                                f"'{CONVENTION}')"))
    try:
        inspect.signature(build).bind()
    except TypeError:
        raise GraphflowError(f"MODEL '{spec}': {name}{inspect.signature(build)} needs "
                             f"arguments; it is called with none") from None
    except ValueError:  # no signature to read (a builtin): just call it
        pass
    graph, loss = _unpack(build(), spec)
    short = Path(target).stem if target.endswith(".py") else target
    return short if name == CONVENTION else f"{short}:{name}", graph, loss


LOSSES = ("softmax_cross_entropy", "mse")  # the losses whose labels we can make up


def load_trainable(spec: str, seed: int = 0) -> Model:
    """MODEL as a `Model` to train on synthetic batches; a reference workload is built with
    `seed` (a user's function takes no arguments, so it seeds its own graph)."""
    if spec in WORKLOADS:
        return WORKLOADS[spec](batch=None, seed=seed)
    return trainable(*load_model(spec), spec)


def trainable(name: str, graph: Graph, loss: Node | None, spec: str) -> Model:
    """The Model of a graph and its loss: the loss's first input is the prediction (the
    logits), its second the labels placeholder, and the one other placeholder the input.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     x = gf.placeholder("x", (None, 4)); y = gf.placeholder("y", (None, 2))
    ...     loss = gf.mse(gf.layers.dense(x, 2, name="fc"), y)
    >>> m = trainable("toy", g, loss, "toy.py")
    >>> m.x.name, m.y.name, m.logits.name
    ('x', 'y', 'fc/add')
    """
    where = f"MODEL '{spec}'"
    if loss is None:
        raise GraphflowError(f"{where} has no loss; to train it, return a model with .loss "
                             f"or a (graph, loss) pair")
    if loss.op not in LOSSES:
        raise GraphflowError(f"{where}: its loss '{loss.name}' is a {loss.op}; graphflow makes "
                             f"up labels for a loss that is one of {', '.join(LOSSES)}")
    prediction, labels = loss.inputs
    if labels.op != "placeholder":
        raise GraphflowError(f"{where}: the labels of its loss '{loss.name}' are '{labels.name}' "
                             f"({labels.op}), not a placeholder the batch can feed")
    inputs = [n for n in graph.placeholders() if n is not labels]
    if len(inputs) != 1:
        names = ", ".join(n.name for n in inputs) or "none"
        raise GraphflowError(f"{where} has {len(inputs)} input placeholders besides the labels "
                             f"'{labels.name}' ({names}); training feeds it one input")
    for node in (inputs[0], labels):
        if any(d is None for d in node.shape[1:]):
            raise GraphflowError(f"{where}: placeholder '{node.name}' {node.shape} has a size "
                                 f"other than the batch's left open; synthetic batches need it")
    return Model(name, graph, inputs[0], labels, prediction, loss)


def _load(target: str, spec: str, workloads: dict[str, Callable[..., Any]]) -> ModuleType:
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise GraphflowError(f"MODEL '{spec}': no file {path}")
        module_name = f"_graphflow_model_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise GraphflowError(f"MODEL '{spec}': cannot load {path} as Python")
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module  # dataclasses in the file look their module up
        loader.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise GraphflowError(f"MODEL '{spec}': no module named '{e.name}' (a reference "
                             f"workload is one of {', '.join(workloads)}; a file needs its "
                             f".py path)") from None


def _unpack(result: object, spec: str) -> tuple[Graph, Node | None]:
    if isinstance(result, Graph):
        return result, None
    graph, loss = getattr(result, "graph", None), getattr(result, "loss", None)
    if graph is None and isinstance(result, tuple) and len(result) == 2:
        graph, loss = result
    if not isinstance(graph, Graph) or not (loss is None or isinstance(loss, Node)):
        raise GraphflowError(f"MODEL '{spec}' returned {type(result).__name__}; expected a "
                             f"model with .graph and .loss, a (graph, loss) pair or a Graph")
    if loss is not None and loss.graph is not graph:
        raise GraphflowError(f"MODEL '{spec}': the loss '{loss.name}' is not a node of the "
                             f"returned graph")
    return graph, loss
