"""Trainer misuse named where it happens: counts, batches that are not (x, y) pairs of as many
rows, labels that do not match the inputs (graphflow/train.py, Model.classes / accuracy)."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.train import Trainer


@pytest.fixture(scope="module")
def digits():
    return gf.datasets.digits()


@pytest.fixture(scope="module")
def trainer():
    return Trainer(gf.models.digits_lc(batch=None), gf.optim.SGD(0.05))


@pytest.mark.parametrize(("kw", "message"), [
    ({"steps": 0}, "steps must be an int >= 1, got 0"),
    ({"steps": None}, "steps must be an int >= 1, got None"),  # (it trained for ever)
    ({"steps": 2.5}, "steps must be an int >= 1, got 2.5"),
    ({"steps": 2, "log_every": 0}, "log_every must be an int >= 1, got 0"),  # (ZeroDivision)
])
def test_counts_are_checked_before_a_step(trainer, digits, kw, message):
    with pytest.raises(ValueError, match=message):
        trainer.fit(gf.datasets.batches(digits.x_train, digits.y_train, 8), progress=False,
                    **kw)
    assert trainer.step_count == 0


def test_batches_must_be_pairs_of_as_many_rows(trainer, digits):
    with pytest.raises(TypeError, match="batch 0 is a dict; expected an \\(x, y\\) pair"):
        trainer.fit([{"x": digits.x_train[:8], "y": digits.y_train[:8]}], 1, progress=False)
    with pytest.raises(ValueError, match="batch 1: 8 inputs but 3 labels"):
        trainer.fit([(digits.x_train[:8], digits.y_train[:8]),
                     (digits.x_train[:8], digits.y_train[:3])], 2, progress=False)
    with pytest.raises(ValueError, match="20 inputs but 5 labels"):
        next(gf.datasets.batches(digits.x_train[:20], digits.y_train[:5], 4))


def test_accuracy_checks_its_labels_and_pads_a_fixed_batch(trainer, digits):
    with pytest.raises(ValueError, match="10 inputs but 3 labels"):
        trainer.accuracy(digits.x_test[:10], digits.y_test[:3])
    with pytest.raises(ValueError, match="no rows to predict"):
        trainer.accuracy(digits.x_test[:0], digits.y_test[:0])
    fixed = Trainer(gf.models.digits_lc(batch=16), gf.optim.SGD(0.05))
    fixed.session.params.update(trainer.session.params)
    # 21 rows: 16, then 5 padded to 16; the same classes as the open-batch graph's
    np.testing.assert_array_equal(fixed.predict(digits.x_test[:21]),
                                  trainer.predict(digits.x_test[:21]))
