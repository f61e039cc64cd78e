"""Reductions vs NumPy (CPU): every kind x axes x keepdims x dtypes on strided views, the fused
patterns (one launch each), NaN/empty/two-stage/out= cases, random reduction trees, and ft.jit."""

from __future__ import annotations

import numpy as np
import pytest
import reduce_cases as rc
from hypothesis import given, settings
from hypothesis import strategies as st

import fusetree as ft

DTYPES = ("bool", "int8", "int32", "uint16", "uint64", "int64", "float16", "float32", "float64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kind_axis_keepdims(dtype, rng):
    assert rc.check_kinds("cpu", rng, [(7,), (3, 4, 5)], [dtype]) > 0


def test_patterns_one_launch_each(rng):
    assert rc.check_patterns("cpu", rng, shape=(6, 40)) == 48
    assert rc.check_patterns("cpu", rng, shape=(3, 5, 33), dtypes=("float32",)) == 16


def test_special_values_two_stage_and_targets(rng):
    assert rc.check_special("cpu", rng) > 0


def test_softmax_is_one_kernel_with_readable_source():
    x = ft.asarray(np.ones((4, 8), np.float32))
    (k,) = ft.explain(ft.softmax(x)).kernels
    assert "2 phase(s)" in k.source and "for rr in prange(nkeep)" in k.source
    ft.reset_stats()
    ft.softmax(x).numpy()
    s = ft.stats()
    assert s["launches"] == 1 and s["kernels"] == 1


def test_reduction_kernels_are_cached_by_structure(rng):
    ft.softmax(ft.asarray(rng.standard_normal((4, 8)).astype(np.float32))).numpy()
    ft.reset_stats()
    ft.softmax(ft.asarray(rng.standard_normal((9, 31)).astype(np.float32))).numpy()
    assert ft.stats()["compiles"] == 0 and ft.stats()["cache_hits"] == 1, ft.stats()  # new sizes
    # a reduction kernel takes every leaf with its strides; the CPU has one variant for rows of
    # unit stride (vectorized loops) and one for any strides, which every strided view reuses
    for cols in (62, 40):
        x = rng.standard_normal((9, cols)).astype(np.float32)
        got = ft.softmax(ft.asarray(x)[:, ::2]).numpy()
        e = np.exp(x[:, ::2].astype(np.float64) - x[:, ::2].max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-9)
    assert ft.stats()["compiles"] == 1 and ft.stats()["cache_hits"] == 2, ft.stats()


def test_unfused_baseline_launches_per_op(rng):
    x = ft.asarray(rng.standard_normal((4, 8)).astype(np.float32))
    with ft.options(fuse=False):
        ft.reset_stats()
        y = ft.softmax(x).numpy()
    assert ft.stats()["launches"] >= 4
    np.testing.assert_allclose(y, ft.softmax(x).numpy(), rtol=1e-6)


def test_jit_replays_reductions(rng):
    @ft.jit
    def f(x, w, b):
        return ft.layer_norm(x, w, b), ft.logsumexp(x, axis=0), x.argmax(1)

    w, b = ft.asarray(np.ones(16, np.float32)), ft.asarray(np.zeros(16, np.float32))
    ft.reset_stats()
    for _ in range(4):
        xv = rng.standard_normal((8, 16)).astype(np.float32)
        ln, lse, am = f(ft.asarray(xv), w, b)
        np.testing.assert_array_equal(ln.numpy(), ft.layer_norm(ft.asarray(xv), w, b).numpy())
        np.testing.assert_allclose(lse.numpy(), np.log(np.exp(xv.astype(np.float64)).sum(0)), rtol=1e-5)
        np.testing.assert_array_equal(am.numpy(), xv.argmax(1))
    assert ft.stats()["traces"] == 1 and ft.stats()["replays"] == 3


KINDS = st.sampled_from(["sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "mean"])


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    kind=KINDS,
    dtype=st.sampled_from(["int16", "float32", "float64", "bool"]),
    keepdims=st.booleans(),
    data=st.data(),
)
def test_random_reduction_trees(shape, kind, dtype, keepdims, data):
    """A random elementwise producer, a reduction over random axes, and a consumer that
    broadcasts the result back: compared with NumPy evaluating the same tree."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    nd = len(shape)
    if kind.startswith("arg"):
        axis = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1)))
    else:
        axes = data.draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd))
        axis = tuple(axes) if axes else None
    x = rc.draw(rng, shape, dtype, kind)
    y = rc.draw(rng, shape, dtype, kind)
    fx, fy = ft.asarray(x), ft.asarray(y)
    if dtype == "bool":
        px, py = fx & fy, x & y
    else:
        px, py = fx * 2 - fy, x * 2 - y
    got = getattr(ft, kind)(px, axis=axis, keepdims=True)
    want = getattr(np, kind)(py, axis=axis, keepdims=True)
    if kind.startswith("arg") and axis is None:
        want = want.reshape((1,) * nd)
    if not keepdims:
        got = getattr(ft, kind)(px, axis=axis)
        want = getattr(np, kind)(py, axis=axis)
        rc.compare(got.numpy(), want, None if want.dtype.kind != "f" else np.abs(want) + 1, kind)
        return
    cons = got + fx if kind not in ("any", "all") else got & (fx != 0)
    wcons = want + x if kind not in ("any", "all") else want & (x != 0)
    g = cons.numpy()
    assert g.shape == wcons.shape and g.dtype == wcons.dtype
    if wcons.dtype.kind == "f":
        np.testing.assert_allclose(g, wcons, rtol=1e-5, atol=1e-5 * (np.abs(py).sum() + 1))
    else:
        np.testing.assert_array_equal(g, wcons)


def test_repeated_reductions_reuse_their_rules_exactly(rng):
    """A reduction taken again with the same kind, shape, dtype, axis and keepdims reuses its
    memoized rules (frontend.reductions._PLAIN): alternating axes, keepdims, kinds and dtypes over
    the same shapes, every call is checked against NumPy (values, dtype, shape)."""
    xs = {dt: rng.standard_normal((3, 4, 5)).astype(dt) for dt in ("float32", "float64", "int32")}
    xs["int32"] = (xs["int32"] * 10).astype("int32")
    calls = [(k, dt, ax, kd) for k in ("sum", "max", "argmax", "mean") for dt in xs for ax in (None, 0, -1, 2)
             for kd in (False, True) if not (k == "argmax" and kd and ax is None)]  # fmt: skip
    for _ in range(2):
        for kind, dt, ax, kd in calls:
            x = xs[dt]
            fx = ft.asarray(x)
            got = getattr(ft, kind)(fx, axis=ax, keepdims=kd).numpy()
            want = getattr(np, kind)(x, axis=ax, keepdims=kd)
            assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, (kind, dt, ax, kd)
            if dt == "float32" and kind in ("sum", "mean"):  # float64 reference: summation order differs
                want = getattr(np, kind)(x.astype(np.float64), axis=ax, keepdims=kd)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(x).sum()))
            else:
                np.testing.assert_allclose(got, want, rtol=1e-12)
