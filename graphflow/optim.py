"""Update rules: SGD, momentum and DistBelief's Adagrad, written once.

An optimizer updates a named array in place from its gradient and keeps its per-name state
(velocity, squared-gradient sums). The single-process Trainer uses it on whole parameters; a
parameter-server shard uses the same object on the slices it holds.

>>> import numpy as np
>>> opt = Adagrad(lr=0.1)
>>> w = np.ones(3, np.float32)
>>> opt.update("w", w, np.full(3, 2.0, np.float32))
>>> [round(float(v), 3) for v in w]
[0.9, 0.9, 0.9]
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numba import njit

from graphflow.ops import aligned


@njit(cache=True, nogil=True, inline="always")
def _element(g: np.ndarray, h: np.ndarray, i: int) -> float:
    """Element i of the gradient: g's, or g's plus h's where the gradient comes in two parts
    (an empty h: one part; the test is the same for every i, so LLVM takes it out of the loop)."""
    return g[i] + h[i] if h.size else g[i]


# error_model="numpy": no zero-division check in the loop, so it vectorises (Adagrad 5x)
@njit(cache=True, nogil=True, error_model="numpy")
def _sgd(p: np.ndarray, g: np.ndarray, h: np.ndarray, lr: float) -> None:
    for i in range(p.size):
        p[i] -= lr * _element(g, h, i)


@njit(cache=True, nogil=True, error_model="numpy")
def _momentum(p: np.ndarray, g: np.ndarray, h: np.ndarray, v: np.ndarray, lr: float, mu: float,
              scale: float) -> None:
    for i in range(p.size):
        v[i] = mu * v[i] + scale * _element(g, h, i)
        p[i] -= lr * v[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _adagrad(p: np.ndarray, g: np.ndarray, h: np.ndarray, acc: np.ndarray, lr: float,
             eps: float, scale: float) -> None:
    for i in range(p.size):
        gi = scale * _element(g, h, i)
        acc[i] += gi * gi
        # the floor: with eps 0, an element that never had a gradient stays (0 / tiny = 0)
        p[i] -= lr * gi / max(np.sqrt(acc[i]) + eps, 1e-30)


class Optimizer(ABC):
    """Base: `update(name, param, grad, scale, also)` changes `param` in place from the gradient
    `scale * (grad + also)` (a sum over micro-batches takes its mean here, and a gradient in
    two parts its sum, not in a pass of its own); state is kept per name."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: float) -> None:
        if lr <= 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.lr = lr
        self.state: dict[str, dict[str, np.ndarray]] = {}

    def update(self, name: str, param: np.ndarray, grad: np.ndarray, scale: float = 1.0,
               also: np.ndarray | None = None) -> None:
        for part in (grad, also):
            if part is not None and part.shape != param.shape:
                raise ValueError(f"'{name}': gradient shape {part.shape} != parameter "
                                 f"{param.shape}")
        if not param.flags.c_contiguous:
            raise ValueError(f"'{name}': parameter must be C-contiguous to update in place")
        state = self.state.get(name)
        if state is None:
            state = self.state[name] = {s: self._initial_slot(param) for s in self.slots}
        g = np.ascontiguousarray(grad, dtype=param.dtype).reshape(-1)
        h = g[:0] if also is None else np.ascontiguousarray(also, dtype=param.dtype).reshape(-1)
        # scale in the parameter's dtype: a float64 one makes the loops float64 (momentum 1.5x
        # slower on float32)
        self._apply(param.reshape(-1), g, h, {k: v.reshape(-1) for k, v in state.items()},
                    param.dtype.type(scale))

    def _initial_slot(self, param: np.ndarray) -> np.ndarray:
        return aligned.full(param.shape, 0, param.dtype)

    @abstractmethod
    def _apply(self, p: np.ndarray, g: np.ndarray, h: np.ndarray, state: dict[str, np.ndarray],
               scale: float) -> None:
        """Update flat `p` from flat `scale * (g + h)` (an empty h: from g alone), with this
        name's flat state slots."""

    def spec(self) -> dict[str, float | str]:
        """{"name": ..., "lr": ..., ...}: what a worker or shard needs to build the same rule."""
        name = next(k for k, v in OPTIMIZERS.items() if v is type(self))
        return {"name": name, **{k: v for k, v in vars(self).items() if k != "state"}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr})"


class SGD(Optimizer):
    """p -= lr * g"""

    def _apply(self, p: np.ndarray, g: np.ndarray, h: np.ndarray, state: dict[str, np.ndarray],
               scale: float) -> None:
        _sgd(p, g, h, self.lr * scale)


class Momentum(Optimizer):
    """v = mu * v + g; p -= lr * v"""

    slots = ("velocity",)

    def __init__(self, lr: float, momentum: float = 0.9) -> None:
        super().__init__(lr)
        self.momentum = momentum

    def _apply(self, p: np.ndarray, g: np.ndarray, h: np.ndarray, state: dict[str, np.ndarray],
               scale: float) -> None:
        _momentum(p, g, h, state["velocity"], self.lr, self.momentum, scale)


class Adagrad(Optimizer):
    """DistBelief's Adagrad: each element's rate is lr / sqrt(sum of its squared gradients)."""

    slots = ("sum_sq",)

    def __init__(self, lr: float, eps: float = 1e-8, initial_accumulator: float = 0.0) -> None:
        super().__init__(lr)
        if eps < 0 or initial_accumulator < 0:
            raise ValueError(f"Adagrad needs eps >= 0 and initial_accumulator >= 0, got {eps}, "
                             f"{initial_accumulator}")
        self.eps = eps
        self.initial_accumulator = initial_accumulator

    def _initial_slot(self, param: np.ndarray) -> np.ndarray:
        return aligned.full(param.shape, self.initial_accumulator, param.dtype)

    def _apply(self, p: np.ndarray, g: np.ndarray, h: np.ndarray, state: dict[str, np.ndarray],
               scale: float) -> None:
        _adagrad(p, g, h, state["sum_sq"], self.lr, self.eps, scale)


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "momentum": Momentum, "adagrad": Adagrad}
