"""Creation, attributes, realization protocols, evaluate/explain/DOT, options, stats, errors."""

import numpy as np
import pytest

import fusetree as ft


def test_creation_and_attributes():
    z = ft.zeros((2, 3), dtype=np.float32)
    assert z.shape == (2, 3) and z.dtype == np.float32 and z.ndim == 2 and z.size == 6
    assert z.device == "cpu" and z.T.shape == (3, 2)
    np.testing.assert_array_equal(ft.ones(3).numpy(), np.ones(3))
    np.testing.assert_array_equal(ft.full((2,), 7, dtype=np.int8).numpy(), [7, 7])
    assert ft.full((2,), 1.5).dtype == np.float64
    assert ft.empty_like(z).shape == (2, 3) and ft.zeros_like(z).dtype == np.float32
    np.testing.assert_array_equal(ft.ones_like(z, dtype=np.int32).numpy(), np.ones((2, 3), np.int32))
    assert ft.empty(4).shape == (4,) and ft.full_like(z, 2).numpy().sum() == 12


def test_realization_protocols():
    x = ft.asarray(np.array([1.5, 2.5]))
    y = x * 2
    assert not y.is_realized
    assert float(ft.asarray(np.array(2.0)) * 2) == 4.0
    assert bool(ft.asarray(np.array(True)) & True)
    assert int(ft.asarray(np.array(3)) + 1) == 4
    assert "ft.Array" in repr(y) and y.is_realized
    np.testing.assert_array_equal(np.asarray(y), [3.0, 5.0])
    assert len(y) == 2 and [float(v) for v in y] == [3.0, 5.0]


def test_numpy_ufuncs_stay_lazy():
    x = ft.asarray(np.arange(3, dtype=np.float32))
    y = np.exp(x) + np.float32(1)
    assert isinstance(y, ft.Array) and not y.is_realized
    np.testing.assert_allclose(y.numpy(), np.exp(np.arange(3, dtype=np.float32)) + 1, rtol=1e-6)


def test_evaluate_multi_output_one_kernel(rng):
    a = ft.asarray(rng.standard_normal((3, 4)))
    ft.reset_stats()
    p, q, r = ft.evaluate(a + 1, a * 2, ft.exp(a[0]))
    assert ft.stats()["kernels"] == 2  # (3,4) outputs share one kernel; (4,) gets its own
    np.testing.assert_allclose(q.numpy(), a.numpy() * 2)


def test_live_intermediate_is_stored_by_the_same_kernel(rng):
    a, b = (ft.asarray(rng.standard_normal(5)) for _ in range(2))
    c2 = a * b + 1
    h2 = ft.tanh(c2) * 2
    ft.reset_stats()
    h2.numpy()
    assert c2.is_realized and ft.stats()["kernels"] == 1
    np.testing.assert_allclose(c2.numpy(), a.numpy() * b.numpy() + 1)
    assert ft.stats()["kernels"] == 1


def test_live_values_among_many_pending_values(rng):
    """The live-value rule with hundreds of other pending values alive: older and newer unrelated
    values do not join the kernel, a live value inside the tree does (whichever order they are
    realized in), and the search for it looks only at values registered since the tree's oldest
    node (engine.state.recent_pending)."""
    from fusetree.engine.state import recent_pending

    a, b = (ft.asarray(rng.standard_normal(6)) for _ in range(2))
    older = [a * float(i) for i in range(300)]
    c2 = a * b + 1  # inside h2's tree, made between its oldest node and h2
    h2 = ft.tanh(c2) * 2
    newer = [b - float(i) for i in range(300)]
    assert len(recent_pending(h2._node.lo)) == 302  # c2, h2 and the newer values, not the older
    assert recent_pending(h2._node.lo, h2._node.uid)[-1] is c2
    ft.reset_stats()
    h2.numpy()
    assert c2.is_realized and ft.stats()["kernels"] == 1
    assert not older[-1].is_realized and not newer[0].is_realized
    np.testing.assert_allclose(c2.numpy(), a.numpy() * b.numpy() + 1)
    np.testing.assert_allclose(h2.numpy(), np.tanh(a.numpy() * b.numpy() + 1) * 2)
    for i in (0, 299):  # oldest first and newest first: each its own kernel, right values
        np.testing.assert_allclose(older[i].numpy(), a.numpy() * i)
        np.testing.assert_allclose(newer[-1 - i].numpy(), b.numpy() - (299 - i))
    assert ft.stats()["kernels"] == 5


