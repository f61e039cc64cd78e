"""CPU backend: generated loops compiled by numba ``njit(parallel=True)``.

float32 ``exp``, ``tanh`` and ``sigmoid`` use branch-free polynomial versions (Cephes-style, ~1-2
ulp) that LLVM vectorizes: numba's ``math.exp``/``math.tanh`` are scalar libm calls, so a fused
loop would otherwise lose to NumPy's SIMD loops. float64 uses libm. numba has no float16 on the
CPU: kernels read and write float16 memory as its uint16 bits and convert in registers
(``h2f``/``f2h``, exact; computation is float32 as NumPy's loops do), so there is no staging copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable
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

from .. import config
from ..codegen import abi
from ..codegen.common import Target
from ..ir import dtypes
from . import helpers
from .base import Backend, _Raw, mapped, store_product
from .diskcache import disk_cache_dir

_F = np.float32
_jit = njit(error_model="numpy", cache=False)


def _f32_from_bits_impl(typingctx, i):  # type: ignore[no-untyped-def]
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], llir.FloatType())

    return sig, codegen


# bit pattern -> float32 (vectorizes; builds 2**n without libm)
_f32_from_bits: Any = intrinsic(_f32_from_bits_impl)


def _f32_bits_impl(typingctx, x):  # type: ignore[no-untyped-def]
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], llir.IntType(32))

    return sig, codegen


# float32 -> its bit pattern
_f32_bits: Any = intrinsic(_f32_bits_impl)


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
def f16_round_d(x):  # type: ignore[no-untyped-def]
    """float64 -> the nearest float16 value (ties to even), as float32. Rounding to float32 first
    and then to float16 would round twice (2.2910156250000004 -> 2.29296875, NumPy: 2.291015625):
    the float32 step rounds to odd instead (toward zero, then the last bit set when inexact), which
    keeps the float16 rounding exact because float32 carries 13 > 2 more bits."""
    f = np.float32(x)
    if np.float64(f) != x and f == f:  # inexact (NaN stays NaN, overflow to inf comes back below)
        b = _f32_bits(f)
        if abs(np.float64(f)) > abs(x):
            b -= np.int32(1)  # toward zero: one float32 step down in magnitude
        f = _f32_from_bits(np.int32(b | np.int32(1)))
    return f16_round(f)


@_jit
def h2f(h):  # type: ignore[no-untyped-def]
    """float16 bits (uint16) -> float32, exact (subnormals through one float multiply)."""
    u = np.int32((np.int32(h) & np.int32(0x7FFF)) << np.int32(13))
    f = _f32_from_bits(u) * _F(5.192296858534828e33)  # 2**112: rebias the exponent
    if f >= _F(65536.0):  # was inf or NaN: keep it so
        f = _f32_from_bits(np.int32(_f32_bits(f) | np.int32(0x7F800000)))
    return -f if np.int32(h) & np.int32(0x8000) else f


@_jit
def f2h(x):  # type: ignore[no-untyped-def]
    """float32 -> float16 bits (uint16), rounded to nearest even (NumPy's cast)."""
    r = f16_round(x)
    a = abs(r)
    if a != a:
        h = np.int32(0x7E00)
    elif a == _F(np.inf):
        h = np.int32(0x7C00)
    elif a >= _F(6.103515625e-05):  # normal: rebias the exponent, keep the top 10 fraction bits
        b = _f32_bits(a)
        h = np.int32(((b >> np.int32(23)) - np.int32(112)) << np.int32(10)) | (
            (b >> np.int32(13)) & np.int32(0x3FF)
        )
    else:  # subnormal: a multiple of 2**-24
        h = np.int32(a * _F(16777216.0))
    if _f32_bits(x) < np.int32(0):
        h = h | np.int32(0x8000)
    return np.uint16(h)


@_jit
def sigmoid_f4(x):  # type: ignore[no-untyped-def]
    return _F(1.0) / (_F(1.0) + exp_f4(-x))


@_jit
def sigmoid_f8(x):  # type: ignore[no-untyped-def]
    return 1.0 / (1.0 + math.exp(-x))


# NumPy's npy_divmod (floor division, Python-style remainder), shared with the CUDA target
floordiv = _jit(helpers.divmod_helper(0))
fmod_py = _jit(helpers.divmod_helper(1))


@_jit
def rint(x):  # type: ignore[no-untyped-def]
    """Round half to even, as np.round; the sign of x is kept (-0.4 rounds to -0.0)."""
    r = np.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r - 2.0 * np.floor(r * 0.5) != 0.0):
        r = r + 1
    return np.copysign(r, x)


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
    for g in helpers.GENERIC:  # the same integer/NaN helpers as the CUDA target
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
    ns["f16_round"], ns["f16_round_d"], ns["h2f"], ns["f2h"] = f16_round, f16_round_d, h2f, f2h
    return ns


