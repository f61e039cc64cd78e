"""The C front end (fusetree/_native.c) against its Python definitions.

``ir.node.make_op`` / ``frontend.array.wrap`` / the operators run in C when the extension is built;
``make_op_py`` and each operator's ``__wrapped__`` are the Python definitions. Nodes from both must
be the same nodes (every field but the creation counter), and the operators must fall back to Python
for everything off their fast path (broadcasts, gradient traces, deferred stores, fuse=False).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fusetree as ft
from fusetree.frontend import array as fa
from fusetree.ir import node as nm

native = pytest.mark.skipif(nm.NATIVE is None, reason="fusetree._native is not built")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_extension_is_built_where_required():
    """CI builds the extension at install (.ci/run sets FUSETREE_REQUIRE_NATIVE=1)."""
    if os.environ.get("FUSETREE_REQUIRE_NATIVE") == "1" and os.environ.get("FUSETREE_NATIVE") != "0":
        assert nm.NATIVE is not None, "fusetree._native did not build or import"


def _same(a: nm.Node, b: nm.Node) -> None:
    for f in ("op", "dtype", "shape", "attrs", "key", "device", "flags", "mask"):
        assert getattr(a, f) == getattr(b, f), (f, getattr(a, f), getattr(b, f))
    assert type(a) is type(b)
    assert len(a.args) == len(b.args) and all(x is y for x, y in zip(a.args, b.args))
    assert len(a.leaves) == len(b.leaves) and all(x is y for x, y in zip(a.leaves, b.leaves))
    assert a.memo is None and b.memo is None
    # lo: the smallest op uid of the tree, the node's own when it is the first op
    child_lo = min([x.lo for x in a.args] + [1 << 62])
    assert a.lo == min(child_lo, a.uid) and b.lo == min(child_lo, b.uid)


@native
def test_make_op_builds_the_python_definitions_nodes(rng, monkeypatch):
    """Random trees (shared leaves, scalars, GEMM leaves, 1-4 operands) built once by each (the
    verifier off: a 4-operand op is no op of the table, the construction is what is compared)."""
    monkeypatch.setattr(nm, "VERIFY", False)
    shape = (3, 4)
    f32 = np.dtype(np.float32)
    leaves: list[nm.Node] = [
        nm.make_buffer(rng.standard_normal(shape).astype(np.float32), "cpu") for _ in range(5)
    ]
    leaves += [nm.make_scalar(0.5), nm.make_scalar(3), nm.make_matmul(leaves[0], leaves[1], shape, f32)]
    pool = list(leaves)
    for _ in range(300):
        k = int(rng.integers(1, 5))
        args = tuple(pool[int(i)] for i in rng.integers(0, len(pool), k))
        if all(a.op == "scalar" for a in args):
            continue
        op = {1: "tanh", 2: "add", 3: "where", 4: "fma_test"}[k]
        attrs = () if rng.random() < 0.7 else (int(rng.integers(3)),)
        c = nm.make_op(op, args, f32, shape, "cpu", attrs)
        p = nm.make_op_py(op, args, f32, shape, "cpu", attrs)
        _same(c, p)
        assert c.uid != p.uid
        pool.append(c if rng.random() < 0.5 else p)
    deep = nm.make_op("reduce", (pool[-1],), f32, (3,), "cpu", ("sum", (1,), False))
    assert deep.flags & nm.REDUCE and nm.make_op("expand", (deep,), f32, shape, "cpu").flags & nm.EXPAND


@native
def test_shared_leaves_merge_as_the_python_definition():
    """The merge cases make_op does in C: a tree and its own leaf (either one), b's leaves ending
    a's, a small merge, and a Bloom false positive (64 buffers: masks repeat every 64 uids)."""
    f32 = np.dtype(np.float32)
    xs = [nm.make_buffer(np.ones(3, np.float32), "cpu") for _ in range(70)]
    x, y, z = xs[:3]
    a = nm.make_op("multiply", (x, y), f32, (3,), "cpu")
    c = nm.make_op("add", (y, z), f32, (3,), "cpu")
    twin = next(w for w in xs[3:] if w.mask & x.mask)  # same Bloom bit as x, another leaf
    cases = [(a, x), (a, y), (a, twin), (nm.make_op("add", (a, z), f32, (3,), "cpu"), a), (a, c), (c, a),
             (nm.make_op("tanh", (a,), f32, (3,), "cpu"), a), (a, nm.make_op("add", (twin, z), f32, (3,), "cpu"))]  # fmt: skip
    for args in cases:
        got, want = nm.make_op("add", args, f32, (3,), "cpu"), nm.make_op_py("add", args, f32, (3,), "cpu")
        _same(got, want)
        assert nm.KEY_DESCRIPTIONS[got.key][-1] == nm.merge_leaves(args)[1]


