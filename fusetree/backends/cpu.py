"""CPU backend: generated loops compiled by numba ``njit(parallel=True)``.

float32 ``exp``, ``tanh`` and ``sigmoid`` use branch-free polynomial versions (Cephes-style, ~1-2
ulp) that LLVM vectorizes: numba's ``math.exp``/``math.tanh`` are scalar libm calls, so a fused
loop would otherwise lose to NumPy's SIMD loops. float64 uses libm. numba has no float16 on the
CPU: float16 buffers are widened to float32 around the kernel (computation is float32 anyway).
"""

from __future__ import annotations

import math
import os
from typing import Any

# Fused kernels alternate with BLAS GEMMs. With spinning OpenMP workers (libgomp's default) numba's
# threads and OpenBLAS's threads busy-wait against each other, and on a 2-core machine an LSTM step
# took 9 ms instead of 0.5 ms. Passive waiting costs a few µs per parallel region. Set before numba
# loads its OpenMP layer; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba
import numpy as np
from llvmlite import ir as llir
from numba import njit, prange, types
from numba.extending import intrinsic

from .. import config, dtypes
from . import cuda_helpers
from .base import Backend, _Raw, mapped, store_product

_F = np.float32
_jit = njit(error_model="numpy", cache=False)


def _f32_from_bits_impl(typingctx, i):  # type: ignore[no-untyped-def]
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], llir.FloatType())

    return sig, codegen


# bit pattern -> float32 (vectorizes; builds 2**n without libm)
_f32_from_bits: Any = intrinsic(_f32_from_bits_impl)


@_jit
def exp_f4(x):  # type: ignore[no-untyped-def]
    xc = min(max(x, _F(-104.0)), _F(89.0))
    n = np.floor(xc * _F(1.44269504088896341) + _F(0.5))
    r = xc - n * _F(0.693359375)
    r = r - n * _F(-2.12194440e-4)
    z = r * r
    p = (((((_F(1.9875691500e-4) * r + _F(1.3981999507e-3)) * r + _F(8.3334519073e-3)) * r
          + _F(4.1665795894e-2)) * r + _F(1.6666665459e-1)) * r + _F(5.0000001201e-1)) * z + r + _F(1.0)  # fmt: skip
    ni = np.int32(n)
    h = ni >> np.int32(1)
    s1 = _f32_from_bits((h + np.int32(127)) << np.int32(23))
    s2 = _f32_from_bits((ni - h + np.int32(127)) << np.int32(23))
    y = p * s1 * s2
    return x if x != x else y


@_jit
def tanh_f4(x):  # type: ignore[no-untyped-def]
    ax = abs(x)
    z = x * x
    small = ((((_F(-5.70498872745e-3) * z + _F(2.06390887954e-2)) * z - _F(5.37397155531e-2)) * z
              + _F(1.33314422036e-1)) * z - _F(3.33332819422e-1)) * z * x + x  # fmt: skip
    e = exp_f4(_F(2.0) * ax)
    big = _F(1.0) - _F(2.0) / (e + _F(1.0))
    big = big if x >= _F(0.0) else -big
    return small if ax < _F(0.625) else big


@_jit
def f16_round(x):  # type: ignore[no-untyped-def]
    """float32 -> the nearest float16 value (ties to even), as float32 (numba has no CPU float16)."""
    ax = abs(x)
    # normal float16 range: drop the low 13 of float32's 23 fraction bits, rounding to nearest even
    # (adding 2**(e+13)*1.5 then subtracting it rounds at the float16 quantum of ax's binade)
    t = ax * _F(8193.0)  # Veltkamp split: keep 11 significant bits
    hi = t - (t - ax)
    lo = (ax + _F(0.75)) - _F(0.75)  # float16 subnormals: multiples of 2**-24
    r = hi if ax >= _F(6.103515625e-05) else lo
    r = r if ax < _F(65520.0) else _F(np.inf)
    r = math.copysign(r, x)
    return x if x != x else r


@_jit
def sigmoid_f4(x):  # type: ignore[no-untyped-def]
    return _F(1.0) / (_F(1.0) + exp_f4(-x))


@_jit
def sigmoid_f8(x):  # type: ignore[no-untyped-def]
    return 1.0 / (1.0 + math.exp(-x))


# NumPy's npy_divmod (floor division, Python-style remainder), shared with the CUDA target
floordiv = _jit(cuda_helpers.divmod_helper(0))
fmod_py = _jit(cuda_helpers.divmod_helper(1))


@_jit
def rint(x):  # type: ignore[no-untyped-def]
    r = np.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r - 2.0 * np.floor(r * 0.5) != 0.0):
        r = r + 1
    return r


