"""NumPy's in-place semantics: element reads after writes, augmented assignment in place, views of
pending values alias them, writes wait for pending readers, ft.jit(graph=True) keeps the caller's
in-place updates. Each test failed before the fix it names."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import fusetree as ft

# -- stale element reads (an all-integer index was a cached scalar *copy*) ----------------------


def test_element_reads_see_later_writes():
    a = ft.zeros((2, 3))
    assert float(a[0, 0]) == 0.0
    a[...] = a + 1
    assert float(a[0, 0]) == 1.0
    assert a[0, 0].item() == 1.0
    assert float((a + 0)[0, 0]) == 1.0
    x = ft.asarray(np.arange(5.0))
    assert float(x[2]) == 2.0
    x[...] = x * 10
    assert float(x[2]) == 20.0 and x[2].item() == 20.0 and float(x[-1]) == 40.0


def test_element_write_and_integer_index_is_a_view():
    buf = np.zeros((2, 3))
    x = ft.asarray(buf)
    x[0, 0] = 5  # raised TypeError (copyto into a NumPy scalar)
    x[1, 2] = x[0, 0] * 2
    np.testing.assert_array_equal(buf, [[5, 0, 0], [0, 0, 10]])
    e = x[1, 2]
    assert e.shape == () and np.shares_memory(e.data, buf)


# -- augmented assignment writes in place, with NumPy's same-kind casting ------------------------

AUGMENTED = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "&=": operator.iand,
    "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift, ">>=": operator.irshift,
}  # fmt: skip


@pytest.mark.parametrize(
    "op,dtype,value",
    [
        ("+=", "float64", 1.5), ("-=", "float32", 2), ("*=", "int64", 3), ("/=", "float64", 4.0),
        ("//=", "int32", 2), ("%=", "int16", 3), ("**=", "float64", 2), ("&=", "int64", 6),
        ("|=", "uint8", 1), ("^=", "int8", 5), ("<<=", "int64", 2), (">>=", "int32", 1),
        ("+=", "float32", np.ones(4)), ("*=", "float64", np.arange(4.0)),
    ],
)  # fmt: skip
def test_augmented_assignment_in_place(op, dtype, value):
    fn = AUGMENTED[op]
    base = (np.arange(4) + 3).astype(dtype)
    want = fn(base.copy(), value)
    x = ft.asarray(base)
    alias = x
    data = x.data
    x = fn(x, ft.asarray(value) if isinstance(value, np.ndarray) else value)
    assert x is alias and x.data is data
    np.testing.assert_array_equal(base, want)  # the wrapped NumPy buffer holds the result
    np.testing.assert_array_equal(alias.numpy(), want)


def test_augmented_assignment_through_a_view_and_on_pending_values():
    buf = np.arange(6.0)
    x = ft.asarray(buf)
    v = x[::2]
    v += 100
    np.testing.assert_array_equal(buf, [100, 1, 102, 3, 104, 5])
    y = x * 2  # pending
    z = y
    y += 1
    assert z is y and y.is_realized
    np.testing.assert_array_equal(z.numpy(), buf * 2 + 1)
    x[1:] += x[:-1]  # reads what it writes: staged, as NumPy
    ref = np.array([100, 1, 102, 3, 104, 5.0])
    ref[1:] += ref[:-1].copy()
    np.testing.assert_array_equal(buf, ref)


@pytest.mark.parametrize(
    "dtype,value,op",
    [("int64", 1.5, "+="), ("int32", 2.0, "/="), ("bool", 1, "+="), ("float32", 1j, "*=")],
)
def test_augmented_assignment_refuses_what_numpy_refuses(dtype, value, op):
    base = np.ones(3, dtype)
    with pytest.raises((TypeError, ft.DTypeError)):
        AUGMENTED[op](base.copy(), value)  # NumPy refuses
    with pytest.raises((TypeError, ft.DTypeError)):
        AUGMENTED[op](ft.asarray(base), value)
    np.testing.assert_array_equal(base, np.ones(3, dtype))  # nothing written


def test_augmented_assignment_errors_name_the_problem():
    x = ft.asarray(np.ones(3, np.int64))
    with pytest.raises(ft.DTypeError, match=r"float64.*int64.*same_kind"):
        x += 1.5
    with pytest.raises(OverflowError, match="int8"):
        y = ft.asarray(np.ones(3, np.int8))
        y += 1000
    with pytest.raises(ft.ShapeError, match="non-broadcastable"):
        z = ft.asarray(np.ones(3))
        z += ft.asarray(np.ones((2, 3)))


def test_shift_operators():
    a = np.array([1, -3, 100, 5, 7, 0], np.int64)
    b = np.array([1, 2, 70, -1, 0, 63], np.int64)
    fa, fb = ft.asarray(a), ft.asarray(b)
    np.testing.assert_array_equal((fa << fb).numpy(), a << b)
    np.testing.assert_array_equal((fa >> fb).numpy(), a >> b)
    np.testing.assert_array_equal((3 << fb[:3]).numpy(), 3 << b[:3])
    u = np.array([2**64 - 3, 8, 1], np.uint64)
    np.testing.assert_array_equal((ft.asarray(u) >> 1).numpy(), u >> 1)


# -- views of pending values alias them (NumPy's views) -----------------------------------------


def test_view_of_a_pending_value_sees_writes_to_it():
    a = ft.asarray(np.arange(5.0))
    y = ft.tanh(a)  # pending
    v = y[::-1]
    w = y.reshape(5, 1).T  # a view of a view
    y[1:] = 0.5
    want = np.tanh(np.arange(5.0))
    want[1:] = 0.5
    np.testing.assert_array_equal(v.numpy(), want[::-1])
    np.testing.assert_array_equal(w.numpy(), want.reshape(5, 1).T)
    v[0] = -1.0  # and writes through the view are seen by the viewed value
    assert float(y[-1]) == -1.0


def test_realizing_a_view_first_realizes_what_it_views():
    a = ft.asarray(np.arange(4.0))
    y = a * 3
    v = y[1:]
    assert float(v[0]) == 3.0  # realizes y (as NumPy computed it), v is a view of it
    y[1] = 7.0
    assert float(v[0]) == 7.0


def test_a_dropped_base_leaves_the_view_lazy():
    a = ft.asarray(np.arange(4.0))
    v = (a * 3)[1:]  # the viewed value is gone: nothing else can change v
    ft.reset_stats()
    np.testing.assert_array_equal(v.numpy(), [3, 6, 9])
    assert ft.stats()["kernels"] == 1


# -- a write waits for the pending values that read the memory it overwrites --------------------


@pytest.mark.parametrize("fuse", [True, False])
def test_pending_gemm_reading_the_target_is_computed_before_the_write(fuse):
    buf = np.arange(12.0).reshape(6, 2)
    ref = buf.copy()
    with ft.options(fuse=fuse):
        a0, a1 = ft.asarray(buf[1:]), ft.asarray(buf[:-1])
        g = a0[:2] @ a0.T  # pending GEMM reading buf
        t = a1[-1]
        t += 100.0  # writes buf[4], which g reads
        want = ref[1:][:2] @ ref[1:].T
        np.testing.assert_array_equal(g.numpy(), want)


def test_scalar_tree_stored_into_targets_of_different_rank():
    a = ft.asarray(np.zeros((4, 4)))
    a[::2, ::2] = ft.tanh(ft.asarray(np.float64(-1.25)))
    b = ft.asarray(np.zeros(4))
    b[1::2] = ft.tanh(ft.asarray(np.float64(-1.25)))  # the same tree key, rank 1: another kernel
    np.testing.assert_allclose(b.numpy(), [0, np.tanh(-1.25), 0, np.tanh(-1.25)])


def test_values_realized_together_with_and_without_reductions():
    x = ft.asarray(np.random.default_rng(0).standard_normal((3, 5)))
    v1 = ft.maximum(x, x[0])
    v2 = ft.softmax(v1, axis=-1)
    ft.evaluate(v1, v2)
    e = np.exp(np.maximum(x.numpy(), x.numpy()[0]))
    np.testing.assert_allclose(v2.numpy(), e / e.sum(-1, keepdims=True))


# -- ft.jit(graph=True) keeps in-place updates of arguments (CPU: the same semantics, emulated) ---


def test_graph_mode_keeps_in_place_updates_of_arguments():
    @ft.jit(graph=True)
    def step(p, m, g):
        m[...] = 0.9 * m + g
        p -= 0.1 * m
        return p, m * 2

    P, M, G = np.ones(4), np.zeros(4), np.arange(4.0)
    pp, mm = P.copy(), M.copy()
    ft.reset_stats()
    for _ in range(5):
        rp, r2 = step(ft.asarray(P), ft.asarray(M), ft.asarray(G))
        mm[...] = 0.9 * mm + G
        pp -= 0.1 * mm
        np.testing.assert_allclose(P, pp)
        np.testing.assert_allclose(M, mm)
        assert np.shares_memory(rp.data, P)  # a returned argument is the caller's array
        np.testing.assert_allclose(r2.numpy(), mm * 2)
    assert ft.stats()["graph_launches"] == 4


@pytest.mark.parametrize("graph", [False, True])
def test_jit_overlapping_arguments(graph):
    @ft.jit(graph=graph)
    def f(a0, a1):
        a1[-1] += 100.0
        a0[:, 1:] -= 1.0
        return a0 * 1

    for _ in range(3):
        buf = np.arange(12.0).reshape(6, 2)
        ref = buf.copy()
        r = f(ft.asarray(buf[1:]), ft.asarray(buf[:-1]))
        ref[:-1][-1] += 100
        ref[1:][:, 1:] -= 1
        np.testing.assert_array_equal(buf, ref)
        np.testing.assert_array_equal(r.numpy(), ref[1:])
    # the same arrays without overlap are another signature
    a, b = np.ones((5, 2)), np.ones((5, 2))
    f(ft.asarray(a), ft.asarray(b))
    assert b[-1].tolist() == [101.0, 101.0] and a[0].tolist() == [1.0, 0.0]


def test_float_to_small_unsigned_cast_wraps_like_numpy():
    x = np.array([-1.5, -2.7, 200.5, 3.2, -0.5, 70000.0], np.float32)
    for dt in ("uint8", "uint16", "int8", "int16", "uint32"):
        np.testing.assert_array_equal(ft.asarray(x).astype(dt).numpy(), x.astype(dt))


def test_reduction_over_one_element_is_a_new_value():
    buf = np.array([3.0])
    x = ft.asarray(buf)
    m = ft.max(x)
    m[...] = 7.0  # NumPy's reductions return new values, never views of their input
    assert buf[0] == 3.0 and float(m) == 7.0


def test_values_made_of_scalars_go_with_any_device():
    s = ft.tanh(0.5)  # no array operand: no device until combined
    assert s.device == "cpu" and abs(float(s) - np.tanh(0.5)) < 1e-15
    x = ft.asarray(np.ones(3), device="cuda-sim")
    assert (x + ft.negative(2.0)).device == "cuda-sim"
    t = ft.asarray(np.zeros(2))
    t[...] = ft.exp(ft.negative(1.0))
    np.testing.assert_allclose(t.numpy(), np.exp(-1.0))
