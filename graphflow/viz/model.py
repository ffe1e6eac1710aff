"""MODEL, as the command names it: what builds the graph to visualize.

- a reference workload: `lc-large`, `speech-mlp`, `digits-lc` (built with a symbolic batch,
  so `--batch` sets the figures' batch size);
- `package.module:function` (imported) or `path/to/file.py:function` (loaded from the file);
- `path/to/file.py` or `package.module` alone: its function named `build_model`.

The function is called with no arguments and returns a model (anything with `.graph` and
`.loss`, like `graphflow.models.Model`), a `(graph, loss)` pair, or a Graph alone (then the
plan has no backward pass).

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

CONVENTION = "build_model"  # the function a MODEL without `:function` names


def load_model(spec: str) -> tuple[str, Graph, Node | None]:
    """(a short name, the graph, its loss or None) for a MODEL string."""
    from graphflow.models import WORKLOADS

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
    return Path(target).stem if target.endswith(".py") else f"{target}:{name}", graph, loss


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
