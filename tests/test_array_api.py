"""The Array API namespace (fusetree.frontend.namespace) and NumPy's function protocol, against
NumPy on the CPU."""

import numpy as np
import pytest

import fusetree as xp


def test_dtypes_constants_and_inspection():
    assert xp.float32 == np.float32 and xp.bool == np.bool_ and xp.uint64 == np.uint64
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps and xp.iinfo(xp.int8).min == -128
    assert xp.isdtype(xp.int16, "signed integer") and not xp.isdtype(xp.float32, "integral")
    a = xp.asarray(np.ones(2, np.int8))
    assert xp.result_type(a, xp.float32) == np.float32 and xp.can_cast(xp.int8, xp.int64)
    assert xp.__array_api_version__ == "2023.12" and a.__array_namespace__() is xp
    assert xp.pi == np.pi and xp.newaxis is None


def test_asarray_dtypes_and_copies():
    assert xp.asarray([1, 2]).dtype == np.int64 and xp.asarray([True]).dtype == np.bool_
    assert xp.asarray([1.5, 2]).dtype == np.float64 and xp.asarray(3.0, dtype=xp.float32).dtype == np.float32
    buf = np.zeros(3)
    same, copied = xp.asarray(buf), xp.asarray(buf, copy=True)
    buf[0] = 7
    assert float(same[0]) == 7 and float(copied[0]) == 0
    with pytest.raises(ValueError, match="copy=False"):
        xp.asarray([1, 2], copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        xp.asarray(buf, dtype=xp.float32, copy=False)
    with pytest.raises(xp.UnsupportedError, match="str"):
        xp.asarray("text")


@pytest.mark.parametrize(
    "name, args, kwargs",
    [
        ("concat", ([np.arange(3.0), np.arange(2.0)],), {}),
        ("stack", ([np.arange(3.0), np.ones(3)],), {"axis": 1}),
        ("expand_dims", (np.arange(3.0),), {"axis": 0}),
        ("squeeze", (np.ones((1, 3)),), {"axis": 0}),
        ("flip", (np.arange(6.0).reshape(2, 3),), {"axis": 1}),
        ("roll", (np.arange(5),), {"shift": 2}),
        ("permute_dims", (np.arange(6.0).reshape(1, 2, 3),), {"axes": (2, 0, 1)}),
        ("broadcast_to", (np.arange(3.0),), {"shape": (2, 3)}),
        ("take", (np.arange(5.0) * 2, np.array([4, 0])), {}),
        ("cumulative_sum", (np.arange(5),), {}),
        ("nonzero", (np.array([0, 3, 0, 4]),), {}),
        ("tril", (np.ones((3, 3)),), {}),
        ("tensordot", (np.ones((2, 3)), np.ones((3, 4))), {"axes": 1}),
        ("vecdot", (np.arange(3.0), np.arange(3.0)), {}),
        ("matrix_transpose", (np.arange(6.0).reshape(2, 3),), {}),
        ("searchsorted", (np.array([1.0, 3.0, 5.0]), np.array([2.0, 6.0])), {}),
    ],
)
def test_boundary_functions_match_numpy(name, args, kwargs):
    want = getattr(np, name)(*args, **kwargs)
    fargs = [[xp.asarray(a) for a in x] if isinstance(x, list) else xp.asarray(x) for x in args]
    got = getattr(xp, name)(*fargs, **kwargs)
    if isinstance(want, tuple):
        assert all(isinstance(g, xp.Array) for g in got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)
    else:
        assert isinstance(got, xp.Array)
        np.testing.assert_array_equal(got.numpy(), want)


def test_boundaries_take_pending_values_and_sort_is_stable():
    x = xp.asarray(np.array([3.0, 1.0, 2.0, 1.0]))
    np.testing.assert_array_equal(xp.sort(x * 2).numpy(), [2, 2, 4, 6])
    np.testing.assert_array_equal(xp.sort(x, descending=True).numpy(), [3, 2, 1, 1])
    np.testing.assert_array_equal(xp.argsort(x).numpy(), [1, 3, 2, 0])
    np.testing.assert_array_equal(xp.argsort(x, descending=True).numpy(), [0, 2, 1, 3])
    u = xp.unique_counts(xp.asarray(np.array([2, 1, 2])))
    assert sorted(zip(u.values.numpy().tolist(), u.counts.numpy().tolist())) == [(1, 1), (2, 2)]
    np.testing.assert_array_equal(xp.arange(1, 7, 2).numpy(), np.arange(1, 7, 2))
    np.testing.assert_allclose(xp.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(xp.eye(3, k=1).numpy(), np.eye(3, k=1))


def test_elementwise_names_of_the_standard_stay_lazy(rng):
    a = rng.uniform(-0.9, 0.9, 6)
    x = xp.asarray(a)
    for name, ref in [("acos", np.arccos), ("asin", np.arcsin), ("atan", np.arctan)]:
        y = getattr(xp, name)(x)
        assert not y.is_realized
        np.testing.assert_allclose(y.numpy(), ref(a), rtol=1e-12)
    np.testing.assert_allclose(xp.atan2(x, x + 2).numpy(), np.arctan2(a, a + 2), rtol=1e-12)
    np.testing.assert_allclose(xp.pow(xp.abs(x), 2.5).numpy(), np.abs(a) ** 2.5, rtol=1e-12)
    i = xp.asarray(np.array([1, 2, 3]))
    np.testing.assert_array_equal(xp.bitwise_left_shift(i, 2).numpy(), [4, 8, 12])
    np.testing.assert_array_equal(xp.bitwise_invert(i).numpy(), ~np.array([1, 2, 3]))
    z = xp.asarray(np.array([-0.0, 0.0, -2.0, 3.0]))
    np.testing.assert_array_equal(xp.signbit(z).numpy(), np.signbit([-0.0, 0.0, -2.0, 3.0]))
    np.testing.assert_array_equal(
        xp.copysign(xp.asarray(np.ones(4)), z).numpy(), np.copysign(1, [-0.0, 0, -2, 3])
    )
    np.testing.assert_array_equal(
        xp.logical_xor(z, xp.asarray(np.array([1.0, 0, 1, 0]))).numpy(), [True, False, False, True]
    )
    np.testing.assert_allclose(xp.hypot(x, x).numpy(), np.hypot(a, a), rtol=1e-12)


def test_numpy_functions_dispatch_to_fusetree():
    a = xp.asarray(np.arange(6.0).reshape(2, 3))
    s = np.sum(a)
    assert isinstance(s, xp.Array) and float(s) == 15.0
    m = np.max(a, 1)
    np.testing.assert_array_equal(m.numpy(), [2.0, 5.0])
    w = np.where(a > 2, a, 0)
    assert isinstance(w, xp.Array) and not w.is_realized
    np.testing.assert_array_equal(np.concatenate([a, a]).numpy(), np.concatenate([a.numpy()] * 2))
    np.testing.assert_array_equal(np.clip(a, 1, 4).numpy(), np.clip(a.numpy(), 1, 4))
    with pytest.raises(xp.UnsupportedError, match="numpy.polyfit"):
        np.polyfit(a[0], a[1], 1)


def test_array_attributes_of_the_standard():
    a = xp.asarray(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(a.mT.numpy(), np.arange(6.0).reshape(2, 3).T)
    assert a.to_device("cpu") is a


def test_advanced_indexing_reads_and_writes_are_boundaries():
    buf = np.arange(6.0)
    x = xp.asarray(buf)
    doubled = x * 2  # pending, reads x: computed before the masked write (NumPy order)
    np.testing.assert_array_equal(x[x > 3].numpy(), [4.0, 5.0])
    np.testing.assert_array_equal(x[[5, 0]].numpy(), [5.0, 0.0])
    np.testing.assert_array_equal(x[xp.asarray(np.array([1, 1]))].numpy(), [1.0, 1.0])
    x[x > 3] = -1.0
    x[[0]] = xp.asarray(np.array([9.0]))
    np.testing.assert_array_equal(buf, [9, 1, 2, 3, -1, -1])
    np.testing.assert_array_equal(doubled.numpy(), np.arange(6.0) * 2)


def test_sign_of_zero_and_signbit_of_nan():
    z = xp.asarray(np.array([-0.0, 0.0, -np.nan, 2.0]))
    got = xp.sign(z).numpy()
    assert got[0] == 0 and not np.signbit(got[0]) and np.isnan(got[2])
    np.testing.assert_array_equal(xp.signbit(z).numpy(), np.signbit(z.numpy()))


def test_complex_arrays_are_computed_unfused(rng):
    """complex64/complex128 arrays: every op is the backend's (NumPy's here), checked against
    NumPy on fresh inputs: operators with complex, real and Python operands, functions, reductions,
    casts, stores, views and products; no fusetree kernel runs for them."""
    for cdt in (np.complex64, np.complex128):
        z = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(cdt)
        w = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(cdt)
        r = rng.standard_normal((3, 4)).astype(np.float32)
        fz, fw, fr = xp.asarray(z), xp.asarray(w), xp.asarray(r)
        tol = 1e-5 if cdt == np.complex64 else 1e-12

        def check(got, want):
            got = got.numpy()
            assert got.dtype == np.asarray(want).dtype, (got.dtype, np.asarray(want).dtype)
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)

        xp.reset_stats()
        check(fz + fw, z + w)
        check(fz * fr, z * r)
        check(fz / fw, z / w)
        check(fz - 2.5, z - 2.5)
        check(fz * 1j, z * 1j)
        check(2 * fz, 2 * z)
        check(fz**2, z**2)
        check(-fz, -z)
        for f, g in ((xp.exp, np.exp), (xp.log, np.log), (xp.sqrt, np.sqrt), (xp.sin, np.sin),
                     (xp.tanh, np.tanh), (xp.expm1, np.expm1), (xp.log1p, np.log1p), (xp.abs, np.abs),
                     (xp.square, np.square), (xp.acos, np.arccos), (xp.asinh, np.arcsinh)):  # fmt: skip
            check(f(fz), g(z))
        check(xp.real(fz), z.real)
        check(xp.imag(fz), z.imag)
        check(xp.conj(fz), np.conj(z))
        check(fz == fw, z == w)
        check(xp.isfinite(fz), np.isfinite(z))
        check(xp.sum(fz, axis=1), z.sum(axis=1))
        check(xp.prod(fz, axis=0, keepdims=True), z.prod(axis=0, keepdims=True))
        check(xp.mean(fz), z.mean())
        check(fr.astype(cdt), r.astype(cdt))
        check(xp.where(fr > 0, fz, fw), np.where(r > 0, z, w))
        check(fz.T, z.T)
        check(fz[1:, ::2], z[1:, ::2])
        check(fz @ fw.T, z @ w.T)
        assert xp.stats()["kernels"] == 1  # the one real kernel: fr > 0
        out = xp.asarray(np.full((3, 4), np.nan, cdt))
        out[...] = fz * 2
        out[0] = fr[0] + 1  # a real pending value into a complex target
        want = z * 2
        want[0] = r[0] + 1
        check(out, want)
        assert complex(xp.asarray(np.array(1 + 2j, cdt))) == 1 + 2j


def test_complex_expm1_is_precise_near_zero_and_keeps_the_special_cases():
    z = np.array([1e-10 + 1e-10j, -3e-9 + 2e-12j, 0.5 - 0.3j], np.complex128)
    want = z + z * z / 2 + z**3 / 6 + z**4 / 24  # the series (|z| small, or checked loosely below)
    got = xp.expm1(xp.asarray(z)).numpy()
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-12)
    np.testing.assert_allclose(got[2], np.exp(z[2]) - 1, rtol=1e-12)
    inf, nan = np.inf, np.nan
    special = np.array([complex(inf, 0), complex(-inf, inf), complex(nan, 0), complex(-inf, nan)])
    got = xp.expm1(xp.asarray(special)).numpy()
    for g, w in zip(got, [complex(inf, 0), complex(-1, 0), complex(nan, 0), complex(-1, 0)]):
        assert (g.real == w.real or (np.isnan(g.real) and np.isnan(w.real))) and g.imag == w.imag, (g, w)


def test_complex_errors_name_the_problem():
    z = xp.asarray(np.ones(2, np.complex64))
    with pytest.raises(xp.DTypeError, match="floor.*complex64"):
        xp.floor(z)
    with pytest.raises(xp.DTypeError, match="complex"):
        xp.var(z)
    with pytest.raises(xp.UnsupportedError, match="complex.*ft.jit"):
        xp.jit(lambda a: a * 2)(z)


def test_default_device_option():
    """``ft.options(device=...)`` / FUSETREE_DEVICE: where Python objects and the creation functions
    go (another device is checked in the simulator's process, test_cudasim, and on the GPU); NumPy
    arrays keep theirs; an unknown device is named."""
    with xp.options(device="tpu"):
        assert xp.asarray(np.ones(2)).device == "cpu"  # wrapped, not moved
        with pytest.raises(xp.DeviceError, match="tpu"):
            xp.zeros(2)
        with pytest.raises(xp.DeviceError, match="tpu"):
            xp.asarray([1, 2])
    assert xp.asarray([1]).device == "cpu" and xp.zeros(1).device == "cpu"
    assert xp.__array_namespace_info__().default_device() == "cpu"


def test_vecdot_and_unstack_are_fusetree_functions(rng):
    """Written in fusetree (the backends need not have them: CuPy has neither): vecdot is one fused
    reduction kernel for real operands, unstack lazy views; against NumPy, broadcast operands."""
    a = rng.standard_normal((4, 1, 5))
    b = rng.standard_normal((3, 5))
    xp.reset_stats()
    got = xp.vecdot(xp.asarray(a), xp.asarray(b))
    np.testing.assert_allclose(got.numpy(), np.vecdot(a, b), rtol=1e-12)
    assert xp.stats()["kernels"] == 1
    c = a[:, 0]
    np.testing.assert_allclose(
        xp.vecdot(xp.asarray(c), xp.asarray(c), axis=0).numpy(), np.vecdot(c, c, axis=0)
    )
    u = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert xp.vecdot(xp.asarray(u), xp.asarray(u)).dtype == np.uint8  # the operands' type, not sum's
    with pytest.raises(xp.ShapeError, match="vecdot"):
        xp.vecdot(xp.asarray(a), xp.asarray(b[:, :4]))
    for axis in (0, 1, -1):
        for got, want in zip(xp.unstack(xp.asarray(a), axis=axis), np.unstack(a, axis=axis), strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
