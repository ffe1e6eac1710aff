"""graphflow: a DistBelief-style engine for training large networks across cores and machines.

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 4))
...     w = gf.parameter("w", (4, 2))
...     y = gf.relu(x @ w)
>>> y.shape
(None, 2)
"""

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

__all__ = [
    "CycleError", "DTypeError", "Graph", "GraphError", "GraphflowError", "MissingFeedError",
    "Node", "NonFiniteError", "Session", "ShapeError", "UnknownOpError", "add", "constant",
    "device", "div", "exp", "gradients", "log", "maximum", "mul", "name_scope", "neg",
    "parameter", "placeholder", "relu", "sigmoid", "sqrt", "square", "sub", "tanh",
]
