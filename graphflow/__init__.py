"""graphflow: a DistBelief-style engine for training large networks across cores and machines.

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 4))
...     w = gf.parameter("w", (4, 2))
...     y = gf.relu(x @ w)
>>> y.shape
(None, 2)
"""

import importlib
import importlib.util
from typing import Any

from graphflow import datasets, layers, models, optim
from graphflow import ops as _ops  # noqa: F401  (registers every op)
from graphflow.autodiff import gradients
from graphflow.dsl import constant, device, name_scope, parameter, placeholder
from graphflow.errors import (
                              CycleError,
                              DTypeError,
                              GraphError,
                              GraphflowError,
                              MissingFeedError,
                              NonFiniteError,
                              ShapeError,
                              UnknownOpError,
)
from graphflow.executor import Session
from graphflow.ir import Graph, Node
from graphflow.ops.elementwise import (
                              add,
                              div,
                              exp,
                              log,
                              maximum,
                              mul,
                              neg,
                              relu,
                              sigmoid,
                              sqrt,
                              square,
                              sub,
                              tanh,
)
from graphflow.ops.loss import log_softmax, mse, softmax, softmax_cross_entropy
from graphflow.ops.matmul import matmul
from graphflow.ops.norm import lrn
from graphflow.ops.pool import avg_pool2d, max_pool2d
from graphflow.ops.reduce import reduce_max, reduce_mean, reduce_sum
from graphflow.ops.shape import concat, flatten, pad, reshape, slice_, transpose
from graphflow.runtime import Cluster

__all__ = [
    "Cluster", "CycleError", "DTypeError", "Graph", "GraphError", "GraphflowError",
    "MissingFeedError", "Node", "NonFiniteError", "Plan", "Session", "ShapeError", "Trainer",
    "UnknownOpError", "add", "avg_pool2d", "concat", "constant", "datasets", "device", "div",
    "exp", "flatten", "gradients", "layers", "log", "log_softmax", "lrn", "matmul",
    "max_pool2d", "maximum", "models", "mse", "mul", "name_scope", "neg", "optim", "pad",
    "parameter", "partition", "placeholder", "reduce_max", "reduce_mean", "reduce_sum", "relu",
    "reshape", "sigmoid", "slice_", "softmax", "softmax_cross_entropy", "sqrt", "square", "sub",
    "tanh", "transpose", "visualize",
]

# The driver's parts, imported on first use: a worker process needs none of them (with
# networkx, which they import, 0.4 s of its start); so are submodules (`gf.train.Trainer`)
_LAZY = {"Plan": "graphflow.partitioners", "partition": "graphflow.partitioners",
         "Trainer": "graphflow.train", "visualize": "graphflow.viz"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'graphflow' has no attribute '{name}'")
    globals()[name] = value
    return value
