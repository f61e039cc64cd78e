"""cuBLAS through its C API: CuPy's wrappers refuse to run during stream capture, and fusetree's GEMMs
must be captured into CUDA graphs (``ft.jit(graph=True)``). Own handle, own workspace (no allocation
while capturing), host pointer mode, default math (no TF32)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from ..errors import DeviceError


def _find_cublas() -> ctypes.CDLL:
    names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    try:  # the library CuPy loaded, if any
        import cupy_backends.cuda.libs.cublas  # noqa: F401

        with open("/proc/self/maps", encoding="utf-8") as f:
            names = sorted({ln.split()[-1] for ln in f if "libcublas.so" in ln and "Lt" not in ln}) + names
    except Exception:
        pass
    import glob
    import sys

    for p in sys.path:
        names += glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcublas.so*"))
        names += glob.glob(os.path.join(p, "nvidia", "cublas", "lib", "libcublas.so*"))
    errors = []
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append(str(e))
    raise DeviceError(f"cuBLAS could not be loaded (tried {names[:6]}): {errors[-1] if errors else ''}")


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
