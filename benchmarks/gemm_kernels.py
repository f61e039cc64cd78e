"""Which device kernels one fusetree GEMM launches (torch.profiler sees fusetree's cuBLASLt calls):
the char-LSTM step's products at B128 H512, forward (h @ Wh) and backward (dg @ Wh.T, h.T @ dg).

    python benchmarks/gemm_kernels.py            # needs a CUDA GPU, CuPy and torch
"""

from __future__ import annotations

import collections

import numpy as np


def main() -> None:
    import cupy as cp
    from torch.profiler import ProfilerActivity, profile

    from fusetree import backends

    be = backends.get("cuda")
    rng = np.random.default_rng(0)
    B, H = 128, 512
    h = cp.asarray(rng.standard_normal((B, H), dtype=np.float32))
    W = cp.asarray(rng.standard_normal((H, 4 * H), dtype=np.float32))
    g = cp.asarray(rng.standard_normal((B, 4 * H), dtype=np.float32))
    cases = {"h @ Wh": (h, W), "dg @ Wh.T": (g, W.T), "h.T @ dg": (h.T, g)}
    for name, (a, b) in cases.items():
        be.gemm(a, b)  # the plan made (heuristic, split-K timed against one kernel) outside the profile
        cp.cuda.Device().synchronize()
        lt = be._lt
        choice = list(lt.choices.values())[-1] if lt and lt.choices else "cuBLAS (no cuBLASLt)"
        t0 = cp.cuda.Event()
        t1 = cp.cuda.Event()
        t0.record()
        for _ in range(100):
            be.gemm(a, b)
        t1.record()
        t1.synchronize()
        us = cp.cuda.get_elapsed_time(t0, t1) * 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                be.gemm(a, b)
            cp.cuda.Device().synchronize()
        names = collections.Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")
        print(
            f"{name} {a.shape}x{b.shape} [{choice}, {us:.1f} us/call]: "
            + "; ".join(f"{c / 10:.1f}x {n}" for n, c in names.items())
        )
        if lt:
            explain(be, lt, a, b)


def explain(be, lt, a, b) -> None:
    """The candidates behind a choice: (split-K, reduction scheme, µs) of the default heuristic's and
    of the in-place-only heuristic's algorithms on these operands."""
    key = list(lt.plans)[-1]
    dt, ta, tb, m, n, k, lda, ldb, ldc = key
    plan = lt.plans[key]
    if plan is None:
        return
    ops = (b.data.ptr, a.data.ptr)
    for name, pref in (("default", lt.pref), ("in-place only", lt.pref_one_kernel)):
        cands = lt._heuristic(plan.desc, plan.layouts, pref)
        times = lt._times(cands, dt, ops, n * ldc) if cands else []
        desc = ", ".join(
            f"[splitK {lt._config(c, 2, 1)} scheme {lt._config(c, 3, 0)} {t * 200:.1f} us]"
            for c, t in zip(cands, times)
        )
        print(f"    {name}: {desc}")


if __name__ == "__main__":
    main()
