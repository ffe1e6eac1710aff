"""Every registered op: forward against NumPy, gradients against central finite differences."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.ops.registry import REGISTRY, apply
from tests.cases import OpCase, all_cases

CASES = all_cases()


def test_every_registered_op_has_a_case():
    # Ops without a kernel (placeholder, parameter, constant, send, recv) are the executor's.
    with_kernel = {name for name, op in REGISTRY.items() if op.forward is not None}
    missing = sorted(with_kernel - {c.op for c in CASES})
    assert not missing, f"ops without a test case in tests/cases/: {missing}"


def _build(case: OpCase, dtype: str, inputs: list[np.ndarray]):
    g = gf.Graph(dtype=dtype)
    with g:
        phs = [gf.placeholder(f"in{i}", x.shape, dtype if x.dtype.kind == "f" else x.dtype.name)
               for i, x in enumerate(inputs)]
        out = apply(case.op, *phs, **case.attrs)
    return g, phs, out


def _feeds(phs, inputs, dtype):
    return {p: (x.astype(dtype) if x.dtype.kind == "f" else x) for p, x in zip(phs, inputs)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_matches_numpy(case: OpCase, dtype: str):
    inputs = case.make_inputs(np.random.default_rng(0))
    g, phs, out = _build(case, dtype, inputs)
    got = gf.Session(g).run(out, _feeds(phs, inputs, dtype))
    want = case.reference(*inputs, **case.attrs)
    assert got.shape == tuple(want.shape)
    assert got.dtype == np.dtype(out.dtype)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    tol = 1e-10 if dtype == "float64" else case.rtol32
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


GRAD_CASES = [c for c in CASES if REGISTRY[c.op].grad is not None]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradient_matches_finite_differences(case: OpCase):
    rng = np.random.default_rng(1)
    inputs = case.make_inputs(rng)
    g, phs, out = _build(case, "float64", inputs)
    wrt = [p for i, (p, x) in enumerate(zip(phs, inputs))
           if x.dtype.kind == "f" and i not in case.no_grad]
    assert wrt, f"{case.id}: no float input to differentiate"
    with g:
        dy = gf.placeholder("dy", out.shape, "float64")
    grads = gf.gradients(out, wrt, dy=dy)
    sess = gf.Session(g)
    r = rng.standard_normal(out.shape)
    feeds = _feeds(phs, inputs, "float64")
    analytic = sess.run([grads[p.name] for p in wrt], {**feeds, dy: r})

    def f() -> float:
        return float(np.sum(sess.run(out, feeds) * r))

    eps = 1e-6
    for p, a in zip(wrt, analytic):
        x = feeds[p]
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            up = f()
            x[idx] = old - eps
            down = f()
            x[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(a, numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case.id}: gradient wrt {p.name}")


def test_slice_of_whole_rows_is_a_view_and_costs_nothing():
    """Rows along the first axis (an HWCN halo) are one run of memory: no copy, no traffic.
    Any other slice is copied (kernels want contiguous inputs) and costs its bytes."""
    from graphflow.ops.registry import node_cost

    x = np.arange(60, dtype=np.float32).reshape(5, 4, 3)
    with gf.Graph() as g:
        p = gf.placeholder("x", (5, 4, 3))
        rows = apply("slice", p, begin=(1, 0, 0), end=(4, None, None))
        cols = apply("slice", p, begin=(0, 1, 0), end=(None, 3, None))
    got_rows, got_cols = gf.Session(g).run([rows, cols], {p: x})
    assert np.shares_memory(got_rows, x) and np.array_equal(got_rows, x[1:4])
    assert not np.shares_memory(got_cols, x) and got_cols.flags.c_contiguous
    assert np.array_equal(got_cols, x[:, 1:3])
    assert node_cost(rows, 1).bytes_read == 0
    assert node_cost(cols, 1).bytes_read == got_cols.nbytes
