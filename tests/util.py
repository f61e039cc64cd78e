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
