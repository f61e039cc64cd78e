"""CUDA backend: numba.cuda compiles the generated kernels to PTX; the driver loads and launches them.

Host cost per launch is what this backend is about. numba's dispatcher costs 31-117 µs per launch
(argument marshalling), so it is never used: kernels are compiled once with ``compile_ptx`` and the
pointer ABI of :mod:`fusetree.codegen.abi` (every parameter 8 bytes), loaded with
``cuModuleLoadData`` (falling back to a cubin linked by nvJitLink when the driver cannot JIT the
PTX), and launched with ``cuLaunchKernel`` (CuPy's typed Cython binding: 3.4 µs per call on an H100
host against 5.1 through ctypes) from a parameter buffer laid out once per kernel: a launch packs
the pointers and sizes with one ``struct.pack_into`` and makes one driver call on CuPy's current
stream. GEMMs call cuBLAS directly (:mod:`.cublas`); compiled PTX is kept on
disk (:mod:`.diskcache`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pathlib
import re
import struct
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from .shim import numpy_shim

numpy_shim()  # before numba.cuda: numba-cuda 0.30.4 calls np.row_stack, gone in NumPy 2.5

import cupy as cp  # noqa: E402
from numba import cuda, types  # noqa: E402
from numba.cuda import libdevice  # noqa: E402

from .. import config  # noqa: E402
from ..codegen import abi  # noqa: E402
from ..codegen.common import Target  # noqa: E402
from ..codegen.elementwise import TILE_BLOCK, tile_edge, tiled, vector_width  # noqa: E402
from ..errors import CompileError, DeviceError, UnsupportedError  # noqa: E402
from ..ir.node import NATIVE  # noqa: E402
from . import helpers, vector  # noqa: E402
from .base import Backend, launch_dims, mapped, pow2_at_least, pow2_at_most, store_product  # noqa: E402
from .cublas import CuBLAS, CuBLASLt  # noqa: E402
from .diskcache import disk_cache_dir, read_disk_cache, save_source, write_disk_cache  # noqa: E402
from .driver import CUDADriverError, Driver, LoadError, launch_kernel, link_cubin  # noqa: E402

_ndarray = cp.ndarray
_Q = struct.Struct("=Q")


class Params(NamedTuple):
    """A recorded launch's own parameters (see ``CUDABackend.param_buffer``)."""

    buf: Any  # the packed argument bytes
    array: Any  # one pointer per argument into ``buf`` (cuLaunchKernel's kernelParams)
    ptr: int  # the address of ``array``
    call: tuple  # cuLaunchKernel's leading arguments: (function, gx, gy, 1, bx, by, 1, 0)
    name: str  # the kernel's, for errors


_current_stream = cp.cuda.get_current_stream
_ENTRY = re.compile(r"\.entry\s+([^\s(]+)")
_PARAMS_END = re.compile(r"\)(?=\s*\{)")  # the end of an entry's parameter list


def numba_type(dt: np.dtype) -> Any:
    import numba

    return numba.from_dtype(dt)


def storage_dtype(dt: np.dtype) -> np.dtype:
    """Booleans travel as uint8 bytes through kernel pointers."""
    return np.dtype(np.uint8) if dt.kind == "b" else dt


def scalar_storage(dt: np.dtype) -> np.dtype:
    """Every scalar parameter is 8 bytes: float64 for floats, int64 for everything else."""
    return np.dtype(np.float64) if dt.kind == "f" else np.dtype(np.int64)


TARGET = Target("cuda", storage_dtype, scalar_storage)


def signature(spec: Any) -> tuple[Any, str]:
    """numba signature of the pointer-ABI kernel and the struct format of its parameters."""
    sig: list[Any] = []
    fmt = ""
    for p in abi.params(spec, "cuda"):
        if p.kind == "array":
            sig.append(types.CPointer(numba_type(storage_dtype(p.dtype))))
            fmt += "Q"
        elif p.kind == "scalar":
            st = scalar_storage(p.dtype)
            sig.append(numba_type(st))
            fmt += "d" if st.kind == "f" else "q"
        else:
            sig.append(types.int64)
            fmt += "q"
    return types.void(*sig), fmt


