"""Launch shapes of the row-reduction kernels (softmax, layernorm) swept on the current GPU.

Each variant is a set of options (``reduce_held``, ``reduce_rows_per_block``, ``reduce_remat``,
``reduce_max_registers``); each is timed as device time per call (CUDA events around a loop of
jitted calls, warm-up excluded, median of repeats) and compared with a device copy of the same
bytes (read x, write y) timed the same way in the same run. Results are checked against NumPy.

    python benchmarks/probe_reductions.py [--shapes 4096x4096,64x128x1024,128x512] [--held 16,32] [--rows 1,2] [--threads 0,64]
    python benchmarks/probe_reductions.py --src /path/to/older/checkout --held 32 --rows 1   # a baseline
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else os.path.dirname(HERE)
sys.path.insert(0, _src)  # (--src: time another checkout's fusetree, e.g. the commit before a change)
if "--src" in sys.argv:  # a kernel cache of its own: checkouts before stop 36 keyed kernels without
    # their source, so two checkouts sharing a cache ran the first one's kernels
    import tempfile

    os.environ["FUSETREE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ft_probe_")

import fusetree as ft

EPS = 1e-5


def device_us(fn, calls: int = 20, repeats: int = 7) -> float:
    import cupy as cp

    for _ in range(3):
        fn()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(repeats):
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / calls)
    return statistics.median(ts)


def reference(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    if op == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + EPS) * w + b


def main(argv: list[str] | None = None) -> None:
    import cupy as cp

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x4096,64x128x1024,128x512")
    p.add_argument("--held", default="8,16,32", help="reduce_held values")
    p.add_argument(
        "--rows", default="1,2,4", help="reduce_rows_per_block values (1 alone for an older checkout)"
    )
    p.add_argument("--remat", default="0", help="reduce_remat values (0,1; 0 alone for an older checkout)")
    p.add_argument("--maxreg", default="0", help="reduce_max_registers values (0: ptxas chooses)")
    p.add_argument("--threads", default="0", help="reduce_threads values (0: frame_config chooses)")
    p.add_argument("--src", help="the checkout whose fusetree is timed (default: this one)")
    a = p.parse_args(argv)
    held = [int(v) for v in a.held.split(",")]
    rpb = [int(v) for v in a.rows.split(",")]
    remat = [bool(int(v)) for v in a.remat.split(",")]
    maxreg = [int(v) for v in a.maxreg.split(",")]
    threads = [int(v) for v in a.threads.split(",")]
    print(f"fusetree from {os.path.dirname(ft.__file__)}")
    rng = np.random.default_rng(0)
    for shape_s in a.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        for dt in ("float32", "float16"):
            hx = (rng.standard_normal(shape) * 2).astype(dt)
            hw = rng.uniform(0.5, 1.5, shape[-1:]).astype(dt)
            hb = rng.standard_normal(shape[-1:]).astype(dt)
            x, w, b = cp.asarray(hx), cp.asarray(hw), cp.asarray(hb)
            scratch = cp.empty_like(x)
            copy_us = device_us(lambda: cp.copyto(scratch, x))
            print(
                f"== {shape_s} {dt}: device copy {copy_us:.1f} us ({2 * x.nbytes / copy_us / 1e3:.0f} GB/s)"
            )
            fx, fw, fb = ft.asarray(x), ft.asarray(w), ft.asarray(b)
            for op in ("softmax", "layernorm"):
                want = reference(op, hx, hw.astype(np.float64), hb.astype(np.float64))
                best = None
                for h, r, rm, mr, th in itertools.product(held, rpb, remat, maxreg, threads):
                    opts: dict = dict(reduce_held=h)
                    if r != 1:
                        opts["reduce_rows_per_block"] = r
                    if rm:
                        opts["reduce_remat"] = True
                    if mr:
                        opts["reduce_max_registers"] = mr
                    if th:
                        opts["reduce_threads"] = th
                    with ft.options(**opts):
                        if op == "softmax":
                            f = ft.jit(lambda t: ft.softmax(t))
                            call = lambda f=f: f(fx)
                        else:
                            f = ft.jit(lambda t, ww, bb: ft.layer_norm(t, ww, bb, EPS))
                            call = lambda f=f: f(fx, fw, fb)
                        got = call().numpy().astype(np.float64)
                        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                        us = device_us(call)
                    pct = 100 * copy_us / us
                    tag = (
                        f"held={h:2d} rows/block={r}"
                        + (" remat" if rm else "")
                        + (f" maxreg={mr}" if mr else "")
                        + (f" threads={th}" if th else "")
                    )
                    print(f"{op:9s} {tag}: {us:7.1f} us  {pct:5.1f}% of copy  err {err:.1e}", flush=True)
                    if best is None or us < best[0]:
                        best = (us, tag)
                assert best is not None
                print(f"{op:9s} best: {best[1]} {best[0]:.1f} us = {100 * copy_us / best[0]:.1f}% of copy")


if __name__ == "__main__":
    main()
