"""Deferred stores (ft.options(defer_stores=True), always inside ft.jit): NumPy's results exactly,
several stores per kernel."""

import inspect

import numpy as np
import pytest

import fusetree as ft


@pytest.fixture(autouse=True)
def deferred():
    with ft.options(defer_stores=True):
        yield
        ft.synchronize()


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def adamw(ps, gs, ms, vs, xp, lr=1e-2, t=3):
    for p, g, m, v in zip(ps, gs, ms, vs):
        m[...] = 0.9 * m + 0.1 * g
        v[...] = 0.999 * v + 0.001 * (g * g)
        p -= lr * (m / (1 - 0.9**t)) / (xp.sqrt(v / (1 - 0.999**t)) + 1e-8) + 1e-4 * p


def test_an_optimizer_step_is_one_kernel_per_parameter_structure(rng):
    shapes = [(7, 5), (5,), (3, 2, 4), (5,)]
    P, G = [f32(rng, *s) for s in shapes], [f32(rng, *s) for s in shapes]
    M, V = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    refs = [[x.astype(np.float64) for x in xs] for xs in (P, G, M, V)]
    fs = [[ft.asarray(x) for x in xs] for xs in (P, G, M, V)]
    for _ in range(3):
        ft.reset_stats()
        adamw(*fs, ft)
        assert ft.stats()["launches"] == 0 and ft.stats()["stores"] == 12
        ft.synchronize()
        s = ft.stats()
        # one kernel per parameter, and the two (5,) parameters' kernels as one horizontal launch
        assert (s["flushes"], s["kernels"], s["launches"], s["horizontal"]) == (1, 3, 3, 1), s
        adamw(*refs, np)
        for got, want in zip(P + M + V, refs[0] + refs[2] + refs[3]):  # the caller's NumPy buffers
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_pending_reduction_reading_the_targets_is_computed_first_not_staged(rng):
    """A pending loss (a reduction over the parameters, as value_and_grad returns it) reads the
    targets of an optimizer step's stores: it is computed first on the old values, and the stores
    still share their kernels (no staged temporary and copy per store)."""
    shapes = [(7, 5), (5,), (5,)]
    P, G = [f32(rng, *s) for s in shapes], [f32(rng, *s) for s in shapes]
    M, V = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    refs = [[x.astype(np.float64) for x in xs] for xs in (P, G, M, V)]
    fs = [[ft.asarray(x) for x in xs] for xs in (P, G, M, V)]
    for _ in range(3):
        loss = sum(ft.sum(p * p) for p in fs[0]) / 3  # pending, reads every parameter
        want_loss = sum((p * p).sum() for p in refs[0]) / 3
        ft.reset_stats()
        adamw(*fs, ft)
        ft.synchronize()
        s = ft.stats()
        assert s["copies"] == 0 and s["horizontal"] == 1 and s["kernels"] <= 2 + 3, s
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
        adamw(*refs, np)
        for got, want in zip(P + M + V, refs[0] + refs[2] + refs[3]):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_repeated_flush_launches_its_cached_plan(rng):
    """The same stores every step (same targets, trees, arrays and scalars) reuse the flush plan;
    another scalar value, another array or a live value reading a target is planned afresh. Every
    step is checked against float64 NumPy."""
    shapes = [(7, 5), (5,), (3, 2, 4), (5,), (5,)]
    P, G = [f32(rng, *s) for s in shapes], [f32(rng, *s) for s in shapes]
    M, V = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    refs = [[x.astype(np.float64) for x in xs] for xs in (P, G, M, V)]
    fs = [[ft.asarray(x) for x in xs] for xs in (P, G, M, V)]
    for step, lr in enumerate((1e-2, 1e-2, 1e-2, 5e-3, 5e-3, "swap", "reader", 5e-3)):
        ft.reset_stats()
        reader = None
        if lr == "swap":  # a gradient array replaced by another one (new memory, same values)
            fs[1][0] = ft.asarray(G[0].copy())
            lr = 5e-3
        elif lr == "reader":  # a live pending value reading a target: computed with the old data
            reader = fs[0][1] * 2.0
            old = P[1] * np.float32(2.0)  # (the float32 data before the step: exact; the float64
            # reference has drifted from it by float32 rounding over the earlier steps)
            lr = 5e-3
        adamw(*fs, ft, lr=lr)
        ft.synchronize()
        adamw(*refs, np, lr=lr)
        hits = ft.stats()["flush_plan_hits"]
        assert hits == (1 if step in (1, 2, 4, 7) else 0), (step, ft.stats())
        for got, want in zip(P + M + V, refs[0] + refs[2] + refs[3]):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        if reader is not None:
            np.testing.assert_array_equal(reader.numpy(), old)


