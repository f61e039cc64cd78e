"""Compile cost: ms for a new key in a warm process, and per kernel from the disk cache in a fresh
process (CUDA: PTX loaded, no numba compiler call; CPU: numba's cached machine code loaded).
``python benchmarks/compile_time.py [--device cpu|cuda]``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import fusetree as ft
dev = sys.argv[3]
if dev == "cuda":
    import cupy as cp
x = ft.asarray(np.ones((64, 64), np.float32), device=dev); (x + 1).numpy()   # warm: backend, context, first kernel
ft.reset_stats()
fns = [lambda v, k=k: ft.tanh(v * (k + 2)) + ft.exp(v) ** (k % 3 + 1) - v / (k + 3) for k in range(int(sys.argv[2]))]
exprs = []
t0 = time.perf_counter()
for k in range(int(sys.argv[2])):
    y = x
    for _ in range(k % 4 + 1):
        y = ft.sigmoid(y) * 1.5 + ft.tanh(y)    # a different structure per k
    y = y.astype(np.float16) if k % 2 else y
    (y - k).numpy()
dt = time.perf_counter() - t0
s = ft.stats()
print(f"RESULT {dt / int(sys.argv[2]) * 1e3:.2f} {s['compiles']} {s['disk_hits']}")
"""


def run(cache: str, n: int, device: str) -> tuple[float, int, int]:
    env = dict(os.environ, FUSETREE_CACHE_DIR=cache)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, ROOT, str(n), device], env=env, capture_output=True, text=True
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
    if not line:
        raise RuntimeError(r.stdout + r.stderr)
    ms, comp, hits = line[0].split()[1:]
    return float(ms), int(comp), int(hits)


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    n = 8
    with tempfile.TemporaryDirectory() as d:
        cold = run(d, n, device)
        warm = run(d, n, device)
    how = "compile_ptx + load" if device == "cuda" else "numba compile"
    print(f"\ndevice={device}\n| case | ms per new kernel | compiles | disk hits |\n|---|---:|---:|---:|")
    print(f"| new key, warm process ({how}) | {cold[0]:.1f} | {cold[1]} | {cold[2]} |")
    print(f"| fresh process, from disk cache (load only) | {warm[0]:.1f} | {warm[1]} | {warm[2]} |")


if __name__ == "__main__":
    t = time.time()
    main()
