"""GPU tests (pytest -m gpu; skipped without a CUDA GPU): the reference and hypothesis suites on
CuPy arrays with poisoned outputs and fresh random inputs, the LSTM step, caches and interop."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from lstm_ref import lstm_step, make_inputs, reference, rel_err
from test_random_trees import SHAPED_TREES, check_tree
from util import assert_matches, draw, float16_rounding_cases

import fusetree as ft
from fusetree.ir.ops import OPS

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[1]
DTYPES = ("bool", "int8", "int32", "uint8", "int64", "float16", "float32", "float64")


def _ref(name, *xs):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(OPS[name].ref(*xs))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(n for n in OPS if n != "astype"))
def test_op_on_gpu_poisoned(name, dtype, rng):
    import cupy as cp

    d = OPS[name]
    xs = [draw(rng, (33, 17) if k == 0 else (17,), dtype, d.domain) for k in range(d.arity)]
    if name == "where":
        xs[0] = rng.random((33, 17)) < 0.5
    if name == "power" and np.dtype(dtype).kind in "iu":
        xs[1] = np.abs(xs[1]) % 4
    try:
        want = _ref(name, *[x[::-1] if x.ndim == 2 else x for x in xs])
    except (TypeError, ValueError):
        with pytest.raises(ft.DTypeError):
            ft.FUNCTIONS_BY_NAME[name](*[ft.asarray(cp.asarray(x)) for x in xs])
        return
    args = [ft.asarray(cp.asarray(x))[::-1] if x.ndim == 2 else ft.asarray(cp.asarray(x)) for x in xs]
    expr = ft.FUNCTIONS_BY_NAME[name](*args)
    fresh = expr.numpy()
    scale = max([1.0] + [float(np.abs(x.astype(np.float64)).max()) for x in xs if x.dtype.kind == "f"])
    assert_matches(fresh, want, d.ulps, scale, f"{name}({dtype}) fresh")
    # poisoned out[...] = target, strided
    poison = cp.full(
        (want.shape[0], want.shape[1] * 2), np.nan if want.dtype.kind == "f" else 77, dtype=want.dtype
    )
    target = ft.asarray(poison)
    target[:, ::2] = ft.FUNCTIONS_BY_NAME[name](*args)
    got = cp.asnumpy(poison)
    assert_matches(got[:, ::2], want, d.ulps, scale, f"{name}({dtype}) out=")
    if want.dtype.kind == "f":
        assert np.isnan(got[:, 1::2]).all()


@settings(max_examples=150, deadline=None)
@given(out_shape=SHAPED_TREES)
def test_random_trees_on_gpu(out_shape):
    check_tree(out_shape[1], "cuda")


@pytest.mark.parametrize("api", ["cublaslt", "cublas"])
def test_gemm_layouts_on_gpu(api, rng):
    """Products through cuBLASLt (the algorithm chosen once per problem) and through cuBLAS: float32
    and float64, row- and column-major (transposed) operands, 1-D operands, an accumulated pair
    (``x @ W + h @ U``), a repeated problem (the cached plan), into a poisoned ``out``; checked
    against float64 NumPy."""
    import cupy as cp

    from fusetree import backends

    be = backends.get("cuda")
    saved = be._lt
    be._lt = False if api == "cublas" else None
    try:
        for dt, tol in ((np.float32, 2e-5), (np.float64, 1e-12)):
            for m, k, n in ((5, 7, 3), (64, 512, 2048), (1, 33, 1)):
                A = rng.standard_normal((m, k)).astype(dt)
                B = rng.standard_normal((k, n)).astype(dt)
                want = A.astype(np.float64) @ B.astype(np.float64)
                for a in (cp.asarray(A), cp.asfortranarray(cp.asarray(A))):
                    for b in (cp.asarray(B), cp.asarray(np.ascontiguousarray(B.T)).T):
                        for _ in range(2):  # the second call reuses the problem's plan
                            out = cp.full((m, n), cp.nan, dt)
                            be.gemm(a, b, out=out)
                            assert rel_err(out.get(), want) < tol, (api, dt, m, k, n)
                got = be.gemm(cp.asarray(A[0]), cp.asarray(B)).get()  # 1-D @ 2-D
                assert rel_err(got, want[0]) < tol
            x, W = rng.standard_normal((8, 16)).astype(dt), rng.standard_normal((16, 12)).astype(dt)
            h, U = rng.standard_normal((8, 4)).astype(dt), rng.standard_normal((4, 12)).astype(dt)
            fx, fW, fh, fU = (ft.asarray(cp.asarray(v)) for v in (x, W, h, U))
            ft.reset_stats()
            got = (fx @ fW + fh @ fU).numpy()
            assert ft.stats()["gemms"] == 2
            want = x.astype(np.float64) @ W + h.astype(np.float64) @ U
            assert rel_err(got, want) < tol
            # sum_t H[t].T @ G[t] over adjacent row blocks: one GEMM with K = 5 * 8 (join_k)
            Hs, G = rng.standard_normal((40, 6)).astype(dt), rng.standard_normal((40, 9)).astype(dt)
            fH, fG = ft.asarray(cp.asarray(Hs)), ft.asarray(cp.asarray(G))
            ft.reset_stats()
            acc = fH[:8].T @ fG[:8]
            for t in range(1, 5):
                acc = acc + fH[8 * t : 8 * t + 8].T @ fG[8 * t : 8 * t + 8]
            got = acc.numpy()
            assert ft.stats()["gemms"] == 1
            assert rel_err(got, Hs.astype(np.float64).T @ G) < tol
    finally:
        be._lt = saved


def test_complex_unfused_and_default_device_on_gpu(rng):
    """Complex arrays on CUDA run CuPy's functions (no host round trip: results stay CuPy-backed);
    ``ft.options(device="cuda")`` puts Python objects and creation functions on the GPU."""
    import cupy as cp

    z = (rng.standard_normal(50) + 1j * rng.standard_normal(50)).astype(np.complex64)
    r = rng.standard_normal(50).astype(np.float32)
    fz, fr = ft.asarray(cp.asarray(z)), ft.asarray(cp.asarray(r))
    y = ft.exp(fz * fr + 1j) / (fz + 2)
    assert y.device == "cuda" and isinstance(y.data, cp.ndarray) and y.dtype == np.complex64
    np.testing.assert_allclose(y.numpy(), np.exp(z * r + 1j) / (z + 2), rtol=1e-5)
    np.testing.assert_allclose(ft.sum(ft.abs(fz)).numpy(), np.abs(z).sum(), rtol=1e-5)
    with ft.options(device="cuda"):
        made = [ft.asarray([1.0, 2.0]), ft.zeros(3), ft.arange(4), ft.asarray([1j])]
        negz = [ft.asarray(-0.0), ft.full((3,), -0.0), ft.asarray(np.array([-0.0, 1.0]), device="cuda")]
        w = ft.zeros(2)
        w[0] = -0.0
        negz.append(w[:1])
    for a in negz:  # CuPy fills zeros with memset (+0.0): fusetree copies -0.0 bit for bit
        assert a.device == "cuda" and np.signbit(a.numpy().reshape(-1)[0]), a
    assert all(a.device == "cuda" and isinstance(a.data, cp.ndarray) for a in made)
    np.testing.assert_array_equal((made[2] * 2).numpy(), [0, 2, 4, 6])


def test_lstm_step_gpu_two_gemms_one_kernel(rng):
    import cupy as cp

    for B, H in [(64, 512), (128, 512), (7, 33)]:
        inputs = make_inputs(rng, B, H)
        args = [ft.asarray(cp.asarray(a)) for a in inputs]
        ft.reset_stats()
        h2, c2 = lstm_step(*args, xp=ft)
        ft.evaluate(h2, c2)
        s = ft.stats()
        assert s["gemms"] == 2 and s["kernels"] == 1 and s["launches"] == 3, s
        hr, cr = reference(*inputs)
        assert rel_err(h2.numpy(), hr) < 1e-5 and rel_err(c2.numpy(), cr) < 1e-5
        assert isinstance(h2.data, cp.ndarray) and h2.device == "cuda"
    ft.reset_stats()
    inputs = make_inputs(rng, 96, 512)
    h2, c2 = lstm_step(*[ft.asarray(cp.asarray(a)) for a in inputs], xp=ft)
    ft.evaluate(h2, c2)
    assert ft.stats()["compiles"] == 0


def test_launches_from_another_thread_on_gpu(rng):
    """Kernels launch through CuPy's Cython cuLaunchKernel binding; from a fresh thread (where the
    driver's current context may be unset: made current, then retried) results are right, and a
    kernel compiled there loads its module (the context made current first: it raised
    CUDA_ERROR_INVALID_CONTEXT, 201, before)."""
    import threading

    import cupy as cp

    a, b = (rng.standard_normal(3000).astype(np.float32) for _ in range(2))
    da, db = cp.asarray(a), cp.asarray(b)
    got: list = []

    ft.evaluate(ft.asarray(da) * ft.asarray(db) + 1.0)  # compiled and loaded in this thread

    def work() -> None:
        try:
            y = ft.asarray(da) * ft.asarray(db) + 1.0
            ft.evaluate(y)  # launches in this thread
            # a kernel no test compiles: compiled and its module loaded in the fresh thread
            z = ft.sin(ft.asarray(da) * 0.8125) * ft.asarray(db) - 2.375
            ft.evaluate(z)
            got.append(y.numpy())
            got.append(z.numpy())
        except BaseException as e:  # re-raised below, in the test's thread
            got.append(e)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    if isinstance(got[-1], BaseException):
        raise got[-1]
    # float32 a*b+1 (fused or not) against float64: absolute error ~1e-7 where a*b+1 is near 0
    np.testing.assert_allclose(got[0], a.astype(np.float64) * b + 1.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        got[1], np.sin(a.astype(np.float64) * 0.8125) * b - 2.375, rtol=1e-5, atol=1e-5
    )


def test_failed_launch_names_the_kernel_on_gpu():
    """A launch the driver refuses (an empty grid) raises DeviceError naming the kernel and the
    driver's error; nothing else changes (the next launch of the kernel runs)."""
    import cupy as cp

    from fusetree import backends
    from fusetree.backends.cuda import CUDAKernel, Params
    from fusetree.engine import kernels
    from fusetree.errors import DeviceError

    x = ft.asarray(cp.arange(8, dtype=cp.float32))
    np.testing.assert_array_equal((x * 3.0 - 1.0).numpy(), np.arange(8) * 3.0 - 1.0)
    be = backends.get("cuda")
    k = next(v for v in kernels._CACHE.values() if isinstance(v, CUDAKernel))
    bad = Params(k.buf, k.params, k.args, (k.func, 0, 1, 1, 1, 1, 1, 0), k.name)  # an empty grid
    with pytest.raises(DeviceError, match=re.escape(f"cuLaunchKernel({k.name})")):
        be.launch_params(bad)
    np.testing.assert_array_equal((x * 3.0 - 1.0).numpy(), np.arange(8) * 3.0 - 1.0)


