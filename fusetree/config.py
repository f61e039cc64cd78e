"""Runtime options and the limits that shape kernels (kept in one place)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

# CUDA passes kernel parameters through a 4 KB constant bank. Every fusetree kernel parameter is
# 8 bytes (a pointer, an int64 size/stride/offset or a float64 scalar), so a kernel takes at most
# 512 of them; we keep some headroom. Kernels that would need more are split by the fuser.
MAX_KERNEL_PARAMS = 480

# A pending tree deeper than this many op levels is computed when it is built (a loop that updates
# a value thousands of times without reading it would otherwise grow one ever deeper kernel, and the
# planner's and code generator's walks recurse once per level).
MAX_TREE_DEPTH = 128

# Bumped whenever generated code changes meaning; part of every kernel key and disk-cache entry.
CODEGEN_VERSION = 12


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Options:
    """Process-wide settings; change them with :func:`fusetree.options`."""

    fuse: bool = True  # False: one kernel per op node, launched eagerly (the unfused baseline)
    debug: bool = False  # print every newly generated kernel's source
    cpu_parallel: bool = True  # numba parallel=True loops on the CPU backend
    max_kernel_params: int = MAX_KERNEL_PARAMS
    cuda_unroll: int = 1  # groups (vectors or elements) per thread per grid-stride step, CUDA
    cuda_vector: bool = True  # CUDA elementwise kernels: 16-byte accesses where the arrays allow
    # CUDA kernels reading a transposed input: the tile edge of their scalar path (32 or 64; taken
    # when sizes, strides or pointers rule out the wide path's 16 x 16 vectors, or without
    # cuda_vector; a 64 tile gives each thread 2 x 8 elements). H200, 8192^2 transposed add with the
    # scalar path alone, % of copy f32/f16: 64 -> 57.1/31.2, 32 -> 55.3/31.4: no gain, 32 stays
    cuda_tile: int = 32
    max_cached_kernels: int = 1024  # in-memory kernel cache bound (LRU); a numba CPU kernel holds ~3 MB
    # reductions: threads per row on CUDA (0: chosen from the row length; rounded down to a power of
    # two, as the kernels shift by it, and to what the kernel's registers allow), and rows longer than
    # ``reduce_split`` elements are reduced in two stages of chunks that long (0: automatic)
    reduce_threads: int = 0
    # CUDA: elements per thread of a row held in registers (a power of two). H200, softmax/layernorm
    # at (4096, 4096), jit: 32 -> 50.7/49.8 us float32, 38.7/35.2 float16; 16 -> 53.9/52.4, 52.3/48.1;
    # 8 -> 112/105, 112/109 (benchmarks/reductions.py under FUSETREE_REDUCE_HELD). 32 passed the
    # reduction GPU tests (patterns, two-stage, wide access: aligned and misaligned rows) on the H200.
    # H100 after the kernels lost their row loop (stop 32, benchmarks/probe_reductions.py, device
    # time per call): 32 -> 52.3/53.6 us float32 (91.9/89.7% of copy), 40.2/33.2 float16 (64.7/78.2%);
    # 16 -> 64.1/64.4, 60.9/50.8; 8 -> 133/124, 127/120
    reduce_held: int = 32
    reduce_split: int = 0
    # CUDA reduction launches: rows per block when a row takes a warp or more (1: a block per row).
    # H100, held 32: 2 and 4 rows per block were slower at (4096, 4096) (softmax float32 62.9/74.0 us
    # vs 52.3) and level within noise at (64, 128, 1024) and (128, 512): 1 stays
    reduce_rows_per_block: int = 1
    # CUDA reductions holding rows in registers: phases after the first recompute their values from
    # the held row (float16 held as packed pairs) instead of keeping the earlier phases' values
    # live, and the cap on registers per thread of reduction kernels (ptxas .maxnreg; 0: ptxas
    # chooses). ptxas -v, sm_90, (4096, 4096) softmax / layernorm, float32 and float16: 95/106/72/72
    # registers without, 72/80/56/61 with recomputation. Not yet timed on a GPU: off by default
    reduce_remat: bool = False
    reduce_max_registers: int = 0
    # queue whole-array stores of pending values and write them together at the next read or
    # ft.synchronize() (eager and ft.jit traces; off by default); see fusetree.engine.stores
    defer_stores: bool = False
    # where arrays made from Python objects and the creation functions (zeros, full, arange, ...)
    # go when no ``device=`` is given (as torch.set_default_device); NumPy/CuPy arrays keep theirs
    device: str = "cpu"


def _from_env() -> Options:
    return Options(
        fuse=_env_flag("FUSETREE_FUSE", True),
        debug=_env_flag("FUSETREE_DEBUG", False),
        cpu_parallel=_env_flag("FUSETREE_CPU_PARALLEL", True),
        max_kernel_params=int(os.environ.get("FUSETREE_MAX_KERNEL_PARAMS", MAX_KERNEL_PARAMS)),
        cuda_unroll=int(os.environ.get("FUSETREE_CUDA_UNROLL", 1)),
        cuda_vector=_env_flag("FUSETREE_CUDA_VECTOR", True),
        cuda_tile=int(os.environ.get("FUSETREE_CUDA_TILE", 32)),
        max_cached_kernels=int(os.environ.get("FUSETREE_MAX_CACHED_KERNELS", 1024)),
        reduce_threads=int(os.environ.get("FUSETREE_REDUCE_THREADS", 0)),
        reduce_held=int(os.environ.get("FUSETREE_REDUCE_HELD", 32)),
        reduce_split=int(os.environ.get("FUSETREE_REDUCE_SPLIT", 0)),
        reduce_rows_per_block=int(os.environ.get("FUSETREE_REDUCE_ROWS_PER_BLOCK", 1)),
        reduce_remat=_env_flag("FUSETREE_REDUCE_REMAT", False),
        reduce_max_registers=int(os.environ.get("FUSETREE_REDUCE_MAX_REGISTERS", 0)),
        defer_stores=_env_flag("FUSETREE_DEFER_STORES", False),
        device=os.environ.get("FUSETREE_DEVICE", "") or "cpu",
    )


# After the first kernel of each backend is ready, collect once and move every live object into
# the collector's permanent generation (gc.freeze): numba's compiler, typing registries and the
# imported modules (~140k objects on the CPU backend) then stay out of every later collection. A full
# collection otherwise walked them each time the program's surviving objects grew by a quarter: an
# eager AdamW step with deferred stores over 148 tensors (2-core VM) paid a 41 ms full collection
# every ~10 steps (4.1 ms a step of 21.0) and took 17.0 ms a step with the freeze. Frozen objects
# that later die in a reference cycle are not reclaimed (FUSETREE_GC_FREEZE=0 turns this off).
GC_FREEZE = _env_flag("FUSETREE_GC_FREEZE", True)


_lock = threading.Lock()
current: Options = _from_env()


def get() -> Options:
    """The options in force."""
    return current


@contextlib.contextmanager
def options(**changes: object) -> Iterator[Options]:
    """Temporarily change options.

    >>> import fusetree as ft
    >>> with ft.options(fuse=False):
    ...     ft.get_options().fuse
    False
    """
    global current
    known = {f.name for f in fields(Options)}
    bad = sorted(set(changes) - known)
    if bad:
        raise TypeError(f"unknown fusetree option(s) {bad}; known options are {sorted(known)}")
    with _lock:
        saved = current
        current = replace(current, **changes)  # type: ignore[arg-type]
    try:
        yield current
    finally:
        with _lock:
            current = saved
