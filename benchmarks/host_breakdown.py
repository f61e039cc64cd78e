"""The eager ``evaluate(a*b+c)`` hot path taken apart, each piece timed alone (no profiler: its
own cost would swamp pieces of a microsecond). Complements ``host_overhead.py`` (whole phases).

    python benchmarks/host_breakdown.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fusetree as ft
from fusetree import engine
from fusetree.engine import executor
from fusetree.engine import realization as R
from fusetree.engine.state import STATS
from fusetree.frontend.array import wrap
from fusetree.ir.node import make_contiguous


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--n", type=int, default=4096)
    a = ap.parse_args(argv)
    n, dev = a.n, a.device
    xs = [ft.asarray(np.random.default_rng(k).random(n, dtype=np.float32), device=dev) for k in range(3)]
    x, y, z = xs
    if dev == "cuda":
        import cupy as cp

        sync = cp.cuda.Device().synchronize
    else:
        sync = lambda: None

    def us(fn, k=5000):
        fn()
        sync()
        best = min(timeit.repeat(fn, number=k, repeat=7)) / k * 1e6
        sync()
        return best

    ft.evaluate(x * y + z)
    t = (x * y + z)._node
    ctx = R._CONTEXTS[dev]
    plan = ctx.plans[(t.key, 1)]
    be = ctx.be
    out = be.empty((n,), np.float32)
    single = plan.single
    bound = [v for leaf in t.leaves for v in executor.bind_leaf(be, leaf, False)]
    jf = ft.jit(lambda a, b, c: a * b + c)
    rows = {
        "evaluate(a*b+c)": lambda: ft.evaluate(x * y + z),
        "jit replay a*b+c": lambda: jf(x, y, z),
        "realize((a*b+c,))": lambda: engine.realize((x * y + z,)),
        "evaluate(wrap(prebuilt))": lambda: ft.evaluate(wrap(t)),
        "build a*b+c": lambda: x * y + z,
        "build a*b": lambda: x * y,
        "wrap(node)": lambda: wrap(t),
        "wrap + realize": lambda: engine.realize((wrap(t),)),
        "be.empty": lambda: be.empty((n,), np.float32),
        "executor.run (bind + launch)": lambda: executor.run(plan, be, ctx.tag, t.leaves, (n,), [out], None),
        "be.launch (prebound args)": lambda: be.launch(
            single.launcher, list(bound), [out], single.out_layouts, (n,)
        ),
        "make_contiguous": lambda: make_contiguous(out, dev, (n,), out.dtype),
        "stats dict += 1 (x2)": lambda: (STATS.__setitem__("x", 1), STATS.__setitem__("y", 1)),
    }
    if dev == "cuda":
        s = cp.cuda.get_current_stream()
        rows["cupy current stream .ptr"] = lambda: cp.cuda.get_current_stream().ptr
        rows["stream.ptr"] = lambda: s.ptr
        rows["out.data.ptr"] = lambda: out.data.ptr
        rows["cupy.ndarray(shape)"] = lambda: cp.ndarray((n,), np.float32)
    for name, fn in rows.items():
        print(f"{name:32s} {us(fn):8.2f} us")
    import gc

    gc.disable()
    print(f"{'evaluate(a*b+c), gc off':32s} {us(rows['evaluate(a*b+c)']):8.2f} us")
    gc.enable()
    tr = jf._last.trace
    print("jit: quick replay", tr.quick is not None, "fast", bool(tr.fast), "ops", len(tr.ops))
    if dev == "cuda" and tr.prepared and tr.prepared[0] is not None and tr.prepared[0].params is not None:
        prm = tr.prepared[0].params
        print(f"{'launch_params (prepacked)':32s} {us(lambda: be.launch_params(prm)):8.2f} us")
    fresh = x * y + z
    print(
        "fresh tree takes the one-value path:", R._realize_one(fresh, fresh._node), "pending:", len(R.PENDING)
    )


if __name__ == "__main__":
    main()