def test_interop_zero_copy():
    import cupy as cp

    a = cp.arange(12, dtype=cp.float32).reshape(3, 4)
    x = ft.asarray(a)
    assert x.device == "cuda" and x.data.data.ptr == a.data.ptr
    y = ft.exp(x) + 1
    back = cp.asarray(y)  # __cuda_array_interface__
    np.testing.assert_allclose(cp.asnumpy(back), np.exp(np.arange(12).reshape(3, 4)) + 1, rtol=1e-6)
    try:
        import torch

        t = torch.arange(6, dtype=torch.float32, device="cuda")
        z = (ft.asarray(t) * 2).numpy()
        np.testing.assert_array_equal(z, np.arange(6) * 2)
        assert torch.from_dlpack(y).shape == (3, 4)
    except ImportError:
        pass
    with pytest.raises(ft.DeviceError, match="different devices"):
        x + ft.asarray(np.ones((3, 4), np.float32))


def test_gpu_cache_and_disk_cache(tmp_path):
    code = (
        "import cupy as cp, fusetree as ft\n"
        "x = ft.asarray(cp.ones((5, 7), cp.float32))\n"
        "y = (ft.tanh(x * 3.5) + ft.sigmoid(x[:, ::-1])).numpy()\n"
        "print(ft.stats()['compiles'], ft.stats()['disk_hits'])\n"
    )
    env = dict(os.environ, FUSETREE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    out = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in out), out[0].stderr + out[1].stderr
    assert out[0].stdout.split() == ["1", "0"] and out[1].stdout.split() == ["1", "1"], [
        r.stdout for r in out
    ]
    assert (tmp_path.stat().st_mode & 0o777) == 0o700
    # a corrupted entry is detected and rebuilt
    for f in tmp_path.glob("*.json"):
        f.write_text(f.read_text()[:-20])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["1", "0"], r.stdout + r.stderr


