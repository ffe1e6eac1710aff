"""Cases for ops/split_loss.py: the softmax cross-entropy of logits split by classes (that the
blocks' statistics combine to the whole loss: tests/test_split_loss.py)."""

import numpy as np

from tests.cases import OpCase

N, CLASSES, BOUNDS = 5, 10, [(0, 3), (3, 7), (7, 10)]


def block_ref(x, labels, lo, classes):
    m = x.max(axis=1)
    t = labels - lo
    inside = (t >= 0) & (t < x.shape[1])
    z = np.where(inside, x[np.arange(len(x)), np.clip(t, 0, x.shape[1] - 1)], 0.0)
    return np.stack([m, np.exp(x - m[:, None]).sum(axis=1), z], axis=1)


def block_grad_ref(x, labels, stats, d, lo, classes):
    m, s = stats[:, :1], stats[:, 1:2]
    dx = d[:, 1:2] * np.exp(x - m)
    rows = np.arange(len(x))
    first = (x == m).argmax(axis=1)
    dx[rows, first] += d[:, 0] - d[:, 1] * s[:, 0]
    t = labels - lo
    inside = (t >= 0) & (t < x.shape[1])
    dx[rows[inside], t[inside]] += d[inside, 2]
    return dx


def _whole(rng):
    return rng.standard_normal((N, CLASSES)), rng.integers(0, CLASSES, N)


def _block_inputs(rng):
    x, labels = _whole(rng)
    return [x[:, 3:7], labels]


def _block_grad_inputs(rng):
    x, labels = _block_inputs(rng)
    return [x, labels, block_ref(x, labels, 3, CLASSES), rng.standard_normal((N, 3))]


def _stats(rng):
    x, labels = _whole(rng)
    return [block_ref(x[:, lo:hi], labels, lo, CLASSES) for lo, hi in BOUNDS]


def combine_ref(*stats):
    """The whole logits' loss, from the blocks' statistics."""
    m = np.stack([s[:, 0] for s in stats], axis=1)
    big = m.max(axis=1)
    total = sum(s[:, 1] * np.exp(s[:, 0] - big) for s in stats)
    return np.mean(big + np.log(total) - sum(s[:, 2] for s in stats))


def combine_grad_ref(*ins, index):
    *stats, dy = ins
    big = np.stack([s[:, 0] for s in stats], axis=1).max(axis=1)
    total = sum(s[:, 1] * np.exp(s[:, 0] - big) for s in stats)
    share = np.exp(stats[index][:, 0] - big) / total * dy / N
    return np.stack([stats[index][:, 1] * share, share, np.full(N, -dy / N)], axis=1)


BLOCK = {"lo": 3, "classes": CLASSES}
CASES = [
    OpCase("xent_block", _block_inputs, block_ref, BLOCK),
    OpCase("xent_block_grad", _block_grad_inputs, block_grad_ref, BLOCK),
    OpCase("xent_combine", _stats, combine_ref),
    OpCase("xent_combine_grad", lambda rng: [*_stats(rng), np.array(0.7)], combine_grad_ref,
           {"index": 1}),
]
