"""Run the GPU test suite (tests/test_gpu.py) in round-robin slices: the suite compiles ~2,500
kernels, ~25 minutes in one process on the H200 host, more than one device call may run.

    python benchmarks/gpu_suite_slice.py K N [pytest options...]   # slice K (1..N) in this process
    python benchmarks/gpu_suite_slice.py --procs P [--logs DIR] [-k EXPR] [--part K-L/N] [--deadline S]

``--procs`` runs P pytest processes side by side on the one GPU (kernel compilation is CPU-bound and
single-threaded per process; the disk cache is written atomically, so they share it), each logging
to ``DIR/suite_<k>.log`` (``-v``: a stuck log ends with the test it is in), and prints each
process's summary line as it finishes; the exit status is non-zero when one failed. Tests are dealt
longest first to the least loaded process (``HEAVY``: the tests that compile hundreds of kernels,
~175-360 s each with 14 processes on the 16-core H100 host, stop 31: the program fuzzer
361 s, transposed tiles 338 s, a reduction kind 175-290 s; the whole suite then takes ~9.5 min). ``--part K-L/N`` runs only
round-robin slices K..L of N (the rest of a suite a cut-off call did not finish); ``--deadline S``
stops every process still running after S seconds and prints the test each was in, so a device
call's own time limit never swallows the report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

BASE = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider"]
SUMMARY = re.compile(r"\d+ (passed|failed|skipped|errors?)")
RUN = ["-v", "-W", "ignore::DeprecationWarning", "--durations=5"]


# tests that compile hundreds of kernels (seconds each, measured in stop 31's suite with 14 processes)
HEAVY = re.compile(
    r"reduction_patterns|reductions_every_kind|program_fuzzer|program_regressions|large_reductions|random_trees|transposed_tiles"
)
MEDIUM = re.compile(r"char_lstm|wide_access|deep_chains|autodiff|arithmetic_views|train")


def cost(test_id: str) -> int:
    return 200 if HEAVY.search(test_id) else 30 if MEDIUM.search(test_id) else 2


def deal(ids: list[str], procs: int) -> list[list[str]]:
    """Longest first, each test to the process with the least estimated work (LPT)."""
    loads = [0] * procs
    out: list[list[str]] = [[] for _ in range(procs)]
    for t in sorted(ids, key=cost, reverse=True):
        k = loads.index(min(loads))
        out[k].append(t)
        loads[k] += cost(t)
    return out


def collect(select: str | None = None) -> list[str]:
    sel = ["-k", select] if select else []
    out = subprocess.run([*BASE, "tests/test_gpu.py", "tests/test_jit.py", "--collect-only", "-q", *sel],
                         capture_output=True, text=True)  # fmt: skip
    return [line for line in out.stdout.splitlines() if "::" in line]


def one(k: int, n: int, extra: list[str]) -> int:
    ids = collect()
    mine = round_robin(ids, k, k, n)
    print(f"slice {k}/{n}: {len(mine)} of {len(ids)} tests", flush=True)
    return subprocess.run([*BASE, *RUN, *extra, *mine]).returncode


def round_robin(ids: list[str], lo: int, hi: int, n: int) -> list[str]:
    """The tests of round-robin slices ``lo``..``hi`` (1-based) of ``n``."""
    return [t for k in range(lo, hi + 1) for t in ids[k - 1 :: n]]


def part_of(ids: list[str], part: str) -> list[str]:
    """``K-L/N``: the tests of round-robin slices K..L of N (as ``one`` and older runs dealt them)."""
    span, n = part.split("/")
    lo, _, hi = span.partition("-")
    return round_robin(ids, int(lo), int(hi or lo), int(n))


def report(k: int, procs: int, count: int, code: int | None, log_name: str) -> None:
    with open(log_name) as f:
        lines = [line.strip() for line in f if line.strip()]
    if code is None:  # stopped at the deadline: -v prints a test's id before it runs
        where = next((line for line in reversed(lines) if "::" in line), "?")
        done = sum(1 for line in lines if " PASSED" in line)
        print(
            f"process {k}/{procs} ({count} tests): STOPPED at the deadline after {done} passed, in {where[:200]}",
            flush=True,
        )
    else:
        summary = next((line for line in reversed(lines) if " in " in line and SUMMARY.search(line)), "?")
        print(f"process {k}/{procs} ({count} tests): rc={code}: {summary}", flush=True)
    for line in lines:
        if line.startswith("FAILED") or line.startswith("ERROR"):
            print("   ", line[:300], flush=True)


def parallel(procs: int, logs: str, select: str | None = None, part: str | None = None,
             deadline: float | None = None) -> int:  # fmt: skip
    ids = collect(select)
    if part:
        ids = part_of(ids, part)
    os.makedirs(logs, exist_ok=True)
    t0 = time.time()
    running = {}
    for k, mine in enumerate(deal(ids, procs), 1):
        if not mine:
            continue
        log = open(os.path.join(logs, f"suite_{k}.log"), "w")
        running[k] = (len(mine), log, subprocess.Popen([*BASE, *RUN, *mine], stdout=log, stderr=log))
    rc = 0
    while running:
        for k, (count, log, p) in list(running.items()):
            code = p.poll()
            late = deadline is not None and time.time() - t0 > deadline
            if code is None and not late:
                continue
            if code is None:
                p.kill()
                p.wait()
                rc = rc or 124
            log.close()
            report(k, procs, count, code, log.name)
            rc = rc or (code or 0)
            del running[k]
        time.sleep(0.5)
    print(f"{len(ids)} tests in {procs} processes: {time.time() - t0:.0f} s", flush=True)
    return rc


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--procs":
        logs = argv[argv.index("--logs") + 1] if "--logs" in argv else os.environ.get("OUT", "/tmp/out")
        select = argv[argv.index("-k") + 1] if "-k" in argv else None
        part = argv[argv.index("--part") + 1] if "--part" in argv else None
        deadline = float(argv[argv.index("--deadline") + 1]) if "--deadline" in argv else None
        return parallel(int(argv[1]), logs, select, part, deadline)
    return one(int(argv[0]), int(argv[1]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
