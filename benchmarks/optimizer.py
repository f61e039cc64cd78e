"""AdamW over a model's parameters, written as natural in-place code, in every mode against peers.

    python benchmarks/optimizer.py [--device cpu|cuda] [--models small,gpt2] [--steps N] [--json F]

Models: ``small`` (GPT-2's structure at width 128: 148 tensors, ~3.1M parameters) and ``gpt2``
(GPT-2 small: 148 tensors, 124M). The step is three stores per parameter (m, v, p). Modes:
fusetree eager, eager with deferred stores (``ft.options(defer_stores=True)``: m, v and p of a
parameter in one kernel), ``ft.jit`` and ``ft.jit(graph=True)`` (traced with deferred stores; the parameters,
moments and gradients are passed as lists: a pytree), NumPy or CuPy with the same code, torch
``AdamW(foreach=True)`` and ``AdamW(fused=True)`` (GPU). The step-dependent bias corrections are a
small array the loop writes each step, so traced modes do not freeze them. Every mode runs
``--steps`` steps from the same state and is compared with a float64 NumPy reference, the caller's
arrays included; time is wall time per step, device synchronized, median of repeats, warm-up
excluded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, ".")

LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01


def shapes(model: str) -> list[tuple[int, ...]]:
    d, vocab, ctx, layers = (128, 5000, 256, 12) if model == "small" else (768, 50257, 1024, 12)
    out = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        out += [
            (d,),
            (d,),
            (d, 3 * d),
            (3 * d,),
            (d, d),
            (d,),
            (d,),
            (d,),
            (d, 4 * d),
            (4 * d,),
            (4 * d, d),
            (d,),
        ]
    return out + [(d,), (d,)]


def adamw(params, grads, ms, vs, coef, xp):
    """One AdamW step, natural in-place code. ``coef`` holds (lr / (1 - b1**t), 1 / (1 - b2**t))."""
    c1, c2 = coef[0], coef[1]
    for p, g, m, v in zip(params, grads, ms, vs):
        m[...] = B1 * m + (1 - B1) * g
        v[...] = B2 * v + (1 - B2) * (g * g)
        p[...] = p - c1 * m / (xp.sqrt(v * c2) + EPS) - (LR * WD) * p


def coefs(t: int) -> np.ndarray:
    return np.array([LR / (1 - B1**t), 1 / (1 - B2**t)])


def reference(P, G, steps):
    p = [x.astype(np.float64) for x in P]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    g = [x.astype(np.float64) for x in G]
    for t in range(1, steps + 1):
        adamw(p, g, m, v, coefs(t), np)
    return p, m, v


def rel(got, want) -> float:
    num = sum(float(np.sum((np.asarray(a, np.float64) - b) ** 2)) for a, b in zip(got, want))
    den = sum(float(np.sum(b**2)) for b in want)
    return (num / den) ** 0.5


def run(device: str, model: str, steps: int, repeats: int) -> list[dict]:
    import fusetree as ft

    rng = np.random.default_rng(0)
    shp = shapes(model)
    P0 = [(rng.standard_normal(s) * 0.02).astype(np.float32) for s in shp]
    G = [(rng.standard_normal(s) * 0.01).astype(np.float32) for s in shp]
    n_params = sum(int(np.prod(s)) for s in shp)
    refp, refm, refv = reference(P0, G, steps)
    rows: list[dict] = []
    if device == "cuda":
        import cupy as cp

        xp_dev = cp

        def sync():
            cp.cuda.Device().synchronize()

        def host(a):
            return cp.asnumpy(a)
    else:
        xp_dev = np

        def sync():
            pass

        def host(a):
            return np.asarray(a)

    def fresh():
        P = [xp_dev.asarray(p.copy()) for p in P0]
        M = [xp_dev.zeros(p.shape, np.float32) for p in P0]
        V = [xp_dev.zeros(p.shape, np.float32) for p in P0]
        Gd = [xp_dev.asarray(g) for g in G]
        return P, M, V, Gd

    def record(mode, make):
        try:
            step, state = make()
            for t in range(1, steps + 1):  # accuracy: `steps` steps from the initial state
                step(t)
            sync()
            err = max(rel([host(x) for x in state[0]], refp), rel([host(x) for x in state[1]], refm),
                      rel([host(x) for x in state[2]], refv))  # fmt: skip
            ft.reset_stats()
            times = []
            t = steps
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(5):
                    t += 1
                    step(t)
                sync()
                times.append((time.perf_counter() - t0) / 5 * 1e6)
            launches = ft.stats()["launches"] / (5 * repeats) if mode.startswith("fusetree") else None
            rows.append({"model": model, "tensors": len(shp), "params": n_params, "mode": mode,
                         "us": statistics.median(times), "launches": launches, "rel_err": err})  # fmt: skip
        except Exception as e:  # a failing mode must not hide the others
            rows.append({"model": model, "tensors": len(shp), "params": n_params, "mode": mode, "us": float("nan"),
                         "launches": None, "rel_err": float("nan"), "note": f"{type(e).__name__}: {e}"[:200]})  # fmt: skip

    def fusetree_mode(kind):
        def make():
            P, M, V, Gd = fresh()
            coef = xp_dev.asarray(coefs(1).astype(np.float32))
            fP, fM, fV, fG = ([ft.asarray(x) for x in xs] for xs in (P, M, V, Gd))
            fc = ft.asarray(coef)
            if kind == "eager":

                def step(t):
                    coef[...] = xp_dev.asarray(coefs(t).astype(np.float32))
                    adamw(fP, fG, fM, fV, fc, ft)
                    ft.evaluate(*fP)

            elif kind == "deferred":  # stores queued, m, v and p of a parameter in one kernel

                def step(t):
                    coef[...] = xp_dev.asarray(coefs(t).astype(np.float32))
                    with ft.options(defer_stores=True):
                        adamw(fP, fG, fM, fV, fc, ft)
                    ft.synchronize()

            else:
                jf = ft.jit(graph=kind == "graph")(lambda p, g, m, v, c: adamw(p, g, m, v, c, ft))

                def step(t):
                    coef[...] = xp_dev.asarray(coefs(t).astype(np.float32))
                    with ft.options(defer_stores=True):  # traced with deferred stores (horizontal)
                        jf(fP, fG, fM, fV, fc)

            return step, (P, M, V)

        return make

    for kind in ("eager", "deferred", "jit", "graph"):
        record(f"fusetree-{kind}", fusetree_mode(kind))

    def peer():
        P, M, V, Gd = fresh()
        coef = xp_dev.asarray(coefs(1).astype(np.float32))

        def step(t):
            coef[...] = xp_dev.asarray(coefs(t).astype(np.float32))
            adamw(P, Gd, M, V, coef, xp_dev)

        return step, (P, M, V)

    record("cupy-unfused" if device == "cuda" else "numpy", peer)
    if device == "cuda":
        try:
            import torch

            for flag in ("foreach", "fused"):

                def make(flag=flag):
                    P = [torch.nn.Parameter(torch.as_tensor(p, device="cuda").clone()) for p in P0]
                    for p, g in zip(P, G):
                        p.grad = torch.as_tensor(g, device="cuda")
                    opt = torch.optim.AdamW(
                        P, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, **{flag: True}
                    )

                    def step(t):
                        opt.step()

                    class _State:
                        def __getitem__(self, i):
                            if i == 0:
                                return [p.detach() for p in P]
                            key = "exp_avg" if i == 1 else "exp_avg_sq"
                            return [opt.state[p][key] for p in P]

                    return step, _State()

                def host_t(x):
                    return x.detach().cpu().numpy()

                nonlocal_host = host

                def torch_record(mode, make=make):
                    nonlocal host
                    host = host_t
                    try:
                        record(mode, make)
                    finally:
                        host = nonlocal_host

                torch_record(f"torch-adamw-{flag}")
        except ImportError:
            pass
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | tensors | params | mode | µs/step | launches/step | rel_err | vs fusetree-graph |",
           "|---|---:|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    base = {r["model"]: r["us"] for r in rows if r["mode"] == "fusetree-graph"}
    for r in rows:
        b = base.get(r["model"])
        ratio = f"{r['us'] / b:.2f}" if b and r["us"] == r["us"] else "-"
        la = f"{r['launches']:.1f}" if r.get("launches") is not None else "-"
        note = f" ({r['note']})" if r.get("note") else ""
        out.append(f"| {r['model']} | {r['tensors']} | {r['params'] / 1e6:.1f}M | {r['mode']}{note} | "
                   f"{r['us']:.0f} | {la} | {r['rel_err']:.1e} | {ratio} |")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--models", default="small,gpt2")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = []
    for m in args.models.split(","):
        rows += run(args.device, m, args.steps, args.repeats)
    print(
        f"AdamW step, float32, device={args.device}; wall µs per step (median), rel_err vs float64 after {args.steps} steps"
    )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