def _unary(fn):  # type: ignore[no-untyped-def]
    if isinstance(fn, type(_unary)):  # a Python function: compile it as is
        return njit(error_model="numpy")(fn)

    def f(x):  # type: ignore[no-untyped-def]
        return fn(x)

    return njit(error_model="numpy")(f)


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"np": np, "math": math, "prange": prange}
    for d in dtypes.SUPPORTED:
        ns[dtypes.CTOR[d]] = d.type
    generic = dict(floordiv=floordiv, fmod_py=fmod_py, rint=rint)
    for g in cuda_helpers.GENERIC:  # the same integer/NaN helpers as the CUDA target
        ns[g.__name__] = _jit(g)
    libm = {
        "exp": math.exp, "exp2": lambda x: 2.0**x, "expm1": math.expm1, "log": math.log,
        "log2": math.log2, "log10": math.log10, "log1p": math.log1p, "sin": math.sin,
        "cos": math.cos, "tan": math.tan, "tanh": math.tanh, "sinh": math.sinh, "cosh": math.cosh,
        "asin": math.asin, "acos": math.acos, "atan": math.atan, "erf": math.erf,
        "sqrt": math.sqrt, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    }  # fmt: skip
    for name, fn in libm.items():
        ns[f"{name}_f4"] = ns[f"{name}_f8"] = _unary(fn)
    ns["exp2_f4"] = njit(error_model="numpy")(lambda x: _F(2.0) ** x)
    ns["rsqrt_f4"] = njit(error_model="numpy")(lambda x: _F(1.0) / math.sqrt(x))
    ns["rsqrt_f8"] = njit(error_model="numpy")(lambda x: 1.0 / math.sqrt(x))
    ns["pow_f4"] = ns["pow_f8"] = njit(error_model="numpy")(lambda a, b: a**b)
    ns["atan2_f4"] = ns["atan2_f8"] = njit(error_model="numpy")(lambda a, b: math.atan2(a, b))
    for name, h in generic.items():
        ns[f"{name}_f4"] = ns[f"{name}_f8"] = h
    ns["exp_f4"], ns["tanh_f4"], ns["sigmoid_f4"], ns["sigmoid_f8"] = exp_f4, tanh_f4, sigmoid_f4, sigmoid_f8
    ns["f16_round"] = f16_round
    return ns