def test_float16_and_bool_on_gpu(rng):
    import cupy as cp

    a = rng.standard_normal((64, 3)).astype(np.float16)
    x = ft.asarray(cp.asarray(a))
    got = (ft.exp(x) * 2 > 1).numpy()
    np.testing.assert_array_equal(got, np.exp(a) * 2 > 1)
    h = (x * 2 + 1).numpy()
    assert h.dtype == np.float16
    np.testing.assert_allclose(h, a * 2 + 1, rtol=1e-3)
    d = float16_rounding_cases(rng)  # float64 -> float16 in one rounding, bit for bit
    with np.errstate(all="ignore"):
        want = d.astype(np.float16)
    got = ft.asarray(cp.asarray(d)).astype("float16").numpy()
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint16)[ok], want.view(np.uint16)[ok])


def test_jit_lstm_on_gpu(rng):
    import cupy as cp

    @ft.jit
    def step(x, h, c, Wx, Wh, b):
        return lstm_step(x, h, c, Wx, Wh, b, xp=ft)

    inputs = make_inputs(rng, 64, 512)
    x, h, c, Wx, Wh, b = (ft.asarray(cp.asarray(a)) for a in inputs)
    ft.reset_stats()
    fh, fc, eh, ec = h, c, h, c
    for _ in range(20):
        fh, fc = step(x, fh, fc, Wx, Wh, b)
        eh, ec = lstm_step(x, eh, ec, Wx, Wh, b, xp=ft)
    s = ft.stats()
    assert s["traces"] == 1 and s["replays"] == 19, s
    np.testing.assert_array_equal(fh.numpy(), eh.numpy())
    np.testing.assert_array_equal(fc.numpy(), ec.numpy())


# -- reductions ------------------------------------------------------------------------------


# every dtype runs every kind on the CPU and in the CUDA simulator; on the GPU each dtype compiles
# ~400 kernels (~100 s on the H200), so the GPU run keeps one of each family (int32, int64 and
# float32 ride on int8, uint64 and the float32 pattern/large-reduction tests)
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint64", "float16", "float64"])
def test_reductions_every_kind_on_gpu(dtype, rng):
    import reduce_cases as rc

    assert rc.check_kinds("cuda", rng, [(7,), (3, 4, 5), (5, 300)], [dtype]) > 0


def test_reduction_kinds_once_on_gpu(rng):
    """Every reduction kind once in float16 along a row (the quick GPU subset's reduction check;
    the test above runs every axis in five dtypes)."""
    import reduce_cases as rc

    assert rc.check_kinds("cuda", rng, [(5, 300)], ["float16"], axes=[-1]) > 0


@pytest.mark.parametrize("threads,rows", [(0, 1), (1, 1), (8, 1), (64, 1), (1024, 1), (64, 4), (0, 2)])
def test_reduction_patterns_on_gpu(threads, rows, rng):
    import reduce_cases as rc

    with ft.options(reduce_threads=threads, reduce_rows_per_block=rows):
        assert rc.check_patterns("cuda", rng, shape=(6, 40)) == 48
        assert rc.check_patterns("cuda", rng, shape=(4, 5, 700), dtypes=("float32",)) == 16
        assert rc.check_special("cuda", rng) > 0


@pytest.mark.parametrize("maxreg", [0, 48])
def test_reductions_recomputing_held_rows_on_gpu(maxreg, rng):
    """Held rows recomputed per pass (``reduce_remat``; float16 held as packed pairs), with ptxas's
    own register count and capped at 48 (spilling): every pattern along both axes, rows of one
    thread to several warps, every kind in float16."""
    import reduce_cases as rc

    with ft.options(reduce_remat=True, reduce_max_registers=maxreg):
        assert rc.check_patterns("cuda", rng, shape=(6, 40)) == 48
        assert rc.check_patterns("cuda", rng, shape=(8, 4096), dtypes=("float32", "float16")) == 32
        assert rc.check_kinds("cuda", rng, [(5, 64)], ["float16"]) > 0


def test_large_reductions_and_two_stage_on_gpu(rng):
    import cupy as cp
    import reduce_cases as rc

    for shape in [(4096, 4096), (3, 1 << 20), (1 << 22,)]:
        x = rng.standard_normal(shape).astype(np.float32)
        a = ft.asarray(cp.asarray(x))
        for kind in ("sum", "max", "argmax", "min", "any"):
            want, scale = rc._ref(kind, x, -1, False)
            rc.compare(getattr(ft, kind)(a, axis=-1).numpy(), want, scale, f"{kind}{shape}")
        rc.compare(ft.sum(a).numpy(), np.float32(x.astype(np.float64).sum()), np.abs(x).sum(), "sum all")
        ft.reset_stats()
        y = ft.softmax(a, axis=-1).numpy()
        np.testing.assert_allclose(y, rc._np_softmax(x.astype(np.float64), -1), rtol=2e-5, atol=1e-9)


def test_transposed_tiles_on_gpu(rng):
    """Kernels reading a transposed input: the wide tile path (16-byte float32, 8-byte float16,
    float64 vectors) and the scalar tile path in the same kernel (misaligned pointers, row strides
    and sizes that are not multiples of the width), at both scalar tile edges; several tiles,
    partial tiles, a batch axis, a transposed output. (Apart from test_wide_access_paths_on_gpu:
    each compiles a few hundred kernels on a cold cache.)"""
    import vector_cases

    assert vector_cases.check_transposed("cuda", rng, big=True) > 0
    with ft.options(cuda_tile=64):  # the scalar tile path at its 64 edge
        assert vector_cases.check_transposed("cuda", rng, big=True) > 0


