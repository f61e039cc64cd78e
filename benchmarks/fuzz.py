"""Differential fuzzing: random expression DAGs (or whole programs, in every execution mode)
evaluated by fusetree and by NumPy, compared.

    python benchmarks/fuzz.py --n 2000 [--device cpu|cuda|cuda-sim] [--seed S] [--jobs J]
    python benchmarks/fuzz.py --programs --n 2000 [--narrow] [--modes eager,unfused,deferred,jit,graph]

``--programs`` runs random programs (tests/programs.py: stores through views, augmented
assignments, element reads, reductions, GEMMs) eagerly, unfused, under ft.jit and
ft.jit(graph=True), and compares every array they touch, the caller's included; a mismatch is
minimized (statements dropped while it persists) and saved with the program's source.

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
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import programs
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


def fuzz_programs(
    device: str, start: int, n: int, narrow: bool, modes: tuple[str, ...]
) -> tuple[int, list[dict]]:
    """Programs ``start .. start+n-1`` in ``modes`` on ``device``: (comparisons, mismatches)."""
    failures = []
    compared = 0
    for seed in range(start, start + n):
        prog = programs.random_program(seed, narrow=narrow)
        try:
            compared += sum(programs.check_program(prog, modes, device).values())
        except Exception as e:
            small = programs.minimize(prog, modes, device) if isinstance(e, AssertionError) else prog
            failures.append(
                {
                    "seed": seed,
                    "narrow": narrow,
                    "error": f"{type(e).__name__}: {e}"[:500],
                    "trace": traceback.format_exc()[-1500:],
                    "program": programs.describe(prog),
                    "minimized": programs.describe(small),
                }
            )
            print(f"MISMATCH program seed={seed}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return compared, failures


def _work(job: tuple) -> list[dict]:
    return fuzz_range(*job)


def _work_programs(job: tuple) -> tuple[int, list[dict]]:
    return fuzz_programs(*job)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each compiles its own kernels)")
    p.add_argument("--edges", action="store_true", help="integer extreme values in the leaves")
    p.add_argument("--programs", action="store_true", help="random programs in every execution mode")
    p.add_argument("--narrow", action="store_true", help="programs: few ops, shallow trees (cache hits)")
    p.add_argument("--modes", default=",".join(programs.MODES), help="programs: modes to run")
    args = p.parse_args(argv)
    modes = tuple(args.modes.split(","))
    t0 = time.time()
    per = -(-args.n // max(args.jobs, 1))
    starts = [(args.seed + k * per, min(per, args.n - k * per)) for k in range(max(args.jobs, 1))]
    starts = [(a, n) for a, n in starts if n > 0]
    if args.programs:
        jobs: list[tuple] = [(args.device, a, n, args.narrow, modes) for a, n in starts]
        work: Any = _work_programs
    else:
        jobs = [(args.device, a, n, args.edges) for a, n in starts]
        work = _work
    if args.jobs <= 1:
        results = [work(j) for j in jobs]
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(work, jobs)
    if args.programs:
        compared = sum(r[0] for r in results)
        failures = [f for r in results for f in r[1]]
    else:
        failures = [f for part in results for f in part]
    dt = time.time() - t0
    if args.programs:
        print(f"fuzz: {args.n} programs{' (narrow)' if args.narrow else ''} on {args.device} in modes "
              f"{','.join(modes)}: {compared} arrays compared, {len(failures)} mismatches, {dt:.0f} s")  # fmt: skip
    else:
        print(f"fuzz: {args.n} trees on {args.device}{' (integer edges)' if args.edges else ''}, "
              f"{len(failures)} mismatches, {dt:.0f} s")  # fmt: skip
    for f in failures[:20]:
        print(f"  seed {f['seed']}: {f['error'][:160]}\n    minimized:\n{f['minimized'][:600]}")
    if failures:
        with open("fuzz_failures.json", "w") as f:
            json.dump(failures, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
