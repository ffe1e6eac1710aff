"""A user review of runs: a lockstep data-parallel run's final loss is the same every run,
`train --timeout` reaches the replicas, and float32 sums of millions of elements keep their
low bits."""

import argparse
import math

import numpy as np
import pytest

import graphflow as gf
from graphflow import train_command
from graphflow.optim import SGD
from graphflow.replicas.options import ReplicaOptions
from graphflow.train import DataParallelTrainer


def _bsp_fit():
    """A tiny bsp run: (its history, the losses of its last round's replicas)."""
    data = gf.datasets.digits()
    it = gf.datasets.batches(data.x_train, data.y_train, 16, seed=0)
    batches = [next(it) for _ in range(6)]
    trainer = DataParallelTrainer(gf.models.digits_lc(batch=None), SGD(0.05), replicas=2,
                                  options=ReplicaOptions(mode="bsp", timeout=8.0))
    try:
        history = trainer.fit(batches, 6, progress=False, log_every=2)
        record = trainer.manager.record
    finally:
        trainer.close()
    last = [loss for losses in record.losses.values() for _, step, loss in losses if step == 2]
    return history, last


def test_a_bsp_runs_final_loss_is_its_last_rounds_mean_every_run():
    first, last = _bsp_fit()
    again, _ = _bsp_fit()
    assert len(last) == 2 and first.steps == [2, 4, 6]
    # (not whichever replica reported last: that one changed from run to run)
    assert first.losses[-1] == math.fsum(last) / 2
    assert again.losses == first.losses


def _train_args(*argv):
    parser = argparse.ArgumentParser()
    train_command.configure(parser.add_subparsers())
    return parser.parse_args(["train", *argv])


def test_timeout_reaches_the_replicas_and_scales_the_bsp_deadline():
    args = _train_args("--replicas", "2", "--sync", "bsp", "--timeout", "6")
    assert train_command.conflict(args) is None
    options = train_command._replica_options(args)
    assert options.timeout == 6.0
    assert options.bsp_deadline == 2.0 < options.timeout / 2  # (dropped before they give up)
    default = train_command._replica_options(_train_args("--replicas", "2"))
    assert (default.timeout, default.bsp_deadline) == (30.0, 10.0)


def test_timeout_without_workers_is_still_refused():
    assert "--timeout" in train_command.conflict(_train_args("--timeout", "6"))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
@pytest.mark.parametrize("shape, axes", [((3_000_000,), None), ((1_500_000, 2), 0),
                                         ((2, 3, 500_000), (0, 2))])
def test_a_float32_sum_of_millions_matches_float64(op, shape, axes):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    with gf.Graph(dtype="float32") as g:
        ph = gf.placeholder("x", shape, "float32")
        y = getattr(gf, op)(ph, axes)
    got = gf.Session(g).run([y], {ph: x})[0]
    want = getattr(np, "sum" if op == "reduce_sum" else "mean")(x.astype(np.float64), axis=axes)
    # (element after element in float32: ~1e-6 off; numpy's pairwise sum: ~5e-8)
    np.testing.assert_allclose(got, want, rtol=2e-7)
