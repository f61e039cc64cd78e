"""Lazy views read through strides, and out[...] = expr with NumPy's semantics (aliasing included)."""

import numpy as np
import pytest

import fusetree as ft


@pytest.mark.parametrize(
    "index",
    [
        np.s_[1:, ::2],
        np.s_[::-1],
        np.s_[..., 1],
        np.s_[None, 2],
        np.s_[:, None, ::-2],
        np.s_[-1],
        np.s_[1, 2],
    ],
)
def test_views_of_expressions(index, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    e = ft.exp(ft.asarray(a)) + ft.asarray(b)
    want = (np.exp(a) + b)[index]
    np.testing.assert_allclose(np.asarray(e[index]), want, rtol=2e-6, atol=1e-6)


def test_views_are_not_copies():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    v = ft.asarray(a)[::2, ::-1]
    assert v.is_realized and np.shares_memory(v.data, a)
    assert np.shares_memory(ft.asarray(a).T.data, a)
    assert np.shares_memory(ft.asarray(a).reshape(4, 3).data, a)


def test_transpose_reshape_expression(rng):
    a = rng.standard_normal((2, 3, 4))
    e = ft.asarray(a) * 2
    np.testing.assert_allclose(np.asarray(e.transpose(2, 0, 1)), (a * 2).transpose(2, 0, 1))
    np.testing.assert_allclose(np.asarray(e.T), (a * 2).T)
    np.testing.assert_allclose(np.asarray(e.reshape(6, -1)), (a * 2).reshape(6, -1))
    np.testing.assert_allclose(np.asarray(ft.asarray(a).T.reshape(-1) + 1), a.T.reshape(-1) + 1)


def test_setitem_writes_in_place(rng):
    out = ft.asarray(np.full((3, 4), np.nan, np.float32))
    a = rng.standard_normal((3, 4)).astype(np.float32)
    buf = out.data
    out[...] = ft.sigmoid(ft.asarray(a)) * 2
    assert out.data is buf
    np.testing.assert_allclose(buf, 2 / (1 + np.exp(-a)), rtol=2e-6)
    out[1:, ::2] = 5
    assert (buf[1:, ::2] == 5).all()
    out[0] = ft.asarray(np.arange(4, dtype=np.int64))  # cast on store, broadcast
    np.testing.assert_array_equal(buf[0], np.arange(4))


def test_aliasing_shifted_view_is_staged():
    x = np.arange(8, dtype=np.float64)
    fx = ft.asarray(x.copy())
    fx[1:] = fx[:-1] + 1
    y = x.copy()
    y[1:] = y[:-1] + 1
    np.testing.assert_array_equal(fx.numpy(), y)
    m = np.arange(9.0).reshape(3, 3)
    fm = ft.asarray(m.copy())
    fm[:] = fm.T * 1
    np.testing.assert_array_equal(fm.numpy(), m.T)


def test_pending_reader_sees_old_value():
    x = ft.asarray(np.ones(4))
    y = x * 3  # pending, reads x
    x[...] = 10.0
    np.testing.assert_array_equal(y.numpy(), [3, 3, 3, 3])
    np.testing.assert_array_equal(x.numpy(), [10] * 4)


def test_assigned_live_value_survives():
    x = ft.asarray(np.ones(4))
    y = x * 2 + 1  # reads x; after x[...] = y, y must still be 3
    x[...] = y
    x[...] = 0.0
    np.testing.assert_array_equal(y.numpy(), [3] * 4)


def test_temporary_value_is_not_kept():
    """``x[...] = x * a + b`` writes x only: the temporary is not stored as a second output (a
    local in ``__setitem__`` once made every temporary look held: 2 outputs, an allocation per
    store). A held value still gets its own memory."""
    x = ft.asarray(np.ones(4, np.float32))
    a = ft.asarray(np.full(4, 2, np.float32))

    def step(x, a):
        x[...] = x * a + 1
        return ()

    j = ft.jit(step)
    j(x, a)
    (trace,) = j.plans.values()
    assert [len(op.outputs) for op in trace.ops] == [1]
    np.testing.assert_array_equal(x.numpy(), [3] * 4)

    def held(x, a):
        y = x * a + 1
        x[...] = y
        return y

    y = ft.jit(held)(x, a)
    np.testing.assert_array_equal(y.numpy(), [7] * 4)
    x[...] = 0.0
    np.testing.assert_array_equal(y.numpy(), [7] * 4)


def test_fancy_indexing_is_a_copy_and_bad_indices_raise():
    x = ft.asarray(np.arange(4.0))
    y = x[[0, 1]]  # advanced indexing (a fusion boundary): a copy, as in NumPy
    y[...] = -1
    assert x.numpy().tolist() == [0.0, 1.0, 2.0, 3.0] and y.numpy().tolist() == [-1.0, -1.0]
    with pytest.raises(IndexError, match="out of bounds"):
        x[7]
    with pytest.raises(IndexError):
        x[[9]]


def test_repeated_broadcasts_of_a_buffer_reuse_its_view_and_see_writes(rng):
    """``c[0] * x`` and ``x + bias`` every step: the operator reuses the broadcast view made the
    first time (either operand order), and the view still reads the buffer's current values."""
    coef = ft.asarray(np.array([0.5, 2.0], np.float32))
    c0 = coef[0]
    bias = ft.asarray(rng.standard_normal(4).astype(np.float32))
    for step in range(4):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        y = rng.standard_normal((2, 4)).astype(np.float32)
        fx, fy = ft.asarray(x), ft.asarray(y)
        c = coef.numpy()[0]
        np.testing.assert_allclose((c0 * fx).numpy(), c * x, rtol=1e-6)
        np.testing.assert_allclose((fx * c0).numpy(), x * c, rtol=1e-6)
        np.testing.assert_allclose((fx + bias).numpy(), x + bias.numpy(), rtol=1e-6)
        np.testing.assert_allclose((bias - fy).numpy(), bias.numpy() - y, rtol=1e-6)  # another shape
        np.testing.assert_allclose(((fx * fy[:1]) + fx).numpy(), x * y[:1] + x, rtol=1e-6)
        coef[0] = float(step + 3)  # a write through the buffer: the cached views read it


def test_arithmetic_views_of_gemm_outputs_and_memory(rng):
    """Slices and transposes of pending GEMM outputs and of memory are leaves described by an
    offset and strides (bound without NumPy view objects): every result against NumPy, writes to
    the memory seen through them, and through them into the memory."""
    import view_cases

    assert view_cases.check_arithmetic_views("cpu", rng) > 0
