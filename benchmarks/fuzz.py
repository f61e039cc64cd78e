"""Differential fuzzing: random expression DAGs evaluated by fusetree and by NumPy, compared.

    python benchmarks/fuzz.py --n 2000 [--device cpu|cuda|cuda-sim] [--seed S]

Trees share subexpressions, broadcast, read views with steps and negative steps, mix dtypes and
Python scalars (NaN, inf, -0.0 included). A mismatch prints the seed that reproduces it and is saved
to fuzz_failures.json with the tree and a minimized version of it (subtrees replaced by their operands
while the mismatch persists). ``--edges`` puts integer extremes in the leaves. The comparison rules are tests/test_random_trees.check_tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from test_random_trees import BINARY, DTYPES, LEAF_BINARY, LEAF_UNARY, SMOOTH_UNARY, SPECIAL, check_tree

EDGES = False  # --edges: integer leaves also hold their dtype's extreme values (wrap-around, INT_MIN // -1)


def random_leaf(rng, shape):
    nd = int(rng.integers(0, len(shape) + 1))
    sub = [1 if rng.random() < 0.25 else s for s in shape[len(shape) - nd :]]
    dtype = str(rng.choice(DTYPES))
    steps = [int(rng.choice([1, 2, -1, -2])) for _ in sub]
    base_shape = [s * abs(k) for s, k in zip(sub, steps)]
    if dtype == "bool":
        base = rng.random(base_shape) < 0.5
    elif dtype.startswith(("int", "uint")):
        base = rng.integers(0 if dtype == "uint8" else -20, 20, base_shape).astype(dtype)
        if EDGES and base.size and rng.random() < 0.5:
            info = np.iinfo(base.dtype)
            base.reshape(-1)[rng.integers(0, base.size)] = rng.choice([info.min, info.max, -1, 0])
    else:
        base = (rng.standard_normal(base_shape) * 3).astype(dtype)
        if base.size and rng.random() < 0.5:
            base.reshape(-1)[rng.integers(0, base.size)] = rng.choice([np.nan, np.inf, -np.inf, -0.0])
    view = base[tuple(slice(None, None, k) for k in steps)]
    if view.ndim >= 2 and rng.random() < 0.3:
        view = view.T if view.shape == view.shape[::-1] else view  # a transposed view where it fits
    return ("leaf", view)


def random_tree(rng, shape, depth=0, pool=None):
    pool = [] if pool is None else pool
    if pool and rng.random() < 0.2:
        return pool[int(rng.integers(0, len(pool)))]  # a shared subexpression
    r = rng.random()
    if depth >= 4 or r < 0.2:
        t = random_leaf(rng, shape)
    elif r < 0.3:
        t = (str(rng.choice(LEAF_UNARY)), random_leaf(rng, shape))
    elif r < 0.4:
        t = (
            str(rng.choice(LEAF_BINARY)),
            random_leaf(rng, shape),
            ("scalar", SPECIAL[int(rng.integers(2, 7))]),
        )
    elif r < 0.6:
        t = (str(rng.choice(SMOOTH_UNARY)), random_tree(rng, shape, depth + 1, pool))
    elif r < 0.8:
        t = (
            str(rng.choice(BINARY)),
            random_tree(rng, shape, depth + 1, pool),
            random_tree(rng, shape, depth + 1, pool),
        )
    elif r < 0.9:
        t = (
            str(rng.choice(BINARY)),
            random_tree(rng, shape, depth + 1, pool),
            ("scalar", SPECIAL[int(rng.integers(0, len(SPECIAL)))]),
        )
    else:
        t = (
            "where",
            random_leaf(rng, shape),
            random_tree(rng, shape, depth + 1, pool),
            random_tree(rng, shape, depth + 1, pool),
        )
    pool.append(t)
    return t


def describe(t) -> str:
    """A tree as readable text (leaves: dtype, shape, values)."""
    if t[0] == "leaf":
        v = t[1]
        return f"leaf({v.dtype}{list(v.shape)}={np.asarray(v).reshape(-1)[:6].tolist()})"
    if t[0] == "scalar":
        return repr(t[1])
    return f"{t[0]}({', '.join(describe(c) for c in t[1:])})"


def _shrinks(t):
    if t[0] in ("leaf", "scalar"):
        return
    for ch in t[1:]:
        if ch[0] != "scalar":
            yield ch  # the node replaced by one of its operands
    for k, ch in enumerate(t[1:], 1):
        for c in _shrinks(ch):
            yield t[:k] + (c,) + t[k + 1 :]


def _fails(tree, device) -> bool:
    try:
        check_tree(tree, None if device == "cpu" else device)
        return False
    except Exception:
        return True


def minimize(tree, device, budget: int = 300):
    """Greedily replace subtrees by their operands while the mismatch persists."""
    changed = True
    while changed and budget > 0:
        changed = False
        for c in _shrinks(tree):
            budget -= 1
            if _fails(c, device):
                tree, changed = c, True
                break
            if budget <= 0:
                break
    return tree


def fuzz_range(device: str, start: int, n: int, edges: bool = False) -> list[dict]:
    """Run trees ``start .. start+n-1`` (seeds) on ``device``; the mismatches (minimized)."""
    global EDGES
    EDGES = edges
    failures = []
    for seed in range(start, start + n):
        rng = np.random.default_rng(seed)
        shape = tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(0, 4))))
        tree = random_tree(rng, shape)
        try:
            check_tree(tree, None if device == "cpu" else device)
        except Exception as e:
            failures.append(
                {
                    "seed": seed,
                    "error": f"{type(e).__name__}: {e}"[:500],
                    "trace": traceback.format_exc()[-1500:],
                    "tree": describe(tree),
                    "minimized": describe(minimize(tree, device)),
                }
            )
            print(f"MISMATCH seed={seed}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return failures


def _work(job: tuple[str, int, int, bool]) -> list[dict]:
    return fuzz_range(*job)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each compiles its own kernels)")
    p.add_argument("--edges", action="store_true", help="integer extreme values in the leaves")
    args = p.parse_args(argv)
    t0 = time.time()
    if args.jobs <= 1:
        failures = fuzz_range(args.device, args.seed, args.n, args.edges)
    else:
        import multiprocessing as mp

        per = -(-args.n // args.jobs)
        jobs = [
            (args.device, args.seed + k * per, min(per, args.n - k * per), args.edges)
            for k in range(args.jobs)
        ]
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            failures = [f for part in pool.map(_work, [j for j in jobs if j[2] > 0]) for f in part]
    dt = time.time() - t0
    print(f"fuzz: {args.n} trees on {args.device}{' (integer edges)' if args.edges else ''}, "
          f"{len(failures)} mismatches, {dt:.0f} s")  # fmt: skip
    for f in failures[:20]:
        print(f"  seed {f['seed']}: {f['error'][:120]}\n    minimized: {f['minimized'][:300]}")
    if failures:
        with open("fuzz_failures.json", "w") as f:
            json.dump(failures, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
