"""ops/aligned.py: large arrays start on a page, and still count as owning their data."""

import gc

import numpy as np
import pytest

from graphflow import models
from graphflow.init import initial_value
from graphflow.ops import aligned
from graphflow.optim import make_optimizer
from graphflow.partitioners import partition
from graphflow.runtime.backlog import Backlog


def _starts_on_a_page(a: np.ndarray) -> bool:
    return a.ctypes.data % aligned.PAGE == 0


@pytest.mark.parametrize("shape,dtype", [((256, 65), np.float32), ((3, 7, 1025), np.float64),
                                         (20000, np.int32), ((2560, 33), np.uint8)])
def test_large_arrays_start_on_a_page_and_own_their_data(shape, dtype):
    for _ in range(8):  # malloc's offsets vary with what came before: try several
        a = aligned.empty(shape, dtype)
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,))
        assert a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert _starts_on_a_page(a) and aligned.owns_data(a)
        assert not aligned.owns_data(a[1:]) and not aligned.owns_data(a.reshape(-1))
        np.empty(int(np.random.default_rng().integers(1, 4096)), np.uint8)  # shift the heap


def test_small_arrays_are_numpys_own():
    a = aligned.empty((4, 4), np.float32)
    assert a.flags.owndata and aligned.owns_data(a)


def test_a_dead_arrays_id_does_not_make_a_view_an_owner():
    a = aligned.empty((512, 64), np.float32)
    key = id(a)
    del a
    gc.collect()
    views = [np.ones((512, 64), np.float32)[::2] for _ in range(64)]  # ids are reused
    assert not any(aligned.owns_data(v) for v in views)
    assert key not in aligned._owners or aligned._owners[key]() is not None


def test_zeros_copy_and_concatenate_match_numpy():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 300), dtype=np.float32) for n in (32, 32, 17)]
    joined = aligned.concatenate(parts, 0)
    assert _starts_on_a_page(joined) and np.array_equal(joined, np.concatenate(parts))
    cols = aligned.concatenate([p[:17] for p in parts], 1)
    assert np.array_equal(cols, np.concatenate([p[:17] for p in parts], 1))
    z = aligned.full((100, 300), 0.5, np.float32)
    assert _starts_on_a_page(z) and (z == 0.5).all()
    big = rng.standard_normal((300, 64), dtype=np.float32)
    c = aligned.copy(big.T)  # a strided source: the copy is C-contiguous
    assert _starts_on_a_page(c) and c.flags.c_contiguous and np.array_equal(c, big.T)


def test_parameters_optimizer_state_and_joined_microbatches_are_aligned():
    model = models.speech_mlp(batch=None)
    big = [p for p in model.graph.parameters() if np.prod(p.attrs["shape"]) * 4 >= 65536]
    assert big
    for p in big:
        value = initial_value(p.name, p.attrs, model.graph.seed)
        assert _starts_on_a_page(value) and aligned.owns_data(value)
        opt = make_optimizer({"name": "adagrad", "lr": 0.1})
        opt.update(p.name, value, np.ones_like(value))
        assert all(_starts_on_a_page(s) for s in opt.state[p.name].values())
    # a partitioned block of a parameter too
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    blocks = [(p, w.graph.seed) for w in plan.workers for p in w.graph.parameters()
              if "block" in p.attrs and np.prod(p.attrs["shape"]) * 4 >= aligned.MIN_BYTES]
    assert blocks
    assert all(_starts_on_a_page(initial_value(p.name, p.attrs, seed)) for p, seed in blocks)


def test_backlog_joins_microbatches_into_aligned_arrays():
    import graphflow as gf

    with gf.Graph():
        x, dy = gf.placeholder("x", (None, 2560)), gf.placeholder("dy", (None, 64))
        w = gf.matmul(x, dy, transpose_a=True)
    backlog = Backlog([[w]], [x, dy])
    rng = np.random.default_rng(1)
    parts = [[rng.standard_normal((32, 2560), dtype=np.float32),
              rng.standard_normal((32, 64), dtype=np.float32)] for _ in range(2)]
    for values in parts:
        backlog.add(values)
    joined = backlog.take(0)
    assert joined[x].shape == (64, 2560) and _starts_on_a_page(joined[x])
    assert np.array_equal(joined[x], np.concatenate([p[0] for p in parts]))
    assert np.array_equal(joined[dy], np.concatenate([p[1] for p in parts]))
