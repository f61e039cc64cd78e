"""Reduction reference cases shared by the CPU tests, the simulator test and the GPU tests.

Every case draws fresh inputs, runs fusetree on ``device`` (outputs poisoned with NaN where an
``out[...] =`` target is used) and compares with NumPy: exactly for max/min/arg*/any/all and integer
sums (wrap-around included), and against a float64 reference scaled by the magnitudes involved for
floating sums, means, variances and the fused patterns.
"""

from __future__ import annotations

import math

import numpy as np

import fusetree as ft
from fusetree.ir.ops import REDUCTIONS

KINDS = tuple(REDUCTIONS)
RTOL = {"float16": 4e-3, "float32": 3e-6, "float64": 1e-13}


def draw(rng, shape, dt, kind="sum"):
    dt = np.dtype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if kind == "prod":
            lo, hi = (0, 3) if dt.kind == "u" else (-2, 2)
        else:
            lo, hi = max(info.min, -100), min(info.max, 100)
        x = rng.integers(lo, hi + 1, size=shape).astype(dt)
        if x.size > 2 and kind in ("max", "min", "argmax", "argmin"):
            x.flat[rng.integers(0, x.size)] = info.max
            x.flat[rng.integers(0, x.size)] = info.min
        return x
    if kind == "prod":
        return rng.uniform(0.7, 1.4, shape).astype(dt)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    if kind in ("argmax", "argmin") and x.size > 4:  # ties: the first one must win
        x.flat[1] = x.flat[3] = x.max() if kind == "argmax" else x.min()
    return x


def _ref(kind, x, axis, keepdims):
    if kind in ("max", "min", "argmax", "argmin", "any", "all") or x.dtype.kind in "biu":
        return getattr(np, kind)(x, axis=axis, keepdims=keepdims), None
    with np.errstate(all="ignore"):
        want_dt = getattr(np, kind)(x, axis=axis, keepdims=keepdims).dtype
        r64 = getattr(np, kind)(x.astype(np.float64), axis=axis, keepdims=keepdims)
        n = x.size if axis is None else math.prod(x.shape[a] for a in np.atleast_1d(axis))
        if kind == "sum":
            scale = np.sum(np.abs(x.astype(np.float64)), axis=axis, keepdims=keepdims)
        else:
            scale = np.abs(r64) * max(1.0, math.sqrt(n))
    return np.asarray(r64).astype(want_dt), scale


