"""Softmax and layernorm: fusetree (one kernel each) against CuPy unfused, cupy.fuse pieces, torch
eager and torch.compile, in one run, float32 and float16 (on CUDA also ``ft.jit(graph=True)``: one
CUDA graph launch per call, its result the graph's static buffer).

    python benchmarks/reductions.py               # cuda if present, else cpu (fusetree vs NumPy)
    python benchmarks/reductions.py --quick --json out.json

Each mode is checked against a float64 NumPy reference (max relative error over the output), then
timed as wall time per call over a loop with the device synchronized at the end (host overhead
included), median of repeats, warm-up excluded. ``GB/s`` counts the minimum traffic (read x, write y;
layernorm also reads weight and bias) and ``% copy`` compares it with a device-to-device copy of the
same bytes measured in the same run. On CUDA (with torch installed) ``kernel µs`` is the GPU time of
the kernels one call launches, from CUPTI (torch.profiler, which sees fusetree's and CuPy's driver
launches too): at small shapes a call is host-bound, and this column compares the kernels alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import fusetree as ft

SHAPES = [(128, 512), (4096, 4096), (64, 128, 1024)]
EPS = 1e-5


@dataclass
class Record:
    op: str
    shape: str
    dtype: str
    mode: str
    us: float
    gbps: float
    pct_copy: float
    launches: float | None
    rel_err: float
    note: str = ""
    kernel_us: float | None = None  # GPU time of the kernels of one call (CUPTI), CUDA only


def timeit(fn, sync, calls: int, repeats: int) -> float:
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / calls)
    return statistics.median(ts) * 1e6


def kernel_us(fn, calls: int) -> float | None:
    """GPU time per call of the kernels (and copies) ``fn`` launches: their durations summed over
    ``calls`` calls under torch.profiler (CUPTI), divided by ``calls``; None without torch."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.time_range.end - e.time_range.start for e in prof.events() if e.device_type.name == "CUDA")
    return total / calls if total > 0 else None


def ref_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + EPS) * w + b


def modes_for(op: str, x, w, b, device: str):
    """name -> zero-argument callable computing the op on device arrays."""
    modes = {}
    fx, fw, fb = ft.asarray(x), ft.asarray(w), ft.asarray(b)
    if op == "softmax":
        modes["fusetree"] = lambda: ft.softmax(fx).data
        jf = ft.jit(lambda a: ft.softmax(a))
        modes["fusetree-jit"] = lambda: jf(fx)
    else:
        modes["fusetree"] = lambda: ft.layer_norm(fx, fw, fb, EPS).data
        jl = ft.jit(lambda a, ww, bb: ft.layer_norm(a, ww, bb, EPS))
        modes["fusetree-jit"] = lambda: jl(fx, fw, fb)
    if device == "cuda":  # a CUDA graph of the one kernel: its result is the graph's static buffer
        if op == "softmax":
            gf = ft.jit(graph=True)(lambda a: ft.softmax(a))
            modes["fusetree-graph"] = lambda: gf(fx)
        else:
            gl = ft.jit(graph=True)(lambda a, ww, bb: ft.layer_norm(a, ww, bb, EPS))
            modes["fusetree-graph"] = lambda: gl(fx, fw, fb)
    if device == "cpu":
        if op == "softmax":
            modes["numpy"] = lambda: ref_softmax(x)
        else:
            modes["numpy"] = lambda: ref_layernorm(x, w, b)
        return modes, None
    import cupy as cp

    if op == "softmax":

        def cupy_unfused():
            e = cp.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        @cp.fuse()
        def _exp_sub(a, m):
            return cp.exp(a - m)

        @cp.fuse()
        def _div(a, s):
            return a / s

        def cupy_fuse():  # cupy.fuse fuses elementwise chains; each reduction is its own kernel
            e = _exp_sub(x, x.max(-1, keepdims=True))
            return _div(e, e.sum(-1, keepdims=True))

    else:

        def cupy_unfused():
            m = x.mean(-1, keepdims=True)
            d = x - m
            v = (d * d).mean(-1, keepdims=True)
            return d / cp.sqrt(v + EPS) * w + b

        @cp.fuse()
        def _norm(d, v, ww, bb):
            return d / cp.sqrt(v + EPS) * ww + bb

        @cp.fuse()
        def _sub(a, m):
            return a - m

        def cupy_fuse():
            d = _sub(x, x.mean(-1, keepdims=True))
            return _norm(d, (d * d).mean(-1, keepdims=True), w, b)

    modes["cupy-unfused"] = cupy_unfused
    modes["cupy-fuse"] = cupy_fuse
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        tx, tw, tb = (torch.as_tensor(a, device="cuda") for a in (x, w, b))
        n = x.shape[-1]
        if op == "softmax":
            te = lambda: torch.softmax(tx, -1)
            tc_fn = torch.compile(lambda a: torch.softmax(a, -1))
            modes["torch-eager"] = te
            modes["torch-compile"] = lambda: tc_fn(tx)
        else:
            te = lambda: torch.nn.functional.layer_norm(tx, (n,), tw, tb, EPS)
            tc_fn = torch.compile(lambda a, ww, bb: torch.nn.functional.layer_norm(a, (n,), ww, bb, EPS))
            modes["torch-eager"] = te
            modes["torch-compile"] = lambda: tc_fn(tx, tw, tb)
    except Exception as e:
        print(f"torch unavailable: {e}", file=sys.stderr)
        torch = None
    return modes, torch


