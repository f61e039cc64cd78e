"""The few CUDA driver calls fusetree makes (numba's dispatcher costs 31-117 µs per launch in
argument marshalling; a prepacked ``cuLaunchKernel`` costs ~5). Kernel launches, the hot call, go
through CuPy's typed Cython binding of ``cuLaunchKernel`` (no per-argument ctypes conversion); the
rest through ctypes."""

from __future__ import annotations

import ctypes

from cupy_backends.cuda.api.driver import CUDADriverError
from cupy_backends.cuda.api.driver import launchKernel as launch_kernel

from ..errors import DeviceError

__all__ = ["CUDADriverError", "Driver", "LoadError", "launch_kernel", "link_cubin"]


class Driver:
    """The few libcuda calls fusetree needs."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        vp, i = ctypes.c_void_p, ctypes.c_int
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuOccupancyMaxPotentialBlockSize.argtypes = [
            ctypes.POINTER(i),
            ctypes.POINTER(i),
            vp,
            vp,
            ctypes.c_size_t,
            i,
        ]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(i), vp, i, ctypes.c_size_t]
        lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(i), i, vp]
        lib.cuGetErrorString.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(i)]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
        lib.cuCtxSetCurrent.argtypes = [vp]

    def check(self, res: int, what: str) -> None:
        if res != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(res, ctypes.byref(s))
            raise DeviceError(f"CUDA driver error {res} in {what}: {(s.value or b'?').decode()}")

    def version(self) -> int:
        v = ctypes.c_int()
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return v.value

    def context(self) -> int:
        c = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(c)), "cuCtxGetCurrent")
        return c.value or 0

    def load(self, image: bytes) -> int:
        mod = ctypes.c_void_p()
        res = self.lib.cuModuleLoadData(ctypes.byref(mod), image)
        if res != 0:
            raise LoadError(res)
        return mod.value or 0

    def function(self, module: int, name: str) -> int:
        f = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(f), module, name.encode()), "cuModuleGetFunction"
        )
        return f.value or 0

    def max_threads(self, func: int) -> int:
        """The largest power-of-two block ``func`` can be launched with (its register use)."""
        v = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(v), 0, func), "cuFuncGetAttribute")
        p = 1
        while p * 2 <= min(v.value, 1024):
            p *= 2
        return p

    def occupancy(self, func: int) -> tuple[int, int]:
        """(block size, max resident blocks per SM) for ``func``."""
        grid, block = ctypes.c_int(), ctypes.c_int()
        self.check(
            self.lib.cuOccupancyMaxPotentialBlockSize(
                ctypes.byref(grid), ctypes.byref(block), func, None, 0, 0
            ),
            "occupancy",
        )
        bs = min(block.value, 512)
        per_sm = ctypes.c_int()
        self.check(
            self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), func, bs, 0),
            "occupancy",
        )
        return bs, max(1, per_sm.value)


class LoadError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def link_cubin(ptx: str, cc: tuple[int, int]) -> bytes:
    """Link PTX to a cubin with nvJitLink (for PTX newer than the driver can JIT)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    obj = ObjectCode.from_ptx(ptx.encode())
    linker = Linker(obj, options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    return bytes(linker.link("cubin").code)
