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
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from graphflow.errors import GraphflowError
from graphflow.ir import SOURCE_OPS, Graph, Node
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
    with _user_code(spec, f"{name}()"):
        result = build()
    graph, loss = _unpack(result, spec)
    _check_computes(graph, spec)
    short = Path(target).stem if target.endswith(".py") else target
    return short if name == CONVENTION else f"{short}:{name}", graph, loss


def figure_batch(graph: Graph, asked: int | None, default: int = 64) -> int:
    """The batch a plan's figures are for: `asked` (`--batch`), else the model's own when its
    placeholders fix one, else `default`. A fixed batch cannot be asked to be another.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     x = gf.placeholder("x", (8, 20))
    >>> figure_batch(g, None)
    8
    """
    fixed = {n.shape[0]: n for n in graph.placeholders() if n.shape and n.shape[0] is not None}
    if not fixed:
        return default if asked is None else asked
    own, node = next(iter(fixed.items()))
    if asked is not None and asked != own:
        raise GraphflowError(f"--batch {asked}: the model's placeholder '{node.name}' "
                             f"{node.shape} fixes its batch at {own}")
    return own


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
        with _user_code(spec, f"loading {path}"):
            loader.loader.exec_module(module)
        return module
    if not {"", os.getcwd()} & set(sys.path):  # a module of the current folder, found as
        sys.path.append(os.getcwd())  # `python -m` finds it (the `graphflow` script does not)
    try:  # found before it runs, so that an import inside it is the user's mistake, not ours
        found, missing = importlib.util.find_spec(target), target
    except ModuleNotFoundError as e:  # a parent package is missing
        found, missing = None, e.name or target
    if found is None:
        raise GraphflowError(f"MODEL '{spec}': no module named '{missing}' (a reference "
                             f"workload is one of {', '.join(workloads)}; a file needs its "
                             f".py path)")
    with _user_code(spec, f"importing {target}"):
        return importlib.import_module(target)


@contextmanager
def _user_code(spec: str, doing: str) -> Iterator[None]:
    """Run the user's code: its own mistakes (a syntax error, an exception its code raised)
    become one error naming its file and line, not a traceback through graphflow. Our errors
    (a ShapeError at one of its lines) already say where, and pass through."""
    try:
        yield
    except GraphflowError:
        raise
    except SyntaxError as e:
        where = f"{e.filename}:{e.lineno}" if e.filename else "?"
        raise GraphflowError(f"MODEL '{spec}': syntax error at {where}: {e.msg}") from None
    except Exception as e:
        raise GraphflowError(f"MODEL '{spec}': {doing} raised {type(e).__name__}: {e}"
                             f"{_user_line(e)}") from None


def _user_line(e: BaseException) -> str:
    """' (at FILE:LINE)' for the innermost frame of the error's traceback outside graphflow
    and Python's import machinery: the user's line that raised or called what raised."""
    ours = str(Path(__file__).resolve().parent.parent)
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(("<frozen", ours))]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _check_computes(graph: Graph, spec: str) -> None:
    """A graph with nothing to compute is the user's mistake (a builder that returned before
    adding its layers), not a plan of idle workers or an error from deep inside a command."""
    if not graph.nodes:
        raise GraphflowError(f"MODEL '{spec}': the graph has no nodes")
    if all(n.op in SOURCE_OPS for n in graph.nodes):
        names = ", ".join(n.name for n in graph.nodes[:4]) + (", ..." if len(graph) > 4 else "")
        raise GraphflowError(f"MODEL '{spec}': the graph computes nothing: it has only "
                             f"placeholders, parameters and constants ({names})")


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
