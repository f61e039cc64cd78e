"""Device bandwidth of fused elementwise kernels vs a device-to-device copy and torch.compile, one run.

    python benchmarks/bandwidth.py [--size 8192] [--sweep] [--json out.json]

Cases over an (S, S) matrix (S = 8192: 64M elements), float32 and float16: contiguous
``a*b+exp(c)``, a 6-input expression, a row-broadcast bias + relu + residual, a column-broadcast scale
+ residual, and a transposed input. GB/s counts the fused minimum (every full-size input read once,
the output written once); % copy compares with ``cupy.copyto`` of the same dtype in the same run.
fusetree writes into a preallocated output (``out[...] = expr``); torch.compile returns a fresh
tensor (its caching allocator: no allocation cost). Timed with CUDA events over repeated calls,
median of repeats, warm-up excluded. Each fusetree result is checked against torch's.
``--sweep``: block size x waves for two float32 cases (the numbers behind the launch shapes in
``fusetree/backends/cuda.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gpu_time(fn, repeats=7, iters=20):
    import time

    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # clocks up to speed (the GPU idles while kernels compile)
        for _ in range(10):
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


def cases(xp):
    """name -> (expression over (a, b, c, d, e, f, bias, col, at), number of full-size inputs)."""
    sig = xp.sigmoid
    relu = xp.relu if hasattr(xp, "relu") else (lambda x: xp.maximum(x, 0))
    return {
        "contiguous a*b+exp(c)": (lambda v: v["a"] * v["b"] + xp.exp(v["c"]), 3),
        "6-input": (lambda v: (v["a"] * v["b"] + v["c"]) * sig(v["d"]) - v["e"] / (v["f"] + 2), 6),
        "row-broadcast relu(x+bias)+res": (lambda v: relu(v["a"] + v["bias"]) + v["b"], 2),
        "column-broadcast x*s+res": (lambda v: v["a"] * v["col"] + v["b"], 2),
        "transposed a.T+b": (lambda v: v["at"].T + v["b"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    import fusetree as ft
    from fusetree.engine import kernels

    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
        except Exception as e:  # pragma: no cover
            print(f"torch unavailable: {e}", file=sys.stderr)
    S = args.size
    n = S * S
    rows = []
    for dt in (cp.float32, cp.float16):
        name_dt = cp.dtype(dt).name
        item = cp.dtype(dt).itemsize
        rng = cp.random.default_rng(0)
        full = {k: rng.standard_normal((S, S), dtype=cp.float32).astype(dt) for k in "abcdef"}
        full["at"] = rng.standard_normal((S, S), dtype=cp.float32).astype(dt)
        small = {"bias": rng.standard_normal(S, dtype=cp.float32).astype(dt),
                 "col": rng.standard_normal((S, 1), dtype=cp.float32).astype(dt)}  # fmt: skip
        out = cp.empty((S, S), dt)
        t = gpu_time(lambda: cp.copyto(out, full["a"]))
        copy_bw = 2 * n * item / t / 1e9
        rows.append(
            {
                "case": "copy",
                "dtype": name_dt,
                "impl": "cupy.copyto",
                "us": t * 1e6,
                "gbps": copy_bw,
                "pct": 100.0,
            }
        )
        fv = {k: ft.asarray(v) for k, v in {**full, **small}.items()}
        fo = ft.asarray(out)
        tv = {k: torch.as_tensor(v, device="cuda") for k, v in {**full, **small}.items()} if torch else None
        for (name, (expr, nin)), (_, (texpr, _)) in zip(
            cases(ft).items(), cases(torch).items() if torch else cases(ft).items()
        ):

            def run_ft(expr=expr):
                fo[...] = expr(fv)

            nbytes = (nin + 1) * n * item
            t = gpu_time(run_ft)
            rows.append({"case": name, "dtype": name_dt, "impl": "fusetree", "us": t * 1e6, "gbps": nbytes / t / 1e9,
                         "pct": 100 * nbytes / t / 1e9 / copy_bw})  # fmt: skip
            if torch is not None:
                fn = torch.compile(texpr)
                t = gpu_time(lambda fn=fn: fn(tv))
                rows.append({"case": name, "dtype": name_dt, "impl": "torch.compile", "us": t * 1e6,
                             "gbps": nbytes / t / 1e9, "pct": 100 * nbytes / t / 1e9 / copy_bw})  # fmt: skip
                want = cp.asarray(fn(tv)).astype(cp.float32)
                run_ft()
                got = out.astype(cp.float32)
                tol = 2e-2 if dt == cp.float16 else 1e-5
                ok = cp.isfinite(want)  # x / (f + 2) overflows float16 where f is near -2
                err = float(cp.max(cp.where(ok, cp.abs(got - want) / (cp.abs(want) + 1), 0)))
                same_nonfinite = bool(cp.all(ok == cp.isfinite(got)))
                rows[-2]["max_err_vs_torch"] = err
                if not (err < tol and same_nonfinite):
                    print(f"MISMATCH {name} {name_dt}: fusetree differs from torch by {err}", file=sys.stderr)
                    rows[-2]["case"] += " (MISMATCH)"
            if args.sweep and name in ("row-broadcast relu(x+bias)+res", "column-broadcast x*s+res"):
                run_ft()
                k = list(kernels._CACHE.values())[-1]  # the kernel just used
                saved = (k.block, k.max_blocks)
                sms = cp.cuda.Device().attributes["MultiProcessorCount"]
                for block in (128, 256, 512, 1024):
                    for waves in (1, 4, 10**6):
                        k.block, k.max_blocks = block, min(10**9, sms * waves * (2048 // block))
                        t = gpu_time(run_ft, repeats=3, iters=10)
                        rows.append({"case": f"  sweep {name} block={block} waves={waves}", "dtype": name_dt,
                                     "impl": "fusetree", "us": t * 1e6, "gbps": nbytes / t / 1e9,
                                     "pct": 100 * nbytes / t / 1e9 / copy_bw})  # fmt: skip
                k.block, k.max_blocks = saved
                rows.append({"case": f"  (default: block={saved[0]}, max_blocks={saved[1]}, per_thread={k.per_thread})",
                             "dtype": name_dt, "impl": "fusetree", "us": 0.0, "gbps": 0.0, "pct": 0.0})  # fmt: skip
    print(f"\n| case ({S}x{S}) | dtype | impl | µs | GB/s | % of copy |\n|---|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['dtype']} | {r['impl']} | {r['us']:.1f} | {r['gbps']:.0f} | {r['pct']:.1f}% |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"size": S, "rows": rows, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
