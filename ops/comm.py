"""Communication ops inserted by split() at every cut edge: send on the producer's worker,
recv on the consumer's. The worker runtime moves the tensor; these rows give shapes and costs.

attrs: key (one per tensor and destination), src and dst (worker indices); recv also carries
the tensor's shape and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from graphflow.ops.registry import Cost, Spec, register


def _infer_send(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec((), ins[0].dtype)


def _infer_recv(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec(tuple(attrs["shape"]), attrs["dtype"])


def _send_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
               itemsize: int) -> Cost:
    return Cost(0.0, itemsize * prod(ins[0]), 0.0)


def _recv_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
               itemsize: int) -> Cost:
    return Cost(0.0, 0.0, itemsize * prod(out))


register("send", _infer_send, None, cost=_send_cost, doc="send input 0 to worker dst (key)")
register("recv", _infer_recv, None, cost=_recv_cost, doc="receive a tensor from worker src (key)")
