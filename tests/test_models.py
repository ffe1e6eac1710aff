"""The reference workloads: sizes from design.md, symbolic batch, and real learning."""

from math import prod

import numpy as np
import pytest

import graphflow as gf


def _n_params(model):
    return sum(prod(p.shape) for p in model.graph.parameters())


def test_lc_large_and_speech_mlp_sizes():
    lc = gf.models.lc_large(batch=64)
    assert lc.graph["lc1/W"].shape == (29, 29, 32, 147)
    assert lc.graph["lc2/W"].shape == (13, 13, 64, 800)
    assert abs(_n_params(lc) - 12.75e6) / 12.75e6 < 0.01
    mlp = gf.models.speech_mlp(batch=64)
    assert abs(_n_params(mlp) - 42e6) / 42e6 < 0.02
    assert mlp.logits.shape == (64, 8192)


@pytest.mark.parametrize("build", [gf.models.lc_large, gf.models.digits_lc])
def test_symbolic_batch_runs_at_two_batch_sizes(build):
    model = build(batch=None)
    assert model.loss.shape == () and model.logits.shape[0] is None
    grads = gf.gradients(model.loss, model.graph.parameters())
    sess = gf.Session(model.graph)
    shape = tuple(int(d) for d in model.x.shape[1:])
    rng = np.random.default_rng(0)
    for n in (1, 3):
        x = rng.standard_normal((n, *shape)).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
        loss, g_fc = sess.run([model.loss, grads["fc/W"]], {model.x: x, model.y: y})
        assert np.isfinite(loss) and g_fc.shape == model.graph["fc/W"].shape


def test_digits_lc_learns():
    pytest.importorskip("sklearn", reason="digits needs scikit-learn (the [data] extra)")
    data = gf.datasets.digits()
    trainer = gf.Trainer(gf.models.digits_lc(), gf.optim.Adagrad(0.03))
    before = trainer.accuracy(data.x_test, data.y_test)
    history = trainer.fit(gf.datasets.batches(data.x_train, data.y_train, 32, shift=2),
                          steps=300, progress=False)
    after = trainer.accuracy(data.x_test, data.y_test)
    assert before < 0.3 and after > 0.9
    assert np.mean(history.losses[-5:]) < 0.5 * history.losses[0]


def test_trainer_step_matches_manual_sgd():
    model = gf.models.digits_lc()
    trainer = gf.Trainer(model, gf.optim.SGD(0.1))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1, 32, 32)).astype(np.float32)
    y = np.array([1, 2, 3, 4], np.int32)
    before = {k: v.copy() for k, v in trainer.session.params.items()}
    grads = trainer.session.run([trainer.grads[p.name] for p in trainer.params],
                                {model.x: x, model.y: y})
    trainer.step(x, y)
    for p, g in zip(trainer.params, grads):
        np.testing.assert_allclose(trainer.session.params[p.name], before[p.name] - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)
