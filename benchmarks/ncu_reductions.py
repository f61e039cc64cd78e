"""Row-reduction kernels under Nsight Compute, beside torch's and a copy of the same bytes.

Each kernel is launched once between ``cudaProfilerStart``/``Stop`` (compiled and warmed up
before), so ncu reads its duration and counters (occupancy, warp stall reasons, memory
throughput) and tells latency from issue limits::

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/ncu_reductions.py [--shapes 4096x4096] [--held 32,16] \
        [--ops softmax,layernorm] [--dtypes float16,float32]

(``bash benchmarks/gpu_session.sh ncured`` runs the default and keeps the report's key lines.)
Small shapes (``--shapes 128x512 --held 2,4,8,16,32``, or ``--threads 16,32,64,128`` threads
per row with the default held kernel) are where a wall-clock or CUDA-event
timing of a single call measures the host, not the kernel: ncu's duration is the kernel's own.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fusetree as ft

EPS = 1e-5


def main(argv: list[str] | None = None) -> None:
    import cupy as cp
    import torch

    from fusetree.backends import cuda as cuda_backend

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x4096")
    p.add_argument(
        "--held", default="32,16", help="reduce_held values (32 and 16: 128 and 256 threads per 4096-row)"
    )
    p.add_argument("--threads", default="0", help="reduce_threads values (0: from the row length and held)")
    p.add_argument(
        "--spread", default="", help="SPREAD_THREADS values of the CUDA backend (few-row launches)"
    )
    p.add_argument("--ops", default="softmax,layernorm")
    p.add_argument("--dtypes", default="float16,float32")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    calls = []
    for shape_s in a.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        for dt in a.dtypes.split(","):
            x = cp.asarray((rng.standard_normal(shape) * 2).astype(dt))
            w, b = cp.ones(shape[-1], dt), cp.zeros(shape[-1], dt)
            fx, fw, fb = ft.asarray(x), ft.asarray(w), ft.asarray(b)
            spreads = [int(v) for v in a.spread.split(",")] if a.spread else [None]
            for held, tpr, spread in itertools.product(
                [int(v) for v in a.held.split(",")], [int(v) for v in a.threads.split(",")], spreads
            ):
                if spread is not None:
                    cuda_backend.SPREAD_THREADS = spread
                with ft.options(reduce_held=held, reduce_threads=tpr):
                    for op in a.ops.split(","):
                        if op == "softmax":
                            f = ft.jit(lambda t: ft.softmax(t))
                            call = lambda f=f, fx=fx: f(fx)
                        else:
                            f = ft.jit(lambda t, ww, bb: ft.layer_norm(t, ww, bb, EPS))
                            call = lambda f=f, fx=fx, fw=fw, fb=fb: f(fx, fw, fb)
                        call()
                        calls.append(
                            (
                                f"fusetree {op} held={held} threads={tpr or 'auto'} spread={spread} {shape_s} {dt}",
                                call,
                            )
                        )
            tx, tw, tb = (torch.as_tensor(v, device="cuda") for v in (x, w, b))
            if "softmax" in a.ops:
                calls.append((f"torch softmax {shape_s} {dt}", lambda tx=tx: torch.softmax(tx, -1)))
            if "layernorm" in a.ops:
                calls.append(
                    (
                        f"torch layernorm {shape_s} {dt}",
                        lambda tx=tx, tw=tw, tb=tb: torch.nn.functional.layer_norm(
                            tx, tx.shape[-1:], tw, tb, EPS
                        ),
                    )
                )
            scratch = cp.empty_like(x)
            calls.append((f"copy {shape_s} {dt}", lambda s=scratch, x=x: cp.copyto(s, x)))
    for _, call in calls:  # compiled and warm before the profiled range
        call()
        call()
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    cp.cuda.runtime.profilerStart()
    for name, call in calls:
        print("launch:", name, flush=True)
        call()
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
    cp.cuda.runtime.profilerStop()


if __name__ == "__main__":
    main()