def test_live_value_search_while_the_collector_drops_pending_values(rng, monkeypatch):
    """recent_pending when dead pending arrays leave PENDING between its slices and while one is
    taken (a garbage collection's weak-reference callbacks; seen on the H100 as "dictionary changed
    size during iteration"): every live value registered since ``lo`` is still found, once."""
    import itertools

    from fusetree.engine import state

    a = ft.asarray(rng.standard_normal(4))
    live, junk = [], []
    for i in range(400):
        live.append(a * float(i))
        junk.append(a + float(i))  # interleaved with the live values in PENDING
    calls = []

    class Collecting:  # stands in for itertools in engine.state: PENDING changes under the walk
        @staticmethod
        def islice(it, k):
            calls.append(k)
            if len(calls) == 2:  # between the first slice and the second: the newest junk dies
                del junk[-150:]
            if len(calls) == 3:  # while a slice is taken
                del junk[:100]
                raise RuntimeError("dictionary changed size during iteration")
            return itertools.islice(it, k)

    monkeypatch.setattr(state, "itertools", Collecting)
    found = state.recent_pending(live[0]._node.lo)
    ids = [id(w) for w in found]
    assert len(calls) >= 4 and len(ids) == len(set(ids))
    assert {id(w) for w in live} <= set(ids)
    assert {id(w) for w in junk} <= set(ids)  # (and junk seen in the first slice, before it died)


def test_explain_and_dot(rng):
    x = ft.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    y = ft.sigmoid(x @ x + 1)
    e = ft.explain(y)
    s = str(e)
    assert "1 GEMM(s), 1 fused kernel(s)" in s and "sigmoid_f4" in s and "# key:" in s
    assert e.kernels[0].source.count("def ft_") == 1 and e.kernels[0].ptx is None
    assert "digraph" in e.dot() and "sigmoid" in ft.to_dot(y)
    g = ft.to_networkx(ft.exp(x) * ft.exp(x))
    assert sorted(d["op"] for _, d in g.nodes(data=True)) == ["buffer", "exp", "multiply"]  # CSE


def test_options_and_env():
    assert ft.get_options().fuse is True
    with ft.options(fuse=False):
        assert ft.get_options().fuse is False
    with pytest.raises(TypeError, match="unknown fusetree option"):
        with ft.options(fusion=False):
            pass


def test_errors_name_the_problem():
    a, b = ft.asarray(np.ones((2, 3))), ft.asarray(np.ones((4,)))
    with pytest.raises(ft.ShapeError, match=r"add.*\(2, 3\).*\(4,\)"):
        a + b
    with pytest.raises(ft.ShapeError, match="not aligned"):
        a @ b
    with pytest.raises(ft.DTypeError, match="floor.*complex128"):
        ft.floor(ft.asarray(np.ones(2, np.complex128)))
    with pytest.raises(ft.UnsupportedError, match="str"):
        ft.asarray("hello")
    with pytest.raises(ft.DTypeError, match="<U1"):
        ft.asarray(np.array(["a"]))
    with pytest.raises(ft.DTypeError, match="object"):
        ft.asarray([object()])
    with pytest.raises(ft.DTypeError, match="invert.*float64"):
        ~a
    with pytest.raises(ft.DeviceError, match="different devices"):
        a + ft.asarray(np.ones((2, 3)), device="cuda-sim")
    with pytest.raises(ft.DeviceError, match="unknown device"):
        ft.zeros(3, device="tpu")
    with pytest.raises(ft.ShapeError, match="reshape"):
        a.reshape(4, 2)
    with pytest.raises(OverflowError, match="out of bounds for int8"):
        ft.asarray(np.ones(2, np.int8)) + 1000
    with pytest.raises(ft.ShapeError, match="could not broadcast"):
        a[...] = ft.asarray(np.ones(5))


def test_zero_size_and_0d():
    e = ft.asarray(np.ones((0, 3), np.float32))
    assert (ft.exp(e) + 1).numpy().shape == (0, 3)
    s = ft.asarray(np.array(2.0))
    assert (ft.sqrt(s) * s).numpy().shape == ()
    assert float(ft.exp(ft.asarray(np.array(0.0)))) == 1.0


def test_too_many_inputs_are_split(rng):
    xs = [rng.standard_normal(4) for _ in range(60)]
    acc = ft.asarray(xs[0])
    for x in xs[1:]:
        acc = acc + ft.asarray(x)[::-1] * 1.5
    with ft.options(max_kernel_params=40):
        ft.reset_stats()
        got = acc.numpy()
        assert ft.stats()["kernels"] > 1
    want = xs[0].copy()
    for x in xs[1:]:
        want = want + x[::-1] * 1.5
    np.testing.assert_allclose(got, want)