def to_np(a):
    if isinstance(a, ft.Array):
        return a.numpy()
    if hasattr(a, "detach"):
        return a.detach().float().cpu().numpy()
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


def run(args) -> list[Record]:
    device = args.device
    if device is None:
        try:
            from numba import cuda

            device = "cuda" if cuda.is_available() else "cpu"
        except Exception:
            device = "cpu"
    shapes = [(16, 64), (64, 256)] if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    dts = ["float32"] if args.quick else ["float32", "float16"]
    rng = np.random.default_rng(0)
    recs: list[Record] = []
    for shape in shapes:
        for dt in dts:
            host = (rng.standard_normal(shape) * 2).astype(dt)
            hw = rng.uniform(0.5, 1.5, shape[-1:]).astype(dt)
            hb = rng.standard_normal(shape[-1:]).astype(dt)
            if device == "cuda":
                import cupy as cp

                x, w, b = cp.asarray(host), cp.asarray(hw), cp.asarray(hb)

                def sync():
                    cp.cuda.Device().synchronize()

                scratch = cp.empty_like(x)
                copy_us = timeit(lambda: cp.copyto(scratch, x), sync, args.calls, args.repeats)
            else:
                x, w, b = host, hw, hb
                sync = lambda: None
                scratch = np.empty_like(x)
                copy_us = timeit(lambda: np.copyto(scratch, x), sync, args.calls, args.repeats)
            nbytes = 2 * host.nbytes
            copy_gbps = nbytes / copy_us / 1e3
            for op in ("softmax", "layernorm"):
                x64 = host.astype(np.float64)
                want = (
                    ref_softmax(x64)
                    if op == "softmax"
                    else ref_layernorm(x64, hw.astype(np.float64), hb.astype(np.float64))
                )
                modes, torch = modes_for(op, x, w, b, device)
                for name, fn in modes.items():
                    try:
                        got = to_np(fn()).astype(np.float64)
                        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

                        def full_sync():
                            sync()
                            if torch is not None:
                                torch.cuda.synchronize()

                        ft.reset_stats()
                        us = timeit(fn, full_sync, args.calls, args.repeats)
                        launches = (
                            ft.stats()["launches"] / (3 + args.calls * args.repeats)
                            if name.startswith("fusetree")
                            else None
                        )
                        gbps = nbytes / us / 1e3
                        kus = kernel_us(fn, 20) if device == "cuda" and args.kernel_time else None
                        recs.append(Record(op, "x".join(map(str, shape)), dt, name, us, gbps,
                                           100 * gbps / copy_gbps, launches, err, kernel_us=kus))  # fmt: skip
                        ktxt = f", kernels {kus:.1f} us" if kus is not None else ""
                        print(f"  {op} {recs[-1].shape} {dt} {name}: {us:.1f} us ({recs[-1].pct_copy:.0f}% of copy{ktxt})",
                              flush=True)  # fmt: skip
                        # (rows printed as they come: a run cut off by a time limit keeps them)
                    except Exception as e:
                        recs.append(Record(op, "x".join(map(str, shape)), dt, name, float("nan"), float("nan"),
                                           float("nan"), None, float("nan"), f"failed: {type(e).__name__}: {e}"[:160]))  # fmt: skip
            copy_kus = (
                kernel_us(lambda: cp.copyto(scratch, x), 20)
                if device == "cuda" and args.kernel_time
                else None
            )
            recs.append(
                Record(
                    "copy",
                    "x".join(map(str, shape)),
                    dt,
                    "device copy",
                    copy_us,
                    copy_gbps,
                    100.0,
                    None,
                    0.0,
                    kernel_us=copy_kus,
                )
            )
    return recs


def table(recs: list[Record]) -> str:
    lines = ["| op | shape | dtype | mode | µs/call | GB/s | % copy | launches | rel err | vs fusetree | kernel µs |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    base = {(r.op, r.shape, r.dtype): r.us for r in recs if r.mode == "fusetree"}
    for r in recs:
        b = base.get((r.op, r.shape, r.dtype))
        rel = f"{r.us / b:.2f}x" if b and r.us == r.us else "-"
        la = f"{r.launches:.1f}" if r.launches is not None else "-"
        ku = f"{r.kernel_us:.1f}" if r.kernel_us is not None else "-"
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.op} | {r.shape} | {r.dtype} | {r.mode}{note} | {r.us:.1f} | {r.gbps:.0f} | "
                     f"{r.pct_copy:.0f}% | {la} | {r.rel_err:.1e} | {rel} | {ku} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--shapes", help="e.g. 4096x4096,64x128x1024 (default: the standard set)")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    p.add_argument("--no-kernel-time", dest="kernel_time", action="store_false",
                   help="CUDA: skip the CUPTI kernel time of each mode")  # fmt: skip
    a = p.parse_args()
    if a.quick:
        a.calls, a.repeats = min(a.calls, 5), min(a.repeats, 3)
    recs = run(a)
    print(table(recs))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in recs], f, indent=1)


if __name__ == "__main__":
    main()