_device_ns: dict[str, Any] | None = None
_generic_minmax: dict[str, Any] = {}  # helpers' compare-and-select maximum/minimum (before sm_80)


def device_namespace() -> dict[str, Any]:
    global _device_ns
    if _device_ns is None:
        ns = helpers.namespace(lambda f: cuda.jit(device=True)(f), libdevice)
        _generic_minmax.update(maximum=ns["maximum"], minimum=ns["minimum"])
        ns.update(vector.cuda_namespace())
        ns["cuda"] = cuda
        _device_ns = ns
    return _device_ns


def compile_ptx(spec: Any, source: str, cc: tuple[int, int] = (9, 0)) -> tuple[str, str, str]:
    """PTX of a rendered kernel for compute capability ``cc`` (no GPU needed); (ptx, entry, fmt)."""
    ns = dict(device_namespace())
    if cc < (8, 0):  # no max.NaN.f32 before sm_80: the generic compare and select
        ns.update(_generic_minmax)
    exec(compile(source, f"<fusetree {spec.name}>", "exec"), ns)
    sig, fmt = signature(spec)
    with _target_cc(cc):
        ptx, _ = cuda.compile_ptx(ns[spec.name], sig, cc=cc)
    m = _ENTRY.search(ptx)
    if m is None:
        raise CompileError(f"kernel {spec.name}: no .entry in the generated PTX")
    cap = config.current.reduce_max_registers
    if cap and spec.frame is not None:  # ptxas's register cap for reduction kernels (the option)
        ptx = ptx[: m.end()] + _PARAMS_END.sub(f") .maxnreg {cap}", ptx[m.end() :], count=1)
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


class CUDAKernel:
    """A loaded kernel and its prepared launch: parameter buffer, pointer array, block size."""

    __slots__ = ("args", "block", "buf", "bufaddr", "calls", "flat", "fmt", "func", "max_blocks", "max_threads",
                 "name", "packer", "params", "per_thread", "ptx", "source", "tile")  # fmt: skip

    def __init__(self, func: int, fmt: str, block: int, max_blocks: int, name: str, ptx: str,
                 max_threads: int = 1024, flat: bool = True, per_thread: int = 1, tile: int = 0) -> None:  # fmt: skip
        self.func = func
        self.packer = struct.Struct("=" + fmt)
        self.buf = ctypes.create_string_buffer(max(8, self.packer.size))
        base = self.bufaddr = ctypes.addressof(self.buf)
        self.fmt = fmt.encode()  # (for the C accelerator's pack_launch)
        n = len(fmt)
        self.params = (ctypes.c_void_p * max(1, n))(*[base + 8 * k for k in range(n)])
        self.args = ctypes.addressof(self.params)
        self.block = block
        self.max_blocks = max_blocks
        self.max_threads = max_threads
        self.name = name
        self.ptx = ptx
        self.flat = flat
        self.per_thread = per_thread  # elements a thread takes per grid-stride step (vectors, unroll)
        self.tile = tile  # > 0: reads a transposed input through tile x tile shared-memory tiles (codegen.elementwise)
        self.source = ""
        # elementwise launches: size (flat) or shape -> the cuLaunchKernel arguments before the stream
        self.calls: dict[Any, tuple] = {}


