"""CUDA backend: numba.cuda compiles the generated kernels to PTX; the driver loads and launches them.

Host cost per launch is what this backend is about. numba's dispatcher costs 31-117 µs per launch
(argument marshalling), so it is never used: kernels are compiled once with ``compile_ptx`` and a
pointer ABI (one pointer per array, every size/stride/offset an int64, every scalar an int64 or a
float64 - all 8-byte parameters), loaded with ``cuModuleLoadData`` (falling back to a cubin linked by
nvJitLink when the driver cannot JIT the PTX), and launched with ``cuLaunchKernel`` through ctypes
from a parameter buffer laid out once per kernel: a launch packs the pointers and sizes with one
``struct.pack_into`` and makes one driver call on CuPy's current stream.

GEMMs call cuBLAS directly through CuPy's handle (``x@W + h@U`` is one GEMM plus a second with
beta=1 into the same buffer); the disk cache keeps PTX per key in a per-user directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import struct
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import numpy_shim

numpy_shim()  # before numba.cuda: numba-cuda 0.30.4 calls np.row_stack, gone in NumPy 2.5

import cupy as cp  # noqa: E402
from numba import cuda, types  # noqa: E402
from numba.cuda import libdevice  # noqa: E402

from .. import config  # noqa: E402
from ..errors import CompileError, DeviceError  # noqa: E402
from . import cuda_helpers  # noqa: E402
from .base import Backend, mapped, pow2_at_least, store_product  # noqa: E402

_ndarray = cp.ndarray
_current_stream = cp.cuda.get_current_stream
_ENTRY = re.compile(r"\.entry\s+([^\s(]+)")


def numba_type(dt: np.dtype) -> Any:
    import numba

    return numba.from_dtype(dt)


def storage_dtype(dt: np.dtype) -> np.dtype:
    """Booleans travel as uint8 bytes through kernel pointers."""
    return np.dtype(np.uint8) if dt.kind == "b" else dt


def scalar_storage(dt: np.dtype) -> np.dtype:
    """Every scalar parameter is 8 bytes: float64 for floats, int64 for everything else."""
    return np.dtype(np.float64) if dt.kind == "f" else np.dtype(np.int64)


def signature(spec: Any) -> tuple[Any, str]:
    """numba signature of the pointer-ABI kernel and the struct format of its parameters."""
    nd = 1 if spec.flat else max(spec.ndim, 1)
    sig: list[Any] = []
    fmt = ""
    for lf in spec.leaves:
        if lf.kind == "scalar":
            st = scalar_storage(lf.dtype)
            sig.append(numba_type(st))
            fmt += "d" if st.kind == "f" else "q"
            continue
        sig.append(types.CPointer(numba_type(storage_dtype(lf.dtype))))
        fmt += "Q"
        if spec.strided(lf.layout):
            sig += [types.int64] * nd
            fmt += "q" * nd
    for o in spec.outs:
        sig.append(types.CPointer(numba_type(storage_dtype(o.dtype))))
        fmt += "Q"
        if spec.strided(o.layout):
            sig += [types.int64] * nd
            fmt += "q" * nd
    sig += [types.int64] * spec.trailing("cuda")
    fmt += "q" * spec.trailing("cuda")
    return types.void(*sig), fmt


_device_ns: dict[str, Any] | None = None


def device_namespace() -> dict[str, Any]:
    global _device_ns
    if _device_ns is None:
        ns = cuda_helpers.namespace(lambda f: cuda.jit(device=True)(f), libdevice)
        ns["cuda"] = cuda
        _device_ns = ns
    return _device_ns


def compile_ptx(spec: Any, source: str, cc: tuple[int, int] = (9, 0)) -> tuple[str, str, str]:
    """PTX of a rendered kernel for compute capability ``cc`` (no GPU needed); (ptx, entry, fmt)."""
    ns = dict(device_namespace())
    exec(compile(source, f"<fusetree {spec.name}>", "exec"), ns)
    sig, fmt = signature(spec)
    with _target_cc(cc):
        ptx, _ = cuda.compile_ptx(ns[spec.name], sig, cc=cc)
    m = _ENTRY.search(ptx)
    if m is None:
        raise CompileError(f"kernel {spec.name}: no .entry in the generated PTX")
    return ptx, m.group(1), fmt


@contextlib.contextmanager
def _target_cc(cc: tuple[int, int]) -> Iterator[None]:
    """Without a GPU, numba's device-function dispatcher still asks the current device for its
    compute capability; answer with the target's so helpers compile to PTX in CI."""
    if _gpu_present():
        yield
        return
    from numba.cuda import dispatcher

    class _Target:
        compute_capability = cc

    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Target()  # type: ignore[assignment]
    try:
        yield
    finally:
        dispatcher.get_current_device = saved