@pytest.mark.parametrize("part", ["elementwise", "horizontal", "reductions"])
def test_wide_access_paths_on_gpu(rng, part):
    """16-byte loads/stores and their fallbacks on the GPU (real alignment: views at odd element
    offsets are misaligned here, unlike in the simulator's copies), sizes spanning many blocks;
    reductions with rows held in registers, aligned and misaligned rows. In three parts: each
    compiles a few hundred kernels on a cold cache, so the suite's slices spread them."""
    import reduce_cases as rc
    import vector_cases

    if part == "elementwise":
        assert vector_cases.check_elementwise("cuda", rng, scale=100) > 0
        return
    if part == "horizontal":
        assert vector_cases.check_horizontal("cuda", rng, scale=2) > 0
        return
    for shape in ((64, 4096), (33, 1000), (5, 16384), (7, 16388), (3, 40000)):
        # few long rows are split into two-stage reductions (several launches): launches unchecked
        assert (
            rc.check_patterns("cuda", rng, shape=shape, dtypes=("float32", "float16"), launches=False) == 32
        )
    # short rows, several per warp, row strides that leave every other row misaligned
    xs = rng.standard_normal((64, 130)).astype(np.float32)
    got = ft.softmax(ft.asarray(xs, device="cuda")[:, :128], -1).numpy()
    np.testing.assert_allclose(got, rc._np_softmax(xs[:, :128].astype(np.float64), -1), rtol=2e-5, atol=1e-9)
    x = rng.standard_normal((9, 4100)).astype(np.float32)
    a = ft.asarray(x, device="cuda")
    for lo in (0, 1, 2, 4):
        want = rc._np_softmax(x[:, lo : lo + 4096].astype(np.float64), -1)
        np.testing.assert_allclose(ft.softmax(a[:, lo : lo + 4096], -1).numpy(), want, rtol=2e-5, atol=1e-9)


# -- CUDA graphs -------------------------------------------------------------------------------


def test_graph_lstm_step_and_sequence(rng):
    import gc
    import weakref

    import cupy as cp
    from lstm_ref import NumpyXP, lstm_layer

    inputs = make_inputs(rng, 64, 512)
    x, h, c, Wx, Wh, b = (ft.asarray(cp.asarray(a)) for a in inputs)

    def body(x_, h_, c_, a, u, v):
        return lstm_step(x_, h_, c_, a, u, v, xp=ft)

    step = ft.jit(graph=True)(body)
    ft.reset_stats()
    eh, ec = h, c
    gh, gc_ = h, c
    for _ in range(10):
        gh, gc_ = step(x, gh, gc_, Wx, Wh, b)
        eh, ec = lstm_step(x, eh, ec, Wx, Wh, b, xp=ft)
    s = ft.stats()
    assert s["traces"] == 1 and s["replays"] == 9 and s["graph_launches"] == 9, s
    np.testing.assert_allclose(gh.numpy(), eh.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gc_.numpy(), ec.numpy(), rtol=1e-5, atol=1e-6)
    # inputs mutated between calls are seen
    x2 = ft.asarray(cp.asarray(rng.standard_normal((64, 512)).astype(np.float32)))
    g2, _ = step(x2, h, c, Wx, Wh, b)
    e2, _ = lstm_step(x2, h, c, Wx, Wh, b, xp=ft)
    np.testing.assert_allclose(g2.numpy(), e2.numpy(), rtol=1e-5, atol=1e-6)
    # a whole sequence: one plan, one graph
    T = 12
    X = rng.standard_normal((T, 64, 512)).astype(np.float32)
    layer = ft.jit(graph=True)(lambda X_, h_, c_, a, u, v, Y_: lstm_layer(X_, h_, c_, a, u, v, Y_, ft))
    Y = ft.asarray(cp.empty((T, 64, 512), np.float32))
    dX = ft.asarray(cp.asarray(X))
    for _ in range(3):
        Yo, co = layer(dX, h, c, Wx, Wh, b, Y)
    Y64 = np.empty((T, 64, 512))
    Yr, cr = lstm_layer(X.astype(np.float64), *[np.asarray(a, np.float64) for a in inputs[1:]], Y64, NumpyXP)
    assert rel_err(Yo.numpy(), Yr) < 1e-5 and rel_err(co.numpy(), cr) < 1e-5
    # the graph goes with the jitted function
    g = weakref.ref(next(iter(layer.plans.values())).graph)
    del layer, Yo, co
    gc.collect()
    assert g() is None


def test_out_of_memory_is_a_clear_error_and_the_library_stays_usable():
    import cupy as cp

    one = ft.asarray(cp.ones(1, np.float32))
    wide = cp.broadcast_to(cp.ones(1, np.float32), (1 << 22, 1 << 22))  # 2**44 elements: 64 TB
    with pytest.raises(ft.DeviceError, match="out of GPU memory"):
        ft.evaluate(ft.exp(one) + wide)
    with pytest.raises(ft.DeviceError, match="out of GPU memory"):
        ft.softmax(ft.exp(one) + wide, axis=1).numpy()
    big = ft.asarray(cp.ones(4, np.float32))
    y = (ft.exp(big) * 2).numpy()  # the cache and the pool still work
    np.testing.assert_allclose(y, np.exp(np.ones(4)) * 2, rtol=1e-6)


# -- in-place semantics (correctness issue) -----------------------------------------------------


def test_graph_mode_in_place_updates_reach_the_callers_arrays(rng):
    """An AdamW step over three tensors, arguments updated in place, as one CUDA graph."""
    import cupy as cp

    shapes = [(64, 33), (33,), (7, 5, 3)]
    n = len(shapes)

    def adamw(*a):
        ps, ms, vs, gs, t = a[:n], a[n : 2 * n], a[2 * n : 3 * n], a[3 * n : 4 * n], a[-1]
        for p, m, v, g in zip(ps, ms, vs, gs):
            m[...] = 0.9 * m + 0.1 * g
            v[...] = 0.999 * v + 0.001 * g * g
            p -= 1e-2 * (m / (1 - 0.9**t)) / (ft.sqrt(v / (1 - 0.999**t)) + 1e-8) + 1e-4 * p
        return ()

    step = ft.jit(graph=True)(adamw)
    P = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    M = [cp.zeros(s, np.float32) for s in shapes]
    V = [cp.zeros(s, np.float32) for s in shapes]
    P64 = [p.get().astype(np.float64) for p in P]
    M64 = [np.zeros(s) for s in shapes]
    V64 = [np.zeros(s) for s in shapes]
    ft.reset_stats()
    for _ in range(5):
        G = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        step(*[ft.asarray(x) for x in P + M + V + G], 3)  # t is static: frozen at trace time
        for p64, m64, v64, g in zip(P64, M64, V64, G):
            g64 = g.get().astype(np.float64)
            m64[...] = 0.9 * m64 + 0.1 * g64
            v64[...] = 0.999 * v64 + 0.001 * g64 * g64
            p64 -= 1e-2 * (m64 / (1 - 0.9**3)) / (np.sqrt(v64 / (1 - 0.999**3)) + 1e-8) + 1e-4 * p64
        for x, x64 in zip(P + M + V, P64 + M64 + V64):
            assert rel_err(x.get(), x64) < 1e-5
    assert ft.stats()["graph_launches"] == 4