def test_horizontal_kernels_tell_negative_zero_scalars_apart():
    """Two stores of one structure with scalars 0.0 and -0.0 are not one horizontal launch (0.0 ==
    -0.0 in Python): ``1 / (x * -0.0)`` is -inf for positive x."""
    xs = [ft.asarray(np.full(4, 2.0, np.float32)) for _ in range(2)]
    for x, z in zip(xs, (0.0, -0.0)):
        x[...] = 1.0 / (x * z)
    ft.synchronize()
    assert np.all(xs[0].numpy() == np.inf) and np.all(xs[1].numpy() == -np.inf)


def test_values_built_before_a_store_see_the_old_data_after_it_the_new(rng):
    buf = f32(rng, 6)
    orig = buf.copy()
    x = ft.asarray(buf)
    before = x * 1  # pending, reads x's memory: computed with the old data
    row = x[2:]  # a view taken before the store
    x[...] = x + 10
    after = x * 1  # built after: the new data
    late = row * 1  # the earlier view read after the store: the new data (a flush)
    assert ft.stats()["flushes"] >= 1
    ref = np.asarray(buf, np.float64)
    np.testing.assert_allclose(after.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(late.numpy(), ref[2:], rtol=1e-6)
    np.testing.assert_array_equal(before.numpy(), orig)
    np.testing.assert_allclose(ref, orig + 10.0, rtol=1e-6)


def test_old_values_survive_and_reads_between_stores_flush(rng):
    a = f32(rng, 5)
    x = ft.asarray(a.copy())
    old = x * 2
    x[...] = x + 1
    assert float(x[0]) == pytest.approx(a[0] + 1)  # a read between stores
    x[...] = x * 3  # a second store to the same array reads the first
    y = x - 1
    x[...] = y * 0  # ... and a third
    np.testing.assert_allclose(old.numpy(), a * 2, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), (a + 1) * 3 - 1, rtol=1e-5)
    np.testing.assert_array_equal(x.numpy(), np.zeros(5, np.float32))


def test_overlapping_views_and_other_wrappers_of_the_same_memory(rng):
    buf = np.arange(8.0)
    x = ft.asarray(buf)
    other = ft.asarray(buf)  # a second wrapper of the same memory
    x[...] = x[::-1] + 1  # reads the target through another view: staged
    y = other + 0  # reads the queued target through another array: flushed first
    ref = np.arange(8.0)[::-1] + 1
    np.testing.assert_array_equal(y.numpy(), ref)
    x[...] = x * 2
    other[...] = other + 1  # a store to memory with a queued store: written now, in order
    x[1:] = x[:-1] + 0  # a partial (not deferred) store after a queued one
    ref = ref * 2 + 1
    ref[1:] = ref[:-1].copy()
    ft.synchronize()
    np.testing.assert_array_equal(buf, ref)


def test_a_view_of_a_dropped_view_still_aliases_the_memory():
    buf = np.arange(1.0, 6.0)
    a = ft.asarray(buf)
    v = a[...]
    v[...] = a[::-1] * 2  # queued on the view v
    w = v[...]  # a pending view of v
    del v  # the owner of the queued store is gone; w must still alias buf
    a[...] = a + 100  # flushes the first store, queues this one
    ref = np.arange(1.0, 6.0)[::-1] * 2 + 100
    np.testing.assert_array_equal(w.numpy(), ref)
    np.testing.assert_array_equal(buf, ref)


def test_values_of_other_shapes_and_gemms_reading_targets(rng):
    W, b, X = f32(rng, 3, 4), f32(rng, 4), f32(rng, 2, 3)
    w, bb, xx = ft.asarray(W.copy()), ft.asarray(b.copy()), ft.asarray(X)
    s = bb.sum()  # a reduction of the old b
    bb[...] = bb * 0.5
    w[...] = w - bb  # reads b's new value (a pending value of another shape)
    out = xx @ w  # a GEMM operand: flushed first
    wr = W - b * 0.5
    np.testing.assert_allclose(out.numpy(), X.astype(np.float64) @ wr, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(s), b.astype(np.float64).sum(), rtol=1e-5)
    np.testing.assert_allclose(bb.numpy(), b * 0.5, rtol=1e-6)


def test_casts_broadcasts_and_integer_targets(rng):
    i = ft.asarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    f = ft.asarray(np.full(3, 2.5))
    i[...] = i * 2 + f.astype(np.int32)  # a (3,) value broadcast into (2, 3)
    i += 1
    ref = np.arange(6).reshape(2, 3) * 2 + 2 + 1
    np.testing.assert_array_equal(i.numpy(), ref)
    with pytest.raises(ft.DTypeError):
        i += 1.5  # NumPy's same-kind rule: nothing written
    np.testing.assert_array_equal(i.numpy(), ref)


