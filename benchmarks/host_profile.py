"""Where host time goes: cProfile of the per-step hot paths (evaluate ``a*b+c``, a jitted
``a*b+c`` replay, an eager LSTM step, a jitted LSTM step fed its own state; also ``ten``, the
10-node tree of ``host_overhead.py``, and an eager ``softmax`` of (128, 512)), top functions by own
time. Complements
``host_overhead.py`` (which times them unprofiled).

    python benchmarks/host_profile.py --device cuda
    python benchmarks/host_profile.py --device cpu --cases evaluate,jit
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from lstm_ref import lstm_step, make_inputs

import fusetree as ft


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default="evaluate,jit,lstm,jitlstm")
    ap.add_argument("--shape", help="LSTM BxH (default 16x64 on the CPU, 64x512 on CUDA)")
    ap.add_argument("--n", type=int, default=3000, help="profiled calls per case")
    ap.add_argument("--top", type=int, default=22)
    a = ap.parse_args(argv)
    if a.device == "cuda":
        import cupy as cp

        conv, sync = cp.asarray, cp.cuda.Device().synchronize
    else:
        conv, sync = (lambda x: x), (lambda: None)
    rng = np.random.default_rng(0)
    A, B, C = (ft.asarray(conv(rng.random(4096, dtype=np.float32))) for _ in range(3))
    jabc = ft.jit(lambda x, y, z: x * y + z)
    Bsz, H = (16, 64) if a.device == "cpu" else (64, 512)
    if a.shape:
        Bsz, H = (int(v) for v in a.shape.split("x"))
    lstm_in = [ft.asarray(conv(v)) for v in make_inputs(rng, Bsz, H)]
    S = ft.asarray(conv(rng.standard_normal((128, 512)).astype(np.float32)))

    def lstm() -> None:
        ft.evaluate(*lstm_step(*lstm_in, xp=ft))

    jstep = ft.jit(lambda *args: lstm_step(*args, xp=ft))
    state = lstm_in[1:3]

    def jitlstm() -> None:  # the step's outputs are the next step's state (new arrays each call)
        state[:] = jstep(lstm_in[0], state[0], state[1], *lstm_in[3:])

    cases = {
        "evaluate": lambda: ft.evaluate(A * B + C),
        "jit": lambda: jabc(A, B, C),
        "lstm": lstm,
        "jitlstm": jitlstm,
        # host_overhead.py's 10-node tree (tanh, sigmoid, exp over two leaves and scalars)
        "ten": lambda: ft.evaluate(ft.tanh(A * B + 1.5) * ft.sigmoid(B - A) + ft.exp(A) / 3.0 - B * 0.5),
        "softmax": lambda: ft.softmax(S).data,
    }
    for name in a.cases.split(","):
        fn = cases[name]
        for _ in range(200):
            fn()
        sync()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.n):
            fn()
        sync()
        pr.disable()
        out = io.StringIO()
        st = pstats.Stats(pr, stream=out)
        print(f"\n=== {name} on {a.device}: {st.total_tt / a.n * 1e6:.1f} µs per call profiled")  # type: ignore[attr-defined]
        st.sort_stats("tottime").print_stats(a.top)
        lines = [ln for ln in out.getvalue().splitlines() if "(" in ln or "ncalls" in ln]
        print("\n".join(lines[: a.top + 1]))


if __name__ == "__main__":
    main()