def test_graph_mode_writes_arguments_in_place_every_call(rng):
    import cupy as cp

    @ft.jit(graph=True)
    def step(p, m, g):
        m[...] = 0.9 * m + g
        p -= 0.1 * m
        return p, m * 2

    P, M = cp.ones(1000, np.float32), cp.zeros(1000, np.float32)
    pp, mm = np.ones(1000), np.zeros(1000)
    ft.reset_stats()
    for _ in range(6):
        G = cp.asarray(rng.standard_normal(1000).astype(np.float32))
        rp, r2 = step(ft.asarray(P), ft.asarray(M), ft.asarray(G))
        mm[...] = 0.9 * mm + G.get()
        pp -= 0.1 * mm
        assert rel_err(P.get(), pp) < 1e-6 and rel_err(M.get(), mm) < 1e-6
        assert rp.data.data.ptr == P.data.ptr
        assert rel_err(r2.numpy(), mm * 2) < 1e-6
    assert ft.stats()["graph_launches"] == 5


def test_element_reads_and_augmented_assignment_on_gpu():
    import cupy as cp

    a = ft.asarray(cp.zeros((2, 3)))
    assert float(a[0, 0]) == 0.0
    a[...] = a + 1
    assert float(a[0, 0]) == 1.0 and a[1, 2].item() == 1.0
    a[0, 0] = 5
    assert float(a.data[0, 0]) == 5.0
    buf = cp.arange(6.0)
    x = ft.asarray(buf)
    v = x[::2]
    v += 100
    x[1:] += x[:-1]
    ref = np.array([100, 1, 102, 3, 104, 5.0])
    ref[1:] += ref[:-1].copy()
    np.testing.assert_array_equal(buf.get(), ref)
    i = ft.asarray(cp.arange(4))
    i <<= 3
    assert i.numpy().tolist() == [0, 8, 16, 24]


def test_program_fuzzer_every_mode_on_gpu():
    """Random programs in every mode; FUSETREE_GPU_PROGRAMS sets how many (60; the quick subset 8)."""
    import programs

    n = int(os.environ.get("FUSETREE_GPU_PROGRAMS", "60"))
    total = 0
    for seed in range(n):
        total += sum(programs.check_program(programs.random_program(seed), device="cuda").values())
    assert total > n


def test_program_regressions_on_gpu():
    """Every seed the program fuzzer once failed on (tests/test_fuzz_programs.py), on CUDA arrays."""
    import programs
    from test_fuzz_programs import NARROW_REGRESSIONS, REGRESSIONS

    for seed in sorted(REGRESSIONS):
        programs.check_program(programs.random_program(seed), device="cuda")
    for seed in sorted(NARROW_REGRESSIONS):
        programs.check_program(programs.random_program(seed, narrow=True), device="cuda")


def test_reductions_over_too_many_inputs_are_split_on_gpu(rng):
    """A softmax over 512 pending leaves (more than a CUDA kernel takes; a balanced tree, so no
    chain is deep enough to be run early) plans as several kernels, within float32 rounding."""
    import cupy as cp

    xs = [rng.standard_normal((8, 33)).astype(np.float32) for _ in range(512)]
    vals = [ft.asarray(cp.asarray(x))[::-1] for x in xs]
    want = [x[::-1].astype(np.float64) for x in xs]
    while len(vals) > 1:  # pairwise sums: depth 9, 512 leaves
        vals = [vals[k] + vals[k + 1] * 0.5 for k in range(0, len(vals), 2)]
        want = [want[k] + want[k + 1] * 0.5 for k in range(0, len(want), 2)]
    ft.reset_stats()
    got = ft.softmax(vals[0], axis=-1).numpy()
    assert ft.stats()["kernels"] > 1, ft.stats()
    e = np.exp(want[0] - want[0].max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=2e-5, atol=1e-7)


# -- jit: bound (zero-copy) graph arguments, staged GEMM operands, pytrees (jit issue) ------------


def test_graph_arguments_are_bound_not_copied(rng):
    """Arguments only fusetree's kernels touch are bound: the same arrays cost no copy, new arrays
    re-point the kernel nodes (no copy, no re-capture); a GEMM operand is staged (one copy)."""
    import cupy as cp

    @ft.jit(graph=True)
    def sgd(params, grads):
        for p, g in zip(params, grads):
            p -= 0.1 * g
        return None

    P = [cp.ones(1000, np.float32), cp.ones((7, 9), np.float32)]
    G = [cp.asarray(rng.standard_normal(p.shape).astype(np.float32)) for p in P]
    ref = [p.get().astype(np.float64) for p in P]
    for _ in range(2):  # trace, capture
        sgd([ft.asarray(p) for p in P], [ft.asarray(g) for g in G])
    ft.reset_stats()
    for _ in range(3):
        sgd([ft.asarray(p) for p in P], [ft.asarray(g) for g in G])
    s = ft.stats()
    assert (s["copies"], s["graph_node_updates"], s["graph_captures"], s["graph_launches"]) == (0, 0, 0, 3), s
    for r, g in zip(ref, G):
        r -= 5 * 0.1 * g.get()
    for p, r in zip(P, ref):
        assert rel_err(p.get(), r) < 1e-6
    P2 = [p.copy() for p in P]  # new addresses: re-pointed kernel nodes, still no copies
    sgd([ft.asarray(p) for p in P2], [ft.asarray(g) for g in G])
    s = ft.stats()
    assert s["copies"] == 0 and s["graph_node_updates"] >= 2 and s["graph_captures"] == 0, s
    for p2, p, g in zip(P2, P, G):
        assert rel_err(p2.get(), p.get() - 0.1 * g.get()) < 1e-6

    @ft.jit(graph=True)
    def layer(x, w):
        return ft.tanh(x @ w)

    w = cp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    for _ in range(3):
        x = cp.asarray(rng.standard_normal((4, 16)).astype(np.float32))
        ft.reset_stats()
        y = layer(ft.asarray(x), ft.asarray(w)).numpy()
        np.testing.assert_allclose(y, np.tanh(x.get().astype(np.float64) @ w.get()), rtol=1e-4, atol=1e-5)
    # GEMM operands are staged: w (the same array every call) is borrowed, no copy; x (a new array
    # every call) moved once, and has a private static copy since: one copy per call
    assert ft.stats()["copies"] == 1


