"""Training benchmark: the seed's char-LSTM (examples/char_lstm.py) at neon's shapes.

For fusetree eager / jit / graph and torch peers (nn.LSTM on cuDNN, an nn.LSTMCell loop), same
math (float32, no TF32), same initialization, same batches, same clipping and AdamW formula:

* tokens/s (T*B per step over the median step time, synchronized, warm-up excluded);
* launches per time step: on CUDA the profiler's count of kernels and copies per step (a CUDA
  graph's nodes counted one by one), on the CPU fusetree's launch counter; divided by T;
* GPU busy fraction: the union of kernel intervals / wall time over the timed steps (CUPTI via
  torch.profiler: it sees fusetree's driver launches as well); CUPTI's host cost lengthens a
  host-bound step, so the same kernel time is also divided by the steps' *unprofiled* wall time;
* the loss after --check steps against torch nn.LSTM from the same start.

    python benchmarks/train_lstm.py --device cuda                      # B128 H512 T64
    python benchmarks/train_lstm.py --device cpu --batch 8 --hidden 32 --seq 8 --steps 3
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import char_lstm as C

import fusetree as ft


def sync(device: str) -> None:
    ft.synchronize()
    if device == "cuda":
        import cupy as cp

        cp.cuda.runtime.deviceSynchronize()


# ---------------------------------------------------------------------------------------------
# torch peers: the same model, loss, clipping and AdamW formula


def torch_model(init: dict, vocab: int, hidden: int, device: str, cell: bool):
    import torch

    dev = torch.device("cuda" if device == "cuda" else "cpu")
    H = hidden
    perm = np.concatenate(
        [np.arange(0, 2 * H), np.arange(3 * H, 4 * H), np.arange(2 * H, 3 * H)]
    )  # ifog -> ifgo
    lstm = (torch.nn.LSTMCell(vocab, H) if cell else torch.nn.LSTM(vocab, H)).to(dev)
    sfx = "" if cell else "_l0"
    with torch.no_grad():
        getattr(lstm, "weight_ih" + sfx).copy_(torch.from_numpy(init["Wx"][:, perm].T.copy()))
        getattr(lstm, "weight_hh" + sfx).copy_(torch.from_numpy(init["Wh"][:, perm].T.copy()))
        getattr(lstm, "bias_ih" + sfx).copy_(torch.from_numpy(init["b"][perm].copy()))
        getattr(lstm, "bias_hh" + sfx).zero_()
    getattr(lstm, "bias_hh" + sfx).requires_grad_(False)  # one bias, as the fusetree model has
    lin = torch.nn.Linear(H, vocab).to(dev)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(init["Wy"].T.copy()))
        lin.bias.copy_(torch.from_numpy(init["by"]))
    params = [p for p in list(lstm.parameters()) + list(lin.parameters()) if p.requires_grad]
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]

    def step(X, Y, lr_t, clip=5.0, b1=0.9, b2=0.999, wd=1e-4, eps=1e-8):
        T, B, V = X.shape
        if cell:
            h = torch.zeros(B, H, device=dev)
            c = torch.zeros(B, H, device=dev)
            hs = []
            for t in range(T):
                h, c = lstm(X[t], (h, c))
                hs.append(h)
            out = torch.stack(hs)
        else:
            out, _ = lstm(X)
        logits = lin(out.reshape(T * B, H))
        loss = torch.nn.functional.cross_entropy(logits, Y.reshape(T * B, V).argmax(-1))
        for p in params:
            p.grad = None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        with torch.no_grad():
            grads = [p.grad for p in params]
            ms, vs = [s[0] for s in state], [s[1] for s in state]
            torch._foreach_mul_(ms, b1)
            torch._foreach_add_(ms, grads, alpha=1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            den = torch._foreach_add(torch._foreach_sqrt(vs), eps)
            upd = torch._foreach_div(ms, den)
            torch._foreach_add_(upd, params, alpha=wd)
            torch._foreach_add_(params, upd, alpha=-lr_t)
        return loss

    return step, dev


# ---------------------------------------------------------------------------------------------


def busy_fraction(run_steps, n: int) -> tuple[float, float] | None:
    """(union of CUDA kernel intervals, wall time) in µs over ``n`` steps run under torch.profiler
    (CUPTI). CUPTI's own host cost lengthens the wall time of a host-bound step, so the caller also
    divides the kernel time by the *unprofiled* wall time of ``n`` steps."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run_steps(n)
        wall = (time.perf_counter() - t0) * 1e6
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start
    )
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return (busy, wall) if wall > 0 else None


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", type=int, default=5, help="steps for the loss comparison with torch")
    ap.add_argument("--modes", default="fusetree,fusetree-jit,fusetree-graph,torch-cudnn,torch-lstmcell")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--curve", type=int, default=0, help="also train this many steps (fresh batches) per mode"
    )
    ap.add_argument("--plot", default=None, help="loss curves of --curve to this PNG (matplotlib)")
    a = ap.parse_args(argv)
    known = ("fusetree", "fusetree-jit", "fusetree-graph", "torch-cudnn", "torch-lstmcell")
    modes = ["fusetree" if m == "fusetree-eager" else m for m in a.modes.split(",")]  # (an alias)
    unknown = [m for m in modes if m not in known]
    if unknown:
        ap.error(
            f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(known)} (fusetree-eager = fusetree)"
        )
    modes = [m for m in modes if a.device == "cuda" or "graph" not in m]
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    except ImportError:
        torch = None  # type: ignore[assignment]
        modes = [m for m in modes if not m.startswith("torch")]
    text = open(C.DEFAULT_TEXT, encoding="utf-8").read()
    B, H, T = a.batch, a.hidden, a.seq
    probe = C.Batches(text, T, B, 0)
    init = C.init_params(np.random.default_rng(0), probe.vocab, H)
    rows = []
    losses: dict[str, list[float]] = {}
    for mode in modes:
        batches = C.Batches(text, T, B, 0)
        data = [batches.next() for _ in range(max(a.check, 4))]
        if mode.startswith("fusetree"):
            tr = C.Trainer(
                init, a.device, {"fusetree": "eager", "fusetree-jit": "jit", "fusetree-graph": "graph"}[mode]
            )

            # the batches on the device up front, as for the torch peers (no per-step upload)
            fdata = [(ft.asarray(x, device=a.device), ft.asarray(y, device=a.device)) for x, y in data]

            def one(k: int, tr=tr, data=fdata) -> float:
                return tr.step(*data[k % len(data)])

            def to_float(x) -> float:
                return float(x)
        else:
            step, dev = torch_model(init, probe.vocab, H, a.device, cell=mode == "torch-lstmcell")
            tdata = [(torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)) for x, y in data]
            counter = {"t": 0}

            def one(k: int, step=step, tdata=tdata, counter=counter):
                counter["t"] += 1
                t = counter["t"]
                return step(*tdata[k % len(tdata)], 1e-2 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t))

            def to_float(x) -> float:
                return float(x.item())

        curve: list[float] = []
        if a.curve:  # a longer run from the same start on fresh batches: the loss curve
            cb = C.Batches(text, T, B, 1)
            if mode.startswith("fusetree"):
                ctr = C.Trainer(
                    init,
                    a.device,
                    {"fusetree": "eager", "fusetree-jit": "jit", "fusetree-graph": "graph"}[mode],
                    lr=1e-2,
                )
                curve = [float(ctr.step(*cb.next())) for _ in range(a.curve)]
            else:
                cstep, cdev = torch_model(init, probe.vocab, H, a.device, cell=mode == "torch-lstmcell")
                for k in range(a.curve):
                    x, y = cb.next()
                    lr_k = 1e-2 * math.sqrt(1 - 0.999 ** (k + 1)) / (1 - 0.9 ** (k + 1))
                    curve.append(
                        float(cstep(torch.from_numpy(x).to(cdev), torch.from_numpy(y).to(cdev), lr_k).item())
                    )
        # the loss from the same start over the first --check steps (lr 1e-2 like the Trainer's default)
        if mode.startswith("fusetree"):
            tr.lr = 1e-2
        losses[mode] = [to_float(one(k)) for k in range(a.check)]
        for k in range(2):  # warm-up (a jit trace, a graph capture)
            one(k)
        sync(a.device)
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for k in range(a.steps):
                one(k)
            sync(a.device)
            if torch is not None and a.device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / a.steps)
        med = statistics.median(times)
        launches = own = None
        if mode.startswith("fusetree"):  # fusetree's own count: its kernels, GEMM calls and copies
            ft.reset_stats()
            one(0)
            sync(a.device)
            st = ft.stats()
            own = {k: st[k] / T for k in ("launches", "kernels", "gemms", "copies")}
            if a.device != "cuda":
                launches = own["launches"]
        busy = busy_unprofiled = None
        if a.device == "cuda" and torch is not None:

            def run_steps(n: int) -> None:
                for k in range(n):
                    one(k)
                sync(a.device)
                torch.cuda.synchronize()

            measured = busy_fraction(run_steps, a.steps)
            if measured is not None:
                busy = min(1.0, measured[0] / measured[1])
                busy_unprofiled = min(1.0, measured[0] / (a.steps * med * 1e6))
            if launches is None:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    run_steps(1)
                names = collections.Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")
                launches = sum(names.values()) / T
                top = ", ".join(f"{n[:60]} {c / T:.2f}" for n, c in names.most_common(8))
                mine = "" if own is None else f"fusetree's count {own}; "
                print(f"{mode}: per time step, {mine}the profiler's kernels and copies: {top}", file=sys.stderr,
                      flush=True)  # fmt: skip
        rows.append({"mode": mode, "ms_per_step": med * 1e3, "tokens_per_s": T * B / med,
                     "launches_per_time_step": launches, "fusetree_count_per_time_step": own, "gpu_busy": busy,
                     "kernel_time_over_unprofiled_wall": busy_unprofiled,
                     "loss_after_check": losses[mode][-1], "losses": losses[mode], "curve": curve})  # fmt: skip
        print(f"{mode}: {med * 1e3:.2f} ms/step", file=sys.stderr, flush=True)
    ref = losses.get("torch-cudnn")
    print(
        f"\nchar-LSTM training step, B{B} H{H} T{T} vocab {probe.vocab}, float32 (no TF32), device={a.device}"
    )
    print("| mode | ms/step | tokens/s | launches per time step | GPU busy (profiled) | kernel time / "
          f"unprofiled step | loss after {a.check} steps | vs torch-cudnn loss |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        dl = f"{abs(r['loss_after_check'] - ref[-1]) / abs(ref[-1]):.1e}" if ref else "-"
        busy = "-" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
        ratio = r["kernel_time_over_unprofiled_wall"]
        busy += " | " + ("-" if ratio is None else f"{100 * ratio:.0f}%")
        lps = "-" if r["launches_per_time_step"] is None else f"{r['launches_per_time_step']:.1f}"
        print(f"| {r['mode']} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | {lps} | {busy} | "
              f"{r['loss_after_check']:.4f} | {dl} |")  # fmt: skip
    if a.plot and a.curve:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4))
            for r in rows:
                ax.plot(range(1, len(r["curve"]) + 1), r["curve"], label=r["mode"], lw=1)
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy (nats/char)")
            ax.set_title(f"char-LSTM B{B} H{H} T{T}, {a.device}: same init, same batches")
            ax.legend()
            fig.tight_layout()
            fig.savefig(a.plot, dpi=110)
        except ImportError:
            print("matplotlib is not installed: no plot", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
