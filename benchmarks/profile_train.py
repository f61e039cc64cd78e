"""Which kernels one char-LSTM training step launches (CUDA, torch.profiler/CUPTI): counts and
GPU time per kernel name, for a fusetree mode.
``python benchmarks/profile_train.py [mode] [trace.json]`` (the second writes the timeline)."""

from __future__ import annotations

import collections
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import char_lstm as C

import fusetree as ft


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    mode = sys.argv[1] if len(sys.argv) > 1 else "graph"
    B, H, T = 128, 512, 64
    b = C.Batches(open(C.DEFAULT_TEXT, encoding="utf-8").read(), T, B, 0)
    tr = C.Trainer(C.init_params(np.random.default_rng(0), b.vocab, H), "cuda", mode)
    data = [tuple(ft.asarray(v, device="cuda") for v in b.next()) for _ in range(3)]  # on the device
    for k in range(3):
        tr.step(*data[k])
    torch.cuda.synchronize()
    ft.reset_stats()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        tr.step(*data[0])
        torch.cuda.synchronize()
    print("fusetree stats:", {k: v for k, v in ft.stats().items() if v})
    if os.environ.get("FT_CPROFILE"):  # the host side of 5 steps
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for k in range(5):
            tr.step(*data[k % 3])
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
    count: collections.Counter = collections.Counter()
    dur: collections.Counter = collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name[:60]
            count[name] += 1
            dur[name] += e.time_range.end - e.time_range.start
    if len(sys.argv) > 2:  # the whole timeline (kernel grids, order, gaps): chrome://tracing JSON
        prof.export_chrome_trace(sys.argv[2])
    print(f"{sum(count.values())} device events, {sum(dur.values()) / 1e3:.2f} ms of kernel time")
    for name, n in count.most_common(25):
        print(f"{n:5d} {dur[name] / 1e3:8.3f} ms  {name}")


if __name__ == "__main__":
    main()
