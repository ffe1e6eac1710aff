"""The reference workloads (DistBelief's models scaled to one machine), written in the DSL.

Each builder returns a Model: the graph, its input and label placeholders, logits and loss.
Examples, benchmarks and the CLI all build models from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from graphflow import layers
from graphflow.dsl import placeholder
from graphflow.ir import Graph, Node
from graphflow.ops.elementwise import relu, sigmoid
from graphflow.ops.loss import softmax_cross_entropy
from graphflow.ops.shape import flatten, transpose

if TYPE_CHECKING:
    from graphflow.executor import Session


@dataclass(frozen=True)
class Model:
    name: str
    graph: Graph
    x: Node
    y: Node
    logits: Node
    loss: Node

    def classes(self, session: Session | Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                batch_size: int = 256) -> np.ndarray:
        """The predicted class of each row of `x` (argmax of the logits) with `session`'s
        parameters (or by a function from rows to their logits), `batch_size` rows a run; a
        graph of fixed batch N runs N at a time, the last chunk padded."""
        if len(x) == 0:
            raise ValueError(f"{self.name}: no rows to predict")
        logits_of = session if callable(session) else (
            lambda rows: session.run(self.logits, {self.x: rows}))
        size = self.x.shape[0] or batch_size
        out = []
        for start in range(0, len(x), size):
            chunk = x[start:start + size]
            n = len(chunk)
            if n < size and self.x.shape[0] is not None:
                chunk = np.concatenate([chunk, np.zeros((size - n, *chunk.shape[1:]),
                                                        chunk.dtype)])
            out.append(np.argmax(logits_of(chunk)[:n], axis=1))
        return np.concatenate(out)

    def accuracy(self, session: Session | Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                 y: np.ndarray) -> float:
        """The share of rows of `x` whose predicted class is `y`'s."""
        if len(x) != len(y):
            raise ValueError(f"{self.name}: {len(x)} inputs but {len(y)} labels")
        return float(np.mean(self.classes(session, x) == np.asarray(y)))


def lc_large(batch: int | None = 64, dtype: str = "float32", seed: int = 0) -> Model:
    """DistBelief's locally connected image model scaled to one machine (~12.75M parameters).

    3x64x64 -> local2d 32 7x7/2 -> relu -> local2d 64 5x5/2 -> relu -> dense 10. The image is
    fed NCHW; the two local2d layers pass their activations on in their own (H, W, C, N) layout.
    """
    with Graph(dtype, seed) as g:
        x = placeholder("x", (batch, 3, 64, 64))
        y = placeholder("y", (batch,), "int32")
        h = transpose(x, layers.NCHW_TO_HWCN, name="lc1/hwcn")
        h = relu(layers.local2d(h, 32, 7, stride=2, name="lc1", layout="HWCN"))
        h = relu(layers.local2d(h, 64, 5, stride=2, name="lc2", layout="HWCN"))
        h = transpose(h, layers.HWCN_TO_NCHW, name="to_nchw")
        logits = layers.dense(flatten(h), 10, name="fc")
        loss = softmax_cross_entropy(logits, y, name="loss")
    return Model("lc-large", g, x, y, logits, loss)


def speech_mlp(batch: int | None = 64, dtype: str = "float32", seed: int = 0) -> Model:
    """DistBelief's fully connected speech model (~42M parameters).

    440 (11 frames x 40) -> 4 x (dense 2560, sigmoid) -> softmax over 8192 states.
    """
    with Graph(dtype, seed) as g:
        x = placeholder("x", (batch, 440))
        y = placeholder("y", (batch,), "int32")
        h = x
        for i in range(4):
            h = sigmoid(layers.dense(h, 2560, name=f"fc{i + 1}"))
        logits = layers.dense(h, 8192, name="out")
        loss = softmax_cross_entropy(logits, y, name="loss")
    return Model("speech-mlp", g, x, y, logits, loss)


def digits_lc(batch: int | None = None, dtype: str = "float32", seed: int = 0) -> Model:
    """A small locally connected net for the 32x32 digits: conv -> pool -> local2d -> dense."""
    with Graph(dtype, seed) as g:
        x = placeholder("x", (batch, 1, 32, 32))
        y = placeholder("y", (batch,), "int32")
        h = relu(layers.conv2d(x, 16, 5, padding=2, name="conv1"))
        h = layers.max_pool2d(h, 2)
        h = relu(layers.local2d(h, 32, 3, stride=2, name="lc2"))
        logits = layers.dense(flatten(h), 10, name="fc")
        loss = softmax_cross_entropy(logits, y, name="loss")
    return Model("digits-lc", g, x, y, logits, loss)


WORKLOADS: dict[str, Callable[..., Model]] = {
    "lc-large": lc_large, "speech-mlp": speech_mlp, "digits-lc": digits_lc,
}