def compare(got, want, scale, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if scale is None:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rt = RTOL[want.dtype.name]
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(g, w, rtol=rt, atol=rt * np.max(np.nan_to_num(scale), initial=0.0) + 1e-300, equal_nan=True,
                               err_msg=what)  # fmt: skip


def check_kinds(device, rng, shapes, dtypes, kinds=KINDS, view=True, axes=None):
    """Every kind x axis (None, each axis, negative, pairs; or ``axes``) x keepdims; returns the count."""
    count = 0
    only = axes
    for shape in shapes:
        nd = len(shape)
        axes = [None, *range(nd), -1] + ([(0, nd - 1)] if nd > 1 else []) + ([(0, 1)] if nd > 2 else [])
        if only is not None:
            axes = list(only)
        for dt in dtypes:
            for kind in kinds:
                if view:  # a strided view with a negative step
                    big = draw(rng, tuple(s * 2 for s in shape), dt, kind)
                    x = (big[::2, ::-2] if nd > 1 else big[::2])[tuple(slice(0, s) for s in shape)]
                else:
                    x = draw(rng, shape, dt, kind)
                for axis in axes:
                    if REDUCTIONS[kind].index and isinstance(axis, tuple):
                        continue
                    for keep in (False, True):
                        want, scale = _ref(kind, x, axis, keep)
                        got = getattr(ft, kind)(
                            ft.asarray(x, device=device), axis=axis, keepdims=keep
                        ).numpy()
                        compare(
                            got, want, scale, f"{kind}({dt}{list(x.shape)}, axis={axis}, keepdims={keep})"
                        )
                        count += 1
    return count


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _np_layernorm(x, w, b, eps, axis):
    m = x.mean(axis, keepdims=True)
    v = ((x - m) ** 2).mean(axis, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def check_patterns(device, rng, shape=(6, 40), dtypes=("float32", "float64", "float16"), launches=True,
                   axes=(-1, 0)):  # fmt: skip
    """softmax, log_softmax, layernorm, logsumexp, mean/var/std and ``x - x.max(...)`` along the
    last and the first axis (``axes``); each fused pattern must be one launch."""
    count = 0
    for dt in dtypes:
        for axis in axes:
            x = (rng.standard_normal(shape) * 2).astype(dt)
            x64 = x.astype(np.float64)
            wshape = [1] * len(shape)
            wshape[axis] = shape[axis]
            w = rng.uniform(0.5, 1.5, wshape).astype(dt)
            b = rng.standard_normal(wshape).astype(dt)
            a = ft.asarray(x, device=device)
            cases = {
                "softmax": (lambda: ft.softmax(a, axis), _np_softmax(x64, axis)),
                "log_softmax": (lambda: ft.log_softmax(a, axis), np.log(_np_softmax(x64, axis))),
                "layer_norm": (
                    lambda: ft.layer_norm(
                        a, ft.asarray(w, device=device), ft.asarray(b, device=device), 1e-5, axis
                    ),
                    _np_layernorm(x64, w.astype(np.float64), b.astype(np.float64), 1e-5, axis),
                ),
                "x-max": (lambda: a - a.max(axis, keepdims=True), x64 - x64.max(axis, keepdims=True)),
                "logsumexp": (lambda: ft.logsumexp(a, axis), np.log(np.exp(x64).sum(axis))),
                "mean": (lambda: a.mean(axis), x64.mean(axis)),
                "var": (lambda: a.var(axis), x64.var(axis)),
                "std_ddof1": (lambda: a.std(axis, ddof=1), x64.std(axis, ddof=1)),
            }
            for name, (fn, ref) in cases.items():
                ft.reset_stats()
                got = fn().numpy()
                n = ft.stats()["launches"]
                if launches:
                    assert n == 1, (name, dt, axis, ft.stats())
                assert got.dtype == np.dtype(dt), (name, got.dtype)
                rt = {"float16": 8e-3, "float32": 2e-5, "float64": 1e-12}[dt]
                atol = rt * np.abs(ref).max()
                err = np.abs(got.astype(np.float64) - ref)
                bad = ~(err <= atol + rt * np.abs(ref))
                assert not bad.any(), (
                    f"{name}({dt}, axis={axis}): {int(bad.sum())} of {bad.size} off, first at "
                    f"{np.argwhere(bad)[0].tolist()}: got {got[bad][:4]}, want {ref[bad][:4]}"
                )
                count += 1
    return count


def check_special(device, rng):
    """NaN propagation, argmax of NaN, -0.0, empty rows, all-axis two-stage splits, poisoned
    ``out[...] =`` targets, reductions that cannot fuse (other axes), views of reductions."""
    count = 0
    x = rng.standard_normal((4, 9)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 5] = np.nan
    x[2, 7] = np.nan
    a = ft.asarray(x, device=device)
    for kind in ("max", "min", "argmax", "argmin", "sum", "any", "all"):
        for axis in (None, 0, 1):
            compare(getattr(ft, kind)(a, axis=axis).numpy(), getattr(np, kind)(x, axis=axis), None
                    if kind != "sum" else np.abs(x), f"nan {kind} axis={axis}")  # fmt: skip
            count += 1
    z = np.zeros((3, 0), np.float32)
    assert ft.sum(ft.asarray(z, device=device), axis=1).numpy().tolist() == [0, 0, 0]
    assert ft.all(ft.asarray(z, device=device), axis=1).numpy().tolist() == [True] * 3
    # two-stage (rows split into chunks), on every kind that supports it, and over all axes
    y = draw(rng, (3, 50), "float32")
    with ft.options(reduce_split=8):
        for kind in ("sum", "prod", "max", "min", "any", "all"):
            yy = draw(rng, (3, 50), "float32", kind)
            for axis in (None, 1):
                want, scale = _ref(kind, yy, axis, False)
                compare(getattr(ft, kind)(ft.asarray(yy, device=device), axis=axis).numpy(), want, scale,
                        f"two-stage {kind} axis={axis}")  # fmt: skip
                count += 1
        compare(ft.mean(ft.asarray(y, device=device)).numpy(), np.float32(y.astype(np.float64).mean()),
                np.abs(y).mean() * 50, "two-stage mean")  # fmt: skip
        sm = ft.softmax(ft.asarray(y, device=device), axis=None).numpy()
        np.testing.assert_allclose(sm, _np_softmax(y.astype(np.float64), None), rtol=1e-5, atol=1e-7)
        count += 2
    # out[...] = reduction into a poisoned strided target
    t = ft.asarray(np.full((9, 3), np.nan, np.float32), device=device)
    xc = np.nan_to_num(x)
    t[::2, 1] = ft.sum(ft.asarray(xc[:, :5].T.copy(), device=device) * 2, axis=1)
    tn = t.numpy()
    np.testing.assert_allclose(tn[::2, 1], (xc[:, :5].T * 2).sum(1), rtol=1e-5)
    assert np.isnan(tn[1::2, 1]).all() and np.isnan(tn[:, 0]).all()
    tgt = ft.asarray(np.full((4, 9), np.nan, np.float32), device=device)
    clean = np.nan_to_num(x)
    tgt[...] = ft.softmax(ft.asarray(clean, device=device), axis=1)
    np.testing.assert_allclose(tgt.numpy(), _np_softmax(clean.astype(np.float64), 1), rtol=2e-5, atol=1e-7)
    # reductions over different axes in one expression, and a view of a reduction
    c = ft.asarray(clean, device=device)
    got = (c - c.mean(0, keepdims=True)) / (c.max(1, keepdims=True) + 10)
    want = (clean - clean.mean(0, keepdims=True)) / (clean.max(1, keepdims=True) + 10)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    s = c.sum(1)[:, None] * c
    np.testing.assert_allclose(s.numpy(), clean.sum(1)[:, None] * clean, rtol=1e-5, atol=1e-5)
    nested = c.sum(1).max()
    np.testing.assert_allclose(nested.numpy(), clean.sum(1).max(), rtol=1e-5)
    return count + 5
