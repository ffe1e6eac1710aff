"""Data: scikit-learn's digits upscaled to 32x32, synthetic inputs, and a seeded batch loader.

>>> data = digits()                                      # doctest: +SKIP
>>> xb, yb = next(batches(data.x_train, data.y_train, 32, seed=0, shift=2))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from graphflow.ir import Node
    from graphflow.models import Model


@dataclass(frozen=True)
class Dataset:
    """Train and held-out test arrays: x float32 (N, ...), y (N,) int32 class indices, or
    float32 targets (N, ...) for a regression (then `classes` is 0)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int


def digits(size: int = 32, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """The 1797 8x8 digits shipped with scikit-learn (no download), bilinearly upscaled."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("the digits data set needs scikit-learn: "
                          "pip install 'graphflow[data]'") from e
    from scipy.ndimage import zoom

    raw = load_digits()
    images = raw.images.astype(np.float32) / 16.0
    big = zoom(images, (1, size / 8, size / 8), order=1).astype(np.float32)
    big = (big - big.mean()) / big.std()
    x = big[:, None, :, :]
    y = raw.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", x[train], y[train], x[test], y[test], 10)


def synthetic(input_shape: tuple[int, ...], classes: int, n: int = 256,
              seed: int = 0) -> Dataset:
    """Random inputs with random labels, for benchmarks and shape tests."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *input_shape), dtype=np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    return Dataset("synthetic", x, y, x[: n // 4], y[: n // 4], classes)


def synthetic_for(model: Model, n: int = 256, seed: int = 0) -> Dataset:
    """Random inputs shaped as `model.x` and labels for its loss: class indices below the
    logits' width for softmax_cross_entropy, standard-normal targets for mse."""
    shape = tuple(int(d) for d in model.x.shape[1:])
    if model.loss.op != "mse":
        return synthetic(shape, int(model.logits.shape[-1]), n, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape), dtype=np.float32)
    y = rng.standard_normal((n, *(int(d) for d in model.y.shape[1:])), dtype=np.float32)
    return Dataset("synthetic", x, y, x[: n // 4], y[: n // 4], 0)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int = 0, shift: int = 0,
            epochs: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Shuffled mini-batches, reshuffled every epoch from `seed`; only full batches.

    `shift` > 0 moves each image by a random offset in [-shift, shift] pixels (zero fill).
    """
    if len(x) != len(y):
        raise ValueError(f"{len(x)} inputs but {len(y)} labels")
    if not 0 < batch_size <= len(x):
        raise ValueError(f"batch_size {batch_size} must be in 1..{len(x)} (the data set size)")
    rng = np.random.default_rng(seed)
    epoch = 0
    while epochs is None or epoch < epochs:
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            xb = x[idx]
            if shift:
                xb = random_shift(xb, shift, rng)
            yield np.ascontiguousarray(xb), y[idx]
        epoch += 1


def random_shift(x: np.ndarray, shift: int, rng: np.random.Generator) -> np.ndarray:
    """Translate each (C, H, W) image by its own random (dy, dx) in [-shift, shift]."""
    n, _, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
    offsets = rng.integers(0, 2 * shift + 1, size=(n, 2))
    out = np.empty_like(x)
    for i, (dy, dx) in enumerate(offsets):
        out[i] = padded[i, :, dy:dy + h, dx:dx + w]
    return out


def pairs(batches: Iterable[tuple[np.ndarray, np.ndarray]], x: Node | None = None,
          y: Node | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The batches, each checked to be an (inputs, labels) pair of as many rows (at least
    one), and with placeholders `x` and `y`, of their shapes and dtypes: a ValueError naming
    the batch, before a worker sees it (a replica would be blamed for it).

    >>> next(pairs([(np.zeros((2, 3)), np.zeros(3))]))
    Traceback (most recent call last):
    ...
    ValueError: batch 0: 2 inputs but 3 labels
    """
    from graphflow.errors import GraphflowError
    from graphflow.executor import checked_value

    for i, batch in enumerate(batches):
        if not isinstance(batch, tuple | list) or len(batch) != 2:
            raise TypeError(f"batch {i} is a {type(batch).__name__}; expected an (x, y) pair "
                            "of arrays, as graphflow.datasets.batches yields")
        xs, ys = batch
        if len(xs) != len(ys) or not len(xs):
            raise ValueError(f"batch {i}: {len(xs)} inputs but {len(ys)} labels" if len(xs)
                             != len(ys) else f"batch {i} has no rows")
        try:
            if x is not None and y is not None:
                xs, ys = checked_value(x, xs), checked_value(y, ys)
        except GraphflowError as e:
            raise ValueError(f"batch {i}: {e}") from None
        yield xs, ys
