"""Trees the differential fuzzer (benchmarks/fuzz.py) once found mismatching, kept as regressions.

1018, 1413: exp of an 8-bit integer is float16 in NumPy and overflows to inf there; fusetree kept the
intermediate in float32 until float16 results were rounded like NumPy's. 1280: a float32 sin inside a
float64 result was compared at float64 tolerance. 22096: np.minimum(0.0, -0.0) is -0.0 (on ties
NumPy's minimum/maximum return the second operand, fmin/fmax the first)."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

from fuzz import random_tree
from test_random_trees import check_tree

SEEDS = [1018, 1280, 1413, 1431, 1566, 1782, 2374, 2562, 22096]


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_regression(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(0, 4))))
    check_tree(random_tree(rng, shape), None)


def test_fuzz_smoke_200_trees():
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        shape = tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(0, 4))))
        check_tree(random_tree(rng, shape), None)