def test_graph_gemm_operands_are_borrowed_until_they_move(rng):
    """A GEMM operand updated in place every call (a weight) is read and written by the graph in
    the caller's memory: no copies, no recapture. Passing another array gives that argument a
    private copy from then on (one recapture); the first array is never written again."""
    import cupy as cp

    @ft.jit(graph=True)
    def step(w, x):
        w[...] = w - 0.01 * (x.T @ ft.tanh(x @ w))
        return None

    X = rng.standard_normal((4, 16)).astype(np.float32)
    W = cp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    x = cp.asarray(X)
    x64 = X.astype(np.float64)

    def ref_step(w):
        return w - 0.01 * (x64.T @ np.tanh(x64 @ w))

    ref = W.get().astype(np.float64)
    for i in range(4):
        ft.reset_stats()
        step(ft.asarray(W), ft.asarray(x))
        ref = ref_step(ref)
        assert rel_err(W.get(), ref) < 1e-5, i
        if i >= 2:
            s = ft.stats()
            assert (s["copies"], s["graph_captures"], s["graph_launches"]) == (0, 0, 1), s
    W2 = W.copy()
    before = W.get()
    ref2 = ref_step(W2.get().astype(np.float64))
    ft.reset_stats()
    step(ft.asarray(W2), ft.asarray(x))
    assert ft.stats()["graph_captures"] == 1
    assert rel_err(W2.get(), ref2) < 1e-5
    np.testing.assert_array_equal(W.get(), before)  # the borrowed array of the first graph
    for arr in (W, W, W2):  # private from now on: copied in and back
        r = ref_step(arr.get().astype(np.float64))
        ft.reset_stats()
        step(ft.asarray(arr), ft.asarray(x))
        s = ft.stats()
        assert rel_err(arr.get(), r) < 1e-5 and s["graph_captures"] == 0, s


def test_jit_replay_on_the_same_arrays_and_on_others(rng):
    """A replay on the previous call's very arrays launches its argument-only kernels without
    re-patching them; other arrays in between (and back) re-patch: every call checked."""
    import cupy as cp

    @ft.jit
    def step(x, a):
        x[...] = x * a + 1.0  # reads and writes arguments only: a static launch
        return ft.exp(x * 0.01)  # a fresh output: patched every call

    a = rng.standard_normal(300).astype(np.float32)
    xs = [rng.standard_normal(300).astype(np.float32) for _ in range(2)]
    fa = ft.asarray(cp.asarray(a))
    fxs = [ft.asarray(cp.asarray(x)) for x in xs]
    refs = [x.astype(np.float64) for x in xs]
    for k in (0, 0, 0, 1, 0, 0, 1, 1, 0):
        y = step(fxs[k], fa).numpy()
        refs[k] = refs[k] * a + 1.0
        np.testing.assert_allclose(fxs[k].numpy(), refs[k], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y, np.exp(refs[k] * 0.01), rtol=1e-5)


def test_jit_quick_replay_on_gpu_follows_rebinding_and_fresh_outputs(rng):
    """From the second call on the same arrays a trace of prepared launches replays through
    Trace.quick (allocate, write the fresh pointers, launch). Alternating argument sets, a kernel
    reading another's output (softmax: a reduction and its consumer) and several results: every
    call checked against NumPy, and every result is its own memory."""
    import cupy as cp

    f = ft.jit(lambda a, b, c: a * b + c)
    g = ft.jit(lambda x, w: (ft.softmax(x * w, axis=-1), ft.tanh(x) + w))
    sets = [[rng.standard_normal((4, 33)).astype(np.float32) for _ in range(3)] for _ in range(2)]
    fts = [[ft.asarray(cp.asarray(x)) for x in s] for s in sets]
    outs = []
    for k in (0, 0, 0, 1, 1, 1, 0, 0, 1, 0):
        cp.copyto(fts[k][0]._node.data, cp.asarray(rng.standard_normal((4, 33)).astype(np.float32)))
        x, w, c = (v.numpy() for v in fts[k])
        y = f(*fts[k])
        p, t = g(fts[k][0], fts[k][1])
        outs.append((y, p, t, x, w, c))
    assert f._last.trace.quick is not None, "the quick replay was not made"
    assert f._last.trace.quick.__name__ == "one", "one launch, one result: the one-launch closure"
    for y, p, t, x, w, c in outs:
        np.testing.assert_allclose(y.numpy(), x * w + c, rtol=1e-5, atol=1e-6)
        e = np.exp(x * w - (x * w).max(-1, keepdims=True))
        np.testing.assert_allclose(p.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.numpy(), np.tanh(x) + w, rtol=1e-5, atol=1e-6)
    assert len({o[0]._node.ptr for o in outs}) == len(outs)


def test_jit_gemm_quick_replay_on_gpu(rng):
    """The short replay of a trace with GEMMs (Trace.quick: cuBLAS products, then launches
    patched with their pointers) on the GPU, checked as on the CPU (test_jit.py)."""
    import cupy as cp
    from test_jit import check_gemm_short_path

    trace = check_gemm_short_path(rng, "float32", cp.asarray, cp.asnumpy)
    assert trace.quick is not None


def test_jit_state_fed_back_on_gpu(rng):
    """A jitted LSTM step fed its own outputs: the short program (Trace.quick) writes the new
    arguments' pointers, checked against NumPy every step (test_jit.py)."""
    import cupy as cp
    from test_jit import check_fed_back_state

    f = check_fed_back_state(rng, cp.asarray)
    assert f._last.trace.quick is not None


