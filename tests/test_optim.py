"""Update rules against their formulas, state kept per name, and bad input."""

import numpy as np
import pytest

from graphflow.optim import SGD, Adagrad, Momentum


def _grads(n=3, shape=(4, 5), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


def test_sgd():
    p = np.ones((4, 5))
    want = p.copy()
    opt = SGD(0.1)
    for g in _grads():
        opt.update("w", p, g)
        want -= 0.1 * g
    np.testing.assert_allclose(p, want)


def test_momentum():
    p, want, v = np.ones((4, 5)), np.ones((4, 5)), np.zeros((4, 5))
    opt = Momentum(0.1, momentum=0.9)
    for g in _grads():
        opt.update("w", p, g)
        v = 0.9 * v + g
        want -= 0.1 * v
    np.testing.assert_allclose(p, want)


def test_adagrad_is_distbelief_form():
    p, want, acc = np.ones((4, 5)), np.ones((4, 5)), np.zeros((4, 5))
    opt = Adagrad(0.5, eps=0.0)
    for g in _grads():
        opt.update("w", p, g)
        acc += g * g
        want -= 0.5 * g / np.sqrt(acc)
    np.testing.assert_allclose(p, want)
    np.testing.assert_allclose(opt.state["w"]["sum_sq"], acc)


def test_state_is_per_name_and_float32_works():
    opt = Adagrad(0.1)
    a, b = np.ones(3, np.float32), np.ones(3, np.float32)
    opt.update("a", a, np.full(3, 1.0, np.float32))
    opt.update("b", b, np.full(3, 3.0, np.float32))
    opt.update("a", a, np.full(3, 1.0, np.float32))
    assert set(opt.state) == {"a", "b"}
    np.testing.assert_allclose(a, 1 - 0.1 - 0.1 / np.sqrt(2), rtol=1e-6)
    np.testing.assert_allclose(b, 0.9, rtol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="learning rate"):
        SGD(0.0)
    with pytest.raises(ValueError, match="'w': gradient shape"):
        SGD(0.1).update("w", np.ones(3), np.ones(4))


def test_adagrad_without_eps_leaves_never_updated_elements_alone():
    p = np.ones(3, np.float32)
    opt = Adagrad(0.5, eps=0.0)
    opt.update("w", p, np.array([0.0, 2.0, 0.0], np.float32))
    np.testing.assert_allclose(p, [1.0, 0.5, 1.0])


@pytest.mark.parametrize("make", [lambda: SGD(0.1), lambda: Momentum(0.1, momentum=0.9),
                                  lambda: Adagrad(0.5)], ids=["sgd", "momentum", "adagrad"])
def test_a_scaled_update_is_the_update_of_the_scaled_gradient(make):
    # a worker hands over a gradient summed over 4 micro-batches with scale 1/4
    scaled, plain = make(), make()
    p, q = np.ones((4, 5)), np.ones((4, 5))
    for g in _grads():
        scaled.update("w", p, 4 * g, scale=0.25)
        plain.update("w", q, g)
    np.testing.assert_allclose(p, q, rtol=1e-12)


@pytest.mark.parametrize("make", [lambda: SGD(0.1), lambda: Momentum(0.1, momentum=0.9),
                                  lambda: Adagrad(0.5)], ids=["sgd", "momentum", "adagrad"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_gradient_in_two_parts_updates_as_their_sum(make, dtype):
    # a first pipeline stage hands over its last micro-batch's weight gradient on its own
    parts, whole = make(), make()
    p, q = np.ones((4, 5), dtype), np.ones((4, 5), dtype)
    for g in _grads():
        g = g.astype(dtype)
        parts.update("w", p, 0.75 * g, scale=0.5, also=0.25 * g)
        whole.update("w", q, g, scale=0.5)
    np.testing.assert_allclose(p, q, rtol=1e-6 if dtype == np.float32 else 1e-12)
    with pytest.raises(ValueError, match="'w': gradient shape"):
        SGD(0.1).update("w", p, np.ones((4, 5), dtype), also=np.ones(3, dtype))