@native
def test_make_op_keywords_and_bad_arguments_take_the_python_path():
    x = nm.make_buffer(np.ones(3, np.float32), "cpu")
    n = nm.make_op("negative", (x,), x.dtype, (3,), "cpu", attrs=())
    assert n.op == "negative" and n.leaves == (x,)
    with pytest.raises((AttributeError, TypeError)):
        nm.make_op("add", (x, "not a node"), x.dtype, (3,), "cpu")
    f = nm.NATIVE.make_float(2.5)
    assert type(f) is nm.Scalar and f.value == 2.5 and f.weak is float and f.key == nm.make_scalar(1.0).key
    with pytest.raises(TypeError, match="Python float"):
        nm.NATIVE.make_float(2)


def _operands(rng):
    a = ft.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    b = ft.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    return a, b


@native
@pytest.mark.parametrize(
    "case",
    ["a*b", "a-b", "a/b", "a<b", "a==b", "a*0.5", "0.5-a", "a*3", "2**60*a", "a/2**60", "-a", "abs(a)",
     "ft.tanh(a)", "ft.exp(a*b)", "a*b[0]", "a+True", "a*np.float32(2)", "(a@b.T)*2.0"],
)  # fmt: skip
def test_operators_match_the_python_operators(rng, case):
    """The C operator's result and the Python operator's: the same tree, the same values."""
    a, b = _operands(rng)
    na, nb = a.numpy(), b.numpy()
    got = eval(case, {"a": a, "b": b, "ft": ft, "np": np, "abs": abs})
    with ft.options(fuse=True):
        saved = {m: v for m, v in vars(fa.Array).items() if type(v) is type(fa.Array.__mul__)}
        try:
            for m, op in saved.items():
                setattr(fa.Array, m, op.__wrapped__)
            tanh, exp = ft.tanh.__wrapped__, ft.exp.__wrapped__  # type: ignore[attr-defined]
            want = eval(case, {"a": a, "b": b, "ft": type("F", (), {"tanh": tanh, "exp": exp}), "np": np,
                               "abs": abs})  # fmt: skip
        finally:
            for m, op in saved.items():
                setattr(fa.Array, m, op)
    assert got._node.key == want._node.key and got.dtype == want.dtype and got.shape == want.shape
    ref = eval(case, {"a": na, "b": nb, "ft": np, "np": np, "abs": abs})
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(want.numpy(), ref, rtol=1e-6)


@native
def test_operators_fall_back_off_the_fast_path(rng):
    a, b = _operands(rng)
    # unfused: one kernel per op (the Python operator's generic path)
    with ft.options(fuse=False):
        ft.reset_stats()
        (a * b + 1.0).numpy()
        assert ft.stats()["launches"] == 2
    # a gradient trace records every op
    g = ft.grad(lambda x: ft.sum(ft.tanh(x) * x * 2.0))(a)
    x = a.numpy().astype(np.float64)
    np.testing.assert_allclose(g.numpy(), (1 - np.tanh(x) ** 2) * x * 2 + np.tanh(x) * 2, rtol=1e-5)
    # a deferred store's target read by a later op sees the old value (the store watch)
    t = ft.asarray(np.ones((3, 4), np.float32))
    with ft.options(defer_stores=True):
        t[...] = a * 2.0
        y = t * b  # reads the stored value: flushed first
        np.testing.assert_allclose(y.numpy(), a.numpy() * 2 * b.numpy(), rtol=1e-6)
    # operator metadata comes from the Python operator
    assert fa.Array.__mul__.__name__ == "multiply" and "tanh" in repr(ft.tanh)
    assert a.__mul__(b).shape == (3, 4) and fa.Array.__mul__(a, b).shape == (3, 4)
    assert (a.__radd__(1.0)).shape == (3, 4)
    with pytest.raises(TypeError):
        ft.tanh(a, a)


