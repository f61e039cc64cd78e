"""The CUDA target's generated kernels run in numba's CUDA simulator (own process, tiny arrays)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys, warnings
import numpy as np
sys.path.insert(0, "tests")
import fusetree as ft
from fusetree.ir.ops import OPS
from lstm_ref import lstm_step, make_inputs, reference, rel_err
from util import assert_matches, draw
warnings.simplefilter("ignore")
rng = np.random.default_rng(0)
D = "cuda-sim"
checked = 0
PART = sys.argv[1]
# SEMANTICS
for name, d in sorted(OPS.items()) if PART == "ops" else ():
    if name in ("astype",):
        continue
    for dt in ("int16", "float32", "float64", "bool"):
        xs = [draw(rng, (3, 4) if k == 0 else (4,), dt, d.domain) for k in range(d.arity)]
        if name == "where":
            xs[0] = rng.random((3, 4)) < 0.5
        try:
            with np.errstate(all="ignore"):
                want = np.asarray(d.ref(*xs))
        except (TypeError, ValueError):
            continue
        got = ft.FUNCTIONS_BY_NAME[name](*[ft.asarray(x, device=D)[::-1] if x.ndim == 2 else ft.asarray(x, device=D) for x in xs]).numpy()
        with np.errstate(all="ignore"):
            want = np.asarray(d.ref(*[x[::-1] if x.ndim == 2 else x for x in xs]))
        assert_matches(got, want, d.ulps, 20.0, f"{name}({dt})")
        checked += 1
if PART == "reductions":
    import reduce_cases as rc

    checked += rc.check_special(D, rng)
    checked += rc.check_patterns(D, rng, shape=(3, 10), dtypes=("float32", "float16"))
    checked += rc.check_kinds(D, rng, [(2, 3, 4)], ["float32", "int16", "bool"])
    with ft.options(reduce_threads=128):  # four warps per row: the second butterfly over 4 partials
        x4 = rng.standard_normal((2, 300)).astype(np.float32)
        x4[1, 17] = np.nan
        a4 = ft.asarray(x4, device=D)
        e = np.exp(x4 - x4.max(-1, keepdims=True))
        np.testing.assert_allclose(ft.softmax(a4, -1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, err_msg="4 warps")
        x4[1, 17] = 0.0
        a4 = ft.asarray(x4, device=D)
        assert (ft.argmin(a4, axis=1).numpy() == x4.argmin(1)).all(), "argmin, 4 warps"
        np.testing.assert_allclose(ft.sum(a4, axis=1).numpy(), x4.sum(1), rtol=1e-5, err_msg="sum, 4 warps")
        checked += 3
if PART == "warps":  # (each simulated thread is a Python thread: 64 per row take their time)
    import reduce_cases as rc

    with ft.options(reduce_threads=64):  # several warps per row: the shared-memory exchange
        checked += rc.check_patterns(D, rng, shape=(2, 70), dtypes=("float32",), axes=(-1,))
        # rows shorter than their threads (most lanes hold nothing): 3 rows, not 70 (each row
        # is 64 simulated Python threads; axis 0 of the (2, 70) array took ~95% of this part)
        checked += rc.check_patterns(D, rng, shape=(2, 3), dtypes=("float32",), axes=(0,))
    with ft.options(reduce_threads=64, reduce_rows_per_block=2):  # two rows per block, the last alone
        xr = rng.standard_normal((3, 70)).astype(np.float32)
        got = ft.softmax(ft.asarray(xr, device=D), -1).numpy()
        e = np.exp(xr - xr.max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, err_msg="softmax, 2 rows per block")
        checked += 1
if PART == "held":  # (its own process: the suite's longest test split in two)
    import reduce_cases as rc

    # rows held in registers with wide loads (row length a multiple of the vector width, rows
    # aligned), and the streaming fallback for misaligned row views
    checked += rc.check_patterns(D, rng, shape=(3, 16), dtypes=("float32", "float16"))
    checked += rc.check_patterns(D, rng, shape=(2, 24), dtypes=("float64",))
    checked += rc.check_kinds(D, rng, [(3, 16)], ["float32", "float16"])
    xv = rng.standard_normal((3, 24)).astype(np.float32)
    av = ft.asarray(xv, device=D)
    xs = rng.standard_normal((3, 18)).astype(np.float32)  # row stride 18: rows not all aligned
    got = ft.softmax(ft.asarray(xs, device=D)[:, :16], -1).numpy()
    e = np.exp(xs[:, :16] - xs[:, :16].max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, err_msg="softmax, row stride 18")
    for lo in (0, 1, 4):
        got = ft.softmax(av[:, lo:lo + 16], -1).numpy()
        e = np.exp(xv[:, lo:lo + 16] - xv[:, lo:lo + 16].max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, err_msg=f"softmax view at {lo}")
        checked += 1
    # held rows recomputed in each phase from the held leaves (float16 held as packed pairs)
    with ft.options(reduce_remat=True):
        checked += rc.check_patterns(D, rng, shape=(3, 16), dtypes=("float32", "float16"))
        checked += rc.check_kinds(D, rng, [(3, 16)], ["float16"])
if PART == "semantics":
    checked += semantics()
if PART == "vector":
    import vector_cases

    checked += vector_cases.check_elementwise(D, rng)
    checked += vector_cases.check_horizontal(D, rng)
if PART == "tiles":
    import vector_cases

    with ft.options(cuda_tile=64):  # the 64-wide tile variant (2 x 8 elements per thread)
        checked += vector_cases.check_transposed(D, rng, big=True)
print("SIM OK", checked)
"""

