"""Where the host time of one eager fusetree LSTM step goes (cProfile), on the current device."""

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
    if device == "cuda":
        import cupy as cp

        conv, sync = cp.asarray, cp.cuda.Device().synchronize
    else:
        conv, sync = np.asarray, lambda: None
    x, h, c, Wx, Wh, b = (ft.asarray(conv(a)) for a in make_inputs(np.random.default_rng(0), B, H))
    st = [h, c]

    def step():
        h2, c2 = lstm_step(x, st[0], st[1], Wx, Wh, b, xp=ft)
        ft.evaluate(h2, c2)
        st[0], st[1] = h2, c2

    for _ in range(50):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(300):
        step()
    sync()
    print(f"{device} B{B} H{H}: {(time.perf_counter() - t) / 300 * 1e6:.1f} us/step")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        step()
    sync()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