def test_reductions_over_too_many_inputs_are_split(rng):
    """A reduction kernel whose tree has more leaves than one kernel takes (views of pending values
    multiply them) computes its largest elementwise part into a temporary first (an error before:
    fuzzer seed 351464); with a live value inside, each output is planned on its own."""
    xs = [rng.standard_normal((3, 5)) for _ in range(40)]
    acc = ft.asarray(xs[0])
    want = xs[0].copy()
    for x in xs[1:]:
        acc = acc + ft.asarray(x)[::-1] * 1.5
        want = want + x[::-1] * 1.5
    with ft.options(max_kernel_params=60):
        ft.reset_stats()
        s = ft.sum(ft.exp(acc * 0.1) * acc, axis=1)  # one frame kernel over 40 leaves before
        sm = ft.softmax(acc, axis=-1)
        live = acc * 2.0  # a live value inside the next tree: an extra output
        m = ft.max(live - 1.0, axis=0, keepdims=True) + live
        got_s, got_sm, got_m, got_live = s.numpy(), sm.numpy(), m.numpy(), live.numpy()
        assert ft.stats()["kernels"] > 4
    np.testing.assert_allclose(got_s, np.sum(np.exp(want * 0.1) * want, axis=1), rtol=1e-12)
    e = np.exp(want - want.max(-1, keepdims=True))
    np.testing.assert_allclose(got_sm, e / e.sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(
        got_m, np.max(want * 2.0 - 1.0, axis=0, keepdims=True) + want * 2.0, rtol=1e-12
    )
    np.testing.assert_allclose(got_live, want * 2.0, rtol=1e-12)


def test_a_reduction_with_no_part_to_split_names_the_limit(rng):
    """A reduction that does not fit a kernel with nothing left to compute first (one input, a
    parameter limit below what it needs): a clear error naming the inputs and the limit."""
    x = ft.asarray(rng.standard_normal((2, 3)))
    with (
        ft.options(max_kernel_params=4),
        pytest.raises(ft.ShapeError, match=r"over 1 input needs \d+ parameters \(at most 4\)"),
    ):
        ft.sum(x, axis=1).numpy()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint16", "int64", "bool"])
def test_square_by_operator_is_a_multiply(dtype):
    """``x ** 2`` computes ``x * x`` (NumPy's operator takes np.square): same dtype and values, and
    the kernel multiplies instead of calling ``pow``; other exponents stay ``power``."""
    a = (np.arange(-6, 7) * 3).astype(dtype)  # (bool: NumPy's operator squares to int8, np.power to int64)
    x = ft.asarray(a)
    for e in (2, 2.0, 3, 0.5):
        if isinstance(e, float) and a.dtype.kind != "f":
            continue
        with np.errstate(all="ignore"):
            want = a**e
        got = (x**e).numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    (k,) = ft.explain(x**2).kernels
    assert "multiply" in k.source and "pow" not in k.source.split("def ")[1]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint8", "int32"])
def test_python_int_operands_follow_numpy_2(dtype, rng):
    """Python ints with arrays (NEP 50: weak scalars) on the operators' fast path and off it (large
    ints, comparisons, integer dtypes): NumPy's result dtype and values, or NumPy's error."""
    x = (rng.standard_normal(7) * 5).astype(dtype)
    fx = ft.asarray(x)
    ints = [0, 1, 2, 7, 64, 300, -3, 2**24 + 1, 2**53, 2**53 + 1, 2**62]
    ops = [
        lambda a, k: a + k, lambda a, k: k + a, lambda a, k: a - k, lambda a, k: k - a, lambda a, k: a * k,
        lambda a, k: k * a, lambda a, k: a / k if k else a / 1, lambda a, k: a ** 2, lambda a, k: a < k,
        lambda a, k: k == a, lambda a, k: a >= k,
    ]  # fmt: skip
    for k in ints:
        for op in ops:
            try:
                with np.errstate(over="ignore"):  # (float16: 2**24 + 1 is inf, as in NumPy)
                    want = op(x, k)
            except (OverflowError, ValueError) as e:
                with pytest.raises(type(e)):
                    ft.evaluate(op(fx, k))
                continue
            got = op(fx, k).numpy()
            assert got.dtype == want.dtype, (k, got.dtype, want.dtype)
            np.testing.assert_array_equal(got, want)


def test_integer_dtypes_keep_the_operators_memoized_rules():
    """The operators' fast path looks rules up in ``RULES2``: int64 arrays must land there too
    (an int64 dtype compares equal to Python's ``int``, the weak-int marker; e9d8457 lost them),
    while a float array with a Python int does only outside comparisons."""
    from fusetree.ir.ops import RULES2

    i64, f32 = np.dtype(np.int64), np.dtype(np.float32)
    a, f = ft.asarray(np.arange(4)), ft.asarray(np.ones(4, np.float32))
    ft.evaluate(a + a, a * 0.5, f / 64, f < 3)
    assert ("add", i64, i64) in RULES2 and ("multiply", i64, float) in RULES2
    assert ("true_divide", f32, int) in RULES2 and ("less", f32, int) not in RULES2