SEMANTICS = r"""
def semantics():
    checked = 0
    inp = make_inputs(rng, 4, 8)
    h2, c2 = lstm_step(*(ft.asarray(v, device=D) for v in inp), xp=ft)
    ft.reset_stats()
    ft.evaluate(h2, c2)
    assert ft.stats()["kernels"] == 1, ft.stats()
    hr, cr = reference(*inp)
    assert rel_err(h2.numpy(), hr) < 1e-5 and rel_err(c2.numpy(), cr) < 1e-5
    out = ft.asarray(np.full((3, 4), np.nan, np.float32), device=D)
    out[:, ::2] = ft.asarray(np.ones((3, 2), np.float32), device=D) * 3
    assert np.isnan(out.numpy()[:, 1::2]).all() and (out.numpy()[:, ::2] == 3).all()
    # in-place semantics on the CUDA target: element reads after writes, augmented assignment in place
    a = ft.zeros((2, 3), device=D)
    assert float(a[0, 0]) == 0.0
    a[...] = a + 1
    assert float(a[0, 0]) == 1.0 and a[1, 2].item() == 1.0
    a[0, 0] = 5
    assert a.numpy()[0, 0] == 5
    xb = np.arange(6.0)
    x = ft.asarray(xb, device=D)
    v = x[::2]
    v += 100
    x[1:] += x[:-1]
    ref = np.array([100, 1, 102, 3, 104, 5.0]); ref[1:] += ref[:-1].copy()
    np.testing.assert_array_equal(x.numpy(), ref)
    i = ft.asarray(np.arange(4), device=D)
    i <<= 3
    assert i.numpy().tolist() == [0, 8, 16, 24]
    with ft.options(defer_stores=True):  # deferred stores: m and p written by one kernel
        p, m, g = (ft.asarray(a, device=D) for a in (np.ones(5, np.float32), np.zeros(5, np.float32), np.arange(5, dtype=np.float32)))
        ft.reset_stats()
        m[...] = 0.9 * m + g
        p -= 0.1 * m
        ft.synchronize()
        assert ft.stats()["kernels"] == 1 and ft.stats()["flushes"] == 1, ft.stats()
        np.testing.assert_allclose(p.numpy(), 1 - 0.1 * np.arange(5), rtol=1e-6)
        np.testing.assert_allclose(m.numpy(), np.arange(5), rtol=1e-6)
    # complex arrays (unfused: the backend's functions) and the namespace's own vecdot / unstack
    z = (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64)
    r = rng.standard_normal(6).astype(np.float32)
    fz, fr = ft.asarray(z, device=D), ft.asarray(r, device=D)
    got = ft.exp(fz * fr) + ft.sum(fz)
    assert got.device == D and got.dtype == np.complex64
    np.testing.assert_allclose(got.numpy(), np.exp(z * r) + z.sum(), rtol=1e-5)
    np.testing.assert_allclose(ft.real(fz).numpy(), z.real)
    m = rng.standard_normal((3, 4)).astype(np.float32)
    fm = ft.asarray(m, device=D)
    np.testing.assert_allclose(ft.vecdot(fm, fm).numpy(), np.vecdot(m, m), rtol=1e-5)
    assert [u.numpy().tolist() for u in ft.unstack(fm)] == [row.tolist() for row in m]
    with ft.options(device=D):  # the default device: Python objects and creation functions
        made = [ft.asarray([1, 2]), ft.zeros(3), ft.full((2,), 1.5), ft.arange(3), ft.linspace(0, 1, 3),
                ft.eye(2), ft.asarray(3.0, dtype=ft.float32)]
        assert {a.device for a in made} == {D} and ft.__array_namespace_info__().default_device() == D
        assert ft.asarray(np.ones(2)).device == "cpu"
    assert made[3].numpy().tolist() == [0, 1, 2]
    import programs
    for seed in range(6):
        checked += sum(programs.check_program(programs.random_program(seed, narrow=True), device=D).values())
    return checked
"""


@pytest.mark.parametrize("part", ["warps", "reductions", "vector", "tiles", "held", "ops", "semantics"])
def test_generated_cuda_kernels_in_simulator(part):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    script = SCRIPT.replace("# SEMANTICS", SEMANTICS)
    r = subprocess.run(
        [sys.executable, "-c", script, part], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if "No module named 'numba.cuda'" in r.stderr:
        pytest.skip("numba-cuda not installed")
    assert r.returncode == 0 and "SIM OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