def test_jit_reduction_quick_replay_on_gpu(rng):
    """Reduction kernels under ft.jit replayed on the same arrays and fed back (Trace.quick),
    checked against NumPy as on the CPU (test_jit.py), float32 and float16."""
    import cupy as cp
    from test_jit import check_reduction_short_path

    for dtype in ("float32", "float16"):
        f = check_reduction_short_path(rng, dtype, cp.asarray, cp.asnumpy)
        assert f._last.trace.quick is not None


def test_jit_pytrees_and_static_arguments_on_gpu(rng):
    import cupy as cp

    @ft.jit(graph=True, static_argnames=("lr",))
    def step(state, batch, lr=0.1):
        w, m = state["w"], state["m"]
        m[...] = 0.9 * m + batch[0] * batch[1]
        w -= lr * m
        return {"norm": ft.sum(w * w)}, [m * 2]

    st = {"w": cp.ones(64, np.float32), "m": cp.zeros(64, np.float32)}
    w64, m64 = np.ones(64), np.zeros(64)
    for _ in range(4):
        a, b = (cp.asarray(rng.standard_normal(64).astype(np.float32)) for _ in range(2))
        out, (m2,) = step({k: ft.asarray(v) for k, v in st.items()}, (ft.asarray(a), ft.asarray(b)), lr=0.05)
        m64 = 0.9 * m64 + a.get() * b.get()
        w64 -= 0.05 * m64
        assert rel_err(st["w"].get(), w64) < 1e-5 and rel_err(m2.numpy(), 2 * m64) < 1e-5
        assert abs(float(out["norm"]) - float(w64 @ w64)) < 1e-4 * float(w64 @ w64)


def test_deferred_stores_and_horizontal_kernels_on_gpu(rng):
    """AdamW over tensors of several sizes (one over several table rows) on CuPy arrays: deferred
    stores, same-structure parameters in one horizontal launch, eager and under ft.jit."""
    import cupy as cp

    from fusetree.engine import horizontal

    shapes = [(5,), (7, 3), (horizontal.CHUNK * 2 + 3,), (9,), (4, 3)]

    def adamw(ps, gs, ms, vs):
        for p, g, m, v in zip(ps, gs, ms, vs):
            m[...] = 0.9 * m + 0.1 * g
            v[...] = 0.999 * v + 0.001 * (g * g)
            p -= 1e-2 * m / (ft.sqrt(v) + 1e-8) + 1e-4 * p

    for mode in ("eager", "jit", "graph"):
        P = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        G = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        M = [cp.zeros(s, np.float32) for s in shapes]
        V = [cp.zeros(s, np.float32) for s in shapes]
        R = [[x.get().astype(np.float64) for x in xs] for xs in (P, G, M, V)]
        fs = [[ft.asarray(x) for x in xs] for xs in (P, G, M, V)]
        step = ft.jit(graph=mode == "graph")(adamw)
        for k in range(4):
            if k == 3:  # new parameter arrays: graph kernel nodes re-pointed, tables rebuilt
                P = [p.copy() for p in P]
                fs[0] = [ft.asarray(p) for p in P]
            ft.reset_stats()
            with ft.options(defer_stores=True):
                if mode == "eager":
                    adamw(*fs)
                else:
                    step(*fs)
            ft.synchronize()
            s = ft.stats()
            if mode == "eager":  # the same stores as the step before: the flush's cached plan
                assert s["flush_plan_hits"] == (1 if k in (1, 2) else 0), s
            if mode != "graph" or k == 0:
                assert (s["launches"], s["horizontal"]) == (2, 2), (mode, s)  # rank 1 and rank 2
            elif k == 3:
                assert s["graph_launches"] == 1 and s["graph_node_updates"] == 2 and s["copies"] == 0, s
            for p, g, m, v in zip(*R):
                m[...] = 0.9 * m + 0.1 * g
                v[...] = 0.999 * v + 0.001 * (g * g)
                p -= 1e-2 * m / (np.sqrt(v) + 1e-8) + 1e-4 * p
            for x, want in zip(P + M + V, R[0] + R[2] + R[3]):
                assert rel_err(x.get(), want) < 1e-5, mode


@pytest.mark.parametrize("mode", ["eager", "jit", "graph"])
def test_autodiff_lstm_on_gpu_matches_finite_differences(mode, rng):
    """A T=4 LSTM with cross-entropy: ft.value_and_grad on CuPy arrays, eager, under ft.jit and in
    a CUDA graph (two calls each: a trace and a replay), against float64 finite differences."""
    import cupy as cp
    from test_autodiff import NumpyXP, _xent_ft, _xent_np, lstm_loss, numeric_grad

    T, B, n_in, H, V = 4, 3, 5, 4, 6
    X = rng.standard_normal((T, B, n_in))
    tgt = np.eye(V)[rng.integers(0, V, (T, B))]
    h0, c0 = rng.standard_normal((B, H)) * 0.5, rng.standard_normal((B, H)) * 0.5
    P = [rng.standard_normal(s) * 0.5 for s in ((n_in, 4 * H), (H, 4 * H), (4 * H,), (H, V))]
    want = [
        numeric_grad(
            lambda *p: float(lstm_loss(p, X, tgt, h0, c0, NumpyXP, _xent_np)), [p.copy() for p in P], i
        )
        for i in range(len(P))
    ]

    def f(p, x, t, h, c):
        return ft.value_and_grad(lambda p: lstm_loss(p, x, t, h, c, ft, _xent_ft))(p)

    if mode != "eager":
        f = ft.jit(f, graph=mode == "graph")
    for _ in range(2):
        dev = [ft.asarray(cp.asarray(a)) for a in (X, tgt, h0, c0)]
        loss, grads = f([ft.asarray(cp.asarray(p)) for p in P], *dev)
        np.testing.assert_allclose(float(loss), lstm_loss(P, X, tgt, h0, c0, NumpyXP, _xent_np), rtol=1e-10)
        for g, w in zip(grads, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-8)


