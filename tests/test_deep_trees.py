"""Long chains and shared subexpressions: a loop that updates a value without reading it builds a
deep pending tree, and a value used twice per step makes a DAG whose tree unfolds exponentially.
Both must evaluate (NumPy's result, bounded kernels), in every mode."""

import numpy as np
import pytest

import fusetree as ft
from fusetree import config
from fusetree.ir.node import depth


def _chain(xp, y, n, a, b):
    for _ in range(n):
        y = y * a + b
    return y


@pytest.mark.parametrize("n", [config.MAX_TREE_DEPTH // 2 - 1, 300, 2000])
def test_a_long_chain_of_pending_ops_evaluates(n, rng):
    x = rng.uniform(-1, 1, 37).astype(np.float32)
    a, b = np.float32(0.999), np.float32(0.01)
    y = _chain(ft, ft.asarray(x), n, 0.999, 0.01)
    assert depth(y._node) <= config.MAX_TREE_DEPTH  # computed in pieces as it grew
    want = _chain(np, x, n, a, b)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)


def test_a_value_used_twice_per_step_stays_one_small_kernel(rng):
    """y = y * a - y * b: the tree unfolds to 2**40 leaves, the DAG has 40 levels and 81 leaves."""
    x = rng.uniform(0.5, 1.5, 23).astype(np.float32)
    y, r = ft.asarray(x), x.copy()
    for _ in range(40):
        y = y * 1.75 - y * 0.75
        r = r * np.float32(1.75) - r * np.float32(0.75)
    assert len(y._node.leaves) == 1 + 2 * 40  # each scalar once, the array once
    (kernel,) = ft.explain(y).kernels
    assert len(kernel.key) < 20_000  # the kernel's key text grows with the DAG, not the tree
    ft.reset_stats()
    got = y.numpy()
    assert ft.stats()["launches"] == 1
    np.testing.assert_allclose(got, r, rtol=1e-5)


def test_long_chains_under_jit_and_deferred_stores(rng):
    x = rng.uniform(-1, 1, 19).astype(np.float32)
    want = _chain(np, x, 700, np.float32(0.999), np.float32(0.01))
    f = ft.jit(lambda a: _chain(ft, a, 700, 0.999, 0.01))
    for _ in range(2):  # the trace, then a replay
        np.testing.assert_allclose(f(ft.asarray(x)).numpy(), want, rtol=1e-5, atol=1e-6)
    m, g = ft.asarray(x.copy()), ft.asarray(2 * x)
    mr = x.copy()
    with ft.options(defer_stores=True):
        for _ in range(1000):
            m[...] = 0.9 * m + 0.1 * g
    for _ in range(1000):
        mr[...] = np.float32(0.9) * mr + np.float32(0.1) * (2 * x)
    np.testing.assert_allclose(m.numpy(), mr, rtol=1e-5, atol=1e-6)
