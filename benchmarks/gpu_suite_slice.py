"""Run the GPU test suite (tests/test_gpu.py) in round-robin slices: the suite compiles ~2,500
kernels, ~25 minutes in one process on the H200 host, more than one device call may run.

    python benchmarks/gpu_suite_slice.py K N [pytest options...]   # slice K (1..N) in this process
    python benchmarks/gpu_suite_slice.py --procs P [--logs DIR] [-k EXPR]   # all P slices at once

``--procs`` runs P pytest processes side by side on the one GPU (kernel compilation is CPU-bound and
single-threaded per process; the disk cache is written atomically, so they share it), each logging
to ``DIR/suite_<k>.log``, and prints each slice's summary line; the exit status is non-zero when a
slice failed. Round-robin keeps the slow reduction and fuzzer tests spread over the slices.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

BASE = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider"]
SUMMARY = re.compile(r"\d+ (passed|failed|skipped|errors?)")
RUN = ["-q", "-W", "ignore::DeprecationWarning", "--durations=5"]


def collect(select: str | None = None) -> list[str]:
    sel = ["-k", select] if select else []
    out = subprocess.run([*BASE, "tests/test_gpu.py", "tests/test_jit.py", "--collect-only", "-q", *sel],
                         capture_output=True, text=True)  # fmt: skip
    return [line for line in out.stdout.splitlines() if "::" in line]


def one(k: int, n: int, extra: list[str]) -> int:
    ids = collect()
    mine = ids[k - 1 :: n]
    print(f"slice {k}/{n}: {len(mine)} of {len(ids)} tests", flush=True)
    return subprocess.run([*BASE, *RUN, *extra, *mine]).returncode


def parallel(procs: int, logs: str, select: str | None = None) -> int:
    ids = collect(select)
    os.makedirs(logs, exist_ok=True)
    t0 = time.time()
    running = []
    for k in range(procs):
        mine = ids[k::procs]
        log = open(os.path.join(logs, f"suite_{k + 1}.log"), "w")
        running.append(
            (k + 1, len(mine), log, subprocess.Popen([*BASE, *RUN, *mine], stdout=log, stderr=log))
        )
    rc = 0
    for k, count, log, p in running:
        code = p.wait()
        log.close()
        with open(log.name) as f:
            lines = [line.strip() for line in f if line.strip()]
        summary = next((line for line in reversed(lines) if " in " in line and SUMMARY.search(line)), "?")
        print(f"slice {k}/{procs} ({count} tests): rc={code}: {summary}", flush=True)
        for line in lines:
            if line.startswith("FAILED") or line.startswith("ERROR"):
                print("   ", line[:300], flush=True)
        rc = rc or code
    print(f"{len(ids)} tests in {procs} processes: {time.time() - t0:.0f} s", flush=True)
    return rc


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--procs":
        logs = argv[argv.index("--logs") + 1] if "--logs" in argv else os.environ.get("OUT", "/tmp/out")
        select = argv[argv.index("-k") + 1] if "-k" in argv else None
        return parallel(int(argv[1]), logs, select)
    return one(int(argv[0]), int(argv[1]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
