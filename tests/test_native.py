"""The C front end (fusetree/_native.c) against its Python definitions.

``ir.node.make_op`` / ``frontend.array.wrap`` / the operators run in C when the extension is built;
``make_op_py`` and each operator's ``__wrapped__`` are the Python definitions. Nodes from both must
be the same nodes (every field but the creation counter), and the operators must fall back to Python
for everything off their fast path (broadcasts, gradient traces, deferred stores, fuse=False).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import fusetree as ft
from fusetree.frontend import array as fa
from fusetree.ir import node as nm

native = pytest.mark.skipif(nm.NATIVE is None, reason="fusetree._native is not built")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_fold(monkeypatch):
    """Slices of ``x@W + b`` pushed into both operands on the CPU too (as on CUDA), not the sum
    computed into memory first (Backend.fold_sliced_sums)."""
    from fusetree import backends

    monkeypatch.setattr(backends.get("cpu"), "fold_sliced_sums", False)


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
    a's, a small merge, a merge of more than 8 leaves, and Bloom false positives (64 buffers:
    masks repeat every 64 uids)."""
    f32 = np.dtype(np.float32)
    xs = [nm.make_buffer(np.ones(3, np.float32), "cpu") for _ in range(70)]
    x, y, z = xs[:3]
    a = nm.make_op("multiply", (x, y), f32, (3,), "cpu")
    c = nm.make_op("add", (y, z), f32, (3,), "cpu")
    twin = next(w for w in xs[3:] if w.mask & x.mask)  # same Bloom bit as x, another leaf
    cases = [(a, x), (a, y), (a, twin), (nm.make_op("add", (a, z), f32, (3,), "cpu"), a), (a, c), (c, a),
             (nm.make_op("tanh", (a,), f32, (3,), "cpu"), a), (a, nm.make_op("add", (twin, z), f32, (3,), "cpu"))]  # fmt: skip

    def chain(leaves):  # a tree over these leaves, in order
        t = leaves[0]
        for w in leaves[1:]:
            t = nm.make_op("add", (t, w), f32, (3,), "cpu")
        return t

    # more than 8 leaves on the right (the address table): some shared, in another order, or none
    # shared with a Bloom bit in common (64 buffers apart)
    big = chain([xs[5], y, *xs[10:20], x, xs[30]])
    cases += [(a, big), (chain(xs[3:12]), chain(xs[40:45] + xs[8:3:-1] + xs[50:52])), (chain(xs[:12]), big),
              (a, chain([twin, *(w for w in xs[20:31] if w is not twin)]))]  # fmt: skip
    # a scalar node twice among the first operand's leaves (scalars carry no Bloom bit, so
    # disjoint operands concatenate): its last index, as the Python dict gives it
    half = nm.make_scalar(0.5)
    dup = chain(
        [
            nm.make_op("multiply", (x, half), f32, (3,), "cpu"),
            nm.make_op("multiply", (y, half), f32, (3,), "cpu"),
        ]
    )
    assert [w for w in dup.leaves if w is half] == [half, half]
    cases += [(dup, chain([half, *xs[20:28], y, half]))]
    assert all(len(b.leaves) > 8 for _, b in cases[-5:])
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


# ---------------------------------------------------------------------------------------------
# the engine's plan-hit realize in C (realize_hit) and its pieces


def _leaf_fields(n: nm.Node) -> tuple:
    return (type(n), n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.device, n.flags, n.lo, n.memo,
            n.layout, n.bound, n._ptr, n._span, n.mask == 1 << (n.uid % 64))  # fmt: skip


@native
def test_make_contiguous_builds_the_python_definitions_leaf(rng):
    for dt in (np.float32, np.float64, np.int32, np.bool_, np.float16, np.complex64):
        for shape in ((3, 4), (5,), (), (2, 1, 3, 1, 1, 2)):  # (a 6-d complex key: interned on first use)
            d = np.asarray(rng.standard_normal(shape)).astype(dt)
            a = nm.NATIVE.make_contiguous(d, "cpu", shape, d.dtype)
            b = nm.make_contiguous(d, "cpu", shape, d.dtype)
            assert _leaf_fields(a) == _leaf_fields(b) and a.data is d and a.uid != b.uid


def _lock_released() -> bool:
    """Whether another thread can take the engine lock (an error left it released)."""
    import threading

    from fusetree.engine import state

    got = []
    th = threading.Thread(
        target=lambda: got.append(state.LOCK.acquire(timeout=2) and state.LOCK.release() is None)
    )
    th.start()
    th.join()
    return got == [True]


