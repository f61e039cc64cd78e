"""Run slice K of N of the GPU test suite (tests/test_gpu.py, round-robin over the collected
tests, so each slice gets its share of the slow reduction and fuzzer tests): the whole suite
compiles ~2,500 kernels, ~25 minutes on one H200 host, more than one device call may run.

    python benchmarks/gpu_suite_slice.py K N [pytest options...]   # K in 1..N
"""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    k, n, extra = int(argv[0]), int(argv[1]), argv[2:]
    base = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    out = subprocess.run([*base, "--collect-only", "-q"], capture_output=True, text=True).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    mine = ids[k - 1 :: n]
    print(f"slice {k}/{n}: {len(mine)} of {len(ids)} tests", flush=True)
    return subprocess.run(
        [*base[:-1], "-q", "-W", "ignore::DeprecationWarning", "--durations=8", *extra, *mine]
    ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
