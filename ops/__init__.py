"""The op library (installed as graphflow.ops): one registry, kernels grouped by family."""

from graphflow.ops import elementwise, source  # noqa: F401  (importing registers the ops)
from graphflow.ops.registry import REGISTRY, Cost, OpDef, Spec, apply, register

__all__ = ["REGISTRY", "Cost", "OpDef", "Spec", "apply", "register"]