class CPUBackend(Backend):
    name = "cpu"
    device = "cpu"
    target = "cpu"
    xp = np

    def __init__(self) -> None:
        self.ns = _namespace()

    @staticmethod
    def storage_dtype_static(dt: np.dtype) -> np.dtype:
        return np.dtype(np.float32) if dt == np.float16 else dt

    def storage_dtype(self, dt: np.dtype) -> np.dtype:
        return self.storage_dtype_static(dt)

    def cache_tag(self) -> str:
        return "cpu/par" if config.current.cpu_parallel else "cpu/serial"

    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        ns = dict(self.ns)
        exec(compile(source, f"<fusetree {spec.name}>", "exec"), ns)
        fn = ns[spec.name]
        sig = self._signature(spec)
        par = config.current.cpu_parallel
        kernel = njit(sig, parallel=par, error_model="numpy", nogil=True)(fn)
        return kernel, {}

    def _signature(self, spec: Any) -> Any:
        def arr(dt: np.dtype, readonly: bool = False) -> Any:
            return types.Array(numba.from_dtype(self.storage_dtype(dt)), 1, "C", readonly=readonly)

        nd = 1 if spec.flat else max(spec.ndim, 1)
        sig: list[Any] = []
        for lf in spec.leaves:
            if lf.kind == "scalar":
                sig.append(numba.from_dtype(lf.dtype))
                continue
            sig.append(arr(lf.dtype, readonly=True))  # inputs may be read-only (broadcast views)
            if spec.strided(lf.layout):
                sig += [types.int64] * (nd + 1)
        for o in spec.outs:
            sig.append(arr(o.dtype))
            if spec.strided(o.layout):
                sig += [types.int64] * (nd + 1)
        sig += [types.int64] * spec.trailing("cpu")
        return types.void(*sig)

    def scalar_arg(self, leaf: Any) -> Any:
        return leaf.dtype.type(leaf.data)

    def bind(self, data: np.ndarray, layout: str, flat: bool) -> tuple:
        if data.dtype == np.float16:
            data = data.astype(np.float32)
        if flat or layout == "C":
            return (data.reshape(-1),)
        base, off, strides, _ = _flat_view(data)
        return (base, off, *strides)

    def launch(self, plan: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        flat = plan.spec.flat
        staged = []
        for o, lay in zip(outs, layouts):
            buf = o
            if o.dtype == np.float16:
                buf = np.empty(o.shape, np.float32)
                staged.append((o, buf))
            if flat or lay == "C":
                args.append(buf.reshape(-1))
                continue
            base, off, strides, copied = _flat_view(buf)
            if copied:  # a view of foreign memory: write a copy, then copy back
                staged.append((o, base.reshape(buf.shape)))
                strides = tuple(s // buf.itemsize for s in base.reshape(buf.shape).strides)
            args.extend((base, off, *strides))
        if flat:
            args.append(int(np.prod(shape, dtype=np.int64)))
        else:
            args.extend(shape)
        plan.kernel(*args)
        for o, buf in staged:
            np.copyto(o, buf, casting="unsafe")

    def view(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        return host_view(root, offset, shape, strides, dtype)

    def bind_view(
        self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any, layout: str, flat: bool
    ) -> tuple:
        """Arguments for a view of ``root`` without building the view (replays of ft.jit)."""
        if np.dtype(dtype) == np.float16:
            return self.bind(self.view(root, offset, shape, strides, dtype), layout, flat)
        base, off0, _, copied = _flat_view(root)
        if copied:
            return self.bind(self.view(root, offset, shape, strides, dtype), layout, flat)
        item = base.itemsize
        off = off0 + offset // item
        if flat or layout == "C":
            n = 1
            for s in shape:
                n *= s
            return (base[off : off + n],)
        return (base, off, *[s // item for s in strides])

    # -- reduction kernels --------------------------------------------------------------------
    def _auto_chunks(self, nrows: int, rowlen: int) -> int:
        threads = numba.get_num_threads() if config.current.cpu_parallel else 1
        if threads == 1 or nrows >= 2 * threads or rowlen < 65536:
            return 1
        return min(-(-2 * threads // nrows), -(-rowlen // 32768))

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        if data.dtype == np.float16:
            data = data.astype(np.float32)
        base, off, strides, _ = _flat_view(data)
        return (base, off, *mapped(strides, smap))

    def launch_frame(self, plan: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        staged = _frame_outputs(args, outs, smaps, widen=True)
        args.extend(geometry)
        args.append(1)
        plan.kernel(*args)
        for o, buf in staged:
            np.copyto(o, buf, casting="unsafe")

    def matmul(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        return store_product(np.matmul(a, b), out, accumulate)

    def copy(self, dst: Any, src: Any) -> None:
        np.copyto(dst, src, casting="unsafe")


def _frame_outputs(args: list, outs: list, smaps: list, widen: bool) -> list:
    """Append reduction-kernel output arguments (CPU memory); returns (target, staging) pairs."""
    staged = []
    for o, m in zip(outs, smaps):
        buf = o
        if widen and o.dtype == np.float16:
            buf = np.empty(o.shape, np.float32)
            staged.append((o, buf))
        base, off, strides, copied = _flat_view(buf)
        if copied:  # a view of foreign memory: write a copy, then copy back
            staged.append((o, base.reshape(buf.shape)))
        args.extend((base, off, *mapped(strides, m)))
    return staged


def _root_of(v: np.ndarray) -> np.ndarray:
    b = v
    while isinstance(b.base, np.ndarray):
        b = b.base
    return b


def _flat_view(v: np.ndarray) -> tuple[np.ndarray, int, tuple[int, ...], bool]:
    """(1-D C array over v's memory, element offset of v[0,...,0], element strides, copied).

    The 1-D array spans v's whole allocation (the root of its ``base`` chain, reinterpreted as
    v's dtype when it holds another: a static graph buffer is bytes), so an offset and strides
    recorded against one view may reach memory of the allocation outside it (overlapping
    arguments of ft.jit)."""
    item = v.itemsize
    b = _root_of(v)
    if b.flags.c_contiguous and b.size:
        off = v.__array_interface__["data"][0] - b.__array_interface__["data"][0]
        if off % item == 0 and all(s % item == 0 for s in v.strides):
            if b.dtype == v.dtype:
                return b.reshape(-1), off // item, tuple(s // item for s in v.strides), False
            raw = b.reshape(-1).view(np.uint8)
            flat = raw[: raw.size - raw.size % item].view(v.dtype)
            return flat, off // item, tuple(s // item for s in v.strides), False
    c = np.ascontiguousarray(v)  # unusual base (foreign buffer, odd strides): use a copy
    return c.reshape(-1), 0, tuple(s // item for s in c.strides), True


def host_view(root: np.ndarray, offset: int, shape: tuple, strides: tuple, dtype: Any) -> np.ndarray:
    """A view of host memory ``offset`` bytes from ``root``'s element 0 whose ``base`` chain leads
    to ``root``'s allocation (see _flat_view)."""
    b = _root_of(root)
    start = root.__array_interface__["data"][0] - b.__array_interface__["data"][0] + offset
    if b.flags.c_contiguous:
        try:
            return np.ndarray(shape, dtype, buffer=b, offset=start, strides=strides)
        except (TypeError, ValueError):
            pass
    return np.asarray(_Raw(root, root.__array_interface__["data"][0] + offset, shape, strides, dtype))


def make_backend() -> CPUBackend:
    return CPUBackend()