def test_char_lstm_example_trains_in_a_cuda_graph():
    r = subprocess.run(
        [sys.executable, "examples/char_lstm.py", "--device", "cuda", "--mode", "graph", "--steps", "40",
         "--hidden", "64", "--batch", "16", "--seq", "16", "--sample", "40"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("loss "))
    assert float(line.split()[3]) < float(line.split()[1]) - 0.3, line


def test_host_uploads_are_private_copies(rng):
    """ft.asarray of host memory on CUDA: small arrays are staged asynchronously (no device wait),
    large ones copied synchronously; either way the device holds the values of the call, bit for
    bit (-0.0, NaN payloads), also when the caller overwrites its array right after."""
    for shape in ((), (7,), (300, 5), (1200, 1000)):
        src = rng.standard_normal(shape).astype(np.float32)
        flat = src.reshape(-1)
        flat[:1] = -0.0
        want = src.copy()
        for view in (src, src.T):
            d = ft.asarray(view, device="cuda")
            src[...] = np.nan  # the caller reuses its memory at once
            got = d.numpy()
            np.testing.assert_array_equal(
                got.view(np.uint32), (want if view is src else want.T).view(np.uint32)
            )
            src[...] = want


def test_deep_chains_and_shared_dags_on_gpu(rng):
    """A chain deeper than config.MAX_TREE_DEPTH (eager, ft.jit, deferred stores) and a value used
    twice per step (one kernel over the DAG) on CuPy arrays."""
    import cupy as cp

    x = rng.uniform(0.5, 1.5, (33, 5)).astype(np.float32)
    want = x.copy()
    for _ in range(300):
        want = want * np.float32(0.999) + np.float32(0.01)
    y = ft.asarray(cp.asarray(x))
    for _ in range(300):
        y = y * 0.999 + 0.01
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)

    def chain(a):
        for _ in range(300):
            a = a * 0.999 + 0.01
        return a

    f = ft.jit(chain)
    for _ in range(3):
        np.testing.assert_allclose(f(ft.asarray(cp.asarray(x))).numpy(), want, rtol=1e-5)
    m = ft.asarray(cp.asarray(x))
    with ft.options(defer_stores=True):
        for _ in range(300):
            m[...] = m * 0.999 + 0.01
    np.testing.assert_allclose(m.numpy(), want, rtol=1e-5)
    y, r = ft.asarray(cp.asarray(x)), x.copy()
    for _ in range(40):
        y = y * 1.75 - y * 0.75
        r = r * np.float32(1.75) - r * np.float32(0.75)
    ft.reset_stats()
    np.testing.assert_allclose(y.numpy(), r, rtol=1e-5)
    assert ft.stats()["launches"] == 1


def test_arithmetic_views_on_gpu(rng):
    """Slices of pending GEMM outputs and of memory bound by pointer arithmetic (no CuPy view
    objects): results against NumPy, aliasing both ways."""
    import view_cases

    assert view_cases.check_arithmetic_views("cuda", rng) > 0


def test_repeated_gemms_take_the_memoized_path_on_gpu(rng):
    """A product seen before launches through its memoized plan (GemmFast): same shapes with other
    strides (a transposed operand), an accumulating second product, float64, an output view."""
    import cupy as cp

    from fusetree import backends

    be = backends.get("cuda")

    def close(got, want):  # float64 reference; sums of 24-64 products cancel, so an absolute floor
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    for dt in (np.float32, np.float64):
        for _ in range(3):  # first call: the general path; later ones: the memoized one
            a, b, c = (rng.standard_normal(s).astype(dt) for s in ((16, 24), (24, 40), (40, 24)))
            a64, b64, c64 = (x.astype(np.float64) for x in (a, b, c))
            A, B, C = cp.asarray(a), cp.asarray(b), cp.asarray(c)
            out = be.gemm(A, B)
            close(out.get(), a64 @ b64)
            be.gemm(A, C.T, out=out, accumulate=True)  # a transposed operand: another key
            close(out.get(), a64 @ b64 + a64 @ c64.T)
            big = cp.zeros((16, 80), dt)
            be.gemm(A, B, out=big[:, :40])  # a non-contiguous output view: through a temporary
            close(big.get()[:, :40], a64 @ b64)
            assert float(abs(big[:, 40:]).max()) == 0.0
    assert be._gemm_fast or not be._lt


def test_native_realize_and_view_binding_on_cuda(rng):
    """The C plan-hit realize (fusetree._native.realize_hit) on CUDA arrays: an LSTM cell's h and c
    realized by it once cached, equal to NumPy; gate slices of a GEMM output bound in C by pointer
    arithmetic equal to executor.bind_leaf through the CUDA backend's bind_offset."""
    import cupy as cp

    from fusetree import backends
    from fusetree.engine import executor
    from fusetree.ir import node as nm

    if nm.NATIVE is None:
        pytest.skip("fusetree._native is not built")
    be = backends.get("cuda")
    assert be.offset_form == 2
    src = ft.asarray(cp.asarray(rng.standard_normal((6, 8)).astype(np.float32)))
    for key in [(slice(None), slice(2, 5)), (slice(1, None, 2), slice(None, None, -1)), (slice(None), 3)]:
        v = src[key]._node
        assert type(v) is nm.ViewLeaf
        for strided in (True, False):
            twin = [nm.make_view_leaf(v.source, v.fn, v.src_strides, v.offset, v.shape, v.estrides, v.dtype,
                                      v.device) for _ in range(2)]  # fmt: skip
            assert nm.NATIVE.bind_leaf(be, twin[0], strided) == executor.bind_leaf(be, twin[1], strided)
    x, h, c, Wx, Wh, b = (ft.asarray(cp.asarray(a)) for a in make_inputs(rng, 8, 16))
    want_h, want_c = reference(*(a.numpy() for a in (x, h, c, Wx, Wh, b)))
    ft.evaluate(*lstm_step(x, h, c, Wx, Wh, b, xp=ft))  # the plan is made
    for direct in (True, True, False):  # launched by C (cuda_launch), then through be.launch
        h2, c2 = lstm_step(x, h, c, Wx, Wh, b, xp=ft)
        junk = [cp.full((8, 16), cp.nan, cp.float32) for _ in range(6)]  # the pool's next blocks: NaN
        del junk
        be.pack_direct = direct
        before = ft.stats()["launches"]
        try:
            if direct:  # C launches a memoized row-kernel launch itself: be.launch is not called
                launch, be.launch = be.launch, None
            assert nm.NATIVE.realize_hit((h2, c2)) is True
        finally:
            if direct:
                be.launch = launch
            be.pack_direct = True
        assert ft.stats()["launches"] == before + 1
        assert rel_err(h2.numpy(), want_h) < 1e-5 and rel_err(c2.numpy(), want_c) < 1e-5
