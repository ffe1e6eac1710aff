"""Op test cases: for each registered op, inputs, attrs and a NumPy reference.

Each family module in this folder defines `CASES: list[OpCase]`; test_ops.py checks every case's
forward against its reference (float32 and float64) and, for ops with a gradient rule, every
gradient against central finite differences in float64. An op without a case fails the suite.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class OpCase:
    op: str
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]  # float64 / int arrays
    reference: Callable[..., np.ndarray]  # reference(*inputs, **attrs), in float64
    attrs: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    no_grad: tuple[int, ...] = ()  # float inputs not to differentiate (e.g. shape-only inputs)
    rtol32: float = 1e-4  # float32 forward tolerance (relative to the output's scale)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.label}" if self.label else self.op


def all_cases() -> list[OpCase]:
    cases: list[OpCase] = []
    for mod in pkgutil.iter_modules(__path__):
        cases.extend(importlib.import_module(f"{__name__}.{mod.name}").CASES)
    return cases