def _flat_grid(k: CUDAKernel, n: int) -> int:
    """Blocks of a flat elementwise launch of ``n`` elements: one wave of resident blocks at most
    (98-104% of copy at any block size 128..1024 and 1..all waves on the H200)."""
    return max(1, min(-(-n // (k.block * k.per_thread)), k.max_blocks))


class CUDABackend(Backend):
    name = "cuda"
    device = "cuda"
    target = TARGET
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
        # the C accelerator packs parameters and calls cuLaunchKernel itself (~3 us less host time
        # per launch than struct.pack_into + CuPy's launchKernel); None: those run
        self._pack: Any = None
        if NATIVE is not None and hasattr(NATIVE, "pack_launch"):
            NATIVE.set_launcher(ctypes.cast(self.driver.lib.cuLaunchKernel, ctypes.c_void_p).value)
            self._pack = NATIVE.pack_launch
        # the C module's realize_hit may run launch's common case itself (a kernel whose launch shape
        # is memoized in ``calls``, C-contiguous outputs): the same packing, pointer and status
        self.pack_direct = self._pack is not None
        self._lock = threading.Lock()
        self._handle: CuBLAS | None = None
        self._cublas_stream: int | None = None
        self._lt: Any = None  # CuBLASLt once made (False: cuBLAS only)
        # host-pointer-mode alpha/beta: 1 and 0 per dtype, kept alive, addresses taken once
        self._consts: list[np.ndarray] = [
            np.ones(1, np.float32),
            np.zeros(1, np.float32),
            np.ones(1, np.float64),
            np.zeros(1, np.float64),
        ]
        self._gemm_consts: dict[np.dtype, tuple[int, int]] = {
            np.dtype(np.float32): (self._consts[0].ctypes.data, self._consts[1].ctypes.data),
            np.dtype(np.float64): (self._consts[2].ctypes.data, self._consts[3].ctypes.data),
        }
        # a repeated product (an RNN step's GEMMs): operand shapes, strides and dtypes -> what the
        # general path worked out for them (see gemm)
        self._gemm_fast: dict[tuple, GemmFast] = {}
        self.cache_dir = disk_cache_dir()
        import numba_cuda

        # the helpers and intrinsics a kernel calls are compiled into its PTX: their source is part
        # of every disk-cache key, with the kernel's own source (a checkout with changed codegen
        # must not load another checkout's kernels: stop 36's first probe timed one kernel thrice)
        here = pathlib.Path(__file__).parent
        helpers_src = b"".join((here / f).read_bytes() for f in ("cuda.py", "helpers.py", "vector.py"))
        self.versions = (
            f"numba-cuda={getattr(numba_cuda, '__version__', '?')};driver={self.driver.version()};"
            f"helpers={hashlib.sha256(helpers_src).hexdigest()[:16]}"
        )

    # -- arrays --------------------------------------------------------------------------------
    # host arrays up to this size are uploaded without waiting for the device: copied to a private
    # pageable buffer, whose cudaMemcpyAsync stages it at once (no device synchronization), so a
    # training loop's per-step scalars do not serialize the host with the previous step's graph
    ASYNC_UPLOAD = 1 << 20

    def asarray(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and obj.size:  # host memory: copied bit for bit (cupy.asarray
            out = _ndarray(obj.shape, obj.dtype)  # fills a 0-d array by value, and fills a zero
            if obj.nbytes <= self.ASYNC_UPLOAD:  # with memset: -0.0 became +0.0)
                src = np.array(obj, order="C", copy=True)  # private: the caller may reuse its memory
                out.data.copy_from_host_async(src.ctypes.data, src.nbytes, _current_stream())
            else:
                out.set(obj if obj.flags.c_contiguous else obj.copy())
            return out
        return cp.asarray(obj)

    def to_numpy(self, data: Any) -> np.ndarray:
        return cp.asnumpy(data)

    def reshape_view(self, data: Any, shape: tuple[int, ...]) -> Any | None:
        v = data.reshape(shape)
        return v if v.data.ptr == data.data.ptr and v.base is not None else None

    def copy(self, dst: Any, src: Any) -> None:
        if (
            isinstance(src, _ndarray) and dst.dtype == src.dtype and dst.shape == src.shape
            and dst.flags.c_contiguous and src.flags.c_contiguous
        ):  # fmt: skip
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, 3, _current_stream().ptr)
            return
        if not isinstance(src, _ndarray) and np.ndim(src) == 0 and src == 0 and np.signbit(src):
            src = self.asarray(np.asarray(src, dst.dtype))  # CuPy fills a zero with memset: +0.0
        dst[...] = src

    def ptr(self, a: Any) -> int:
        return int(a.data.ptr)

    def view_at(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        return cp.ndarray(shape, dtype, memptr=root.data + offset, strides=strides)

    def cache_tag(self) -> str:
        o = config.current
        return (f"cuda/u{o.cuda_unroll}v{int(o.cuda_vector)}h{o.reduce_held}t{o.cuda_tile}"
                f"r{int(o.reduce_remat)}m{o.reduce_max_registers}")  # fmt: skip

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        try:
            return _ndarray(shape, dtype)
        except cp.cuda.memory.OutOfMemoryError as e:
            raise DeviceError(
                f"out of GPU memory allocating an array of shape {shape} and dtype {np.dtype(dtype)} "
                f"({e}); nothing was written. Free arrays (or cupy's pool: "
                "cupy.get_default_memory_pool().free_all_blocks()) and retry"
            ) from None

    # -- compile ---------------------------------------------------------------------------
    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        cc = self.cc
        dkey = hashlib.sha256(
            f"{spec.key_text}|{self.cache_tag()}|{config.CODEGEN_VERSION}|{self.versions}|sm_{cc[0]}{cc[1]}|{source}".encode()
        ).hexdigest()[:32]
        entry = read_disk_cache(self.cache_dir, dkey)
        disk_hit = entry is not None
        if entry is None:
            ptx, name, fmt = compile_ptx(spec, source, cc)
            entry = {"ptx": ptx, "entry": name, "fmt": fmt}
            write_disk_cache(self.cache_dir, dkey, entry)
        ptx, name, fmt = entry["ptx"], entry["entry"], entry["fmt"]
        with self._lock:
            # a thread that never touched the driver has no current context (CUDA_ERROR_INVALID_CONTEXT
            # from cuModuleLoadData): CuPy's is made current first (compiling is rare; launches retry)
            self.driver.lib.cuCtxSetCurrent(self.ctx)
            try:
                mod = self.driver.load(ptx.encode() + b"\0")
            except LoadError:
                mod = self.driver.load(link_cubin(ptx, cc))
            func = self.driver.function(mod, name)
            block, per_sm = self.driver.occupancy(func)
            maxt = self.driver.max_threads(func)
        opts = config.current
        per_thread = 1
        if spec.frame is None and not spec.horizontal:
            per_thread = max(1, opts.cuda_unroll) * (vector_width(spec) if opts.cuda_vector else 1)
        tile = tile_edge(spec, opts.cuda_vector, opts.cuda_tile) if tiled(spec) else 0
        kernel = CUDAKernel(
            func, fmt, block, per_sm * self.sms, spec.name, ptx, maxt, spec.flat, per_thread, tile
        )
        return kernel, {"disk_hit": disk_hit, "ptx": ptx}

    def save_source(self, spec: Any, source: str) -> str:
        return save_source(spec, source)

    # -- launch ----------------------------------------------------------------------------
    def bind(self, data: Any, strided: bool) -> tuple:
        if not strided:
            return (data.data.ptr,)
        item = data.itemsize
        return (data.data.ptr, *[s // item for s in data.strides])

    def view_source(self, data: Any) -> tuple[tuple, tuple[int, ...]] | None:
        item = data.itemsize
        if any([s % item for s in data.strides]):
            return None
        bound = self.bind(data, True)
        return bound, bound[1:]

    offset_form = 2

    def bind_offset(self, src_bound: tuple, offset: int, estrides: tuple[int, ...], item: int,
                    strided: bool) -> tuple | None:  # fmt: skip
        p = src_bound[0] + offset * item
        return (p, *estrides) if strided else (p,)

    def same_allocation(self, a: Any, b: Any) -> bool:
        return a.data.mem is b.data.mem

    def restride(self, data: Any, shape: tuple[int, ...], estrides: tuple[int, ...]) -> Any:
        item = data.dtype.itemsize
        return cp.ndarray(shape, data.dtype, memptr=data.data, strides=tuple(s * item for s in estrides))

    def scalar_arg(self, leaf: Any) -> Any:
        v = leaf.value
        if leaf.dtype.kind == "f":
            return float(v)
        v = int(v)
        return v - (1 << 64) if v >= (1 << 63) else v

    def launch(self, launcher: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        k: CUDAKernel = launcher
        for o, lay in zip(outs, layouts):
            args.append(o.data.ptr)
            if lay != "C":
                item = o.itemsize
                args.extend(s // item for s in o.strides)
        n = 1
        for s in shape:
            n *= s
        if k.flat:  # the common case: a 1-D grid
            args.append(n)
            key: Any = n
        else:  # row and tile kernels
            args.extend(shape if shape else (1,))
            key = shape
        args.append(n)
        call = k.calls.get(key)  # the launch shape, memoized per size (flat) or shape
        if call is None:
            grid, block = self.elementwise_config(k, shape, n)
            (gx, gy), (bx, by) = launch_dims(grid), launch_dims(block)
            if len(k.calls) > 64:
                k.calls.clear()
            call = k.calls[key] = (k.func, gx, gy, 1, bx, by, 1, 0)
        pack = self._pack
        if pack is not None:  # (C: pack and launch in one call)
            stream = _current_stream().ptr
            res = pack(k.fmt, k.bufaddr, args, call, stream, k.args)
            if res:
                self._launch_failed(res, call, stream, k.args, k.name)
            return
        k.packer.pack_into(k.buf, 0, *args)
        self._driver_launch(call, k.args, k.name)

    def elementwise_config(self, k: CUDAKernel, shape: tuple, n: int) -> tuple[Any, Any]:
        """(grid, block) of an elementwise launch over ``shape`` (``n`` elements): flat kernels a
        1-D grid of at most one wave of resident blocks; row kernels (codegen.elementwise) a 2-D
        grid, x along the inner axis (threads enough for the row, ``per_thread`` elements each)
        and y over rows, ``block`` threads per block."""
        per = k.per_thread
        if k.tile:  # one tile of the last two axes per block (codegen.elementwise.TILE_BLOCK)
            ni, nj, t = shape[-2], shape[-1], k.tile
            ntiles = (n // (ni * nj) if ni * nj else 0) * -(-ni // t) * -(-nj // t)
            return max(1, min(ntiles, 2**31 - 1)), TILE_BLOCK
        if k.flat:
            return _flat_grid(k, n), k.block
        nin = shape[-1] if shape else 1
        cols = -(-nin // per)
        bx = min(k.block, pow2_at_least(cols))
        by = k.block // bx
        gx = max(1, min(-(-cols // bx), k.max_blocks))
        # rows: up to 4 waves of resident blocks. H200, 8192x8192 (benchmarks/bandwidth.py --sweep):
        # row-broadcast float32 97.5% of copy at 4 waves vs 93.0-96.7% at 1 wave; float16 94.8-99.4%
        # at 4 waves or more, 89-93% at 1 wave; block size (128..1024) moved it less than 3%.
        gy = max(1, min(-(-(n // max(nin, 1)) // by), 65535, 4 * k.max_blocks // gx))
        return (gx, gy), (bx, by)

    def _launch(self, k: CUDAKernel, args: list, grid: Any, block: Any) -> None:
        """Pack ``args`` into the kernel's parameter buffer and launch on CuPy's current stream."""
        k.packer.pack_into(k.buf, 0, *args)
        self._call(k, k.args, grid, block)

    def _call(self, k: CUDAKernel, params: int, grid: Any, block: Any) -> None:
        """cuLaunchKernel of ``k`` with the parameter pointer array at ``params``; ``grid`` and
        ``block`` are ints (1-D) or (x, y) pairs."""
        (gx, gy), (bx, by) = launch_dims(grid), launch_dims(block)
        self._driver_launch((k.func, gx, gy, 1, bx, by, 1, 0), params, k.name)

    def _driver_launch(self, call: tuple, params: int, name: str, stream: int | None = None) -> None:
        """``cuLaunchKernel(*call, stream, params)`` on ``stream`` (default: CuPy's current one);
        a refusal goes to :meth:`_launch_failed`."""
        if stream is None:
            stream = _current_stream().ptr
        pack = self._pack
        if pack is not None:
            res = pack(None, 0, None, call, stream, params)
            if res:
                self._launch_failed(res, call, stream, params, name)
            return
        try:
            launch_kernel(*call, stream, params, 0)
        except CUDADriverError as e:
            self._launch_failed(e.status, call, stream, params, name)

    def _launch_failed(self, res: int, call: tuple, stream: int, params: int, name: str) -> None:
        """A ``cuLaunchKernel(*call, stream, params)`` that returned ``res``: with no current context
        on this thread (201) CuPy's is made current and the launch retried; other errors raise,
        naming the kernel."""
        if res == 201:
            self.driver.lib.cuCtxSetCurrent(self.ctx)
            try:
                launch_kernel(*call, stream, params, 0)
                return
            except CUDADriverError as e:
                res = e.status
        self.driver.check(res, f"cuLaunchKernel({name})")

    # -- reduction kernels --------------------------------------------------------------------
    def _auto_chunks(self, nrows: int, rowlen: int) -> int:
        if nrows >= 2 * self.sms or rowlen < 16384:
            return 1
        return min(-(-4 * self.sms // nrows), -(-rowlen // 2048))

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        item = data.itemsize
        return (data.data.ptr, *mapped([s // item for s in data.strides], smap))

    def frame_config(self, k: CUDAKernel, geometry: tuple) -> tuple[int, int, int]:
        """(threads per row, grid, block) of a reduction kernel launch."""
        nkeep, clen = geometry[-4] * geometry[-2], geometry[-1]
        tpr = config.current.reduce_threads or pow2_at_least(-(-clen // config.current.reduce_held))
        tpr = pow2_at_most(min(tpr, k.max_threads))  # a power of two: the kernel shifts by it
        rows = min(config.current.reduce_rows_per_block, k.max_threads // tpr)  # whole rows per block
        block = tpr * max(rows, 1) if tpr >= 32 else 128
        grid = max(1, -(-nkeep // (block // tpr)))  # a block per group of rows (the kernel has no row loop)
        return tpr, grid, block

    def launch_frame(self, launcher: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        k: CUDAKernel = launcher
        for o, m in zip(outs, smaps):
            args.extend(self.bind_frame(o, m))
        tpr, grid, block = self.frame_config(k, geometry)
        args.extend(geometry)
        args.append(tpr)
        self._launch(k, args, grid, block)

    # -- prepared launches (ft.jit replays): a parameter buffer of their own ----------------------
    def param_buffer(self, k: CUDAKernel, template: list, grid: Any = 1, block: Any = 1) -> Params:
        """A parameter buffer and pointer array for one recorded launch of ``k`` on ``grid`` x
        ``block``, filled with ``template`` (its pointers are patched per replay, see engine.replay)."""
        buf = ctypes.create_string_buffer(max(8, k.packer.size))
        k.packer.pack_into(buf, 0, *template)
        base = ctypes.addressof(buf)
        n = len(template)
        array = (ctypes.c_void_p * max(1, n))(*[base + 8 * j for j in range(n)])
        (gx, gy), (bx, by) = launch_dims(grid), launch_dims(block)
        return Params(buf, array, ctypes.addressof(array), (k.func, gx, gy, 1, bx, by, 1, 0), k.name)

    def patch_params(self, params: Params, patches: list, ptrs: list[int], last: list[int] | None) -> None:
        buf = params.buf
        for j, (p, v) in enumerate(zip(patches, ptrs)):
            if last is None or last[j] != v:
                _Q.pack_into(buf, 8 * p.slot, v)

    def set_param(self, params: Params, slot: int, value: int) -> None:
        """Write one pointer argument of a prepared launch (8 bytes per slot, see param_buffer)."""
        _Q.pack_into(params.buf, 8 * slot, value)

    def stream_ptr(self) -> int:
        """The current stream's handle (one lookup for a whole replay)."""
        return _current_stream().ptr

    def launch_params(self, params: Params, stream: int | None = None) -> None:
        """One ``cuLaunchKernel`` of a prepared launch: every argument was packed before."""
        self._driver_launch(params.call, params.ptr, params.name, stream)

    # -- GEMM --------------------------------------------------------------------------------
    def _blas(self) -> CuBLAS:
        if self._handle is None:
            self._handle = CuBLAS()
        return self._handle

    def synchronize(self) -> None:
        _current_stream().synchronize()

    # -- horizontal kernels (engine.horizontal) ------------------------------------------------
    def raw_base(self, ptr: int, n: int, dtype: np.dtype, owner: Any) -> Any:
        return ptr

    def table_arg(self, table: np.ndarray) -> tuple[Any, Any]:
        t = cp.asarray(np.ascontiguousarray(table))  # one host-to-device copy, kept with the table
        return t.data.ptr, t

    def launch_table(self, launcher: Any, args: list, nrows: int, total: int) -> None:
        if nrows:
            self._launch(launcher, args, nrows, min(launcher.block, 1024))

    def gemm(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        """``a @ b`` (into ``out``, adding to it when ``accumulate``) through cuBLAS's C API for
        2-D (or 1-D) float32/float64 operands in any row- or column-major layout (transposed views
        included: cuBLAS's op flags and leading dimensions); other layouts are made contiguous
        first. Batched, float16 and integer products go through ``cupy.matmul`` (not capturable
        into a CUDA graph: CuPy refuses cuBLAS during stream capture)."""
        fk = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype)
        fast = self._gemm_fast.get(fk) if self._lt else None
        if fast is not None and (
            out is None
            or (out.dtype == fast.dtype and out.shape == fast.shape and out.strides == fast.strides)
        ):
            # a product seen before: its plan, output shape and constants known (one cuBLASLt call)
            if out is None:
                out = self.empty(fast.shape, fast.dtype)
            self._lt.matmul(fast.plan, fast.one, b.data.ptr, a.data.ptr, fast.one if accumulate else fast.zero,
                            out.data.ptr, _current_stream().ptr)  # fmt: skip
            return out
        dt = np.result_type(a.dtype, b.dtype)
        if a.ndim > 2 or b.ndim > 2 or a.ndim == 0 or b.ndim == 0 or dt not in self._gemm_consts:
            if _current_stream().is_capturing():
                raise UnsupportedError(
                    f"a {dt} product of shapes {a.shape} @ {b.shape} runs through cupy.matmul, which "
                    "cannot be captured into a CUDA graph (2-D float32/float64 products can)"
                )
            return store_product(cp.matmul(a, b), out, accumulate)
        if a.dtype != dt:
            a = a.astype(dt)
        if b.dtype != dt:
            b = b.astype(dt)
        if out is not None and (not out.flags.c_contiguous or out.dtype != dt):  # through a temporary
            return store_product(self.gemm(a, b), out, accumulate)
        shape = (a.shape[:-1] if a.ndim == 2 else ()) + (b.shape[1:] if b.ndim == 2 else ())
        a2 = a if a.ndim == 2 else a.reshape(1, -1)
        b2 = b if b.ndim == 2 else b.reshape(-1, 1)
        m, k = a2.shape
        n = b2.shape[1]
        if out is None:
            out = self.empty(shape, dt)
        if m == 0 or n == 0:
            return out
        if k == 0:
            if not accumulate:
                out.fill(0)
            return out
        # row-major C = A @ B is column-major C^T = B^T @ A^T
        first = _blas_operand(b2)
        if first is None:
            b2 = cp.ascontiguousarray(b2)
            first = _blas_operand(b2)
        second = _blas_operand(a2)
        if second is None:
            a2 = cp.ascontiguousarray(a2)
            second = _blas_operand(a2)
        assert first is not None and second is not None
        blas = self._blas()
        stream = _current_stream().ptr
        one, zero = self._gemm_consts[dt]
        ta, lda = first
        tb, ldb = second
        lt = self._lt if self._lt is not None else self._make_lt()
        plan = lt.plans.get((dt, ta, tb, n, m, k, lda, ldb, n), _MISS) if lt else None
        if plan is _MISS:  # a new problem: its algorithm timed on these operands (not while capturing)
            ops = None if _current_stream().is_capturing() else (b2.data.ptr, a2.data.ptr)
            plan = lt.plan(dt, ta, tb, n, m, k, lda, ldb, n, ops)
        if plan is not None:  # cuBLASLt with the algorithm chosen once per problem
            lt.matmul(plan, one, b2.data.ptr, a2.data.ptr, one if accumulate else zero, out.data.ptr, stream)
            if a2 is a and b2 is b and a.dtype == dt and b.dtype == dt:  # 2-D operands used as they are
                if len(self._gemm_fast) > 256:
                    self._gemm_fast.clear()
                self._gemm_fast[fk] = GemmFast(plan, shape, dt, out.strides, one, zero)
            return out
        if self._cublas_stream != stream:
            blas.set_stream(stream)
            self._cublas_stream = stream
        blas.gemm(dt, ta, tb, n, m, k, one, b2.data.ptr, lda, a2.data.ptr, ldb, one if accumulate else zero,
                  out.data.ptr, n)  # fmt: skip
        return out

    def _make_lt(self) -> Any:
        """cuBLASLt (False when disabled by FUSETREE_GEMM=cublas or not loadable: cuBLAS serves)."""
        self._lt = False
        if os.environ.get("FUSETREE_GEMM", "cublaslt") != "cublas":
            try:
                self._lt = CuBLASLt(self._blas())
            except (DeviceError, OSError, AttributeError):
                pass
        return self._lt


_MISS = object()


class GemmFast(NamedTuple):
    """A product's cuBLASLt plan and output, worked out once for its operands' shapes, strides and
    dtypes (the general path of :meth:`CUDABackend.gemm`)."""

    plan: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...]  # of a C-contiguous output
    one: int  # host addresses of alpha/beta constants
    zero: int


def _blas_operand(x: Any) -> tuple[int, int] | None:
    """(op, leading dimension) of 2-D ``x`` seen by cuBLAS (column-major) as ``x``'s transpose:
    a row-major layout is that transpose as it is (op N); a column-major one (a transposed view)
    is ``x`` itself, transposed by cuBLAS (op T). None for other strides."""
    r, c = x.shape
    it = x.itemsize
    s0, s1 = x.strides
    if c == 1:
        s1 = it
    if r == 1:
        s0 = max(c, 1) * it
    if s1 == it and s0 > 0 and s0 % it == 0 and s0 // it >= max(1, c):
        return 0, s0 // it
    if s0 == it and s1 > 0 and s1 % it == 0 and s1 // it >= max(1, r):
        return 1, s1 // it
    return None


def make_backend() -> CUDABackend:
    return CUDABackend()


__all__ = ["CUDABackend", "compile_ptx", "disk_cache_dir", "read_disk_cache", "write_disk_cache"]
