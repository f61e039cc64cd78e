"""Structural caching: same structure -> one compile; new size/data/scalar -> none; new dtype -> one."""

import numpy as np

import fusetree as ft


def expr(a, b, s):
    return ft.tanh(a * s + b) - ft.exp(b) / 3


def test_same_structure_compiles_once(rng):
    ft.clear_cache()
    ft.reset_stats()
    a, b = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2))
    expr(ft.asarray(a), ft.asarray(b), 2.0).numpy()
    assert ft.stats()["compiles"] == 1
    ft.reset_stats()
    for shape, s in [((4, 5), 2.0), ((7, 5), 3.5), ((2, 9), -1.0)]:  # new data, sizes, scalars
        a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        got = expr(ft.asarray(a), ft.asarray(b), s).numpy()
        want = np.tanh(a * np.float32(s) + b) - np.exp(b) / np.float32(3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    st = ft.stats()
    assert st["compiles"] == 0 and st["cache_hits"] == 3, st


def test_new_dtype_or_layout_recompiles(rng):
    a, b = (rng.standard_normal((4, 5)) for _ in range(2))
    expr(ft.asarray(a.astype(np.float32)), ft.asarray(b.astype(np.float32)), 2.0).numpy()
    ft.reset_stats()
    expr(ft.asarray(a), ft.asarray(b), 2.0).numpy()  # float64
    assert ft.stats()["compiles"] == 1
    ft.reset_stats()
    expr(ft.asarray(a)[:, ::2], ft.asarray(b)[:, ::2], 2.0).numpy()  # strided layout
    assert ft.stats()["compiles"] == 1


def test_shared_vs_distinct_leaves_are_different_kernels(rng):
    x, y = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    fx, fy = ft.asarray(x), ft.asarray(y)
    np.testing.assert_allclose((fx * fx).numpy(), x * x)
    np.testing.assert_allclose((fx * fy).numpy(), x * y)  # must not reuse the x*x kernel wrongly


def test_key_ignores_scalar_values_but_not_weakness(rng):
    x = ft.asarray(rng.standard_normal(5).astype(np.float32))
    assert (x * 2.0)._node.key == (x * 3.0)._node.key
    assert (x * 2.0)._node.key != (x * np.float64(2.0))._node.key  # strong float64 promotes
    assert (x * np.float64(2.0)).dtype == np.float64 and (x * 2.0).dtype == np.float32


WRITER = r"""
import sys
from fusetree.backends.diskcache import read_disk_cache, write_disk_cache
d, who = sys.argv[1], sys.argv[2]
bad = 0
for k in range(300):
    body = {"ptx": who * (1000 + k), "entry": who, "fmt": "Q" * (k % 7)}
    write_disk_cache(d, "samekey", body)
    got = read_disk_cache(d, "samekey")
    if got is not None and got["ptx"] != got["entry"] * len(got["ptx"]):
        bad += 1
print("BAD", bad)
"""


def test_concurrent_disk_cache_writers_never_corrupt(tmp_path):
    """Two processes writing one key at once: every read is a whole entry of one of them."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), w], stdout=subprocess.PIPE, text=True, env=env
        )
        for w in "ab"
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all("BAD 0" in o for o in outs), outs
    from fusetree.backends.diskcache import disk_cache_dir

    os.environ["FUSETREE_CACHE_DIR"], saved = str(tmp_path / "new"), os.environ.get("FUSETREE_CACHE_DIR")
    try:
        assert os.stat(disk_cache_dir()).st_mode & 0o777 == 0o700
    finally:
        if saved is None:
            del os.environ["FUSETREE_CACHE_DIR"]
        else:
            os.environ["FUSETREE_CACHE_DIR"] = saved
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]  # no stray temporaries


def test_cpu_kernels_are_cached_on_disk_across_processes(tmp_path):
    """A fresh process loads a kernel compiled by an earlier one (numba's cached machine code in
    the fusetree cache directory): the same values, counted as disk hits; off with
    FUSETREE_CPU_DISK_CACHE=0."""
    code = (
        "import numpy as np, fusetree as ft\n"
        "x = ft.asarray(np.linspace(-2, 2, 50, dtype=np.float32))\n"
        "y = (ft.tanh(x) * 3 + ft.exp(x * 0.5)).numpy()\n"
        "assert np.allclose(y, np.tanh(np.linspace(-2, 2, 50)) * 3 + np.exp(np.linspace(-2, 2, 50) * 0.5), atol=1e-5)\n"
        "print('HITS', ft.stats()['disk_hits'], ft.stats()['compiles'])\n"
    )

    def run(**env):
        return _fresh_process(code, tmp_path, "HITS", **env)

    assert run() == [0, 1]
    assert run() == [1, 1]
    assert run(FUSETREE_CPU_DISK_CACHE="0") == [0, 1]
    assert list((tmp_path).glob("cpu-v*/ft_*.py"))


def test_the_cpu_disk_cache_keeps_the_newest_kernels(tmp_path):
    import os

    from fusetree.backends.cpu import prune

    (tmp_path / "__pycache__").mkdir()
    for k, stem in enumerate(("ft_a_1", "ft_b_2", "ft_c_3")):
        (tmp_path / f"{stem}.py").write_text("# kernel\n")
        os.utime(tmp_path / f"{stem}.py", (1000 + k, 1000 + k))  # ft_a_1 oldest
        for ext in ("ft_x-4.py312.nbi", "ft_x-4.py312.1.nbc"):
            (tmp_path / "__pycache__" / f"{stem}.{ext}").write_bytes(b"x")
    assert prune(str(tmp_path), keep=2) == 1
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["ft_b_2.py", "ft_c_3.py"]
    assert not list((tmp_path / "__pycache__").glob("ft_a_1.*"))
    assert len(list((tmp_path / "__pycache__").glob("*"))) == 4
    assert prune(str(tmp_path), keep=2) == 0


def test_cpu_parallel_threshold_follows_the_work_per_element():
    """CPU kernels go parallel by estimated work: an exp-heavy kernel at fewer elements than a
    cheap one; the transcendental ops named are all op-table rows."""
    from fusetree.backends import cpu
    from fusetree.ir.ops import OPS

    assert cpu.HEAVY_OPS <= set(OPS)
    x = ft.asarray(np.ones(8, np.float32))
    cheap_n = cpu.parallel_min(_spec_of(x * 2 + x))
    heavy_n = cpu.parallel_min(_spec_of(ft.tanh(ft.exp(x)) * ft.sigmoid(x)))
    assert heavy_n * 8 < cheap_n, (heavy_n, cheap_n)


def _spec_of(a):
    from fusetree.schedule import planner

    n = a._node
    tgt = planner.PlanTarget("cpu", "cpu/test", 255, 1, lambda spec: 0)
    plan = planner.plan([n], [(0, ())], ["C"], n.leaves, n.shape, tgt)
    return plan.steps[-1].spec


def test_float16_views_are_bound_without_retrying_a_failed_numba_compile(monkeypatch):
    """Binding a float16 view asks numba for its byte offset; numba cannot type float16 and its
    dispatcher would retry (and fail) the compile on every call, ~10 ms each: the dtype pair is
    remembered after the first failure and the NumPy path answers from then on."""
    from fusetree.backends import cpu

    calls = []

    def untyped(v, b):  # numba's behaviour: a typing error for float16, every call
        if np.float16 in (v.dtype, b.dtype):
            calls.append((v.dtype, b.dtype))
            raise TypeError("cannot type float16")
        return v.__array_interface__["data"][0] - b.__array_interface__["data"][0]

    monkeypatch.setattr(cpu, "_byte_offset", untyped)
    monkeypatch.setattr(cpu, "_UNTYPED", set())
    x = np.zeros((8, 8), np.float16)
    for _ in range(3):
        assert cpu.byte_offset(x[1:, 2:], x) == (8 + 2) * 2
    assert len(calls) == 1
    y = ft.asarray(np.arange(64, dtype=np.float16).reshape(8, 8) / 64)
    want = _np_softmax(np.arange(64).reshape(8, 8)[:, ::2] / 64)
    tried = []
    for _ in range(3):  # an eager float16 reduction over a strided view: correct, no retried compile
        np.testing.assert_allclose(ft.softmax(y[:, ::2], -1).numpy(), want, rtol=2e-3)
        tried.append(len(calls))
    assert tried[0] == tried[1] == tried[2] and len(set(calls)) == len(calls), calls


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_first_kernel_freezes_the_long_lived_objects(tmp_path):
    """After a backend's first kernel, the objects alive then (numba's compiler and registries) are
    moved out of the collector's sight (gc.freeze), once (a second kernel freezes nothing more);
    FUSETREE_GC_FREEZE=0 leaves the collector alone. Garbage made before the freeze is collected,
    not frozen."""
    code = (
        "import gc, weakref, numpy as np, fusetree as ft\n"
        "class C: pass\n"
        "c = C(); c.me = c; r = weakref.ref(c); del c\n"  # cyclic garbage made before the first kernel
        "x = ft.asarray(np.ones(8, np.float32))\n"
        "before = gc.get_freeze_count()\n"
        "(x * 2 + 1).numpy()\n"
        "first = gc.get_freeze_count()\n"
        "(ft.exp(x) - 3).numpy()\n"  # a second kernel: no second freeze
        "print('FROZEN', before, int(first > 1000), int(gc.get_freeze_count() <= first), int(r() is None))\n"
    )

    assert _fresh_process(code, tmp_path, "FROZEN", FUSETREE_GC_FREEZE="1") == [0, 1, 1, 1]
    assert _fresh_process(code, tmp_path, "FROZEN", FUSETREE_GC_FREEZE="0")[:2] == [0, 0]


def _fresh_process(code: str, tmp_path, tag: str, **env) -> list[int]:
    """Run ``code`` in a fresh Python process (fusetree from this checkout, its disk cache in
    ``tmp_path``); the integers it printed after ``tag``."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    e = dict(os.environ, FUSETREE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root), **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return [int(v) for v in r.stdout.split(tag)[1].split()]
