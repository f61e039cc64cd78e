"""Device bandwidth of fused kernels on 64M elements vs a device-to-device copy, one run.

GB/s counts the fused minimum: every input read once, the output written once. Timed with CUDA
events over repeated launches into a preallocated output (allocation excluded), median of repeats.
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gpu_time(fn, repeats=7, iters=20):
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(repeats):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / iters * 1e-3)
    return statistics.median(ts)


def main(sweep: bool = True) -> None:
    import cupy as cp

    import fusetree as ft
    from fusetree.engine import kernels

    n = 64 * 1024 * 1024
    rows = []
    for dt in (cp.float32, cp.float16):
        item = cp.dtype(dt).itemsize
        xs = [cp.random.random(n, dtype=cp.float32).astype(dt) for _ in range(6)]
        out = cp.empty(n, dt)
        t = gpu_time(lambda: cp.copyto(out, xs[0]))
        copy_bw = 2 * n * item / t / 1e9
        rows.append((f"copy {cp.dtype(dt).name}", copy_bw, 100.0))
        f = [ft.asarray(x) for x in xs]
        fo = ft.asarray(out)

        def e3():
            fo[...] = f[0] * f[1] + ft.exp(f[2])

        def e6():
            fo[...] = (f[0] * f[1] + f[2]) * ft.sigmoid(f[3]) - f[4] / (f[5] + 2)

        for name, fn, nin in (("a*b+exp(c)", e3, 3), ("6-input", e6, 6)):
            t = gpu_time(fn)
            bw = (nin + 1) * n * item / t / 1e9
            rows.append((f"fusetree {name} {cp.dtype(dt).name}", bw, 100 * bw / copy_bw))
            if sweep and dt == cp.float32:
                k = list(kernels._CACHE.values())[-1]  # the kernel fn just compiled
                saved = (k.block, k.max_blocks)
                for block in (128, 256, 512):
                    for waves in (1, 4, 16, 10**6):
                        k.block, k.max_blocks = block, min(10**9, 132 * waves * (2048 // block))
                        t = gpu_time(fn, repeats=3, iters=10)
                        bw = (nin + 1) * n * item / t / 1e9
                        rows.append((f"  sweep {name} block={block} waves={waves}", bw, 100 * bw / copy_bw))
                k.block, k.max_blocks = saved
        ref = cp.asnumpy((xs[0].astype(cp.float32) * xs[1] + cp.exp(xs[2].astype(cp.float32))).astype(dt))
        e3()
        import numpy as np

        np.testing.assert_allclose(
            cp.asnumpy(out).astype(np.float32),
            ref.astype(np.float32),
            rtol=2e-3 if dt == cp.float16 else 1e-5,
        )
    print("\n| kernel (64M elements) | GB/s | % of copy |\n|---|---:|---:|")
    for name, bw, pct in rows:
        print(f"| {name} | {bw:.0f} | {pct:.1f}% |")


if __name__ == "__main__":
    main("--no-sweep" not in sys.argv)
