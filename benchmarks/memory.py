"""Host and device memory over many LSTM steps: the curve must be flat (no leaked trees or buffers).

    python benchmarks/memory.py --steps 100000 [--device cpu|cuda] [--mode eager|jit]

Every ``steps/10`` steps it prints the process RSS, Python heap (tracemalloc), live pending
fusetree arrays, cached kernels and (CUDA) bytes in CuPy's pool. Exit status 1 when the last
sample's RSS or heap exceeds the one after warm-up by more than ``--tolerance-mb``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

from lstm_ref import lstm_step, make_inputs

import fusetree as ft
from fusetree import engine


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", choices=["eager", "jit"], default="eager")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--tolerance-mb", type=float, default=8.0)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    inputs = make_inputs(rng, a.batch, a.hidden)
    x, h, c, Wx, Wh, b = (ft.asarray(v, device=a.device) for v in inputs)
    step = ft.jit(lambda *t: lstm_step(*t, xp=ft)) if a.mode == "jit" else (lambda *t: lstm_step(*t, xp=ft))
    pool = None
    if a.device == "cuda":
        import cupy as cp

        pool = cp.get_default_memory_pool()
    tracemalloc.start()
    every = max(1, a.steps // 10)
    samples = []
    t0 = time.perf_counter()
    print("| step | RSS MB | heap MB | pending arrays | cached kernels | device pool MB | µs/step |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    last = t0
    for k in range(1, a.steps + 1):
        h, c = step(x, h, c, Wx, Wh, b)
        ft.evaluate(h, c)
        if k % every == 0 or k == 1:
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0] / 2**20
            dev = pool.used_bytes() / 2**20 if pool is not None else float("nan")
            now = time.perf_counter()
            us = (now - last) / (every if k > 1 else 1) * 1e6
            last = now
            samples.append((k, rss_mb(), heap))
            print(f"| {k} | {samples[-1][1]:.1f} | {heap:.2f} | {len(engine.PENDING)} | "
                  f"{engine.cache_info()['entries']} | {dev:.2f} | {us:.0f} |")  # fmt: skip
    base = samples[1] if len(samples) > 1 else samples[0]
    grow_rss, grow_heap = samples[-1][1] - base[1], samples[-1][2] - base[2]
    print(f"growth after warm-up: RSS {grow_rss:+.1f} MB, heap {grow_heap:+.2f} MB "
          f"over {a.steps} steps ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return 0 if max(grow_rss, grow_heap) <= a.tolerance_mb else 1


if __name__ == "__main__":
    sys.exit(main())
