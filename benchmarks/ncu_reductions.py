"""The row-reduction kernels at (4096, 4096) under Nsight Compute, beside torch's and a copy.

The float16 softmax and layernorm stay near 35 us at (4096, 4096) on both the H100 and the H200
while a copy of the same bytes takes 26 / 19 us (docs/probe_reductions_stop33.txt): a cost that
does not scale with bandwidth. This script launches each kernel once between
``cudaProfilerStart``/``Stop`` (compiled and warmed up before), so ncu reads their counters
(occupancy, warp stall reasons, memory throughput) and tells latency from issue limits::

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/ncu_reductions.py

(``bash benchmarks/gpu_session.sh ncured`` runs that and keeps the report's key lines.)
Written in stop 35 and not yet run: the device was not lent for it.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fusetree as ft


def main() -> None:
    import cupy as cp
    import torch

    rng = np.random.default_rng(0)
    x16 = cp.asarray((rng.standard_normal((4096, 4096)) * 2).astype(np.float16))
    x32 = x16.astype(cp.float32)
    w16, b16 = cp.ones(4096, cp.float16), cp.zeros(4096, cp.float16)
    f16, f32, fw, fb = ft.asarray(x16), ft.asarray(x32), ft.asarray(w16), ft.asarray(b16)
    calls = []
    for held in (32, 16):  # 128 and 256 threads per row
        with ft.options(reduce_held=held):
            s = ft.jit(lambda t: ft.softmax(t))
            s(f16)
            calls.append((f"fusetree softmax held={held} float16", lambda s=s: s(f16)))
            if held == 32:
                s(f32)
                calls.append(("fusetree softmax held=32 float32", lambda s=s: s(f32)))
                ln = ft.jit(lambda t, w, b: ft.layer_norm(t, w, b, 1e-5))
                ln(f16, fw, fb)
                calls.append(("fusetree layernorm held=32 float16", lambda ln=ln: ln(f16, fw, fb)))
    t16, t32 = torch.as_tensor(x16, device="cuda"), torch.as_tensor(x32, device="cuda")
    calls.append(("torch softmax float16", lambda: torch.softmax(t16, -1)))
    calls.append(("torch softmax float32", lambda: torch.softmax(t32, -1)))
    scratch = cp.empty_like(x16)
    calls.append(("copy float16", lambda: cp.copyto(scratch, x16)))
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
