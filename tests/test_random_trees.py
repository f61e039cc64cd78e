"""Hypothesis: random expression trees (depth, broadcasting, strided views, scalars, NaN/inf) vs NumPy.

Each tree is evaluated twice, by fusetree and by NumPy (same dtypes), and compared. float16 leaves
are left out (float16 still arises from 8-bit integers through float functions); rounding and
comparison ops only see leaves, so one-ulp differences upstream cannot flip them.
"""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import fusetree as ft
from fusetree.ir.ops import OPS

DTYPES = ["float32", "float64", "int32", "int8", "uint8", "bool"]
SMOOTH_UNARY = ["negative", "absolute", "exp", "tanh", "sigmoid", "sin", "square", "arctan"]
LEAF_UNARY = ["floor", "round", "sign", "isnan", "isfinite", "logical_not", "sqrt"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "fmax", "true_divide"]
LEAF_BINARY = ["less", "greater_equal", "floor_divide", "remainder", "bitwise_and"]
SPECIAL = [0.0, -0.0, 1.5, -2.0, 3, -1, 2, float("nan"), float("inf"), True]


@st.composite
def leaf(draw, out_shape):
    nd = draw(st.integers(0, len(out_shape)))
    shape = list(out_shape[len(out_shape) - nd :])
    shape = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in shape]
    dtype = draw(st.sampled_from(DTYPES))
    steps = [draw(st.sampled_from([1, 2, -1, -2])) for _ in shape]
    base_shape = [s * abs(k) for s, k in zip(shape, steps)]
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        base = rng.random(base_shape) < 0.5
    elif dtype.startswith(("int", "uint")):
        base = rng.integers(-20 if dtype != "uint8" else 0, 20, base_shape).astype(dtype)
    else:
        base = (rng.standard_normal(base_shape) * 3).astype(dtype)
        if base.size and draw(st.booleans()):
            flat = base.reshape(-1)
            flat[rng.integers(0, flat.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf, -0.0]))
    view = base[tuple(slice(None, None, k) for k in steps)]
    return ("leaf", view)


def trees(out_shape):
    base = st.one_of(
        leaf(out_shape),
        st.tuples(st.sampled_from(LEAF_UNARY), leaf(out_shape)),
        st.tuples(
            st.sampled_from(LEAF_BINARY),
            leaf(out_shape),
            st.one_of(leaf(out_shape), st.sampled_from(SPECIAL[2:7]).map(lambda v: ("scalar", v))),
        ),
    )

    def extend(children):
        return st.one_of(
            st.tuples(st.sampled_from(SMOOTH_UNARY), children),
            st.tuples(st.sampled_from(BINARY), children, children),
            st.tuples(
                st.sampled_from(BINARY), children, st.sampled_from(SPECIAL).map(lambda v: ("scalar", v))
            ),
            st.tuples(st.just("where"), leaf(out_shape), children, children),
        )

    return st.recursive(base, extend, max_leaves=8)


def build(t, mode, memo, device=None):
    """Evaluate tree ``t`` with fusetree (mode "ft") or NumPy; a subtree object used twice is built
    once (a shared subexpression)."""
    if id(t) in memo:
        return memo[id(t)]
    out = _build(t, mode, memo, device)
    memo[id(t)] = out
    return out


def _build(t, mode, memo, device):
    kind = t[0]
    if kind == "leaf":
        return ft.asarray(t[1], device=device) if mode == "ft" else t[1]
    if kind == "scalar":
        return t[1]
    args = [build(a, mode, memo, device) for a in t[1:]]
    if mode == "ft":
        return ft.FUNCTIONS_BY_NAME[kind](*args)
    out = np.asarray(OPS[kind].ref(*args))
    if out.dtype.kind == "f":  # the least precise float intermediate sets the tolerance
        memo["bits"] = min(memo.get("bits", 64), 8 * out.dtype.itemsize)
    return out


SHAPED_TREES = (
    st.lists(st.integers(1, 4), min_size=0, max_size=3)
    .map(tuple)
    .flatmap(lambda s: st.tuples(st.just(s), trees(s)))
)


@given(out_shape=SHAPED_TREES)
def test_random_tree_matches_numpy(out_shape):
    check_tree(out_shape[1], None)


def check_tree(tree, device):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        memo: dict = {}
        try:
            want = build(tree, "np", memo)
        except (TypeError, ValueError, OverflowError) as e:  # NumPy refuses: fusetree must refuse too
            try:
                build(tree, "ft", {}, device).numpy()
            except (TypeError, ValueError, OverflowError):
                return
            raise AssertionError(f"NumPy raised {e!r} but fusetree did not") from None
        got = build(tree, "ft", {}, device)
        got = got.numpy() if isinstance(got, ft.Array) else np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        # one-ulp differences in a float16 or float32 intermediate can show in a float64 result
        tol = {16: 4e-3, 32: 1e-4}.get(memo.get("bits", 64), 1e-10)
        finite = np.isfinite(want)
        scale = float(np.max(np.abs(want[finite]), initial=1.0))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True)
