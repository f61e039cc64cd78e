"""Host overhead per phase: what fusetree costs on the host for small steps, against its peers.

    python benchmarks/host_overhead.py [--device cpu|cuda] [--json out.json]

Rows (µs per call, median of repeats, device synchronized at the end of each timed loop, warm-up
excluded, small arrays so that host time is what is measured):

* build: one op node (``a * b``, not evaluated); a 10-node tree;
* engine phases of ``a*b+c`` (fusetree.engine.phases): building, plan lookup (a hit), output
  allocation, binding, bind + launch, and realizing the prebuilt tree;
* whole calls: ``ft.evaluate(a*b+c)`` (4096 elements), a 10-node tree built and launched, an LSTM and
  a GRU step (2 GEMMs + 1 fused kernel) eager, ``ft.jit`` replay of ``a*b+c`` and of the LSTM step;
* peers in the same run: NumPy (CPU); CuPy ElementwiseKernel and RawKernel, torch eager and the
  raw driver launch of a prepacked kernel (GPU).

The table's last column is the ratio to the row's peer (fusetree ÷ peer: below 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

from lstm_ref import NumpyXP, gru_step, lstm_step, make_gru_inputs, make_inputs

import fusetree as ft
from fusetree.engine.phases import per_call


def ten(xp, a, b):
    return xp.tanh(a * b + 1.5) * xp.sigmoid(b - a) + xp.exp(a) / 3.0 - b * 0.5


class CupyXP:
    @staticmethod
    def sigmoid(z):
        import cupy as cp

        return 1.0 / (1.0 + cp.exp(-z))

    @staticmethod
    def tanh(z):
        import cupy as cp

        return cp.tanh(z)

    @staticmethod
    def exp(z):
        import cupy as cp

        return cp.exp(z)


def run(device: str, quick: bool) -> list[dict]:
    n_calls = 300 if quick else 2000
    reps = 3 if quick else 7
    rows: list[dict] = []

    def row(case: str, mode: str, us: float, peer: str | None = None) -> None:
        rows.append({"case": case, "mode": mode, "us": us, "peer": peer, "device": device})

    def t(fn, n=n_calls):
        return per_call(fn, sync, n, reps)

    if device == "cuda":
        import cupy as cp

        conv = cp.asarray
        sync = cp.cuda.Device().synchronize
        xp_peer, peer_name = CupyXP, "cupy"
    else:
        conv = np.asarray
        sync = lambda: None
        xp_peer, peer_name = NumpyXP, "numpy"
    rng = np.random.default_rng(0)
    N = 4096
    A, B, C = (conv(rng.random(N, dtype=np.float32)) for _ in range(3))
    fa, fb, fc = ft.asarray(A), ft.asarray(B), ft.asarray(C)

    # -- building -----------------------------------------------------------------------------
    if device == "cpu":
        row("build 1 node (a * b)", "fusetree", t(lambda: fa * fb, n_calls * 5), "numpy ufunc a * b")
        row("build 1 node (a * b)", "numpy ufunc a * b", t(lambda: A * B, n_calls * 5))
    else:
        row("build 1 node (a * b)", "fusetree", t(lambda: fa * fb, n_calls * 5))
    row("build 10-node tree", "fusetree", t(lambda: ten(ft, fa, fb)))

    # -- engine phases on a prebuilt tree ---------------------------------------------------------
    from fusetree.engine.phases import phases

    for name, us in phases(lambda: fa * fb + fc, sync, n_calls, reps).items():
        row(f"phase: {name} (a*b+c)", "fusetree", us)

    # -- whole calls --------------------------------------------------------------------------------
    row("evaluate(a*b+c), 4096 f32", "fusetree", t(lambda: ft.evaluate(fa * fb + fc)), f"{peer_name} a*b+c")
    row("evaluate(a*b+c), 4096 f32", f"{peer_name} a*b+c", t(lambda: A * B + C))
    if device == "cuda":
        ek = cp.ElementwiseKernel(
            "float32 a, float32 b, float32 c", "float32 o", "o = a * b + c", "ft_peer_abc"
        )
        out = cp.empty_like(A)
        row("evaluate(a*b+c), 4096 f32", "cupy ElementwiseKernel", t(lambda: ek(A, B, C)))
        row("evaluate(a*b+c), 4096 f32", "cupy ElementwiseKernel (out=)", t(lambda: ek(A, B, C, out)))
        rk = cp.RawKernel(
            r'extern "C" __global__ void abc(const float* a, const float* b, const float* c, float* o, int n)'
            r"{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = a[i] * b[i] + c[i]; }",
            "abc",
        )
        grid, block = ((N + 255) // 256,), (256,)
        row(
            "evaluate(a*b+c), 4096 f32",
            "cupy RawKernel (out=)",
            t(lambda: rk(grid, block, (A, B, C, out, np.int32(N)))),
        )
        raw = raw_driver_launch(rk, A, B, C, out, N)
        if raw is not None:
            row("evaluate(a*b+c), 4096 f32", "raw cuLaunchKernel (prepacked)", t(raw))
        raw_cy = raw_driver_launch(rk, A, B, C, out, N, cython=True)
        if raw_cy is not None:
            row("evaluate(a*b+c), 4096 f32", "raw cuLaunchKernel (prepacked, Cython)", t(raw_cy))
        try:
            import torch

            ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (A, B, C))
            row("evaluate(a*b+c), 4096 f32", "torch eager (2 ops)", t(lambda: ta * tb + tc))
        except Exception:
            pass
    row(
        "10-node tree built + launched",
        "fusetree",
        t(lambda: ft.evaluate(ten(ft, fa, fb))),
        f"{peer_name} 10 ops",
    )
    row(
        "10-node tree built + launched",
        f"{peer_name} 10 ops",
        t(lambda: ten(xp_peer, A, B)),
    )

    jabc = ft.jit(lambda a, b, c: a * b + c)
    row("jit replay a*b+c", "fusetree", t(lambda: jabc(fa, fb, fc)), f"{peer_name} a*b+c")
    fo = ft.asarray(conv(np.zeros(N, np.float32)))

    def ten_stores(a, b, o):
        for _ in range(10):
            o[...] = o * a + b  # written into an argument: nothing allocated
            ft.evaluate(o)  # a flush: one kernel each (deferred stores would chain all ten into one)
        return ()

    j10 = ft.jit(ten_stores)
    us10 = t(lambda: j10(fa, fb, fo), max(50, n_calls // 4))
    row("jit replay, 10 kernels (stores into an argument)", "fusetree", us10)
    row(
        "jit replay, per recorded kernel",
        "fusetree",
        us10 / 10,
        "raw cuLaunchKernel (prepacked)" if device == "cuda" else None,
    )
    if device == "cuda":
        jg = ft.jit(graph=True)(ten_stores)
        row(
            "jit graph replay, 10 kernels (stores into an argument)",
            "fusetree",
            t(lambda: jg(fa, fb, fo), max(50, n_calls // 4)),
        )

    # -- recurrent steps --------------------------------------------------------------------------
    configs = [(16, 64)] if device == "cpu" else [(64, 512), (128, 512)]
    for Bsz, H in configs:
        cfg = f"B{Bsz} H{H}"
        x, h, c, Wx, Wh, b = (conv(v) for v in make_inputs(rng, Bsz, H))
        fx, fh, fcc, fWx, fWh, fbb = (ft.asarray(v) for v in (x, h, c, Wx, Wh, b))

        def lstm_ft():
            h2, c2 = lstm_step(fx, fh, fcc, fWx, fWh, fbb, xp=ft)
            ft.evaluate(h2, c2)

        row(f"LSTM step {cfg}", "fusetree eager", t(lstm_ft, n_calls // 2), f"{peer_name} LSTM step")
        row(
            f"LSTM step {cfg}",
            f"{peer_name} LSTM step",
            t(lambda: lstm_step(x, h, c, Wx, Wh, b, xp=xp_peer), n_calls // 2),
        )
        jl = ft.jit(lambda *a: lstm_step(*a, xp=ft))
        row(f"LSTM step {cfg}", "fusetree jit", t(lambda: jl(fx, fh, fcc, fWx, fWh, fbb), n_calls // 2))
        gx, gh, gWx, gWh, gbx, gbh = (conv(v) for v in make_gru_inputs(rng, Bsz, H))
        fg = [ft.asarray(v) for v in (gx, gh, gWx, gWh, gbx, gbh)]

        def gru_ft():
            ft.evaluate(gru_step(*fg, xp=ft))

        row(f"GRU step {cfg}", "fusetree eager", t(gru_ft, n_calls // 2), f"{peer_name} GRU step")
        row(
            f"GRU step {cfg}",
            f"{peer_name} GRU step",
            t(lambda: gru_step(gx, gh, gWx, gWh, gbx, gbh, xp=xp_peer), n_calls // 2),
        )
        jg = ft.jit(lambda *a: gru_step(*a, xp=ft))
        row(f"GRU step {cfg}", "fusetree jit", t(lambda: jg(*fg), n_calls // 2))
        if device == "cuda":
            try:
                import torch

                torch.backends.cuda.matmul.allow_tf32 = False
                cell = torch.nn.LSTMCell(H, H).cuda()
                gcell = torch.nn.GRUCell(H, H).cuda()
                tx, th, tc = (torch.as_tensor(v, device="cuda") for v in (x, h, c))
                with torch.no_grad():
                    row(f"LSTM step {cfg}", "torch LSTMCell", t(lambda: cell(tx, (th, tc)), n_calls // 2))
                    row(f"GRU step {cfg}", "torch GRUCell", t(lambda: gcell(tx, th), n_calls // 2))
            except Exception:
                pass
    return rows


def raw_driver_launch(rk, A, B, C, out, N, cython=False):
    """A prepacked cuLaunchKernel of CuPy's compiled RawKernel through ctypes (or, ``cython``,
    through CuPy's typed Cython binding, which fusetree launches with): the floor."""
    try:
        import ctypes

        import cupy as cp

        lib = ctypes.CDLL("libcuda.so.1")
        fn = rk.kernel.ptr
        vals = [ctypes.c_uint64(A.data.ptr), ctypes.c_uint64(B.data.ptr), ctypes.c_uint64(C.data.ptr),
                ctypes.c_uint64(out.data.ptr), ctypes.c_int32(N)]  # fmt: skip
        params = (ctypes.c_void_p * 5)(*[ctypes.addressof(v) for v in vals])
        launch = lib.cuLaunchKernel
        vp, u = ctypes.c_void_p, ctypes.c_uint
        launch.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        grid = (N + 255) // 256

        def go(keep=(vals, params)):  # the closure keeps the packed values and pointer array alive
            launch(fn, grid, 1, 1, 256, 1, 1, 0, cp.cuda.get_current_stream().ptr, params, None)

        if cython:
            from cupy_backends.cuda.api.driver import launchKernel

            pp = ctypes.addressof(params)

            def go_cy(keep=(vals, params)):
                launchKernel(fn, grid, 1, 1, 256, 1, 1, 0, cp.cuda.get_current_stream().ptr, pp, 0)

            return go_cy
        return go
    except Exception:
        return None


def table(rows: list[dict]) -> str:
    peers = {(r["case"], r["mode"]): r["us"] for r in rows}
    by_mode = {r["mode"]: r["us"] for r in rows}
    out = ["| case | mode | µs | vs peer |", "|---|---|---:|---:|"]
    for r in rows:
        p = (peers.get((r["case"], r["peer"])) or by_mode.get(r["peer"])) if r["peer"] else None
        ratio = f"{r['us'] / p:.2f}x {r['peer']}" if p else ""
        out.append(f"| {r['case']} | {r['mode']} | {r['us']:.2f} | {ratio} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    device = args.device
    if device is None:
        try:
            from numba import cuda

            device = "cuda" if cuda.is_available() else "cpu"
        except Exception:
            device = "cpu"
    rows = run(device, args.quick)
    from fusetree.ir.node import NATIVE

    front = "C (fusetree._native)" if NATIVE is not None else "Python"
    for r in rows:
        r["front_end"] = front
    print(f"host overhead, device={device}, front end: {front} (µs per call, median)")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
