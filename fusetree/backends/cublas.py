"""cuBLAS through its C API: CuPy's wrappers refuse to run during stream capture, and fusetree's GEMMs
must be captured into CUDA graphs (``ft.jit(graph=True)``). Own handle, own workspace (no allocation
while capturing), host pointer mode, default math (no TF32)."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..ir.node import NATIVE


def _mapped(fragment: str) -> list[str]:
    """Paths of the loaded libraries whose file name contains ``fragment`` (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return sorted({ln.split()[-1] for ln in f if fragment in ln})
    except OSError:
        return []


def _load_first(names: list[str], what: str) -> ctypes.CDLL:
    """The first of ``names`` that loads (DeviceError naming ``what`` and the last failure)."""
    errors = []
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append(str(e))
    raise DeviceError(f"{what} could not be loaded (tried {names[:6]}): {errors[-1] if errors else ''}")


def _find_cublas() -> ctypes.CDLL:
    names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    try:  # the library CuPy loaded, if any
        import cupy_backends.cuda.libs.cublas  # noqa: F401

        names = [n for n in _mapped("libcublas.so") if "Lt" not in os.path.basename(n)] + names
    except Exception:
        pass
    import glob
    import sys

    for p in sys.path:
        names += glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcublas.so*"))
        names += glob.glob(os.path.join(p, "nvidia", "cublas", "lib", "libcublas.so*"))
    return _load_first(names, "cuBLAS")


class CuBLAS:
    """The few cuBLAS calls fusetree makes, on its own handle."""

    WORKSPACE = 32 << 20

    def __init__(self) -> None:
        lib = _find_cublas()
        vp, i, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        self.lib = lib
        h = vp()
        self._check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        self.handle = h.value
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetPointerMode_v2.argtypes = [vp, i]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, u64]
        gemm_args: Any = [vp, i, i, i, i, i, vp, vp, i, vp, i, vp, vp, i]
        lib.cublasSgemm_v2.argtypes = gemm_args
        lib.cublasDgemm_v2.argtypes = gemm_args
        self._check(lib.cublasSetPointerMode_v2(self.handle, 0), "cublasSetPointerMode")  # host
        import cupy as cp

        self.workspace = cp.empty(self.WORKSPACE, np.uint8)
        self._check(lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, self.WORKSPACE),
                    "cublasSetWorkspace")  # fmt: skip
        self._gemm = {np.dtype(np.float32): lib.cublasSgemm_v2, np.dtype(np.float64): lib.cublasDgemm_v2}

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise DeviceError(f"cuBLAS error {status} in {what}")

    def set_stream(self, stream: int) -> None:
        self._check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream")
        # cublasSetStream resets the workspace to cuBLAS's own: set ours again (capture-safe)
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, self.WORKSPACE),
                    "cublasSetWorkspace")  # fmt: skip

    def gemm(self, dt: np.dtype, transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int,
             lda: int, b: int, ldb: int, beta: int, c: int, ldc: int) -> None:  # fmt: skip
        """Column-major ``C = op(A) @ op(B)`` (op 0: as is, 1: transposed); alpha/beta host pointers."""
        self._check(self._gemm[dt](self.handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
                    "gemm")  # fmt: skip


def _find_cublaslt(cublas: ctypes.CDLL) -> ctypes.CDLL:
    """libcublasLt from the directory cuBLAS was loaded from (the versions must match)."""
    names = _mapped("libcublasLt.so")
    path = getattr(cublas, "_name", "") or ""
    if "/" in path:
        d = os.path.dirname(path)
        names += sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("libcublasLt.so"))
    names += ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    return _load_first(names, "cuBLASLt")


class _HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),  # cublasLtMatmulAlgo_t: 8 opaque 64-bit words
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


