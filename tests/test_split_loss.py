"""ops/split_loss.py in the spatial strategy: a loss on logits split by classes is made from
each block's statistics, and no block of logits crosses."""

import numpy as np
import pytest

import graphflow as gf
from tests.cases.loss import softmax_ref, xent_ref
from tests.cases.split_loss import (
    BOUNDS,
    CLASSES,
    N,
    block_grad_ref,
    block_ref,
    combine_grad_ref,
    combine_ref,
)


def test_the_blocks_combine_to_the_whole_loss_and_gradient():
    rng = np.random.default_rng(3)
    x, labels = rng.standard_normal((N, CLASSES)), rng.integers(0, CLASSES, N)
    stats = [block_ref(x[:, lo:hi], labels, lo, CLASSES) for lo, hi in BOUNDS]
    assert np.isclose(combine_ref(*stats), xent_ref(x, labels))
    onehot = np.eye(CLASSES)[labels]
    want = (softmax_ref(x) - onehot) * 0.7 / N
    got = [block_grad_ref(x[:, lo:hi], labels, stats[j], combine_grad_ref(*stats, 0.7, index=j),
                          lo, CLASSES) for j, (lo, hi) in enumerate(BOUNDS)]
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=1e-12)



@pytest.mark.parametrize("parts", [2, 3, 8])
def test_only_each_blocks_statistics_cross(parts):
    m = gf.models.speech_mlp(batch=None)
    plan = gf.partition(m.graph, parts, "spatial", loss=m.loss)
    crossing = [t for t in plan.transfers if t.tensor.split("/")[0] in ("loss", "grad")
                and "loss" in t.tensor]
    # each other worker's (N, 3) statistics to worker 0, and their gradient back
    assert sorted((t.src, t.dst, t.nbytes(64)) for t in crossing) == sorted(
        [(w, 0, 64 * 3 * 4) for w in range(1, parts)] + [(0, w, 64 * 3 * 4)
                                                          for w in range(1, parts)])
    assert not [t for t in plan.transfers if t.tensor.startswith(("out/", "grad/out/"))]
    assert [n.op for n in plan.graph if n.name == "loss"] == ["xent_combine"]
