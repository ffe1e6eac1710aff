"""The op library (installed as graphflow.ops): one registry, kernels grouped by family."""

from graphflow.ops import (  # noqa: F401  (importing a family registers its ops)
    comm,
    conv,
    elementwise,
    local,
    loss,
    matmul,
    norm,
    pool,
    reduce,
    shape,
    source,
    split_loss,
)
from graphflow.ops.registry import REGISTRY, Cost, OpDef, Spec, apply, register

__all__ = ["REGISTRY", "Cost", "OpDef", "Spec", "apply", "register"]