@native
def test_operators_under_queued_stores_flush_before_reading(rng, monkeypatch):
    """While stores are queued the C operators show their buffer operands to the queue (as the
    Python operator's _watch does) and stay on the fast path."""
    a, b = _operands(rng)
    (a * b, 0.5 - a, -a, ft.exp(a), a * 1.0)  # each dtype rule memoized (a first use takes the generic path)
    called = []
    monkeypatch.setattr(fa, "_watch", lambda *a: called.append(a))  # the Python operator's watch
    na, nb = a.numpy(), b.numpy()
    t = ft.asarray(np.zeros((3, 4), np.float32))
    with ft.options(defer_stores=True):
        old = t * 1.0  # built before the store: reads the old value
        t[...] = a * 2.0
        assert nm.WATCH is not None
        y1 = t * b  # array-array: flushed first, reads the new value
        t[...] = a * 3.0
        y2 = 0.5 - t  # reflected scalar
        t[...] = a * 4.0
        y3 = -t  # one operand
        t[...] = a * 5.0
        y4 = ft.exp(t)
        unrelated = a * b  # reads no target: no flush
        assert nm.WATCH is not None
        ft.synchronize()
    # every op above took the C path (the stores' own checks call _watch with the stored value)
    assert not [c for c in called if len(c) != 1 or c[0] is t or c[0] is a or c[0] is b]
    np.testing.assert_array_equal(old.numpy(), np.zeros((3, 4), np.float32))
    np.testing.assert_allclose(y1.numpy(), na * 2 * nb, rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), 0.5 - na * 3, rtol=1e-6)
    np.testing.assert_allclose(y3.numpy(), -na * 4, rtol=1e-6)
    np.testing.assert_allclose(y4.numpy(), np.exp(na * 5), rtol=1e-6)
    np.testing.assert_allclose(unrelated.numpy(), na * nb, rtol=1e-6)
    np.testing.assert_allclose(t.numpy(), na * 5, rtol=1e-6)


@native
def test_a_setup_that_does_not_fit_leaves_the_module_refusing_or_falling_back(rng):
    """A stale build (a slot renamed): setup fails with a clear error, nothing half set up runs."""

    class Stale:
        __slots__ = ("op",)

    a, b = _operands(rng)
    try:
        with pytest.raises(AttributeError):
            nm.NATIVE.setup_nodes(dict(nm.NATIVE_SETUP, Node=Stale))
        with pytest.raises(RuntimeError, match="not set up"):
            nm.NATIVE.make_op("add", (a._node, b._node), a.dtype, a.shape, "cpu")
        with pytest.raises(RuntimeError, match="not set up"):
            nm.NATIVE.wrap(a._node)
        # (at import, node.py and array.py then keep their Python make_op and wrap, and warn)
    finally:
        nm.NATIVE.setup_nodes(nm.NATIVE_SETUP)
        nm.NATIVE.setup_arrays(fa.NATIVE_SETUP)
    assert (a * b)._node.op == "multiply" and nm.NATIVE.make_float(1.5).value == 1.5


@native
def test_pending_registration_and_drop(rng):
    """Arrays made in C register as pending and leave the registry when they die."""
    from fusetree import engine

    a, b = _operands(rng)
    before = len(engine.PENDING)
    y = a * b
    assert len(engine.PENDING) == before + 1 and y._pref is not None and y._pmark > y._node.uid
    del y
    assert len(engine.PENDING) == before
    z = a * b + 1.0  # the intermediate dies, the live value stays
    assert len(engine.PENDING) == before + 1
    np.testing.assert_allclose(z.numpy(), a.numpy() * b.numpy() + 1, rtol=1e-6)
    assert len(engine.PENDING) == before


@pytest.mark.skipif(os.environ.get("FUSETREE_NATIVE") == "0", reason="already the pure-Python front end")
def test_the_pure_python_front_end_passes_the_front_end_tests():
    """FUSETREE_NATIVE=0: the Python definitions run the operator, view, store, autodiff, jit and
    program-fuzzer tests (every execution mode)."""
    env = dict(os.environ, FUSETREE_NATIVE="0", PYTHONPATH=ROOT)
    tests = ["tests/test_api.py", "tests/test_views_and_assign.py", "tests/test_deferred_stores.py",
             "tests/test_autodiff.py", "tests/test_jit.py", "tests/test_fuzz_programs.py", "tests/test_native.py"]  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout
