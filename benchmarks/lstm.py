"""LSTM step benchmark: fusetree fused vs unfused against NumPy (CPU) or CuPy/PyTorch/cuDNN (GPU).

    python benchmarks/lstm.py                      # cuda if a GPU is present, else cpu
    python benchmarks/lstm.py --device cpu --quick
    python benchmarks/lstm.py --configs 64x512,128x512 --out results

Sections: ``step`` is a whole LSTM step (two GEMMs and the elementwise cell); ``cell`` only the
elementwise part (gates -> h2, c2), timed on its own on the CPU; ``sequence`` a T=100 layer, per
step (GPU). The table's last column is each row's time divided by eager fusetree's in the same
section (above 1: fusetree eager is faster than that row; fusetree-jit rows below 1 are faster than
eager). The table, a JSON record and a bar chart (if matplotlib is installed) are written to
``--out`` (default ``results/``).

Every mode runs the same step on the same inputs and weights, is checked against a float64 NumPy
reference (relative error ||out - ref|| / ||ref|| of h2 and c2), and is timed as wall time per step over
a loop of steps with the device synchronized at the end (host overhead counts), median of repeats,
warm-up excluded. Math mode: plain fp32, no TF32 (for every mode alike).
On the CPU the elementwise cell (gates -> h2, c2) is also timed on its own, since at B1024 H2048
two ~34 GFLOP GEMMs dominate a whole step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from lstm_ref import NumpyXP, lstm_cell, lstm_layer, lstm_step, make_inputs, reference, rel_err

import fusetree as ft


@dataclass
class Record:
    config: str
    section: str  # "step", "cell" or "sequence"
    mode: str
    us_per_step: float
    launches_per_step: float | None
    rel_err: float
    note: str = ""


def has_gpu() -> bool:
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def timeit(
    step: Callable[[], object], sync: Callable[[], None], steps: int, repeats: int, warmup: int
) -> float:
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times) * 1e6


# ----------------------------------------------------------------------------------------------
# CPU modes


def cpu_modes(inputs):
    x, h, c, Wx, Wh, b = inputs

    def numpy_mode():
        state = [h, c]

        def step():
            h2, c2 = lstm_step(x, state[0], state[1], Wx, Wh, b, xp=NumpyXP)
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    return {
        "fusetree": fusetree_mode(inputs, True),
        "fusetree-jit": jit_mode(x, h, c, Wx, Wh, b),
        "fusetree-unfused": fusetree_mode(inputs, False),
        "numpy": numpy_mode,
    }


def fusetree_mode(inputs, fuse: bool):
    """Natural eager code: the step builds its tree, ``ft.evaluate`` launches it."""
    x, h, c, Wx, Wh, b = inputs

    def make():
        with ft.options(fuse=fuse):
            fx, fWx, fWh, fb = (ft.asarray(a) for a in (x, Wx, Wh, b))
            state = [ft.asarray(h.copy()), ft.asarray(c.copy())]

        def step():
            h2, c2 = lstm_step(fx, state[0], state[1], fWx, fWh, fb, xp=ft)
            ft.evaluate(h2, c2)
            state[0], state[1] = h2, c2
            return h2, c2

        return step if fuse else _unfused(step)

    return make


def jit_mode(x, h, c, Wx, Wh, b, graph: bool = False):
    """The same natural step under ft.jit: traced once, then replayed (``graph``: as a CUDA
    graph; its outputs are static buffers, fed back as the next step's inputs)."""

    def make():
        fx, fWx, fWh, fb = (ft.asarray(a) for a in (x, Wx, Wh, b))
        state = [ft.asarray(h.copy()), ft.asarray(c.copy())]
        step_fn = ft.jit(graph=graph)(lambda x_, h_, c_, a, u, v: lstm_step(x_, h_, c_, a, u, v, xp=ft))

        def step():
            h2, c2 = step_fn(fx, state[0], state[1], fWx, fWh, fb)
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    return make


def _unfused(step):
    def run():
        with ft.options(fuse=False):
            return step()

    return run


def cpu_cell_modes(gates, c):
    def fusetree_mode(fuse: bool):
        def make():
            fg, fc = ft.asarray(gates), ft.asarray(c)

            def step():
                with ft.options(fuse=fuse):
                    h2, c2 = lstm_cell(fg, fc, ft)
                    ft.evaluate(h2, c2)
                return h2, c2

            return step

        return make

    return {
        "fusetree": fusetree_mode(True),
        "fusetree-unfused": fusetree_mode(False),
        "numpy": lambda: lambda: lstm_cell(gates, c, NumpyXP),
    }


# ----------------------------------------------------------------------------------------------
# GPU modes (CuPy / PyTorch peers only where importable; never a hard dependency)


def gpu_modes(inputs):
    import cupy as cp

    x, h, c, Wx, Wh, b = (cp.asarray(a) for a in inputs)
    B, H = h.shape
    modes: dict[str, Callable[[], Callable[[], object]]] = {}

    modes["fusetree"] = fusetree_mode((x, h, c, Wx, Wh, b), True)
    modes["fusetree-jit"] = jit_mode(x, h, c, Wx, Wh, b)
    modes["fusetree-graph"] = jit_mode(x, h, c, Wx, Wh, b, graph=True)
    modes["fusetree-unfused"] = fusetree_mode((x, h, c, Wx, Wh, b), False)

    class CupyXP:
        @staticmethod
        def sigmoid(z):
            return 1.0 / (1.0 + cp.exp(-z))

        tanh = staticmethod(cp.tanh)

    def cupy_unfused():
        state = [h.copy(), c.copy()]

        def step():
            h2, c2 = lstm_step(x, state[0], state[1], Wx, Wh, b, xp=CupyXP)
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    modes["cupy-unfused"] = cupy_unfused

    def fused_cell(g0, g1, g2, g3, b0, b1, b2, b3, c_):
        i = 1.0 / (1.0 + cp.exp(-(g0 + b0)))
        f = 1.0 / (1.0 + cp.exp(-(g1 + b1)))
        o = 1.0 / (1.0 + cp.exp(-(g2 + b2)))
        g = cp.tanh(g3 + b3)
        c2 = f * c_ + i * g
        return o * cp.tanh(c2), c2

    fcell = cp.fuse(kernel_name="lstm_cell_fuse")(fused_cell)

    def cupy_fuse():
        state = [h.copy(), c.copy()]

        def step():
            gates = x @ Wx
            gates += state[0] @ Wh
            h2, c2 = fcell(gates[:, :H], gates[:, H : 2 * H], gates[:, 2 * H : 3 * H], gates[:, 3 * H :],
                           b[:H], b[H : 2 * H], b[2 * H : 3 * H], b[3 * H :], state[1])  # fmt: skip
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    modes["cupy-fuse"] = cupy_fuse

    src = r"""
    extern "C" __global__ void lstm_cell(const float* __restrict__ gates, const float* __restrict__ b,
                                         const float* __restrict__ c, float* __restrict__ xh,
                                         float* __restrict__ h2, float* __restrict__ c2, int B, int H) {
        int idx = blockIdx.x * blockDim.x + threadIdx.x;
        if (idx >= B * H) return;
        int r = idx / H, j = idx - r * H;
        const float* g = gates + (size_t)r * 4 * H;
        float i = 1.f / (1.f + expf(-(g[j] + b[j])));
        float f = 1.f / (1.f + expf(-(g[H + j] + b[H + j])));
        float o = 1.f / (1.f + expf(-(g[2 * H + j] + b[2 * H + j])));
        float gg = tanhf(g[3 * H + j] + b[3 * H + j]);
        float cc = f * c[idx] + i * gg;
        float hh = o * tanhf(cc);
        c2[idx] = cc; h2[idx] = hh; xh[(size_t)r * 2 * H + H + j] = hh;
    }"""
    kern = cp.RawKernel(src, "lstm_cell")
    W = cp.concatenate([Wx, Wh], axis=0)

    def cupy_handwritten():
        xh = cp.empty((B, 2 * H), cp.float32)
        xh[:, H:] = h
        gates = cp.empty((B, 4 * H), cp.float32)
        bufs = [(cp.empty((B, H), cp.float32), cp.empty((B, H), cp.float32)) for _ in range(2)]
        state = {"c": c.copy(), "k": 0}
        n = B * H
        grid = ((n + 255) // 256,)

        def step():
            xh[:, :H] = x  # the step's input (changes every step in real use)
            cp.matmul(xh, W, out=gates)
            h2, c2 = bufs[state["k"]]
            kern(grid, (256,), (gates, b, state["c"], xh, h2, c2, np.int32(B), np.int32(H)))
            state["c"], state["k"] = c2, 1 - state["k"]
            return h2, c2

        return step

    modes["cupy-handwritten"] = cupy_handwritten
    try:
        import torch
    except Exception:
        return modes, None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t = {
        k: torch.as_tensor(np.asarray(v), device="cuda")
        for k, v in zip(("x", "h", "c", "Wx", "Wh", "b"), inputs)
    }

    def torch_eager():
        state = [t["h"].clone(), t["c"].clone()]

        def step():
            h2, c2 = lstm_step(t["x"], state[0], state[1], t["Wx"], t["Wh"], t["b"], xp=torch)
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    modes["torch-eager"] = torch_eager

    def torch_lstmcell():
        m = torch.nn.LSTMCell(H, H).cuda()
        # fusetree's gate order is i, f, o, g; torch's is i, f, g, o
        perm = torch.cat(
            [torch.arange(0, 2 * H), torch.arange(3 * H, 4 * H), torch.arange(2 * H, 3 * H)]
        ).cuda()
        with torch.no_grad():
            m.weight_ih.copy_(t["Wx"].T[perm])
            m.weight_hh.copy_(t["Wh"].T[perm])
            m.bias_ih.copy_(t["b"][perm])
            m.bias_hh.zero_()
        state = [t["h"].clone(), t["c"].clone()]

        @torch.no_grad()
        def step():
            h2, c2 = m(t["x"], (state[0], state[1]))
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    modes["torch-lstmcell"] = torch_lstmcell

    def torch_compile():
        fn = torch.compile(lambda x_, h_, c_: lstm_step(x_, h_, c_, t["Wx"], t["Wh"], t["b"], xp=torch))
        state = [t["h"].clone(), t["c"].clone()]

        def step():
            h2, c2 = fn(t["x"], state[0], state[1])
            state[0], state[1] = h2, c2
            return h2, c2

        return step

    modes["torch-compile"] = torch_compile
    return modes, torch


def torch_launches(torch, step) -> float | None:
    """Kernels one step launches, from torch.profiler (CUDA activities)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return float(sum(1 for e in prof.events() if e.device_type.name == "CUDA"))
    except Exception:
        return None


def cudnn_sequence(torch, inputs, T: int, repeats: int) -> Record | None:
    x, h, c, Wx, Wh, b = inputs
    B, H = h.shape
    m = torch.nn.LSTM(H, H).cuda()
    xs = torch.randn(T, B, H, device="cuda")
    h0 = torch.as_tensor(h, device="cuda")[None]
    c0 = torch.as_tensor(c, device="cuda")[None]
    with torch.no_grad():
        us = timeit(lambda: m(xs, (h0, c0)), torch.cuda.synchronize, 5, repeats, 2) / T
    return Record(
        f"B{B} H{H}", "sequence", "cudnn-lstm", us, None, float("nan"), f"torch.nn.LSTM T={T}, per step"
    )


def sequence_records(torch, inputs, T: int, repeats: int) -> list[Record]:
    """An LSTM layer over T steps: fusetree-jit and fusetree-graph (one plan / one CUDA graph for
    the whole sequence, input projection as one GEMM up front) against cuDNN, same inputs."""
    import cupy as cp

    x, h, c, Wx, Wh, b = inputs
    B, H = h.shape
    rng = np.random.default_rng(1)
    X = rng.standard_normal((T, B, H)).astype(np.float32)
    cfg = f"B{B} H{H}"
    # float64 reference of the whole layer
    Y64 = np.empty((T, B, H))
    Yr, cr = lstm_layer(X.astype(np.float64), h.astype(np.float64), c.astype(np.float64),
                        Wx.astype(np.float64), Wh.astype(np.float64), b.astype(np.float64), Y64, NumpyXP)  # fmt: skip
    out: list[Record] = []
    dev = [ft.asarray(cp.asarray(a)) for a in (X, h, c, Wx, Wh, b)]
    for name, graph in (("fusetree-jit", False), ("fusetree-graph", True)):
        try:
            Y = ft.asarray(cp.empty((T, B, H), np.float32))
            layer = ft.jit(graph=graph)(
                lambda X_, h_, c_, a, u, v, Y_: lstm_layer(X_, h_, c_, a, u, v, Y_, ft)
            )
            Yo, co = layer(*dev, Y)
            Yo, co = layer(*dev, Y)  # graph: captured now
            err = max(rel_err(_np(Yo), Yr), rel_err(_np(co), cr))

            def sync():
                cp.cuda.Device().synchronize()

            ft.reset_stats()
            us = timeit(lambda: layer(*dev, Y), sync, 5, repeats, 2) / T
            calls = 2 + 5 * repeats
            launches = ft.stats()["launches"] / calls / T
            out.append(Record(cfg, "sequence", name, us, launches, err, f"T={T}, per step"))
        except Exception as e:
            out.append(Record(cfg, "sequence", name, float("nan"), None, float("nan"),
                              f"failed: {type(e).__name__}: {e}"[:200]))  # fmt: skip
    if torch is not None:
        r = cudnn_sequence(torch, inputs, T, repeats)
        if r:
            out.append(r)
    return out


# ----------------------------------------------------------------------------------------------


def run(args) -> list[Record]:
    device = args.device or ("cuda" if has_gpu() else "cpu")
    configs = (
        [tuple(int(v) for v in c.lower().split("x")) for c in args.configs.split(",")]
        if args.configs
        else None
    )
    if configs is None:
        if args.quick:
            configs = [(16, 64), (32, 128)]
        elif device == "cpu":
            configs = [(128, 512), (1024, 2048)]
        else:
            configs = [(64, 512), (128, 512), (256, 1024), (1024, 2048)]
    steps = args.steps or (5 if args.quick else (20 if device == "cpu" else 300))
    repeats = args.repeats or (3 if args.quick else (5 if device == "cpu" else 7))
    rng = np.random.default_rng(args.seed)
    records: list[Record] = []
    try:
        from tqdm import tqdm
    except Exception:
        tqdm = None
    # On the CPU every cell is timed before any whole step: OpenBLAS threads keep spinning after a
    # GEMM and steal the 2 cores from numba's threads (measured: the B1024 H2048 cell ran in 6 ms
    # right after the B128 steps, 3.2 ms on its own).
    jobs = [(B, H, "cell") for B, H in configs] if device == "cpu" else []
    jobs += [(B, H, "step") for B, H in configs]
    bar = tqdm(total=len(jobs), desc="lstm", file=sys.stderr) if tqdm else None
    for B, H, part in jobs:
        cfg = f"B{B} H{H}"
        inputs = make_inputs(rng, B, H)
        hr, cr = reference(*inputs) if part == "step" else (None, None)  # GEMMs: not before a cell
        big = B * H >= 1024 * 2048
        st = max(5, steps // 4) if (big and device == "cpu") else steps  # ~0.3 s a step there
        rp = repeats
        torch = None
        if device == "cpu":
            modes = cpu_modes(inputs)
            sync = lambda: None
        else:
            modes, torch = gpu_modes(inputs)
            import cupy as cp

            def sync():
                cp.cuda.Device().synchronize()
                if torch is not None:
                    torch.cuda.synchronize()

        if part == "cell":
            c = inputs[2]
            # gates with the spread of real pre-activations, drawn without a GEMM (see above)
            gates = (rng.standard_normal((B, 4 * H)) * 1.5).astype(np.float32)
            g64 = gates.astype(np.float64)
            hr_c, cr_c = lstm_cell(g64, c.astype(np.float64), NumpyXP)
            for name, make in cpu_cell_modes(gates, c).items():
                fn = make()
                h2, c2 = fn()
                err = max(rel_err(_np(h2), hr_c), rel_err(_np(c2), cr_c))
                ft.reset_stats()
                us = timeit(fn, sync, st * 2, rp, 2)
                total = 2 + st * 2 * rp
                launches = ft.stats()["launches"] / total if name.startswith("fusetree") else None
                records.append(Record(cfg, "cell", name, us, launches, err))
            if bar:
                bar.update(1)
            continue
        for name, make in modes.items():
            if args.modes and name not in args.modes.split(","):
                continue
            try:
                check = make()
                h2, c2 = check()  # one step from the initial state: accuracy
                err = max(rel_err(_np(h2), hr), rel_err(_np(c2), cr))
                stepper = make()
                ft.reset_stats()
                us = timeit(stepper, sync, st, rp, 2)
                total = 2 + st * rp
                launches: float | None = (
                    ft.stats()["launches"] / total if name.startswith("fusetree") else None
                )
                if torch is not None and name.startswith("torch"):
                    launches = torch_launches(torch, stepper)
                records.append(Record(cfg, "step", name, us, launches, err))
            except Exception as e:  # a peer failing must not hide the others
                records.append(
                    Record(
                        cfg,
                        "step",
                        name,
                        float("nan"),
                        None,
                        float("nan"),
                        f"failed: {type(e).__name__}: {e}"[:200],
                    )
                )
        if device == "cuda" and H == 512 and B in (64, 128) and not args.no_sequence:
            records.extend(sequence_records(torch, inputs, 100, repeats))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return records


def _np(a) -> np.ndarray:
    if isinstance(a, ft.Array):
        return a.numpy()
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def table(records: list[Record]) -> str:
    lines = [
        "| config | section | mode | µs/step | launches/step | rel_err | time ÷ fusetree eager |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    ref = {(r.config, r.section): r.us_per_step for r in records if r.mode == "fusetree"}
    for r in records:
        base = ref.get((r.config, r.section if r.section != "sequence" else "step"))
        sp = f"{r.us_per_step / base:.2f}x" if base and r.us_per_step == r.us_per_step else "-"
        la = f"{r.launches_per_step:.1f}" if r.launches_per_step is not None else "unknown"
        us = f"{r.us_per_step:.1f}" if r.us_per_step == r.us_per_step else "n/a"
        err = f"{r.rel_err:.1e}" if r.rel_err == r.rel_err else "-"
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.config} | {r.section} | {r.mode}{note} | {us} | {la} | {err} | {sp} |")
    return "\n".join(lines)


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.us_per_step == r.us_per_step]

    def size(cfg: str) -> int:
        b, h = cfg.replace("B", "").replace("H", "").split()
        return int(b) * int(h)

    configs = sorted({(r.config, r.section) for r in rows}, key=lambda t: (size(t[0]), t[1]))
    modes = list(dict.fromkeys(r.mode for r in rows))
    fig, ax = plt.subplots(figsize=(min(16, max(8, 1.2 * len(configs) + 4)), 5.5))
    w = 0.8 / max(1, len(modes))
    for k, m in enumerate(modes):
        xs, ys = [], []
        for i, cfg in enumerate(configs):
            v = [r.us_per_step for r in rows if (r.config, r.section) == cfg and r.mode == m]
            if v:
                xs.append(i + k * w)
                ys.append(v[0])
        ax.bar(xs, ys, w, label=m)
    ax.set_yscale("log")
    ax.set_ylabel("µs per step (log scale, lower is better)")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(configs))])
    ax.set_xticklabels([f"{c}\n{s}" for c, s in configs])
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("LSTM step: fusetree vs peers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--configs", help="comma-separated BxH list, e.g. 64x512,128x512")
    p.add_argument("--modes", help="comma-separated subset of modes")
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--steps", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sequence", action="store_true", help="skip the T=100 sequence section (GPU)")
    p.add_argument("--out", default="results", help="folder for lstm_<device>.{md,json,png} ('' : none)")
    p.add_argument("--json", help="also write the records to this file")
    p.add_argument("--plot", help="also write the bar chart to this file")
    args = p.parse_args(argv)
    records = run(args)
    device = args.device or ("cuda" if has_gpu() else "cpu")
    head = f"LSTM step, fp32 (no TF32), device={device}; wall µs per step, median of repeats, synchronized"
    print("\n" + head)
    print(table(records))
    jsons = [args.json] if args.json else []
    plots = [args.plot] if args.plot else []
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        base = os.path.join(args.out, f"lstm_{device}")
        with open(base + ".md", "w") as f:
            f.write(head + "\n\n" + table(records) + "\n")
        jsons.append(base + ".json")
        plots.append(base + ".png")
    for path in jsons:
        with open(path, "w") as f:
            json.dump([asdict(r) for r in records], f, indent=1)
    for path in plots:
        try:
            plot(records, path)
        except ImportError:
            print("matplotlib is not installed: no chart (pip install -e .[bench])", file=sys.stderr)
            break
    if args.out:
        print(
            f"written: {args.out}/lstm_{device}.md, .json"
            + (", .png" if os.path.exists(base + ".png") else "")
        )
    bad = [r for r in records if r.mode.startswith("fusetree") and not (r.rel_err <= 1e-5)]
    if bad:
        print("accuracy check FAILED:", bad, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