def storage(dt: np.dtype) -> np.dtype:
    """float16 is read and written as its uint16 bits (numba has no CPU float16)."""
    return np.dtype(np.uint16) if dt == np.float16 else dt


def scalar_storage(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt == np.float16 else dt


TARGET = Target("cpu", storage, scalar_storage)
_U16 = np.dtype(np.uint16)
_F16 = np.dtype(np.float16)


# Below this many elements a kernel runs serially: waking numba's (passively waiting) worker threads
# costs ~70 µs per parallel region on the 2-core CI machine (measured: a 4096-element a*b+c took
# 79 µs in a parallel region, 0.6 µs serially), more than such a kernel takes on one core.
PARALLEL_MIN = 1 << 17
# Elementwise and horizontal kernels go parallel by estimated work instead: elements x (ops, a
# transcendental counting 16), at least PARALLEL_WORK. 2-core VM, 65536 elements: the LSTM cell
# (5 exp-based ops) 380 us serially, 298 in parallel; a*b+a 14 us serially, 81 in parallel (the
# wake-up dominates until ~500k elements of such a cheap kernel).
PARALLEL_WORK = 1 << 20
HEAVY_OPS = frozenset(("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "sin", "cos",
                       "tan", "arcsin", "arccos", "arctan", "arctan2", "sinh", "cosh", "erf", "power"))  # fmt: skip


def parallel_min(spec: Any) -> int:
    """Elements from which ``spec``'s kernel runs its parallel variant (see PARALLEL_WORK)."""
    if spec.frame is not None:
        return PARALLEL_MIN
    work = sum(16 if o.op in HEAVY_OPS else 1 for o in spec.ops) + len(spec.outs)
    return max(1 << 12, PARALLEL_WORK // max(1, work))


PARALLEL_SUFFIX = "_par"  # a cached kernel module's prange twin (see _cached_module)


class CPULauncher:
    """A compiled CPU kernel: numba's dispatcher, called with the ABI's arguments. The serial
    variant is compiled first; the ``prange`` (parallel) variant when a call is large enough.
    ``cached``: the function lives in a module file of the disk cache, so numba keeps its machine
    code beside it (``cache=True``) and a new process loads it instead of compiling."""

    __slots__ = (
        "cached",
        "entry",
        "flat",
        "fn",
        "min_par",
        "name",
        "par",
        "parallel",
        "py",
        "py_par",
        "sig",
        "source",
    )

    def __init__(
        self,
        py: Any,
        sig: Any,
        name: str,
        flat: bool,
        parallel: bool,
        cached: bool = False,
        py_par: Any = None,
        min_par: int = PARALLEL_MIN,
    ) -> None:
        self.py, self.sig, self.cached = py, sig, cached
        self.py_par = py if py_par is None else py_par  # a cached kernel's twin (_cached_module)
        self.min_par = min_par  # elements from which the parallel variant runs (parallel_min)
        self.fn = njit(sig, parallel=False, error_model="numpy", nogil=True, cache=cached)(py)
        # its one compiled overload's entry point: called without the dispatcher's per-argument
        # type matching (~0.2 us of 1 us). The arguments always come from this backend's binding
        # (bind, launch, fresh_arg), which makes exactly the signature's types.
        self.entry = next(iter(self.fn.overloads.values())).entry_point
        self.par: Any = None
        self.parallel = parallel  # options(cpu_parallel=...) allowed the parallel variant
        self.name = name
        self.flat = flat  # one flat size argument (else one per dimension)
        self.source = ""

    def direct(self, n: int) -> Any:
        """The compiled function a launch of ``n`` elements calls with its arguments alone (the
        serial one), or None when it takes the parallel variant (through ``__call__``)."""
        return None if n >= self.min_par and self.parallel else self.entry

    def __call__(self, n: int, args: list) -> None:
        if n >= self.min_par and self.parallel:
            if self.par is None:
                self.par = njit(self.sig, parallel=True, error_model="numpy", nogil=True, cache=self.cached)(
                    self.py_par
                )
            self.par(*args)
        else:
            self.entry(*args)


_KERNEL_GLOBALS: dict[str, Any] = {}


def kernel_globals() -> dict[str, Any]:
    """The names generated CPU kernels use (dtype constructors, math helpers): what a cached
    kernel module imports."""
    if not _KERNEL_GLOBALS:
        _KERNEL_GLOBALS.update(_namespace())
    return _KERNEL_GLOBALS


_MODULE_HEADER = (
    "# fusetree CPU kernel (generated; numba keeps its compiled code in __pycache__ beside it)\n"
    "from fusetree.backends.cpu import kernel_globals as _kernel_globals\n"
    "globals().update(_kernel_globals())\n\n"
)


_WRITES = [0]  # kernel modules this process wrote (a prune every 64)


def prune(d: str, keep: int | None = None) -> int:
    """Keep the newest ``keep`` kernels (default ``FUSETREE_CPU_DISK_CACHE_MAX``, 4096: ~40 KB each
    with numba's files) in the CPU disk cache ``d``; the oldest modules and their compiled code go
    first. Returns how many kernels were removed."""
    if keep is None:
        keep = int(os.environ.get("FUSETREE_CPU_DISK_CACHE_MAX", "4096"))
    try:
        mods = [e for e in os.scandir(d) if e.name.endswith(".py") and not e.name.startswith(".")]
        if len(mods) <= keep:
            return 0
        mods.sort(key=lambda e: e.stat().st_mtime)
        old = {e.name[:-3] for e in mods[: len(mods) - keep]}
        for stem in old:
            os.unlink(os.path.join(d, stem + ".py"))
        pyc = os.path.join(d, "__pycache__")
        if os.path.isdir(pyc):
            for e in os.scandir(pyc):
                if e.name.split(".", 1)[0] in old:
                    os.unlink(e.path)
        return len(old)
    except OSError:  # another process pruning at the same time
        return 0


def _cached_module(d: str, key: str, spec_name: str, source: str) -> Any:
    """Import (writing it first if new) the module file holding a kernel's source."""
    path = os.path.join(d, f"{spec_name}_{key}.py")
    # numba's disk cache keys machine code by function (module, name, line) and signature, not by
    # the ``parallel`` flag: the prange variant is a twin function of its own name, or a parallel
    # dispatcher would load the serial code the other one cached (measured: an AdamW step's kernel
    # ran at serial speed, 10 ms instead of 3, on 2 cores)
    twin = source.replace(f"def {spec_name}(", f"def {spec_name}{PARALLEL_SUFFIX}(", 1)
    text = _MODULE_HEADER + source + "\n\n" + twin
    try:
        with open(path, encoding="utf-8") as f:
            fresh = f.read() != text
    except FileNotFoundError:
        fresh = True
    if fresh:  # written atomically: a process importing it never sees half a file
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".py")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        _WRITES[0] += 1
        if _WRITES[0] % 64 == 0:
            prune(d)
    spec = importlib.util.spec_from_file_location(f"fusetree_cpu_{spec_name}_{key}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # numba finds a cached kernel's module by name when it loads it
    spec.loader.exec_module(mod)
    return mod


class CPUBackend(Backend):
    name = "cpu"
    device = "cpu"
    target = TARGET
    xp = np
    gemm_accumulate = True  # x@W + h@U: one product added into the other's output (one leaf)
    fold_sliced_sums = True  # a sliced x@W + h@U + b: one NumPy add, then slices of memory (Backend)
    host_matmul = np.matmul  # (the C accelerator's GEMM sum: gemm's products without its frame)

    def __init__(self) -> None:
        self.ns = kernel_globals()
        self.cache_dir: str | None = ""  # resolved on the first compile
        self.cache_salt = ""  # versions and helper sources in every disk-cache key (set with it)

    def cache_tag(self) -> str:
        return "cpu/par" if config.current.cpu_parallel else "cpu/serial"

    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        par = config.current.cpu_parallel
        d = self._cache_dir()
        if d is not None:
            key = hashlib.sha256(
                f"{spec.key_text}|{self.cache_tag()}|{self.cache_salt}|{source}".encode()
            ).hexdigest()[:24]
            try:
                mod = _cached_module(d, key, spec.name, source)
                launcher = CPULauncher(
                    getattr(mod, spec.name), signature(spec), spec.name, spec.flat, par, True,
                    getattr(mod, spec.name + PARALLEL_SUFFIX), parallel_min(spec),
                )  # fmt: skip
                hit = bool(launcher.fn.stats.cache_hits)
                return launcher, {"disk_hit": hit}
            except OSError:  # an unwritable cache directory: compile in memory
                self.cache_dir = None
        ns = dict(self.ns)
        exec(compile(source, f"<fusetree {spec.name}>", "exec"), ns)
        launcher = CPULauncher(
            ns[spec.name], signature(spec), spec.name, spec.flat, par, min_par=parallel_min(spec)
        )
        return launcher, {}

    def _cache_dir(self) -> str | None:
        """Where CPU kernel modules are kept (the disk cache's ``cpu`` folder; None: off, with
        ``FUSETREE_CPU_DISK_CACHE=0``)."""
        if self.cache_dir == "":
            self.cache_dir = None
            if os.environ.get("FUSETREE_CPU_DISK_CACHE", "1") not in ("0", ""):
                try:
                    d = os.path.join(disk_cache_dir(), f"cpu-v{config.CODEGEN_VERSION}")
                    os.makedirs(d, mode=0o700, exist_ok=True)
                    # the helpers a kernel calls are compiled into its cached machine code: their
                    # source is part of every key, with the codegen and numba versions
                    helpers_src = b"".join(
                        (pathlib.Path(__file__).parent / f).read_bytes() for f in ("cpu.py", "helpers.py")
                    )
                    digest = hashlib.sha256(helpers_src).hexdigest()[:16]
                    self.cache_salt = f"{config.CODEGEN_VERSION}|{numba.__version__}|{digest}"
                    self.cache_dir = d
                except OSError:
                    pass
        return self.cache_dir

    def bind(self, data: np.ndarray, strided: bool) -> tuple:
        if data.dtype == _F16:
            data = data.view(_U16)
        if not strided:
            return (data.reshape(-1),)
        base, off, strides, _ = _flat_view(data)
        return (base, off, *strides)

    def view_source(self, data: np.ndarray) -> tuple[tuple, tuple[int, ...]] | None:
        if data.dtype == _F16:
            data = data.view(_U16)
        base, off, strides, copied = _flat_view(data)
        return None if copied else ((base, off, *strides), strides)

    offset_form = 1
    flat_launch = True  # (see Backend.flat_launch)
    fast_empty = np.empty
    flat_view_dtypes = frozenset((_F16,))

    def bind_offset(self, src_bound: tuple, offset: int, estrides: tuple[int, ...], item: int,
                    strided: bool) -> tuple | None:  # fmt: skip
        # (the flat form is a 1-D view of the elements: made from the view itself)
        return (src_bound[0], src_bound[1] + offset, *estrides) if strided else None

    def launch(self, launcher: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        if launcher.flat:  # every array C-contiguous: 1-D views and one size
            for o in outs:
                if o.dtype is _F16:
                    o = o.view(_U16)
                args.append(o if o.ndim == 1 else o.reshape(-1))
            n = math.prod(shape)
            args.append(n)
            fn = launcher.direct(n)
            if fn is not None:
                fn(*args)  # the serial kernel's entry point
            else:
                launcher(n, args)
            return
        staged = []
        for o, lay in zip(outs, layouts):
            buf = o.view(_U16) if o.dtype == _F16 else o
            if lay == "C":
                args.append(buf.reshape(-1))
                continue
            base, off, strides, copied = _flat_view(buf)
            if copied:  # a view of foreign memory: write a copy, then copy back
                staged.append((buf, base.reshape(buf.shape)))
                strides = tuple(s // buf.itemsize for s in base.reshape(buf.shape).strides)
            args.extend((base, off, *strides))
        n = 1
        for s in shape:
            n *= s
        if launcher.flat:
            args.append(n)
        else:
            args.extend(shape if shape else (1,))
        launcher(n, args)
        for o, buf in staged:
            np.copyto(o, buf, casting="unsafe")

    def replay_root(self, arr: np.ndarray) -> tuple[np.ndarray, int] | None:
        """(1-D array over ``arr``'s allocation, element offset of its element 0) for a replay's
        argument slots; None for memory that cannot be addressed so (foreign views)."""
        if arr.dtype is _F16:
            arr = arr.view(_U16)
        base, off, _, copied = _flat_view(arr)
        return None if copied else (base, off)

    def replay_root_fresh(self, arr: np.ndarray) -> tuple[np.ndarray, int]:
        """replay_root of a fresh C-contiguous array (its own 1-D view, see :meth:`fresh_arg`)."""
        conv = self.fresh_arg(arr.shape, arr.dtype)
        return (arr if conv is None else conv(arr), 0)

    @staticmethod
    def fresh_arg(shape: tuple[int, ...], dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray] | None:
        """How a kernel takes a fresh C-contiguous output of ``shape`` and ``dtype`` (the first
        element of :meth:`replay_root_fresh`): None when it takes the array as it is (1-D, not
        float16), else the conversion, chosen once for ``ft.jit``'s short replay path."""
        if dtype == _F16:
            return _f16_bits_flat
        return None if len(shape) == 1 else _flat

    def same_allocation(self, a: Any, b: Any) -> bool:
        return _root_of(a) is _root_of(b)

    def restride(self, data: Any, shape: tuple[int, ...], estrides: tuple[int, ...]) -> Any:
        item = data.dtype.itemsize
        return host_view(data, 0, shape, tuple(s * item for s in estrides), data.dtype)

    def view_at(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        return host_view(root, offset, shape, strides, dtype)

    # -- reduction kernels --------------------------------------------------------------------
    def _auto_chunks(self, nrows: int, rowlen: int) -> int:
        threads = numba.get_num_threads() if config.current.cpu_parallel else 1
        if threads == 1 or nrows >= 2 * threads or rowlen < 65536:
            return 1
        return min(-(-2 * threads // nrows), -(-rowlen // 32768))

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        if data.dtype == _F16:
            data = data.view(_U16)
        base, off, strides, _ = _flat_view(data)
        return (base, off, *mapped(strides, smap))

    def launch_frame(self, launcher: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        staged = _frame_outputs(args, [o.view(_U16) if o.dtype == _F16 else o for o in outs], smaps)
        args.extend(geometry)
        args.append(1)
        launcher(geometry[-4] * geometry[-3], args)  # rows x row length
        for o, buf in staged:
            np.copyto(o, buf, casting="unsafe")

    def gemm(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        """``a @ b`` (into ``out``, adding to it when ``accumulate``). A product into an output of
        its own dtype is written there by ``np.matmul`` (no temporary, no copy: NumPy stages
        operands that overlap ``out``)."""
        if out is not None and not accumulate and a.dtype == b.dtype == out.dtype and out.ndim == 2 \
                and a.ndim == 2 and b.ndim == 2:  # fmt: skip
            return np.matmul(a, b, out=out)
        return store_product(np.matmul(a, b), out, accumulate)

    # -- horizontal kernels (engine.horizontal) ------------------------------------------------
    def launch_table(self, launcher: Any, args: list, nrows: int, total: int) -> None:
        launcher(total, args)

    def copy(self, dst: Any, src: Any) -> None:
        np.copyto(dst, src, casting="unsafe")


def signature(spec: Any) -> Any:
    """The numba signature of ``spec``'s CPU kernel, from the ABI (inputs read-only: they may be
    broadcast views)."""
    sig: list[Any] = []
    for p in abi.params(spec, "cpu"):
        if p.kind == "array":
            readonly = p.owner is not None and p.owner[0] == "in"
            sig.append(types.Array(numba.from_dtype(storage(p.dtype)), 1, "C", readonly=readonly))
        elif p.kind == "scalar":
            sig.append(numba.from_dtype(scalar_storage(p.dtype)))
        else:
            sig.append(types.int64)
    return types.void(*sig)


def _frame_outputs(args: list, outs: list, smaps: list) -> list:
    """Append reduction-kernel output arguments (CPU memory); returns (target, staging) pairs."""
    staged = []
    for o, m in zip(outs, smaps):
        base, off, strides, copied = _flat_view(o)
        if copied:  # a view of foreign memory: write a copy, then copy back
            staged.append((o, base.reshape(o.shape)))
        args.extend((base, off, *mapped(strides, m)))
    return staged


@njit(nogil=True)
def _byte_offset(v, b):  # type: ignore[no-untyped-def]
    return v.ctypes.data - b.ctypes.data


_UNTYPED: set[tuple[np.dtype, np.dtype]] = set()  # dtype pairs numba cannot type (float16)


def byte_offset(v: np.ndarray, b: np.ndarray) -> int:
    """Address of ``v``'s element 0 minus ``b``'s: through numba (0.2 µs; ``__array_interface__``
    builds a dict per call, 0.9 µs), or NumPy for arrays numba cannot type (remembered: numba's
    dispatcher retries a failed compile on every call, ~10 ms each)."""
    pair = (v.dtype, b.dtype)
    if pair not in _UNTYPED:
        try:
            return int(_byte_offset(v, b))
        except Exception:
            _UNTYPED.add(pair)
    return int(v.__array_interface__["data"][0] - b.__array_interface__["data"][0])


def _flat(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1)


def _f16_bits_flat(arr: np.ndarray) -> np.ndarray:
    """A float16 array's bits as a 1-D uint16 view (how the CPU kernels take float16)."""
    return arr.view(_U16).reshape(-1)


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
    estrides = tuple([s // item for s in v.strides])
    if v.base is None and v.flags.c_contiguous and v.size:  # an allocation of its own (a fresh output)
        return v.reshape(-1), 0, estrides, False
    b = _root_of(v)
    if b.flags.c_contiguous and b.size:
        off = byte_offset(v, b)
        if off % item == 0 and not any([s % item for s in v.strides]):
            if b.dtype == v.dtype:
                return b.reshape(-1), off // item, estrides, False
            raw = b.reshape(-1).view(np.uint8)
            flat = raw[: raw.size - raw.size % item].view(v.dtype)
            return flat, off // item, estrides, False
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
