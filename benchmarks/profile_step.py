"""Where the host time goes (cProfile), on the current device: an eager LSTM step, ``ft.evaluate(a*b+c)``
and a jit replay of 10 stores.

    python benchmarks/profile_step.py [cuda|cpu] [BxH] [lstm|abc|jit10]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import numpy as np
from lstm_ref import lstm_step, make_inputs

import fusetree as ft


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    B, H = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "128x512").split("x"))
    cases = sys.argv[3].split(",") if len(sys.argv) > 3 else ["lstm", "abc", "jit10"]
    if device == "cuda":
        import cupy as cp

        conv, sync = cp.asarray, cp.cuda.Device().synchronize
    else:
        conv, sync = np.asarray, lambda: None
    x, h, c, Wx, Wh, b = (ft.asarray(conv(a)) for a in make_inputs(np.random.default_rng(0), B, H))
    st = [h, c]

    def lstm() -> None:
        h2, c2 = lstm_step(x, st[0], st[1], Wx, Wh, b, xp=ft)
        ft.evaluate(h2, c2)
        st[0], st[1] = h2, c2

    a1, a2, a3 = (ft.asarray(conv(np.random.rand(4096).astype(np.float32))) for _ in range(3))

    def abc() -> None:
        ft.evaluate(a1 * a2 + a3)

    def ten(p, q, o):
        for _ in range(10):
            o[...] = o * p + q
        return ()

    j10 = ft.jit(ten)

    def jit10() -> None:
        j10(a1, a2, a3)

    for name in cases:
        fn = {"lstm": lstm, "abc": abc, "jit10": jit10}[name]
        for _ in range(50):
            fn()
        sync()
        t = time.perf_counter()
        for _ in range(300):
            fn()
        sync()
        print(f"{device} {name} B{B} H{H}: {(time.perf_counter() - t) / 300 * 1e6:.1f} us/call")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fn()
        sync()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
