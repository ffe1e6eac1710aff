"""Sandblaster's vector operations, run by each shard on its own slices of named vectors.

A coordinator (L-BFGS) never holds the parameters: it asks every shard for partial dot
products and for axpy / scale / copy on vectors that live beside the parameters. "param" is
the parameters themselves (writing it bumps the slices' versions); any other name is created
zeroed, slice by slice, on first use. `accumulate` sums workers' gradients into a vector with
first-result-wins per task, so backup tasks can send duplicates. An axpy or scale that
carries an `op` id is done once: the client retries a call whose reply was lost, and
y += a * x twice would be wrong (copy and zero may run twice).

    >>> from graphflow.ps.shard import Shard
    >>> shard = Shard(0)
    >>> _ = shard.init({"w[0:2]": np.array([1, 2], np.float32)}, {"name": "sgd", "lr": 1.0}, [0])
    >>> shard.accumulate("g", "portion-3", {"w[0:2]": np.ones(2, np.float32)})
    {'accepted': True}
    >>> shard.accumulate("g", "portion-3", {"w[0:2]": np.ones(2, np.float32)})   # a backup's
    {'accepted': False}
    >>> shard.vec_axpy(-0.5, "g", "param"); shard.vec_dot("param", "param")
    2.5
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

PARAM = "param"
OPS_REMEMBERED = 4096  # write ids kept to recognise a retried call (oldest forgotten first)


class VectorOps:
    """Mixin of the shard's vector handlers; the shard provides the attributes below."""

    index: int
    params: dict[str, np.ndarray]
    vectors: dict[str, dict[str, np.ndarray]]
    accepted: dict[str, set[str]]
    _ops_done: OrderedDict[str, None]

    if TYPE_CHECKING:  # provided by Shard
        def _changed(self, keys: Collection[str]) -> None: ...
        def _grad(self, key: str, g: Any) -> np.ndarray: ...
        def flush(self) -> None: ...

    def _vec(self, name: str) -> dict[str, np.ndarray]:
        self.flush()
        if name == PARAM:
            return self.params
        vec = self.vectors.setdefault(name, {})
        for key, p in self.params.items():
            if key not in vec:
                vec[key] = np.zeros_like(p)
        return vec

    def _repeat(self, op: str | None) -> bool:
        """True if write `op` was done before (else it is remembered as done now)."""
        if op is None:
            return False
        if op in self._ops_done:
            return True
        self._ops_done[op] = None
        if len(self._ops_done) > OPS_REMEMBERED:
            self._ops_done.popitem(last=False)
        return False

    def _wrote(self, name: str, keys: Collection[str] | None = None) -> None:
        if name == PARAM:
            self._changed(self.params if keys is None else keys)

    def vec_dot(self, a: str, b: str) -> float:
        """This shard's part of a . b (float64)."""
        x, y = self._vec(a), self._vec(b)
        return float(sum(np.dot(x[k].astype(np.float64), y[k].astype(np.float64))
                         for k in self.params))

    def vec_axpy(self, alpha: float, x: str, y: str, op: str | None = None) -> None:
        """y += alpha * x"""
        if self._repeat(op):
            return
        xs, ys = self._vec(x), self._vec(y)
        for k in self.params:
            ys[k] += np.float32(alpha) * xs[k]
        self._wrote(y)

    def vec_scale(self, alpha: float, x: str, op: str | None = None) -> None:
        """x *= alpha"""
        if self._repeat(op):
            return
        for v in self._vec(x).values():
            v *= np.float32(alpha)
        self._wrote(x)

    def vec_copy(self, src: str, dst: str) -> None:
        """dst = src"""
        s, d = self._vec(src), self._vec(dst)
        for k in self.params:
            d[k][...] = s[k]
        self._wrote(dst)

    def vec_zero(self, name: str) -> None:
        """name = 0, and forget the tasks `accumulate` accepted for it."""
        for v in self._vec(name).values():
            v.fill(0)
        self.accepted.pop(name, None)
        self._wrote(name)

    def vec_drop(self, name: str) -> None:
        """Forget vector `name` (and its accepted tasks)."""
        if name == PARAM:
            raise ValueError(f"shard {self.index}: the parameters cannot be dropped")
        self.vectors.pop(name, None)
        self.accepted.pop(name, None)

    def accumulate(self, name: str, task: str, grads: Mapping[str, Any],
                   weight: float = 1.0) -> dict[str, bool]:
        """name += weight * grads, unless `task` was already accepted for `name`."""
        done = self.accepted.setdefault(name, set())
        if task in done:
            return {"accepted": False}
        flat = {k: self._grad(k, g) for k, g in grads.items()}
        vec = self._vec(name)
        for k, g in flat.items():
            vec[k] += np.float32(weight) * g
        done.add(task)
        self._wrote(name, list(flat))
        return {"accepted": True}

    def _vector_state(self) -> dict[str, Any]:
        return {"vectors": self.vectors,
                "accepted": {n: sorted(t) for n, t in self.accepted.items()}}
