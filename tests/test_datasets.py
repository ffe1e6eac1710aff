"""Digits loading, seeded shuffled batches and shift augmentation."""

import numpy as np
import pytest

from graphflow import datasets


def test_digits_shapes_and_split():
    pytest.importorskip("sklearn", reason="digits needs scikit-learn (the [data] extra)")
    d = datasets.digits(size=32)
    assert d.x_train.shape[1:] == (1, 32, 32) and d.x_train.dtype == np.float32
    assert len(d.y_train) + len(d.y_test) == 1797
    assert set(np.unique(d.y_test)) == set(range(10))


def test_batches_are_seeded_shuffled_and_cover_an_epoch():
    x = np.arange(20, dtype=np.float32).reshape(20, 1, 1, 1)
    y = np.arange(20, dtype=np.int32)
    first = [yb.copy() for _, yb in datasets.batches(x, y, 5, seed=3, epochs=1)]
    again = [yb.copy() for _, yb in datasets.batches(x, y, 5, seed=3, epochs=1)]
    other = [yb.copy() for _, yb in datasets.batches(x, y, 5, seed=4, epochs=1)]
    assert all((a == b).all() for a, b in zip(first, again))
    assert any((a != b).any() for a, b in zip(first, other))
    assert sorted(np.concatenate(first).tolist()) == list(range(20))
    assert np.concatenate(first).tolist() != list(range(20))


def test_random_shift_moves_images_within_bounds():
    x = np.zeros((50, 1, 9, 9), np.float32)
    x[:, 0, 4, 4] = 1.0
    out = datasets.random_shift(x, 2, np.random.default_rng(0))
    pos = np.argwhere(out[:, 0] == 1.0)
    assert len(pos) == 50
    assert (np.abs(pos[:, 1:] - 4) <= 2).all() and len({tuple(p[1:]) for p in pos}) > 5


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size 0"):
        next(datasets.batches(np.zeros((4, 1)), np.zeros(4), 0))