class _PointerBackend:
    """A backend binding views by pointer arithmetic (offset_form 2, as the CUDA backend)."""

    offset_form = 2

    def view_source(self, data):
        item = data.itemsize
        estrides = tuple(s // item for s in data.strides)
        return (data.ctypes.data, *estrides), estrides

    def bind_offset(self, src_bound, offset, estrides, item, strided):
        p = src_bound[0] + offset * item
        return (p, *estrides) if strided else (p,)

    def bind(self, data, strided):
        return (
            (data.ctypes.data, *[s // data.itemsize for s in data.strides])
            if strided
            else (data.ctypes.data,)
        )


def _twin(v: nm.ViewLeaf) -> nm.ViewLeaf:
    return nm.make_view_leaf(v.source, v.fn, v.src_strides, v.offset, v.shape, v.estrides, v.dtype, v.device)


@native
def test_c_view_binding_equals_the_backends_bind_offset(rng):
    """realize_hit binds a slice of a kernel's output (the gate slices of a GEMM) from its source's
    binding in C: the same arguments as executor.bind_leaf through the backend's bind_offset, for
    the CPU's form (array, element offset, strides) and the pointer form of the CUDA backend."""
    from fusetree import backends
    from fusetree.engine import executor

    src = ft.asarray(rng.standard_normal((6, 8)).astype(np.float32))
    keys = [(slice(None), slice(2, 5)), (slice(1, None, 2), slice(None, None, -1)), (slice(None), 3),
            (slice(4, 5), slice(None)), (None, slice(None), slice(0, 8, 3))]  # fmt: skip
    for be in (backends.get("cpu"), _PointerBackend()):
        for key in keys:
            v = src[key]._node
            assert type(v) is nm.ViewLeaf
            for strided in (True, False):
                x, y = _twin(v), _twin(v)
                got = nm.NATIVE.bind_leaf(be, x, strided)
                want = executor.bind_leaf(be, y, strided)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    if isinstance(w, np.ndarray):  # (the CPU's flat form of a strided view: a copy each)
                        assert g.shape == w.shape and g.dtype == w.dtype and np.array_equal(g, w)
                        assert (g.ctypes.data == w.ctypes.data) == np.shares_memory(w, src.numpy())
                    else:
                        assert g == w and type(g) is type(w), (key, strided, got, want)
                assert x.bound[strided] is got  # cached on the leaf as bind_leaf caches it


class _Counting:
    """A backend wrapper counting view_source calls (the Python source binding)."""

    def __init__(self, be):
        self.be, self.calls, self.offset_form = be, 0, be.offset_form

    def view_source(self, data):
        self.calls += 1
        return self.be.view_source(data)

    def bind_offset(self, *a):
        return self.be.bind_offset(*a)

    def bind(self, *a):
        return self.be.bind(*a)


class _DeviceArray:
    """What the pointer form reads of a CuPy array: base, flags, dtype, strides, itemsize, data.ptr."""

    def __init__(self, a):
        self.a, self.base, self.flags, self.dtype = a, None, a.flags, a.dtype
        self.strides, self.itemsize, self.shape, self.size = a.strides, a.itemsize, a.shape, a.size
        self.data = types.SimpleNamespace(ptr=a.ctypes.data)


class _DevicePointers(_PointerBackend):
    def view_source(self, data):
        item = data.itemsize
        estrides = tuple(s // item for s in data.strides)
        return (data.data.ptr, *estrides), estrides


@native
def test_c_source_binding_of_a_fresh_allocation_equals_python(rng):
    """A slice's source that is an allocation of its own (a GEMM's fresh output) is bound in C as
    executor.source_bound binds it (CPU form: its 1-D reshape, offset 0, element strides; pointer
    form: address and element strides) and remembered the same way; a view, a float16 array or
    other strides go to the Python definition."""
    from fusetree import backends
    from fusetree.engine import executor

    def leaf(src, src_strides=None):  # src[:, 2:5]
        es = src_strides or tuple(s // src.itemsize for s in src.strides)
        fn = lambda a: a[:, 2:5]
        return nm.make_view_leaf(src, fn, es, 2, (src.shape[0], 3), es, np.dtype(src.dtype), "cpu")

    fresh = rng.standard_normal((6, 8)).astype(np.float32)
    dev = _DeviceArray(rng.standard_normal((6, 8)).astype(np.float32))
    # (the CPU's flat form of a view is a view object: bound by the Python definition)
    for be, src, forms in ((_Counting(backends.get("cpu")), fresh, (True,)),
                           (_Counting(_DevicePointers()), dev, (True, False))):  # fmt: skip
        for strided in forms:
            executor.RECENT_SOURCES.clear()
            got = nm.NATIVE.bind_leaf(be, leaf(src), strided)
            c_src = executor.RECENT_SOURCES[0][1]
            assert be.calls == 0 and executor.RECENT_SOURCES[0][0]() is src  # bound in C, remembered
            executor.RECENT_SOURCES.clear()
            want_src = executor.source_bound(be, leaf(src))
            want = executor.bind_leaf(be, leaf(src), strided)
            assert be.calls == 1
            be.calls = 0
            assert len(c_src) == len(want_src) and len(got) == len(want)
            for g, w in zip((*c_src, *got), (*want_src, *want)):
                if isinstance(w, np.ndarray):
                    assert g.shape == w.shape and g.ctypes.data == w.ctypes.data
                else:
                    assert g == w and type(g) is type(w)
    # declined: a view of other memory, float16, strides other than the leaf's
    wide = rng.standard_normal((6, 16)).astype(np.float32)
    for src, es in ((wide[:, ::2], None), (fresh.astype(np.float16), None), (fresh, (4, 1))):
        be = _Counting(backends.get("cpu"))
        executor.RECENT_SOURCES.clear()
        nm.NATIVE.bind_leaf(be, leaf(src, src_strides=es), True)
        assert be.calls == 1  # (the Python definition)


@native
def test_realize_hit_runs_a_cached_plan_as_the_python_engine(rng):
    """One value, two values sharing leaves (an LSTM cell's h and c), the same value twice:
    realized in one C call once their plan is cached, equal to NumPy, registered no more."""
    from fusetree import engine

    hit = nm.NATIVE.realize_hit
    i, f, o, g, c = (ft.asarray(rng.standard_normal((4, 5)).astype(np.float32)) for _ in range(5))
    ni, nf, no, ng, nc = (x.numpy().astype(np.float64) for x in (i, f, o, g, c))

    def cell():
        c2 = ft.sigmoid(f) * c + ft.sigmoid(i) * ft.tanh(g)
        return ft.sigmoid(o) * ft.tanh(c2), c2

    def sig(z):
        return 1 / (1 + np.exp(-z))

    want_c = sig(nf) * nc + sig(ni) * np.tanh(ng)
    want_h = sig(no) * np.tanh(want_c)
    ft.evaluate(*cell())  # (the plan is made and cached here)
    ft.evaluate(i * 2.5 + c)
    before = len(engine.PENDING)
    for _ in range(2):
        hits = ft.stats()["plan_hits"]
        h, c2 = cell()
        assert hit((h, c2)) is True
        y = i * 2.5 + c
        assert hit((y, y)) is True
        assert ft.stats()["plan_hits"] == hits + 2
        for x in (h, c2, y):
            assert x._node.op == "buffer" and x._pref is None
        assert len(engine.PENDING) == before
        np.testing.assert_allclose(h.numpy(), want_h, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(c2.numpy(), want_c, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(y.numpy(), ni * 2.5 + nc, rtol=1e-6, atol=4e-6)  # (float32 rounding)
    assert hit((y,)) is True  # a buffer: nothing to do


@native
def test_realize_hit_declines_what_the_python_engine_must_do(rng, monkeypatch):
    """A live value inside the tree (stored by the same kernel), a view of a pending value, a
    reduction, queued stores, a recording trace or gradient tape, other options, a buffer beside a
    pending value: declined with nothing changed, and the Python engine gets them right."""
    from fusetree.engine import realization, state

    hit = nm.NATIVE.realize_hit
    a, b = _operands(rng)
    na, nb = a.numpy(), b.numpy()
    (a * b + 1.0).numpy(), (a * b).numpy(), ((a * b) * 3.0).numpy()  # plans cached

    t = a * b
    y = t + 1.0
    assert hit((y,)) is False and y._node.op == "add"  # t is live inside y: Python stores both
    realization.realize((y,))
    assert t._node.op == "buffer" and y._node.op == "buffer"
    np.testing.assert_allclose(t.numpy(), na * nb, rtol=1e-6)
    del t, y

    p = a * b
    v = p[1:]
    assert hit((v,)) is False and hit((p, a)) is False
    np.testing.assert_allclose(v.numpy(), (na * nb)[1:], rtol=1e-6)
    del p, v
    s = (a * b).sum(axis=1)
    assert hit((s,)) is False
    # (a float32 sum of 4 products may cancel: seed 636318671 left -0.00243 with a relative error
    # of 1.2e-5, so an absolute tolerance on the terms' scale)
    np.testing.assert_allclose(s.numpy(), (na * nb).sum(axis=1), rtol=1e-5, atol=1e-6 * np.abs(na * nb).sum())
    del s

    for attr in ("recorder", "tape"):
        z = a * b * 3.0
        monkeypatch.setattr(state.HOOK, attr, object())
        assert hit((z,)) is False and z._node.op == "multiply"
        monkeypatch.setattr(state.HOOK, attr, None)
        assert hit((z,)) is True
    with ft.options(cpu_parallel=False):  # another options object: its context is made in Python
        z = a * b * 3.0
        assert hit((z,)) is False
    with ft.options(defer_stores=True):
        tgt = ft.asarray(np.zeros((3, 4), np.float32))
        tgt[...] = a * 2.0
        z = a * b * 3.0
        assert state.STORES and hit((z,)) is False
        ft.synchronize()
    np.testing.assert_allclose(tgt.numpy(), na * 2, rtol=1e-6)


@native
@pytest.mark.parametrize("where", ["launch", "entry", "alloc"])
def test_realize_hit_raises_a_launch_error_with_nothing_changed(rng, monkeypatch, where):
    """A refused launch (the backend's launch, the kernel's entry point on the C route) or a failed
    allocation: the error reaches the caller, the value stays pending, the engine lock is free."""

    from fusetree import backends
    from fusetree.backends import cpu

    a, b = _operands(rng)
    (a * b + 2.0).numpy()
    y = a * b + 2.0
    be = backends.get("cpu")

    def refuse(*args):
        raise RuntimeError("launch refused")

    if where == "launch":
        monkeypatch.setattr(be, "flat_launch", False)
        monkeypatch.setattr(be, "launch", refuse)
    elif where == "entry":
        monkeypatch.setattr(cpu.CPULauncher, "direct", lambda self, n: refuse)
    else:
        monkeypatch.setattr(be, "fast_empty", refuse)
    with pytest.raises(RuntimeError, match="launch refused"):
        nm.NATIVE.realize_hit((y,))
    assert y._node.op == "add" and y._pref is not None
    assert _lock_released()
    monkeypatch.undo()
    np.testing.assert_allclose(y.numpy(), a.numpy() * b.numpy() + 2, rtol=1e-6)


@native
def test_pack_launch_packs_the_abi_and_calls_the_launch_function():
    """The CUDA backend's launch through C (pack_launch): every 8-byte parameter slot written as
    codegen.abi's format says, and cuLaunchKernel's arguments passed in order; here the launch
    function is a ctypes callback standing in for the driver's."""
    import ctypes

    seen = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p)  # fmt: skip

    def fake(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        seen.append((f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra))
        return 7 if f == 0xBAD else 0

    cb = proto(fake)
    fmt = b"QqdQq"
    buf = ctypes.create_string_buffer(8 * len(fmt))
    addr = ctypes.addressof(buf)
    prev = nm.NATIVE.set_launcher(ctypes.cast(cb, ctypes.c_void_p).value)
    try:
        args = [0x7F0000001000, -3, 2.5, (1 << 64) - 8, 1 << 40]
        call = (0x1234, 5, 6, 1, 256, 2, 1, 0)
        assert nm.NATIVE.pack_launch(fmt, addr, args, call, 0x99, 0x5000) == 0
        import struct

        assert list(struct.unpack("=QqdQq", buf.raw)) == args
        assert seen[-1] == (0x1234, 5, 6, 1, 256, 2, 1, 0, 0x99, 0x5000, None)
        status = nm.NATIVE.pack_launch(None, 0, None, (0xBAD, 1, 1, 1, 1, 1, 1, 0), 0, 0x5000)
        assert status == 7  # the driver's status, returned
        # NumPy integers and floats, as struct.pack_into takes them
        np_args = [np.uint64(0x7F0000002000), np.int64(-5), np.float32(0.5), np.int32(3), np.int64(7)]
        np_call = (np.int64(0x1234), np.int32(2), 1, 1, np.uint32(128), 1, 1, 0)
        assert nm.NATIVE.pack_launch(fmt, addr, np_args, np_call, 0x99, 0x5000) == 0
        assert list(struct.unpack("=QqdQq", buf.raw)) == [0x7F0000002000, -5, 0.5, 3, 7]
        assert seen[-1][:8] == (0x1234, 2, 1, 1, 128, 1, 1, 0)
        with pytest.raises(ValueError, match="4 arguments for 5"):
            nm.NATIVE.pack_launch(fmt, addr, args[:4], call, 0, 0)
        with pytest.raises(TypeError):
            nm.NATIVE.pack_launch(fmt, addr, [1.5, *args[1:]], call, 0, 0)  # a float for a pointer
    finally:
        nm.NATIVE.set_launcher(prev)


@native
def test_cpu_hits_never_take_the_cuda_launch_while_a_driver_launcher_is_set(rng):
    """With a CUDA backend's launcher set in the process (a GPU machine), a CPU plan hit that
    realize_hit hands to be.launch (float16 outputs) stays the CPU backend's: pack_direct is the
    CUDA backend's only."""
    import ctypes

    calls = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p)  # fmt: skip
    cb = proto(lambda *a: calls.append(a) or 0)
    a = ft.asarray(rng.standard_normal((4, 6)).astype(np.float16))
    (a * a + a).numpy()  # the plan
    prev = nm.NATIVE.set_launcher(ctypes.cast(cb, ctypes.c_void_p).value)
    try:
        y = a * a + a
        assert nm.NATIVE.realize_hit((y,)) is True
    finally:
        nm.NATIVE.set_launcher(prev)
    assert calls == []
    want = (a.numpy().astype(np.float32) ** 2 + a.numpy()).astype(np.float16)
    np.testing.assert_allclose(y.numpy().astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@native
def test_call_c_passes_sixteen_integer_arguments_in_order():
    """call_c (cuBLASLt's 16-argument cublasLtMatmul without ctypes' conversions): each argument
    reaches the C function as the 64-bit integer it was (None as 0, NumPy integers, negative values
    as two's complement), its int result comes back; fewer arguments leave the rest 0."""
    import ctypes

    seen = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_uint64] * 16)

    def fake(*args):
        seen.append(args)
        return -3 if args[0] == 0xBAD else 5

    cb = proto(fake)
    addr = ctypes.cast(cb, ctypes.c_void_p).value
    args = [0x7F0000001000 + 8 * i for i in range(14)] + [32 << 20, 0x99]
    assert nm.NATIVE.call_c(addr, *args) == 5
    assert list(seen[-1]) == args
    assert nm.NATIVE.call_c(addr, 0xBAD, None, np.uint64(7), np.int32(-1)) == -3
    assert seen[-1] == (0xBAD, 0, 7, (1 << 64) - 1) + (0,) * 12
    with pytest.raises(TypeError, match="at most 16"):
        nm.NATIVE.call_c(addr, *range(17))
    with pytest.raises(TypeError):
        nm.NATIVE.call_c(addr, 1.5)  # not an integer
    with pytest.raises(ValueError, match="null"):
        nm.NATIVE.call_c(0)


@native
def test_make_gemm_sum_builds_the_python_definitions_node(rng):
    for dt in (np.float32, np.float64, np.float16):
        bufs = [nm.make_buffer(rng.standard_normal((4, 4)).astype(dt), "cpu") for _ in range(4)]
        for args in (tuple(bufs[:2]), tuple(bufs)):
            a = nm.NATIVE.make_gemm_sum(args, (4, 4), np.dtype(dt))
            b = nm.make_gemm_sum_py(args, (4, 4), np.dtype(dt))
            assert (a.op, a.dtype, a.shape, a.attrs, a.key, a.leaves, a.device, a.flags, a.lo, a.memo) == (
                b.op, b.dtype, b.shape, b.attrs, b.key, b.leaves, b.device, b.flags, b.lo, b.memo)  # fmt: skip
            assert a.args == args and a.mask == 1 << (a.uid % 64) and a.uid != b.uid


@native
def test_matmul_and_broadcast_operators_in_c_match_python(rng):
    """``x @ W`` of two 2-D float arrays in memory, ``x@W + b`` with the bias's broadcast cached,
    ``c * m`` with a 0-d coefficient seen before: built in C, the nodes the Python operators build;
    every other matmul (1-D, integer, misaligned, a NumPy operand, a gradient trace, queued stores)
    goes through the Python operator."""
    x = ft.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    w = ft.asarray(rng.standard_normal((4, 5)).astype(np.float32))
    b = ft.asarray(rng.standard_normal(5).astype(np.float32))
    c0 = ft.asarray(np.float32(0.5))
    matmul_py = type(x).__matmul__.__wrapped__
    add_py = type(x).__add__.__wrapped__
    mul_py = type(x).__mul__.__wrapped__
    g, gp = x @ w, matmul_py(x, w)
    assert g._node.key == gp._node.key and g._node.op == "matmul" and g._node.args == (x._node, w._node)
    add_py(gp, b), mul_py(c0, g + 0.0)  # (the broadcasts are made and cached once by Python)
    y, yp = g + b, add_py(gp, b)
    assert y._node.key == yp._node.key and y._node.args[1] is yp._node.args[1]  # the cached bias view
    m = g * 2.0
    z, zp = c0 * m, mul_py(c0, m)
    assert z._node.key == zp._node.key and z._node.shape == (3, 5)
    want = x.numpy() @ w.numpy()
    np.testing.assert_allclose(y.numpy(), want + b.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-5, atol=1e-6)
    # the Python operator's cases
    v = ft.asarray(rng.standard_normal(4).astype(np.float32))
    np.testing.assert_allclose((x @ v).numpy(), x.numpy() @ v.numpy(), rtol=1e-5, atol=1e-6)
    i = ft.asarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    np.testing.assert_array_equal(
        (i @ ft.asarray(np.ones((4, 2), np.int32))).numpy(), i.numpy() @ np.ones((4, 2))
    )
    with pytest.raises(ft.ShapeError, match="not aligned"):
        x @ x
    np.testing.assert_allclose((x @ w.numpy()).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ft.grad(lambda x: (x @ w).sum())(x).numpy(), np.broadcast_to(w.numpy().sum(1), (3, 4)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    t = ft.asarray(np.zeros((3, 4), np.float32))
    with ft.options(defer_stores=True):
        t[...] = x * 2.0
        p = t @ w  # reads the queued target: the store is written first
        ft.synchronize()
    np.testing.assert_allclose(p.numpy(), (x.numpy() * 2) @ w.numpy(), rtol=1e-5, atol=2e-6)


@native
def test_deferred_store_queued_in_c_as_python_queues_it(rng, monkeypatch):
    """``x[...] = expr`` with stores deferred is queued in C (Array.__setitem__'s fast path): the
    same Store, owner table, sorted spans, queue watch, rebinding and counters as
    engine.stores.defer, the statement's file and line recorded; values equal NumPy after the
    flush. Not taken (the Python definition runs): another shape, dtype, a fill, no deferral."""
    from fusetree import engine
    from fusetree.engine import stores

    setitem_py = type(ft.asarray(np.zeros(1))).__setitem__.__wrapped__

    def queue(set_fn):
        xs = [ft.asarray(rng.standard_normal((5, 4)).astype(np.float32)) for _ in range(3)]
        g = ft.asarray(rng.standard_normal((5, 4)).astype(np.float32))
        want = [x.numpy() * 0.5 + g.numpy() for x in xs]
        want[1] = want[1] * 2.0  # (stored twice: the second value reads the first)
        with ft.options(defer_stores=True):
            for x in xs:
                set_fn(x, Ellipsis, x * 0.5 + g)
            set_fn(xs[1], Ellipsis, xs[1] * 2.0)
            state = [(s.owner, s.tnode, s.node.key, s.span, (os.path.basename(s.site[0]), s.site[1]), s.target is s.tnode.data,
                      s.device) for s in stores.STORES]  # fmt: skip
            tables = (
                sorted(stores._OWNERS) == sorted(id(x) for x in xs),
                list(stores._LOS),
                list(stores._HIS),
            )
            assert nm.WATCH is stores._watch and all(x._node.op != "buffer" for x in xs)
        for x, w in zip(xs, want):
            np.testing.assert_allclose(x.numpy(), w, rtol=1e-6)
        return xs, state, tables

    before = ft.stats()["stores"]
    with monkeypatch.context() as mp:
        mp.setattr(engine, "defer", lambda *a: pytest.fail("the Python defer ran"))
        c_line = inspect.currentframe().f_lineno + 1  # (the statement that queues, through the lambda)
        xs, c_state, c_tables = queue(lambda x, k, v: x.__setitem__(k, v))
    assert ft.stats()["stores"] - before == 4
    ys, py_state, py_tables = queue(setitem_py)
    assert len(c_state) == len(py_state) == 3
    for (co, ct, ck, cs, cw, ctd, cd), (po, pt, pk, ps, pw, ptd, pd), x, y in zip(c_state, py_state, xs, ys):
        assert co is x and po is y and ck == pk and ctd and ptd and cd == pd
        # the statement's file and line, found from (code, offset) when asked
        assert cw == ("test_native.py", c_line) and pw[0] == "test_native.py" and pw[1] > 0
        assert cs == ct.span and ps == pt.span
    assert c_tables[0] and py_tables[0] and c_tables[1] == sorted(c_tables[1])
    assert [h - lo for lo, h in zip(*c_tables[1:])] == [h - lo for lo, h in zip(*py_tables[1:])]
    # not queued in C: the Python definition (which stores some now)
    calls = []
    real = engine.defer
    monkeypatch.setattr(engine, "defer", lambda *a: calls.append(1) or real(*a))
    x = ft.asarray(np.ones((5, 4), np.float32))
    with ft.options(defer_stores=True):
        x[...] = x.astype(np.float64) * 2.0  # another dtype (cast by Python's prepare)
        assert len(calls) == 1
        x[...] = x[0] * 3.0  # another shape (broadcast)
    np.testing.assert_array_equal(x.numpy(), np.full((5, 4), 6.0, np.float32))
    x[...] = x * 2.0  # stores not deferred: written now
    np.testing.assert_array_equal(x.numpy(), np.full((5, 4), 12.0, np.float32))


@native
def test_c_made_op_nodes_are_freed_by_reference_counting(rng):
    """Op and scalar nodes made in C, the Arrays wrapping them and their weak references are not
    tracked by the cyclic collector (nothing they refer to refers back); with the collector off, a
    thousand eager steps, views of pending arrays and deferred-store steps leave nothing behind
    (traced allocations return to where they were)."""
    import gc
    import tracemalloc

    x = ft.asarray(rng.standard_normal((8, 8)).astype(np.float32))
    y = x * 2.0 + 1.0
    assert not gc.is_tracked(y._node) and not gc.is_tracked(y._node.args[0])  # op nodes
    assert not gc.is_tracked(y) and not gc.is_tracked(y._pref)  # the Array and its weak reference
    m = ft.asarray(np.zeros((8, 8), np.float32))

    def work():
        for _ in range(200):
            z = ft.tanh(x * 0.5 + x) * x - 1.0
            w = z[:4] * 2.0  # a view of a pending array: its _base and the source's _views list
            ft.evaluate(w)
            z.numpy()
            m[...] = m * 0.9 + z * 0.1
            ft.synchronize()

    defer = ft.options(defer_stores=True)  # (entered once: an options context is cyclic garbage)
    defer.__enter__()
    work()
    gc.disable()
    try:
        tracemalloc.start()
        work()
        base = tracemalloc.get_traced_memory()[0]
        work()
        work()
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    finally:
        gc.enable()
        defer.__exit__(None, None, None)
    assert grown < 16 * 1024, grown  # (a leaked node per step: 400 nodes, > 50 KB)


@native
def test_flush_signature_and_restore_in_c_match_python(rng):
    """A flush's plan key (engine.stores._signature) and the stored-to arrays' return to memory
    (_restore) in C equal the Python definitions: leaf uids, keys, scalar values with a float
    zero's sign, None for a tree reading a pending GEMM; arrays rebound by a later store stay."""
    from fusetree.engine import stores

    assert stores._signature is nm.NATIVE.store_signature and stores._restore is nm.NATIVE.restore_stores
    xs = [ft.asarray(rng.standard_normal((3, 4)).astype(np.float32)) for _ in range(3)]
    g = ft.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    w = ft.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    with ft.options(defer_stores=True):
        xs[0][...] = xs[0] * 0.5 + g
        xs[1][...] = xs[1] * -0.0 + 2
        xs[2][...] = xs[2] * 0.0 - g
        queued = list(stores.STORES)
        sig = stores._signature(queued)
        assert sig == stores._signature_py(queued) and sig is not None
        assert (float, -0.0, -1.0) in sig and (float, 0.0, 1.0) in sig  # (the zeros told apart)
        snapshot = [x._node for x in xs]
        ft.synchronize()
    # a tree over a pending GEMM: no key
    ys = [ft.asarray(rng.standard_normal((3, 4)).astype(np.float32)) for _ in range(2)]
    with ft.options(defer_stores=True):
        ys[0][...] = ys[0] + (g @ w)
        q = list(stores.STORES)
        assert stores._signature(q) is None and stores._signature_py(q) is None
        ft.synchronize()
    # _restore: each array its memory again (both definitions on copies of a queue's state)
    for restore in (stores._restore, stores._restore_py):
        zs = [ft.asarray(rng.standard_normal((3, 4)).astype(np.float32)) for _ in range(2)]
        with ft.options(defer_stores=True):
            zs[0][...] = zs[0] + 1.0
            zs[1][...] = zs[1] * 2.0
            q = list(stores.STORES)
            pending = [z._node for z in zs]
            zs[1]._node = pending[0]  # (as if rebound by another statement: left alone)
            stores.STORES.clear(), stores._OWNERS.clear(), stores._LOS.clear(), stores._HIS.clear()
            nm.WATCH = None
        restore(q)
        assert zs[0]._node is q[0].tnode and zs[0]._node.op == "buffer"
        assert zs[1]._node is pending[0] and zs[0]._node is not pending[0]
        zs[1]._node = q[1].tnode
    assert all(n.op != "buffer" for n in snapshot)


@native
def test_gemm_sum_computed_in_c_for_a_slice(rng, monkeypatch, no_fold):
    """The first gate slice of ``x@W + h@U + b`` runs the pending GEMM sum in C (the backend's gemm,
    the second product accumulated into the first's output, the counters, the memo) as
    realization.compute_gemm does; a backend error propagates with the engine lock released."""

    from fusetree.engine import executor

    x, h = (ft.asarray(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(2))
    w, u = (ft.asarray(rng.standard_normal((6, 8)).astype(np.float32)) for _ in range(2))
    b = ft.asarray(rng.standard_normal(8).astype(np.float32))
    want = x.numpy() @ w.numpy() + h.numpy() @ u.numpy() + b.numpy()
    (x @ w + h @ u + b)[:, 2:5].numpy()  # (the index, the bias view, the engine context made)
    before = ft.stats()
    g = x @ w + h @ u + b
    with monkeypatch.context() as mp:
        mp.setattr(executor, "compute_gemm", lambda *a: pytest.fail("the Python compute_gemm ran"))
        s = g[:, 2:5]
    after = ft.stats()
    assert after["gemms"] - before["gemms"] == 2 and after["launches"] - before["launches"] == 2
    memo = g._node.args[0].memo
    assert memo is not None and memo.shape == (4, 8)
    np.testing.assert_allclose(s.numpy(), want[:, 2:5], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g[:, 5:].numpy(), want[:, 5:], rtol=1e-5, atol=1e-5)
    from fusetree import backends

    be = backends.get("cpu")

    def broken(*a, **k):
        raise RuntimeError("gemm failed")

    monkeypatch.setattr(be, "host_matmul", broken)  # (the CPU's products, called from C)
    with pytest.raises(RuntimeError, match="gemm failed"):
        (x @ w + h @ u + b)[:, 2:5]
    assert _lock_released()
    monkeypatch.setattr(be, "host_matmul", None)  # through Backend.gemm (as on CUDA)
    monkeypatch.setattr(be, "gemm", broken)
    with pytest.raises(RuntimeError, match="gemm failed"):
        (x @ w + h @ u + b)[:, 2:5]
    assert _lock_released()


@native
def test_gemm_fold_in_c_matches_python(rng, monkeypatch):
    """``x@W + h@U`` (+ a third product) folded in C into one GEMM-sum node: the node the Python
    operator builds, equal to NumPy; products over adjacent column blocks of one array (joined into
    one longer-K product), other operators and a computed GEMM go through the Python operator."""
    x, h = (ft.asarray(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(2))
    w, u = (ft.asarray(rng.standard_normal((6, 5)).astype(np.float32)) for _ in range(2))
    ft.evaluate(x * 1.0)  # (the device's engine context exists: the C fold asks it for the backend)
    add_py = type(x).__add__.__wrapped__
    want = x.numpy() @ w.numpy() + h.numpy() @ u.numpy()
    calls = []
    real = fa._gemm_sum
    monkeypatch.setattr(fa, "_gemm_sum", lambda *a: calls.append(1) or real(*a))
    y = x @ w + h @ u
    assert calls == []  # folded in C
    yp = add_py(x @ w, h @ u)
    assert calls == [1] and y._node.key == yp._node.key and y._node.op == "matmul"
    assert y._node.args == (x._node, w._node, h._node, u._node)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    z = x @ w + h @ u + x @ u  # a sum of three products
    assert calls == [1] and len(z._node.args) == 6
    np.testing.assert_allclose(z.numpy(), want + x.numpy() @ u.numpy(), rtol=1e-5, atol=1e-5)
    # adjacent column blocks of one array: the Python operator joins them into one product
    a = ft.asarray(rng.standard_normal((4, 12)).astype(np.float32))
    bw = ft.asarray(rng.standard_normal((12, 5)).astype(np.float32))
    j = a[:, :6] @ bw[:6] + a[:, 6:] @ bw[6:]
    assert len(calls) == 2 and len(j._node.args) == 2  # (one product: K = 12)
    np.testing.assert_allclose(j.numpy(), a.numpy() @ bw.numpy(), rtol=1e-5, atol=1e-5)
    # not folded: a subtraction, a GEMM computed already
    calls.clear()
    d = x @ w - h @ u
    np.testing.assert_allclose(d.numpy(), x.numpy() @ w.numpy() - h.numpy() @ u.numpy(), rtol=1e-5, atol=1e-5)
    g = x @ w
    g[:, :2]  # (computes the GEMM)
    e = g + h @ u
    np.testing.assert_allclose(e.numpy(), want, rtol=1e-5, atol=1e-5)
    assert calls == []  # (neither reached the fold)


@native
@pytest.mark.parametrize(
    "key",
    [(slice(None), slice(0, 3)), (slice(None), slice(3, None)), (slice(1, None, 2), slice(None, None, -2)),
     (slice(None), 2), (None, slice(None), slice(1, 5)), (1,)],
)  # fmt: skip
def test_getitem_in_c_builds_the_python_views(rng, key, monkeypatch, no_fold):
    """A basic index of ``x@W + b`` (the gate slices of an LSTM step) and of memory: once its pieces
    are memoized, built in C — the nodes, view leaves and view bookkeeping of the Python
    __getitem__ — and NumPy's aliasing holds (the view follows its source's memory)."""
    x = ft.asarray(rng.standard_normal((4, 5)).astype(np.float32))
    w = ft.asarray(rng.standard_normal((5, 6)).astype(np.float32))
    b = ft.asarray(rng.standard_normal(6).astype(np.float32))
    getitem_py = type(x).__getitem__.__wrapped__
    (x @ w + b)[key]  # (Python: the index, its shape, the view geometry and the bias view memoized)
    g = x @ w + b

    def python_path(*args):
        raise AssertionError("the Python __getitem__ ran")

    with monkeypatch.context() as mp:
        mp.setattr(fa, "view_of", python_path)
        v = g[key]
    vp = getitem_py(g, key)
    assert v._node.key == vp._node.key and v._node.op == vp._node.op and v.shape == vp.shape
    for p, q in zip(v._node.args, vp._node.args):
        assert type(p) is type(q)
        if type(p) is nm.ViewLeaf:
            assert (p.source is q.source and p.offset == q.offset and p.estrides == q.estrides
                    and p.src_strides == q.src_strides and p.layout == q.layout and p.key == q.key)  # fmt: skip
        else:
            assert p is q  # the cached bias view
    assert v._base[0]() is g and v._base[1] is vp._base[1] and [r() for r in g._views] == [v, vp]
    want = (x.numpy() @ w.numpy() + b.numpy())[key]
    np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-6)
    g.numpy()  # g gets memory: the live views become views of it (NumPy's aliasing)
    g[...] = 0.0
    np.testing.assert_array_equal(v.numpy(), np.zeros_like(want))
    m = ft.asarray(rng.standard_normal((4, 6)).astype(np.float32))
    m[key]  # (Python: the view of memory cached on its buffer)
    with monkeypatch.context() as mp:
        mp.setattr(fa, "view_of", python_path)
        u = m[key]
    assert u._node is m[key]._node and u._pref is None
    m[...] = 1.0
    np.testing.assert_array_equal(u.numpy(), np.ones_like(want))


@native
def test_c_operators_flush_for_an_operand_over_a_queued_target(rng):
    """While stores are queued the C operators show each buffer operand to the store queue
    (engine.stores._watch): a view of a target taken before its store flushes the queue first (the
    new expression reads the stored data); other memory does not."""
    from fusetree.engine import state

    a, b = _operands(rng)
    (a * 2.0, a * b)  # (each dtype rule memoized)
    t = ft.asarray(np.zeros((3, 4), np.float32))
    head = t[0:2]  # a view of t's memory, taken before the store
    with ft.options(defer_stores=True):
        t[...] = a * 2.0
        assert len(state.STORES) == 1
        unrelated = b * 3.0  # other memory: still queued
        assert len(state.STORES) == 1
        y = head * 1.0  # reads the queued target's memory: written first
        assert not state.STORES
        ft.synchronize()
    np.testing.assert_allclose(y.numpy(), a.numpy()[0:2] * 2, rtol=1e-6)
    np.testing.assert_allclose(unrelated.numpy(), b.numpy() * 3, rtol=1e-6)


@native
@pytest.mark.parametrize("shape", [(37,), (4, 9), (), (2, 3, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_realize_hit_launches_flat_cpu_kernels_as_the_backend_does(rng, monkeypatch, shape, dtype):
    """The CPU backend lets realize_hit launch its flat kernels itself (Backend.flat_launch: 1-D
    outputs from fast_empty, the entry point called directly; float16 outputs, stored as uint16,
    through be.launch): the same values either way, poisoned outputs overwritten."""
    from fusetree import backends

    be = backends.get("cpu")
    assert be.flat_launch and be.fast_empty is np.empty
    a = ft.asarray(np.asarray(rng.integers(-50, 50, shape)).astype(dtype))
    b = ft.asarray(np.asarray(rng.integers(-50, 50, shape)).astype(dtype))
    want = (a.numpy() * b.numpy() + a.numpy()).astype(dtype)
    (a * b + a).numpy()  # the plan
    got = {}
    for flat in (True, False):
        monkeypatch.setattr(be, "flat_launch", flat)
        monkeypatch.setattr(be, "fast_empty", lambda s, d: np.full(s, 7, d))  # poisoned outputs
        y = a * b + a
        assert nm.NATIVE.realize_hit((y,)) is True
        got[flat] = y.numpy()
        assert got[flat].shape == shape and got[flat].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got[flat], want)


@native
@pytest.mark.parametrize("shape", [(37,), (4, 9), (2, 3, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_realize_hit_launches_cpu_row_kernels_as_the_backend_does(rng, monkeypatch, shape, dtype):
    """A row kernel (an input read through strides: every other element of a wider array) launched
    by realize_hit itself (1-D outputs, the shape's extents after them, the entry point; be.launch
    not called) equals the be.launch route, poisoned outputs overwritten."""
    from fusetree import backends

    be = backends.get("cpu")
    a = ft.asarray(np.asarray(rng.integers(-50, 50, shape)).astype(dtype))
    wide = ft.asarray(np.asarray(rng.integers(-50, 50, (*shape[:-1], 2 * shape[-1]))).astype(dtype))
    b = wide[..., ::2]
    want = (a.numpy() * b.numpy() + a.numpy()).astype(dtype)
    (a * b + a).numpy()  # the plan
    assert "flat=False" in ft.explain(a * b + a).kernels[0].source.splitlines()[0]
    got = {}
    for direct in (True, False):
        monkeypatch.setattr(be, "flat_launch", direct)
        monkeypatch.setattr(be, "fast_empty", lambda s, d: np.full(s, 7, d))  # poisoned outputs
        real = be.launch
        if direct:
            monkeypatch.setattr(be, "launch", lambda *a: pytest.fail("be.launch ran"))
        y = a * b + a
        assert nm.NATIVE.realize_hit((y,)) is True
        monkeypatch.setattr(be, "launch", real)
        got[direct] = y.numpy()
        assert got[direct].shape == shape and got[direct].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got[direct], want)


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_sliced_gemm_sum_with_a_bias_is_computed_into_memory_on_the_cpu(rng, path, monkeypatch):
    """On the CPU (Backend.fold_sliced_sums) the first slice of ``x@W + h@U + b`` computes the sum
    into memory with one NumPy add — the array becomes a buffer, as a GEMM does before a view of
    it — in C and in Python alike, and every slice is a view of that memory. A value built from
    the sum before keeps it; a view of it made before aliases the memory; a jit recording, a
    gradient trace and queued stores take the pushed-down slices instead."""
    x, h = (ft.asarray(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(2))
    w, u = (ft.asarray(rng.standard_normal((6, 8)).astype(np.float32)) for _ in range(2))
    b = ft.asarray(rng.standard_normal(8).astype(np.float32))
    want = x.numpy() @ w.numpy() + h.numpy() @ u.numpy() + b.numpy()
    if path == "c" and nm.NATIVE is None:
        pytest.skip("fusetree._native is not built")
    py = getattr(type(x).__getitem__, "__wrapped__", type(x).__getitem__)  # (the Python definition)
    getitem = type(x).__getitem__ if path == "c" else py
    k1, k2 = (slice(None), slice(2, 5)), (slice(None), slice(5, None))
    py(x @ w + h @ u + b, k1), py(x @ w + h @ u + b, k2)  # (the indexes and view geometry memoized)
    z = x @ w + h @ u + b
    y = z * 2.0  # built from the pending sum before the slice
    t = z.T  # a view of it before
    with monkeypatch.context() as mp:
        if path == "c":
            mp.setattr(fa, "view_of", lambda *a: pytest.fail("the Python __getitem__ ran"))
        s1, s2 = getitem(z, k1), getitem(z, k2)
    assert z._node.op == "buffer" and s1._node.op == s2._node.op == "buffer" and s1._pref is None
    assert s1._node.source is z._node.data and getitem(z, k1)._node is s1._node  # a cached view of it
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s1.numpy(), z.numpy()[k1])
    np.testing.assert_array_equal(s2.numpy(), z.numpy()[k2])
    np.testing.assert_allclose(y.numpy(), 2 * want, rtol=1e-5, atol=1e-5)
    z[...] = 0.0  # NumPy's aliasing: the earlier view and the slices follow the memory
    assert not t.numpy().any() and not s1.numpy().any()
    # a GEMM sum computed before (held and realized) is read, not overwritten by the bias
    g = x @ w + h @ u
    z = g + b
    g.numpy()
    assert z._node.args[0].memo is not None
    np.testing.assert_allclose(getitem(z, k1).numpy(), want[k1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.numpy(), want - b.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-5, atol=1e-5)
    # not while recording, tracing or queueing: the slices are pushed into both operands
    jf = ft.jit(lambda x, h, w, u, b: getitem(x @ w + h @ u + b, k1) * 1.0)
    for _ in range(3):
        np.testing.assert_allclose(jf(x, h, w, u, b).numpy(), want[k1], rtol=1e-5, atol=1e-5)
    gw = ft.grad(lambda w: ft.sum(getitem(x @ w + h @ u + b, k1) ** 2))(w)
    np.testing.assert_allclose(gw.numpy(), x.numpy().T[:, :] @ np.pad(2 * want[k1], ((0, 0), (2, 3))),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    m = ft.asarray(np.ones((3,), np.float32))
    z = x @ w + h @ u + b
    with ft.options(defer_stores=True):
        m[...] = m * 2.0  # (queued)
        q = getitem(z, k1)
        assert z._node.op == "add" and q._node.op == "add"
        np.testing.assert_allclose(q.numpy(), want[k1], rtol=1e-5, atol=1e-5)
    ft.synchronize()
    np.testing.assert_array_equal(m.numpy(), np.full(3, 2.0, np.float32))


@native
def test_traced_operators_record_the_python_operators_entries(rng, monkeypatch):
    """While a gradient is traced, the C operators (same shapes, a Python scalar on either side, a
    cached broadcast, a one-operand function, a GEMM below a scalar product) build the Python
    operators' nodes and append the same trace entries (a broadcast operand as given, before its
    view); the gradients agree with the Python operators' and with float64 finite differences."""
    from fusetree.frontend import autodiff as ad

    x = ft.asarray(rng.standard_normal((3, 4)))
    b = ft.asarray(rng.standard_normal(4))
    w = ft.asarray(rng.standard_normal((4, 4)))
    c = ft.asarray(rng.standard_normal(4))  # a constant (not differentiated): the same leaf in the trace
    (x + c).numpy()  # (its broadcast view cached: the C operator's broadcast case)

    def f(x, b, w):
        y = ft.tanh(x) * x + 0.5
        z = 2.0 - y * (x + b) + c
        return ft.sum(ft.sigmoid(z) * z + (x @ w) * 0.1)

    def entries(tape):
        return [
            (op, tuple(n.key for n in ins), attrs, out.key) for op, ins, attrs, out in tape if op != "alias"
        ]

    python_built: list[str] = []

    def trace(count_python):
        with monkeypatch.context() as mp:
            if count_python:  # which ops took the Python operator (it builds through _build)
                real = fa._build
                mp.setattr(
                    fa, "_build", lambda name, *a, **k: python_built.append(name) or real(name, *a, **k)
                )
            _, tape, _, _ = ad._trace(f, (x, b, w), (0, 1, 2), {})
        return tape

    f(x, b, w).numpy()  # (the dtype rules memoized: a first use takes the Python operator)
    c_tape = trace(count_python=True)
    # only the broadcast of the traced (fresh) leaf b, whose broadcast view is not cached (the
    # constant c's is: C, recorded with c itself as the operand)
    assert python_built == ["add"], python_built
    saved = {m: v for m, v in vars(fa.Array).items() if type(v) is type(fa.Array.__mul__)}
    try:
        for m, op in saved.items():
            setattr(fa.Array, m, op.__wrapped__)
        monkeypatch.setattr(ft, "tanh", ft.tanh.__wrapped__)
        monkeypatch.setattr(ft, "sigmoid", ft.sigmoid.__wrapped__)
        py_tape = trace(count_python=False)
        g_py = ft.grad(f, argnums=(0, 1, 2))(x, b, w)
    finally:
        for m, op in saved.items():
            setattr(fa.Array, m, op)
    monkeypatch.undo()
    assert entries(c_tape) == entries(py_tape) and len(c_tape) == len(py_tape)
    assert len(c_tape.whole) == len(py_tape.whole) and len(c_tape.produced) == len(py_tape.produced)
    g_c = ft.grad(f, argnums=(0, 1, 2))(x, b, w)
    nx, nb, nw = x.numpy(), b.numpy(), w.numpy()
    eps = 1e-6

    def fn(nx, nb, nw):
        y = np.tanh(nx) * nx + 0.5
        z = 2.0 - y * (nx + nb) + c.numpy()
        return np.sum(z / (1 + np.exp(-z)) + (nx @ nw) * 0.1)

    for k, (gc, gp) in enumerate(zip(g_c, g_py)):
        np.testing.assert_allclose(gc.numpy(), gp.numpy(), rtol=1e-12, atol=1e-12)
        args = [nx.copy(), nb.copy(), nw.copy()]
        num = np.zeros_like(args[k])
        for i in np.ndindex(num.shape):
            hi = [a.copy() for a in args]
            lo = [a.copy() for a in args]
            hi[k][i] += eps
            lo[k][i] -= eps
            num[i] = (fn(*hi) - fn(*lo)) / (2 * eps)
        np.testing.assert_allclose(gc.numpy(), num, rtol=1e-5, atol=1e-6)
