"""Where the char-LSTM training step's copies and kernels come from (one eager step, call sites).

python benchmarks/probe_copies.py [--device cuda] [--batch 128 --hidden 512 --seq 64]
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback

import numpy as np

sys.path.insert(0, "examples")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=51)
    a = ap.parse_args()
    import char_lstm as C

    import fusetree as ft
    from fusetree import backends
    from fusetree.engine import executor

    D, V, B, H, T = a.device, a.vocab, a.batch, a.hidden, a.seq
    rng = np.random.default_rng(0)
    tr = C.Trainer(C.init_params(rng, V, H), D, "eager")
    X = np.eye(V, dtype=np.float32)[rng.integers(0, V, (T, B))]
    Y = np.eye(V, dtype=np.float32)[rng.integers(0, V, (T, B))]
    tr.step(X, Y)
    sites: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def spy(kind, fn):
        def wrapped(*args, **kw):
            st = traceback.extract_stack()[-9:-1]
            sites[kind][" <- ".join(f"{f.name}:{f.lineno}" for f in reversed(st))] += 1
            return fn(*args, **kw)

        return wrapped

    be = backends.get(D)
    executor.copy = spy("copy", executor.copy)
    for name in ("launch", "launch_frame", "launch_table", "gemm"):
        if hasattr(be, name):
            setattr(be, name, spy(name, getattr(be, name)))
    ft.reset_stats()
    tr.step(X, Y)
    ft.synchronize()
    print({k: v for k, v in ft.stats().items() if v})
    for kind, c in sites.items():
        print(f"== {kind}: {sum(c.values())}")
        for k, n in c.most_common(12):
            print(f"{n:5d} {k}")


if __name__ == "__main__":
    main()