def test_an_error_at_flush_names_the_statement(rng):
    x = ft.asarray(f32(rng, 4))
    a, b = ft.asarray(f32(rng, 4)), ft.asarray(f32(rng, 4))
    line = inspect.currentframe().f_lineno + 1
    x[...] = a + b
    with (
        ft.options(max_kernel_params=1),
        pytest.raises(ft.ShapeError, match=f"test_deferred_stores.py:{line}"),
    ):
        ft.synchronize()


@pytest.mark.parametrize("graph", [False, True])
def test_under_jit_the_stores_of_a_parameter_share_a_kernel(graph, rng):
    shapes = [(9,), (4, 3), (9,)]
    P, G = [f32(rng, *s) for s in shapes], [f32(rng, *s) for s in shapes]
    M, V = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    refs = [[x.astype(np.float64) for x in xs] for xs in (P, G, M, V)]
    step = ft.jit(graph=graph)(lambda p, g, m, v: adamw(p, g, m, v, ft))
    fs = [[ft.asarray(x) for x in xs] for xs in (P, G, M, V)]
    if True:  # the autouse fixture turned deferral on: traces defer too
        for k in range(4):
            if k == 3:  # new arrays, same signature: the horizontal kernel's table is rebuilt
                P2 = [p.copy() for p in P]
                fs[0] = [ft.asarray(p) for p in P2]
            ft.reset_stats()
            step(*fs)
            adamw(*refs, np)
            s = ft.stats()
            if k == 2 and not graph:  # a replay: one kernel for (4, 3), one horizontal for both (9,)
                assert (s["replays"], s["launches"], s["horizontal"]) == (1, 2, 1), s
    got = P2 + M + V
    for x, want in zip(got, refs[0] + refs[2] + refs[3]):
        np.testing.assert_allclose(x, want, rtol=2e-5, atol=1e-6)


def test_off_by_default_stores_are_written_at_once(rng):
    with ft.options(defer_stores=False):
        buf = np.zeros(3)
        x = ft.asarray(buf)
        x[...] = x + 1
        assert buf.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
def test_horizontal_kernels_over_many_sizes(dtype, rng):
    """Same-structure stores of different sizes (some spanning several table rows) as one launch:
    poisoned outputs, a 0-d coefficient read once per row, NumPy's results."""
    from fusetree.engine import horizontal

    sizes = [1, 7, horizontal.CHUNK, horizontal.CHUNK * 2 + 5, 300]
    dt = np.dtype(dtype)
    xs = [(rng.standard_normal(n) * 10).astype(dt) for n in sizes]
    ys = [np.full(n, 99, dt) for n in sizes]  # poisoned targets
    coef = np.asarray(3, dt)
    fx, fy, fc = [ft.asarray(x) for x in xs], [ft.asarray(y) for y in ys], ft.asarray(coef)
    ft.reset_stats()
    for x, y in zip(fx, fy):
        y[...] = x * fc + 1
    ft.synchronize()
    s = ft.stats()
    # the 1-element tensor's broadcast coefficient has another layout class (its own kernel)
    assert (s["launches"], s["horizontal"]) == (2, 1), s
    for x, y in zip(xs, ys):
        want = x * coef + dt.type(1)
        np.testing.assert_allclose(
            y.astype(np.float64), want.astype(np.float64), rtol=1e-3 if dtype == "float16" else 1e-6
        )


def test_misaligned_tensors_fall_back_to_one_kernel_each(rng):
    raw = np.zeros(4 * 20 + 3, np.uint8)
    a = np.frombuffer(raw.data, np.float32, 10, offset=1)  # an odd address
    b = np.zeros(10, np.float32)
    fa, fb = ft.asarray(a), ft.asarray(b)
    ft.reset_stats()
    fa[...] = fa + 1
    fb[...] = fb + 2
    ft.synchronize()
    assert ft.stats()["horizontal"] == 0 and ft.stats()["launches"] == 2
    assert a.tolist() == [1.0] * 10 and b.tolist() == [2.0] * 10


def test_explain_shows_the_flush_groups(rng):
    xs = [ft.asarray(f32(rng, n)) for n in (3, 4, 5)]
    w = ft.asarray(f32(rng, 2, 3))
    for x in xs:
        x[...] = x * 2 + 1
    w -= 0.5 * w
    line = inspect.currentframe().f_lineno - 1
    text = str(ft.explain())
    assert "4 deferred store(s)" in text and "horizontal launch: 3 tensors [(3,), (4,), (5,)]" in text
    assert f"test_deferred_stores.py:{line}" in text  # the statement, not fusetree's frames
    ft.synchronize()
    assert ft.explain().stores == []