_gpu: bool | None = None


def _gpu_present() -> bool:
    global _gpu
    if _gpu is None:
        try:
            _gpu = bool(cuda.is_available())
        except Exception:
            _gpu = False
    return _gpu


# ---------------------------------------------------------------------------------------------
# the driver, through ctypes


class Driver:
    """The few libcuda calls fusetree needs."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        vp, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        lib.cuLaunchKernel.restype = i
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
        self.launch_fn = lib.cuLaunchKernel

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
            raise _LoadError(res)
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


class _LoadError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def link_cubin(ptx: str, cc: tuple[int, int]) -> bytes:
    """Link PTX to a cubin with nvJitLink (for PTX newer than the driver can JIT)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    obj = ObjectCode.from_ptx(ptx.encode())
    linker = Linker(obj, options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    return bytes(linker.link("cubin").code)


# ---------------------------------------------------------------------------------------------
# cuBLAS through its C API: CuPy's wrappers refuse to run during stream capture, and ours must be
# captured into CUDA graphs (ft.jit(graph=True)). Own handle, own workspace (no allocation while
# capturing), host pointer mode, default math (no TF32).


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

    def gemm(self, dt: np.dtype, m: int, n: int, k: int, alpha: int, a: int, lda: int, b: int, ldb: int,
             beta: int, c: int, ldc: int) -> None:  # fmt: skip
        self._check(self._gemm[dt](self.handle, 0, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), "gemm")


class CUDAKernel:
    """A loaded kernel and its prepared launch: parameter buffer, pointer array, block size."""

    __slots__ = (
        "args",
        "block",
        "buf",
        "func",
        "max_blocks",
        "max_threads",
        "name",
        "packer",
        "params",
        "ptx",
    )

    def __init__(self, func: int, fmt: str, block: int, max_blocks: int, name: str, ptx: str,
                 max_threads: int = 1024) -> None:  # fmt: skip
        self.func = func
        self.packer = struct.Struct("=" + fmt)
        self.buf = ctypes.create_string_buffer(max(8, self.packer.size))
        base = ctypes.addressof(self.buf)
        n = len(fmt)
        self.params = (ctypes.c_void_p * max(1, n))(*[base + 8 * k for k in range(n)])
        self.args = ctypes.addressof(self.params)
        self.block = block
        self.max_blocks = max_blocks
        self.max_threads = max_threads
        self.name = name
        self.ptx = ptx


class CUDABackend(Backend):
    name = "cuda"
    device = "cuda"
    target = "cuda"
    gemm_accumulate = True

    def __init__(self) -> None:
        self.xp = cp
        try:
            cp.zeros(1)  # creates the runtime's primary context on this thread
            dev = cp.cuda.Device()
            ccs = str(dev.compute_capability)  # e.g. "90"
            self.cc: tuple[int, int] = (int(ccs[:-1]), int(ccs[-1]))
            self.sms = dev.attributes["MultiProcessorCount"]
        except Exception as e:
            raise DeviceError(f"device 'cuda' is not available: {type(e).__name__}: {e}") from None
        self.driver = Driver()
        self.ctx = self.driver.context()
        self._lock = threading.Lock()
        self._handle: CuBLAS | None = None
        self._cublas_stream: int | None = None
        self._gemm_consts: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {
            np.dtype(np.float32): (np.ones(1, np.float32), np.zeros(1, np.float32)),
            np.dtype(np.float64): (np.ones(1, np.float64), np.zeros(1, np.float64)),
        }
        self.cache_dir = disk_cache_dir()
        import numba_cuda

        self.versions = f"numba-cuda={getattr(numba_cuda, '__version__', '?')};driver={self.driver.version()}"

    # -- arrays --------------------------------------------------------------------------------
    def storage_dtype(self, dt: np.dtype) -> np.dtype:
        return storage_dtype(dt)

    def scalar_storage(self, dt: np.dtype) -> np.dtype:
        return scalar_storage(dt)

    def asarray(self, obj: Any) -> Any:
        return cp.asarray(obj)

    def to_numpy(self, data: Any) -> np.ndarray:
        return cp.asnumpy(data)

    def reshape_view(self, data: Any, shape: tuple[int, ...]) -> Any | None:
        v = data.reshape(shape)
        return v if v.data.ptr == data.data.ptr and v.base is not None else None

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return bool(cp.may_share_memory(a, b))

    def same_view(self, a: Any, b: Any) -> bool:
        return bool(a.shape == b.shape and a.strides == b.strides and a.data.ptr == b.data.ptr)

    def copy(self, dst: Any, src: Any) -> None:
        if (
            isinstance(src, _ndarray) and dst.dtype == src.dtype and dst.shape == src.shape
            and dst.flags.c_contiguous and src.flags.c_contiguous
        ):  # fmt: skip
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, 3, _current_stream().ptr)
            return
        dst[...] = src

    def ptr(self, a: Any) -> int:
        return int(a.data.ptr)

    def view(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        return cp.ndarray(shape, dtype, memptr=root.data + offset, strides=strides)

    def bind_view(
        self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any, layout: str, flat: bool
    ) -> tuple:
        p = root.data.ptr + offset
        if flat or layout == "C":
            return (p,)
        item = np.dtype(dtype).itemsize
        return (p, *[s // item for s in strides])

    def cache_tag(self) -> str:
        return f"cuda/u{config.current.cuda_unroll}"

    # -- compile ---------------------------------------------------------------------------
    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        cc = self.cc
        dkey = hashlib.sha256(
            f"{spec.key_text}|{self.cache_tag()}|{config.CODEGEN_VERSION}|{self.versions}|sm_{cc[0]}{cc[1]}".encode()
        ).hexdigest()[:32]
        entry = read_disk_cache(self.cache_dir, dkey)
        disk_hit = entry is not None
        if entry is None:
            ptx, name, fmt = compile_ptx(spec, source, cc)
            entry = {"ptx": ptx, "entry": name, "fmt": fmt}
            write_disk_cache(self.cache_dir, dkey, entry)
        ptx, name, fmt = entry["ptx"], entry["entry"], entry["fmt"]
        with self._lock:
            try:
                mod = self.driver.load(ptx.encode() + b"\0")
            except _LoadError:
                mod = self.driver.load(link_cubin(ptx, cc))
            func = self.driver.function(mod, name)
            block, per_sm = self.driver.occupancy(func)
            maxt = self.driver.max_threads(func)
        kernel = CUDAKernel(func, fmt, block, per_sm * self.sms, spec.name, ptx, maxt)
        return kernel, {"disk_hit": disk_hit, "ptx": ptx}

    def save_source(self, spec: Any, source: str) -> str:
        return save_source(spec, source)

    # -- launch ----------------------------------------------------------------------------
    def bind(self, data: Any, layout: str, flat: bool) -> tuple:
        if flat or layout == "C":
            return (data.data.ptr,)
        item = data.itemsize
        return (data.data.ptr, *[s // item for s in data.strides])

    def scalar_arg(self, leaf: Any) -> Any:
        v = leaf.data
        if leaf.dtype.kind == "f":
            return float(v)
        v = int(v)
        return v - (1 << 64) if v >= (1 << 63) else v

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        try:
            return _ndarray(shape, dtype)
        except cp.cuda.memory.OutOfMemoryError as e:
            raise DeviceError(
                f"out of GPU memory allocating an array of shape {shape} and dtype {np.dtype(dtype)} "
                f"({e}); nothing was written. Free arrays (or cupy's pool: "
                "cupy.get_default_memory_pool().free_all_blocks()) and retry"
            ) from None

    def launch(self, plan: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        k: CUDAKernel = plan.kernel
        flat = plan.spec.flat
        for o, lay in zip(outs, layouts):
            args.append(o.data.ptr)
            if not (flat or lay == "C"):
                item = o.itemsize
                args.extend(s // item for s in o.strides)
        n = 1
        for s in shape:
            n *= s
        if flat:
            args.append(n)
        else:
            args.extend(shape)
        args.append(n)
        self._launch(k, args, min((n + k.block - 1) // k.block, k.max_blocks), k.block)

    def _launch(self, k: CUDAKernel, args: list, grid: int, block: int) -> None:
        """Pack ``args`` into the kernel's parameter buffer and launch on CuPy's current stream."""
        k.packer.pack_into(k.buf, 0, *args)
        stream = _current_stream().ptr
        res = self.driver.launch_fn(k.func, grid, 1, 1, block, 1, 1, 0, stream, k.args, None)
        if res != 0:
            if res == 201:  # no current context on this thread: make CuPy's current and retry
                self.driver.lib.cuCtxSetCurrent(self.ctx)
                res = self.driver.launch_fn(k.func, grid, 1, 1, block, 1, 1, 0, stream, k.args, None)
            self.driver.check(res, f"cuLaunchKernel({k.name})")

    # -- reduction kernels --------------------------------------------------------------------
    def _auto_chunks(self, nrows: int, rowlen: int) -> int:
        if nrows >= 2 * self.sms or rowlen < 16384:
            return 1
        return min(-(-4 * self.sms // nrows), -(-rowlen // 2048))

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        item = data.itemsize
        return (data.data.ptr, *mapped([s // item for s in data.strides], smap))

    def bind_frame_view(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any,
                        smap: tuple) -> tuple:  # fmt: skip
        item = np.dtype(dtype).itemsize
        return (root.data.ptr + offset, *mapped([s // item for s in strides], smap))

    def launch_frame(self, plan: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        k: CUDAKernel = plan.kernel
        for o, m in zip(outs, smaps):
            args.extend(self.bind_frame(o, m))
        nkeep, clen = geometry[-4] * geometry[-2], geometry[-1]
        tpr = config.current.reduce_threads or pow2_at_least(-(-clen // 16))
        tpr = min(tpr, k.max_threads)
        block = tpr if tpr >= 32 else 128
        grid = max(1, min(-(-nkeep // (block // tpr)), self.sms * 16))
        args.extend(geometry)
        args.append(tpr)
        self._launch(k, args, grid, block)

    # -- GEMM --------------------------------------------------------------------------------
    def _blas(self) -> CuBLAS:
        if self._handle is None:
            self._handle = CuBLAS()
        return self._handle

    def matmul(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        """``a @ b`` (into ``out``, adding to it when ``accumulate``) via cuBLAS directly when the
        operands are 2-D, C-contiguous float32/float64; cupy.matmul otherwise."""
        dt = np.result_type(a.dtype, b.dtype)
        direct = (
            a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype == dt and dt in self._gemm_consts
            and a.flags.c_contiguous and b.flags.c_contiguous
            and (out is None or (out.flags.c_contiguous and out.dtype == dt))
        )  # fmt: skip
        if not direct:
            return store_product(cp.matmul(a, b), out, accumulate)
        m, k = a.shape
        n = b.shape[1]
        if out is None:
            out = cp.empty((m, n), dt)
        if m == 0 or n == 0:
            return out
        if k == 0:
            if not accumulate:
                out.fill(0)
            return out
        blas = self._blas()
        stream = _current_stream().ptr
        if self._cublas_stream != stream:
            blas.set_stream(stream)
            self._cublas_stream = stream
        one, zero = self._gemm_consts[dt]
        beta = one if accumulate else zero
        # row-major C = A @ B is column-major C^T = B^T @ A^T
        blas.gemm(
            dt, n, m, k, one.ctypes.data, b.data.ptr, n, a.data.ptr, k, beta.ctypes.data, out.data.ptr, n
        )
        return out


# ---------------------------------------------------------------------------------------------
# disk cache: JSON (PTX text + entry name + parameter format), written atomically, checksummed


def disk_cache_dir() -> str:
    d = os.environ.get("FUSETREE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fusetree"
    )
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def read_disk_cache(d: str, key: str) -> dict | None:
    path = os.path.join(d, f"{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        body = {k: entry[k] for k in ("ptx", "entry", "fmt")}
        if entry.get("sha256") != _digest(body) or entry.get("version") != config.CODEGEN_VERSION:
            raise ValueError("checksum or version mismatch")
        return body
    except FileNotFoundError:
        return None
    except Exception:
        try:  # corrupted or foreign entry: drop it and rebuild
            os.unlink(path)
        except OSError:
            pass
        return None


def write_disk_cache(d: str, key: str, body: dict) -> None:
    entry = dict(body, sha256=_digest(body), version=config.CODEGEN_VERSION)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, os.path.join(d, f"{key}.json"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save_source(spec: Any, source: str) -> str:
    d = os.path.join(disk_cache_dir(), "failed")
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, f"{spec.name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path


def make_backend() -> CUDABackend:
    return CUDABackend()


__all__ = ["CUDABackend", "compile_ptx"]