class LtPlan:
    """One GEMM problem's cuBLASLt descriptors and chosen algorithm (made once per problem)."""

    __slots__ = ("algo", "algo_ptr", "desc", "layouts")

    def __init__(self, desc: Any, layouts: tuple, algo: Any) -> None:
        self.desc = desc
        self.layouts = layouts  # A, B, C (= D) matrix layouts
        self.algo = algo  # the _HeuristicResult, kept alive: its first field is the algorithm
        self.algo_ptr = ctypes.addressof(algo)


class CuBLASLt:
    """cuBLASLt matmuls with descriptors and the algorithm chosen once per problem (shape, op flags,
    leading dimensions, dtype): a call is one ``cublasLtMatmul``. cuBLAS's ``gemm`` re-runs its
    heuristics inside every call (~19 µs of host time on the H200 host); cuBLASLt with a cached
    algorithm skips them. Compute in the operands' precision (COMPUTE_32F / 64F: no TF32)."""

    COMPUTE = {np.dtype(np.float32): (68, 0), np.dtype(np.float64): (70, 1)}  # (computeType, cudaDataType)

    def __init__(self, cublas: CuBLAS) -> None:
        lib = _find_cublaslt(cublas.lib)
        vp, i, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
        self.lib = lib
        self.cublas = cublas
        h = vp()
        self._check(lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        self.handle = h.value
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i, i]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i, vp, sz]
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i, u64, u64, i64]
        lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i, vp, sz]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i, vp, ctypes.POINTER(i)]
        lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [vp, i, vp, sz, ctypes.POINTER(sz)]
        lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp]
        self.matmul_fn = lib.cublasLtMatmul
        # the C accelerator's call_c: the 16-argument call without ctypes' per-argument conversion
        # (ctypes: ~1.5 µs of host time per call on the 2-core CPU for a no-op C function)
        self._call_c = getattr(NATIVE, "call_c", None)
        self.matmul_addr = ctypes.cast(self.matmul_fn, ctypes.c_void_p).value
        self.pref = self._preference(cublas.WORKSPACE, None)
        # algorithms whose split-K partial sums are reduced inside the GEMM kernel (or not split):
        # one launch per product (see _choose)
        self.pref_one_kernel = self._preference(cublas.WORKSPACE, self.REDUCTION_INPLACE)
        self.workspace = cublas.workspace.data.ptr
        self.plans: dict[tuple, LtPlan | None] = {}
        self.choices: dict[tuple, str] = {}  # how each problem's algorithm was chosen (benchmarks report it)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise DeviceError(f"cuBLASLt error {status} in {what}")

    # cublasLtReductionScheme_t: INPLACE reduces split-K partial sums in the output buffer inside
    # the GEMM kernel; COMPUTE_TYPE / OUTPUT_TYPE reduce them in a second kernel
    REDUCTION_INPLACE = 1

    def _preference(self, workspace: int, reduction_mask: int | None) -> int:
        """A heuristic preference: the workspace limit and, if given, the reduction schemes allowed
        (CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3)."""
        lib = self.lib
        pref = ctypes.c_void_p()
        self._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(workspace)
        self._check(lib.cublasLtMatmulPreferenceSetAttribute(pref.value, 1, ctypes.byref(ws), 8),
                    "cublasLtMatmulPreferenceSetAttribute")  # fmt: skip
        if reduction_mask is not None:
            mask = ctypes.c_uint32(reduction_mask)
            self._check(lib.cublasLtMatmulPreferenceSetAttribute(pref.value, 3, ctypes.byref(mask), 4),
                        "cublasLtMatmulPreferenceSetAttribute")  # fmt: skip
        return int(pref.value or 0)  # (set: the create call succeeded)

    def _heuristic(self, desc: int, layouts: tuple[int, int, int], pref: int) -> list[LtPlan]:
        """The heuristic's usable candidates for a problem, best first."""
        results = (_HeuristicResult * self.CANDIDATES)()
        count = ctypes.c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, layouts[0], layouts[1], layouts[2],
                                                         layouts[2], pref, self.CANDIDATES, results,
                                                         ctypes.byref(count))  # fmt: skip
        if status != 0:
            return []
        return [
            LtPlan(desc, layouts, _HeuristicResult.from_buffer_copy(r))
            for r in results[: count.value]
            if r.state == 0 and r.workspace_size <= self.cublas.WORKSPACE
        ]

    def plan(self, dt: np.dtype, transa: int, transb: int, m: int, n: int, k: int, lda: int, ldb: int,
             ldc: int, operands: tuple[int, int] | None = None) -> LtPlan | None:  # fmt: skip
        """The problem's descriptors and algorithm (None when cuBLASLt offers none: use cuBLAS).
        With ``operands`` (device pointers of A and B, not during a stream capture) a two-kernel
        split-K first choice is timed against a one-kernel algorithm on them once, into scratch
        memory (every candidate with FUSETREE_GEMM_TUNE=1): see :meth:`_choose`."""
        key = (dt, transa, transb, m, n, k, lda, ldb, ldc)
        if key in self.plans:
            return self.plans[key]
        lib, vp = self.lib, ctypes.c_void_p
        compute, dtype = self.COMPUTE[dt]
        desc = vp()
        self._check(
            lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, dtype), "cublasLtMatmulDescCreate"
        )
        for attr, v in ((3, transa), (4, transb)):  # CUBLASLT_MATMUL_DESC_TRANSA / TRANSB
            op = ctypes.c_int32(v)
            self._check(lib.cublasLtMatmulDescSetAttribute(desc.value, attr, ctypes.byref(op), 4),
                        "cublasLtMatmulDescSetAttribute")  # fmt: skip
        layouts = []
        for rows, cols, ld in (((m, k) if not transa else (k, m)) + (lda,), ((k, n) if not transb else (n, k)) + (ldb,),
                               (m, n, ldc)):  # fmt: skip
            lay = vp()
            self._check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
                        "cublasLtMatrixLayoutCreate")  # fmt: skip
            layouts.append(int(lay.value or 0))
        lay3 = (layouts[0], layouts[1], layouts[2])
        d = int(desc.value or 0)  # (the create calls succeeded: set)
        cands = self._heuristic(d, lay3, self.pref)
        plan = None
        if cands:
            plan, self.choices[key] = self._choose(cands, dt, operands, n * ldc, d, lay3)
        self.plans[key] = plan
        return plan

    # FUSETREE_GEMM_TUNE=1: the heuristic's candidates (up to 8) are timed once per problem and the
    # fastest kept. Off by default: on the H200 the char-LSTM training step measured 3.96 ms/step with
    # the heuristic's first choice and 4.00 tuned, and a timed choice can differ between runs.
    TUNE = os.environ.get("FUSETREE_GEMM_TUNE", "0") == "1"
    CANDIDATES = 8  # heuristic results asked for per problem
    # The heuristic's first choice is often split-K (a GEMM kernel + a reduction kernel: two launches,
    # 2 of the 3 GEMM shapes of an LSTM time step at B128 H512). A one-kernel algorithm (split-K
    # reduced in place, asked of the heuristic with only that scheme allowed, or not split): the first
    # two of each kind are timed against it and the fastest kept unless slower by more than this
    # factor. Stop 31 (H100, benchmarks/gemm_kernels.py, µs on the operands): `h @ Wh` split-K 20.2
    # vs unsplit 15.2 (kept: one kernel, faster), in-place split-K 25.4; `dg @ Wh.T` split-K 23-30
    # vs in-place 138-185, no unsplit candidate (keeps its pair).
    SPLIT_K_SLACK = 1.10

    def _choose(self, cands: list[LtPlan], dt: np.dtype, operands: tuple[int, int] | None, csize: int,
                desc: int, layouts: tuple[int, int, int]) -> tuple[LtPlan, str]:  # fmt: skip
        """The algorithm for a new problem and why: 'heuristic' (its first choice), 'one-kernel'
        (instead of a first choice that reduces split-K partial sums in a second kernel: the
        fastest of a few unsplit or in-place-reduced candidates, when at most SPLIT_K_SLACK slower
        on these operands), 'tuned' (FUSETREE_GEMM_TUNE)."""
        first = cands[0]
        if operands is None:  # while capturing a CUDA graph: nothing may run outside the capture
            return first, "heuristic"
        if self.TUNE and len(cands) > 1:
            times = self._times(cands, dt, operands, csize)
            return cands[times.index(min(times))], "tuned"
        if self._one_kernel(first):
            return first, "heuristic"
        # the default heuristic's unsplit candidates first, then the in-place-only heuristic's picks
        others = [c for c in cands[1:] if self._one_kernel(c)][:2]
        others += [c for c in self._heuristic(desc, layouts, self.pref_one_kernel) if self._one_kernel(c)][:2]
        if others:
            t_first, *t_others = self._times([first, *others], dt, operands, csize)
            best = min(range(len(others)), key=t_others.__getitem__)
            if t_others[best] <= self.SPLIT_K_SLACK * t_first:
                return others[best], "one-kernel"
        return first, "heuristic"

    def _config(self, plan: LtPlan, attr: int, default: int) -> int:
        """A uint32 attribute of the plan's algorithm configuration."""
        v, written = ctypes.c_uint32(default), ctypes.c_size_t(0)
        fn = self.lib.cublasLtMatmulAlgoConfigGetAttribute
        status = fn(ctypes.c_void_p(plan.algo_ptr), attr, ctypes.byref(v), 4, ctypes.byref(written))
        return int(v.value) if status == 0 else default

    def _one_kernel(self, plan: LtPlan) -> bool:
        """Whether the algorithm is one kernel: K not split (CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2) or
        its partial sums reduced in place (CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3)."""
        return self._config(plan, 2, 1) <= 1 or self._config(plan, 3, 0) == self.REDUCTION_INPLACE

    def _times(self, cands: list[LtPlan], dt: np.dtype, operands: tuple[int, int], csize: int) -> list[float]:
        """Device time of each candidate on these operands, into scratch memory (inf: it failed)."""
        import cupy as cp

        scalar = ctypes.c_float if dt == np.float32 else ctypes.c_double
        one, zero = scalar(1.0), scalar(0.0)
        scratch = cp.empty(csize, dt)
        stream = cp.cuda.get_current_stream()
        a, b = operands
        out = []
        for c in cands:
            run = functools.partial(
                self.matmul_fn, self.handle, c.desc, ctypes.addressof(one), a, c.layouts[0], b, c.layouts[1],
                ctypes.addressof(zero), scratch.data.ptr, c.layouts[2], scratch.data.ptr, c.layouts[2],
                c.algo_ptr, self.workspace, CuBLAS.WORKSPACE, stream.ptr,
            )  # fmt: skip
            if run() != 0:
                out.append(float("inf"))
                continue
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(5):
                run()
            end.record(stream)
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end))
        return out

    def matmul(self, plan: LtPlan, alpha: int, a: int, b: int, beta: int, c: int, stream: int) -> None:
        """Column-major ``C = alpha op(A) op(B) + beta C`` with ``plan``; alpha/beta host pointers."""
        la, lb, lc = plan.layouts
        call = self._call_c
        if call is not None:
            status = call(self.matmul_addr, self.handle, plan.desc, alpha, a, la, b, lb, beta, c, lc, c, lc,
                          plan.algo_ptr, self.workspace, CuBLAS.WORKSPACE, stream)  # fmt: skip
        else:
            status = self.matmul_fn(self.handle, plan.desc, alpha, a, la, b, lb, beta, c, lc, c, lc, plan.algo_ptr,
                                    self.workspace, CuBLAS.WORKSPACE, stream)  # fmt: skip
        if status != 0:
            self._check(status, "cublasLtMatmul")
