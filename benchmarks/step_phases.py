"""The eager LSTM step taken apart on the current device: each phase timed alone (no profiler;
``benchmarks/profile_step.py`` has the cProfile of the whole step).

    python benchmarks/step_phases.py --device cuda --shape 128x512 [--view-objects]
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

from lstm_ref import lstm_cell, lstm_step, make_inputs

import fusetree as ft
from fusetree.ir.node import make_buffer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", default="128x512")
    ap.add_argument(
        "--view-objects",
        action="store_true",
        help="bind views through backend view objects (before ViewLeaf)",
    )
    a = ap.parse_args(argv)
    if a.view_objects:
        from fusetree.frontend import views

        views._ARITHMETIC = frozenset()
    B, H = (int(v) for v in a.shape.split("x"))
    dev = a.device
    if dev == "cuda":
        import cupy as cp

        sync = cp.cuda.Device().synchronize
    else:
        sync = lambda: None
    x, h, c, Wx, Wh, b = (ft.asarray(v, device=dev) for v in make_inputs(np.random.default_rng(0), B, H))
    st = [h, c]

    def us(fn, k=2000):
        for _ in range(50):
            fn()
        sync()
        best = min(timeit.repeat(fn, number=k, repeat=5)) / k * 1e6
        sync()
        return best

    def gates():
        return x @ Wx + h @ Wh + b

    def gates_gemm():
        g = gates()
        g[:, :H]

    def gates_slices():
        g = gates()
        return g[:, :H], g[:, H : 2 * H], g[:, 2 * H : 3 * H], g[:, 3 * H :]

    def cell_build():
        return lstm_cell(gates(), c, ft)

    def step():
        h2, c2 = lstm_step(x, st[0], st[1], Wx, Wh, b, xp=ft)
        ft.evaluate(h2, c2)
        st[0], st[1] = h2, c2

    from fusetree import backends
    from fusetree.engine import executor

    be = backends.get(dev)
    g = gates()
    g[:, :H]
    gsum = g._node.args[0]  # the pending x@Wx + h@Wh (a GEMM-sum node), computed by the slice
    memo = gsum.memo

    def gemm_sum():  # both products again, through the engine (allocation, memoized plans)
        gsum.memo = None
        executor.compute_gemm(gsum, be)

    xd, Wxd = x._node.data, Wx._node.data

    def cell_evaluate():
        ft.evaluate(*lstm_cell(g, c, ft))

    key = (slice(None), slice(H, 2 * H), Ellipsis)
    view = memo[key]
    rows = {
        "step (eager, evaluate h2 c2)": step,
        "build gates (2 matmul, fold, + b)": gates,
        "gates + first slice (runs the GEMMs)": gates_gemm,
        "gates + 4 slices": gates_slices,
        "gates + 4 slices + cell built": cell_build,
        "x @ Wx (node only)": lambda: x @ Wx,
        "x @ Wx + h @ Wh (fold, nodes only)": lambda: x @ Wx + h @ Wh,
        "compute the GEMM sum (2 GEMMs + output)": gemm_sum,
        "backend gemm x @ Wx (allocates)": lambda: be.gemm(xd, Wxd),
        "4 slices + cell, GEMMs done": lambda: lstm_cell(g, c, ft),
        "4 slices + cell + evaluate(h2, c2), GEMMs done": cell_evaluate,
        "backend slice of the GEMM result": lambda: memo[key],
        "make_buffer(slice)": lambda: make_buffer(view, dev),
        "slice of a pending sum (memoized GEMM)": lambda: g[:, H : 2 * H],
    }
    for name, fn in rows.items():
        print(f"{name:45s} {us(fn):9.2f} us", flush=True)


if __name__ == "__main__":
    main()
