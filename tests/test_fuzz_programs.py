"""The mode fuzzer in CI: random programs eager, unfused, under ft.jit and ft.jit(graph=True), all
compared with NumPy on every array they touch (tests/programs.py; larger runs:
``python benchmarks/fuzz.py --programs``). The seeds below once found a bug (named)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from programs import MODES, check_program, describe, minimize, random_program

# seed -> the bug it found
REGRESSIONS = {
    8: "a view of a pending value did not alias it: a write to the value was not seen through it",
    11: "graph mode: overlapping arguments copied into separate static buffers",
    15: "a pending GEMM reading a store's target was dropped from the pending set (unfused)",
    16: "values realized together where one has a reduction and one has not",
    42: "a view of a pending value: write through the value, read through the view",
    70: "a tree of scalars stored into targets of different rank shared one kernel",
    10595836: "a store into a realized GEMM result did not wait for a pending softmax reading it",
    20196: "a reduction over one element returned a view of its input (a store changed the input)",
    20218: "a value made of scalars only was refused as a store's value",
    2411495: "a view of a pending reduction viewed a separate copy of its value",
    7269: "deferred: a store to memory another queued store targets was queued with a stale value",
    24102: "deferred: a value of scalars (no device) stored into a GPU array ran a CPU kernel",
    24472: "deferred: a reduction reading a target in the same flush ran after the store's kernel",
    351464: "a reduction over views of pending values had more inputs than a kernel takes (an error)",
}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_program_regression(seed):
    check_program(random_program(seed))


NARROW_REGRESSIONS = {  # random_program(seed, narrow=True)
    280401: "deferred: a view of a stored-to view, whose owner was then dropped, became a copy",
    201879: "deferred: a reduction of a computed GEMM result ran after a store into that result",
    241057: "deferred: a second store to an array did not reach a view taken after the first",
    250313: "deferred: a reduction planned with other stores of its shape as one frame kernel",
    250869: "deferred: a view taken between two stores read the first store's value",
    230042: "deferred, staged flush: a view of a stored-to array was stored as a copy (live-value rule)",
}


@pytest.mark.parametrize("seed", sorted(NARROW_REGRESSIONS))
def test_narrow_program_regression(seed):
    check_program(random_program(seed, narrow=True))


N = int(os.environ.get("FUSETREE_FUZZ_PROGRAMS", "120"))


def test_random_programs_in_every_mode():
    # a fixed range in CI (it must not fail on a seed nobody ran); FUSETREE_FUZZ_SEED explores others
    base = int(os.environ.get("FUSETREE_FUZZ_SEED", "500000"))
    print(f"program seeds {base}..{base + N - 1} (narrow) and {base}..{base + N // 4 - 1} (wide)")
    total = 0
    for k in range(N):
        prog = random_program(base + k, narrow=True)
        try:
            total += sum(check_program(prog).values())
        except AssertionError as e:
            small = minimize(prog, MODES)
            raise AssertionError(f"{e}\nprogram:\n{describe(prog)}\nminimized:\n{describe(small)}") from None
    for k in range(N // 4):
        prog = random_program(base + k)
        try:
            total += sum(check_program(prog).values())
        except AssertionError as e:
            raise AssertionError(f"{e}\nprogram:\n{describe(prog)}") from None
    assert total > N  # every program compared arrays


def test_minimizer_drops_statements_that_do_not_matter(monkeypatch):
    import programs

    def fake(p, modes=MODES, device="cpu"):  # "fusetree is wrong on softmax"
        if any(s[0] == "softmax" for s in p.stmts):
            raise AssertionError("mismatch")
        return {}

    monkeypatch.setattr(programs, "check_program", fake)
    for seed in range(200):
        p = random_program(seed)
        if any(s[0] == "softmax" for s in p.stmts) and len(p.stmts) > 4:
            m = programs.minimize(p, MODES)
            assert any(s[0] == "softmax" for s in m.stmts) and len(m.stmts) < len(p.stmts)
            return
    pytest.fail("no program with a softmax drawn")


def test_describe_is_readable():
    text = describe(random_program(3))
    assert text.startswith("# seed 3") and "a0" in text
    assert np.random.default_rng(0)  # programs are deterministic in their seed
    assert describe(random_program(3)) == text
