"""Optimizers: SGD, momentum and DistBelief's Adagrad (their rules: ops/rules.py).

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
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphflow.ops import aligned, local, rules, short_gemm


class Optimizer(ABC):
    """Base: `update(name, param, grad, scale, also)` changes `param` in place from the gradient
    `scale * (grad + also)` (a sum over micro-batches takes its mean here, and a gradient in
    two parts its sum, not in a pass of its own); state is kept per name."""

    slots: tuple[str, ...] = ()  # (at most one)
    rule: int  # ops/rules.py
    # whether `update_product` pays: the rule's arithmetic, inside a gemm bound by arithmetic,
    # must cost less than the pass over memory it saves. Momentum's and Adagrad's do not (2560
    # x 2560 over 64 rows: 8.1 and 8.5 ms against 6.5 and 6.4 for the gemm, then the update;
    # pipelined speech-mlp with Adagrad: 3% slower steps)
    in_product = False

    def __init__(self, lr: float) -> None:
        if not 0 < lr < float("inf"):  # (NaN too)
            raise ValueError(f"learning rate must be a finite number > 0, got {lr}")
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
        g = np.ascontiguousarray(grad, dtype=param.dtype).reshape(-1)
        h = g[:0] if also is None else np.ascontiguousarray(also, dtype=param.dtype).reshape(-1)
        p = param.reshape(-1)
        rules.run(self.rule, p, self._slot(name, param).reshape(-1), g, 0, h, 0, p.size,
                  *self._args(param.dtype.type(scale)))

    def update_product(self, name: str, param: np.ndarray, a: np.ndarray, b: np.ndarray,
                       scale: float = 1.0, also: np.ndarray | None = None) -> bool:
        """`update` from the gradient `a.T @ b` (plus `also`), computed in the same pass
        (`short_gemm.matmul_tn_update`): the same parameter, bit for bit, as `update` from the
        product, without writing the product out and reading it back. False, and nothing
        done, where that kernel does not take these arrays (then compute and `update`)."""
        if not self.in_product:
            return False
        arrays = (param, a, b) if also is None else (param, a, b, also)
        m, n = param.shape if param.ndim == 2 else (0, 0)
        if not (all(x.dtype == np.float32 and x.flags.c_contiguous for x in arrays)
                and a.ndim == b.ndim == 2 and a.shape == (len(b), m) and b.shape[1] == n
                and (also is None or also.shape == param.shape)
                and n % short_gemm.PANEL == 0 and short_gemm.wins(m, n, len(a))):
            return False
        y = param.reshape(-1)[:0] if also is None else also
        short_gemm.matmul_tn_update(a, b, param, self.rule, self._slot(name, param), y,
                                    *self._args(param.dtype.type(scale)))
        return True

    def update_local(self, name: str, param: np.ndarray, x: np.ndarray, dy: np.ndarray,
                     geometry: tuple[int, int, int, int, int, int], scale: float = 1.0,
                     also: np.ndarray | None = None) -> bool:
        """`update` from a locally connected layer's weight gradient of `x` and `dy` (plus
        `also`; `geometry`: kh, kw, sh, sw, ph, pw), computed in the same pass
        (`local.local_grad_weight_update`): the same parameter, bit for bit, without writing
        the gradient out and reading it back. Every rule: its arithmetic runs on a location's
        block in cache, not inside the gemm (lc-large's 35 MB weight with SGD: 14.5 against
        17.4 ms). False, and nothing done, where these arrays do not fit that kernel."""
        kh, kw = geometry[:2]
        arrays = (param, x, dy) if also is None else (param, x, dy, also)
        if not (all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
                and param.ndim == x.ndim == dy.ndim == 4 and dy.shape[:3] == param.shape[:3]
                and 0 < x.shape[3] == dy.shape[3] and param.shape[3] == kh * kw * x.shape[2]
                and (also is None or also.shape == param.shape)):
            return False
        y = param.reshape(-1)[:0] if also is None else also.reshape(-1)
        local.local_grad_weight_update(x, dy, *geometry, param, self.rule,
                                       self._slot(name, param).reshape(-1), y,
                                       *self._args(param.dtype.type(scale)))
        return True

    def _slot(self, name: str, param: np.ndarray) -> np.ndarray:
        """`name`'s state slot (velocity or squared sums), made on first use; empty for SGD."""
        state = self.state.get(name)
        if state is None:
            state = self.state[name] = {s: self._initial_slot(param) for s in self.slots}
        return next(iter(state.values()), param.reshape(-1)[:0])

    def _initial_slot(self, param: np.ndarray) -> np.ndarray:
        return aligned.full(param.shape, 0, param.dtype)

    @abstractmethod
    def _args(self, scale: float) -> tuple[float, float, float, float]:
        """(lr, mu, eps, scale) for `rules.run`. `scale` comes in the parameter's dtype: a
        float64 one would make the loops float64 (momentum 1.5x slower on float32)."""

    def spec(self) -> dict[str, float | str]:
        """{"name": ..., "lr": ..., ...}: what a worker or shard needs to build the same rule."""
        name = next(k for k, v in OPTIMIZERS.items() if v is type(self))
        return {"name": name, **{k: v for k, v in vars(self).items() if k != "state"}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr})"


class SGD(Optimizer):
    """p -= lr * g"""

    rule = rules.SGD
    in_product = True  # 2560 x 2560 over 64 rows: 5.4 ms against 5.6-5.7 (gemm, then update)

    def _args(self, scale: float) -> tuple[float, float, float, float]:
        return self.lr * scale, 0.0, 0.0, scale


class Momentum(Optimizer):
    """v = mu * v + g; p -= lr * v"""

    slots = ("velocity",)
    rule = rules.MOMENTUM

    def __init__(self, lr: float, momentum: float = 0.9) -> None:
        super().__init__(lr)
        self.momentum = momentum

    def _args(self, scale: float) -> tuple[float, float, float, float]:
        return self.lr, self.momentum, 0.0, scale


class Adagrad(Optimizer):
    """DistBelief's Adagrad: each element's rate is lr / sqrt(sum of its squared gradients)."""

    slots = ("sum_sq",)
    rule = rules.ADAGRAD

    def __init__(self, lr: float, eps: float = 1e-8, initial_accumulator: float = 0.0) -> None:
        super().__init__(lr)
        if eps < 0 or initial_accumulator < 0:
            raise ValueError(f"Adagrad needs eps >= 0 and initial_accumulator >= 0, got {eps}, "
                             f"{initial_accumulator}")
        self.eps = eps
        self.initial_accumulator = initial_accumulator

    def _initial_slot(self, param: np.ndarray) -> np.ndarray:
        return aligned.full(param.shape, self.initial_accumulator, param.dtype)

    def _args(self, scale: float) -> tuple[float, float, float, float]:
        return self.lr, 0.0, self.eps, scale


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "momentum": Momentum, "adagrad": Adagrad}


def make_optimizer(spec: Mapping[str, Any] | None) -> Optimizer | None:
    """{"name": "sgd", "lr": 0.1, ...} -> an optimizer (None: no updates)."""
    if not spec:
        return None
    args = dict(spec)
    name = args.pop("name")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](**args)
