"""Shared helpers: random inputs by op domain and dtype, poisoned outputs, tolerant comparisons."""

from __future__ import annotations

import numpy as np

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
ALL = ("bool", *INTS, *FLOATS)


def draw(rng, shape, dtype, domain="any"):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = (
            (1, 9) if domain in ("positive", "nonzero", "small") else (max(info.min, -50), min(info.max, 50))
        )
        if domain == "unit":
            lo, hi = (0, 1) if dt.kind == "u" else (-1, 1)
        a = rng.integers(lo, hi + 1, size=shape).astype(dt)
        if domain == "nonzero":
            a[a == 0] = 1
        return a
    if domain == "positive":
        a = rng.uniform(0.05, 20.0, shape)
    elif domain == "unit":
        a = rng.uniform(-1.0, 1.0, shape)
    elif domain == "small":
        a = rng.uniform(-3.0, 3.0, shape)
    elif domain == "nonzero":
        a = rng.uniform(0.1, 5.0, shape) * np.where(rng.random(shape) < 0.5, -1, 1)
    else:
        a = rng.standard_normal(shape) * 4
    return np.asarray(a).astype(dt)


def float16_rounding_cases(rng, n=2000):
    """float64 values where rounding to float16 through float32 (two roundings) goes wrong: exact
    halfway points between float16 neighbours (normal and subnormal) and points a float32 rounding
    would move onto them, plus the range's edges and special values."""
    h = np.concatenate([rng.uniform(-3, 3, n), rng.uniform(-1e-4, 1e-4, n), rng.uniform(-6.5e4, 6.5e4, n)])
    h = h.astype(np.float16).astype(np.float64)
    half = np.maximum(np.abs(h) * 2.0**-11, 2.0**-25)  # half a float16 quantum (ties), at least 2**-25
    near = [h + half * (1 + s * 2.0**-k) for s in (-1, 1) for k in (30, 45)]
    edges = [
        1e-8,
        3e-8,
        2.0**-25,
        6e-5,
        65519.99,
        65520.0,
        65519.999999,
        1e300,
        np.inf,
        np.nan,
        0.0,
        2.2910156250000004,
    ]
    x = np.concatenate([h + half, h - half, *near, edges, -np.asarray(edges)])
    return x


def eps(dt):
    dt = np.dtype(dt)
    return float(np.finfo(dt).eps) if dt.kind == "f" else 0.0


def assert_matches(got, want, ulps=4.0, scale=1.0, err_msg=""):
    """Exact for integers/bools; for floats within ``ulps`` of the result dtype, NaN == NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape, err_msg)
    assert got.dtype == want.dtype, (got.dtype, want.dtype, err_msg)
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
        return
    e = eps(got.dtype) * ulps
    g, w = got.astype(np.float64), want.astype(np.float64)
    # reference is finite but kernel overflowed (or the reverse) only at the dtype's edge
    np.testing.assert_allclose(g, w, rtol=e, atol=e * scale, equal_nan=True, err_msg=err_msg)
