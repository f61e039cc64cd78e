"""Helpers the generated kernels call, in numba's kernel dialect (no numba import here).

The generic helpers are compiled with ``njit`` for the CPU, ``cuda.jit(device=True)`` for the GPU,
and run as-is under the CUDA simulator. Typed math (``exp_f4``, ``exp_f8``...) maps to libdevice on the GPU
(``__nv_expf``...: correctly rounded or within libdevice's documented ulp bounds) and to ``math`` in
the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

MATH = [
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "sinh",
    "cosh", "asin", "acos", "atan", "erf", "sqrt", "floor", "ceil", "trunc", "rint",
]  # fmt: skip


def ifloordiv(a, b):  # type: ignore[no-untyped-def]
    if b == 0:
        return a - a
    q = a // b
    return q


def imod(a, b):  # type: ignore[no-untyped-def]
    if b == 0:
        return a - a
    return a % b


def ipow(a, b):  # type: ignore[no-untyped-def]
    if b < 0:
        return 1 if a == 1 else ((1 if b % 2 == 0 else -1) if a == -1 else 0)
    r = a - a + 1
    while b:
        if b & 1:
            r = r * a
        a = a * a
        b = b >> 1
    return r


def ilshift(a, b, bits):  # type: ignore[no-untyped-def]
    # NumPy's npy_lshift: counts outside [0, bits) give 0
    if b >= 0 and b < bits:
        return a << b
    return a ^ a  # zero of a's type (``a - a - 1`` would promote uint64 to float64 in numba)


def irshift(a, b, bits):  # type: ignore[no-untyped-def]
    # NumPy's npy_rshift: counts outside [0, bits) give -1 for negative a, else 0
    if b >= 0 and b < bits:
        return a >> b
    if a < 0:
        return ~(a ^ a)
    return a ^ a


def maximum(a, b):  # type: ignore[no-untyped-def]
    # NumPy: NaN propagates; on ties (0.0 vs -0.0) the second operand wins
    return a if (a > b or a != a) else b


def minimum(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b or a != a) else b


# fmax/fmin: NaN is ignored; on ties the first operand wins (NumPy's behaviour)


def fmax(a, b):  # type: ignore[no-untyped-def]
    return a if (a >= b or b != b) else b


def fmin(a, b):  # type: ignore[no-untyped-def]
    return a if (a <= b or b != b) else b


def sign(x):  # type: ignore[no-untyped-def]
    return 1 if x > 0 else (-1 if x < 0 else x - x)  # x - x: +0 for -0 (NumPy), NaN for NaN


def ireciprocal(x):  # type: ignore[no-untyped-def]
    return 1 if x == 1 else (-1 if x == -1 else 0)


def isinf(x):  # type: ignore[no-untyped-def]
    return math.isinf(x)


def isfinite(x):  # type: ignore[no-untyped-def]
    return math.isfinite(x)


GENERIC = [
    ifloordiv,
    imod,
    ipow,
    ilshift,
    irshift,
    maximum,
    minimum,
    fmax,
    fmin,
    sign,
    ireciprocal,
    isinf,
    isfinite,
]


def sim_storage(dt: np.dtype) -> np.dtype:
    """The simulator reads NumPy arrays directly (no float16 widening, no bool bytes)."""
    return dt


def namespace(jit_device: Callable[[Any], Any], libdevice: Any | None) -> dict[str, Any]:
    """Names the generated source refers to, compiled with ``jit_device``."""
    from ..ir import dtypes

    ns: dict[str, Any] = {"math": math, "np": np}
    for d in dtypes.SUPPORTED:
        ns[dtypes.CTOR[d]] = d.type
    for f in GENERIC:
        ns[f.__name__] = jit_device(f)

    def typed(fn: Callable) -> Any:
        return jit_device(fn)

    for name in MATH:
        for t, suffix in (("f4", "f"), ("f8", "")):
            ns[f"{name}_{t}"] = typed(_libm(name, suffix, libdevice))
    for t, suffix in (("f4", "f"), ("f8", "")):
        ns[f"pow_{t}"] = typed(_binary_libm("pow", suffix, libdevice))
        ns[f"atan2_{t}"] = typed(_binary_libm("atan2", suffix, libdevice))
        ns[f"floordiv_{t}"] = typed(divmod_helper(0, libdevice))
        ns[f"fmod_py_{t}"] = typed(divmod_helper(1, libdevice))
    f32 = np.float32
    exp_f4, exp_f8 = ns["exp_f4"], ns["exp_f8"]
    sqrt_f4, sqrt_f8 = ns["sqrt_f4"], ns["sqrt_f8"]

    def sigmoid_f4(x):  # type: ignore[no-untyped-def]
        return f32(1.0) / (f32(1.0) + exp_f4(-x))

    def sigmoid_f8(x):  # type: ignore[no-untyped-def]
        return 1.0 / (1.0 + exp_f8(-x))

    def rsqrt_f4(x):  # type: ignore[no-untyped-def]
        return f32(1.0) / sqrt_f4(x)

    def rsqrt_f8(x):  # type: ignore[no-untyped-def]
        return 1.0 / sqrt_f8(x)

    f16 = np.float16

    def f16_round(x):  # type: ignore[no-untyped-def]
        return f32(f16(x))

    def f16_round_d(x):  # type: ignore[no-untyped-def]
        return f32(f16(x))  # float64 -> float16 in one rounding (cvt.rn.f16.f64)

    for f in (sigmoid_f4, sigmoid_f8, rsqrt_f4, rsqrt_f8, f16_round, f16_round_d):
        ns[f.__name__] = jit_device(f)
    return ns


def _libm(name: str, suffix: str, libdevice: Any | None) -> Callable:
    if libdevice is not None:
        fn = getattr(libdevice, name + suffix)

        def f(x):  # type: ignore[no-untyped-def]
            return fn(x)

        return f
    np_name = {"asin": "arcsin", "acos": "arccos", "atan": "arctan"}.get(name, name)
    py = getattr(np, np_name, None) or getattr(math, name)

    def g(x):  # type: ignore[no-untyped-def]
        with np.errstate(all="ignore"):
            return py(x)

    return g


def _binary_libm(name: str, suffix: str, libdevice: Any | None) -> Callable:
    if libdevice is not None:
        fn = getattr(libdevice, name + suffix)

        def f(a, b):  # type: ignore[no-untyped-def]
            return fn(a, b)

        return f
    py = {"pow": lambda a, b: float(np.power(np.float64(a), np.float64(b))), "atan2": math.atan2}[name]

    def g(a, b):  # type: ignore[no-untyped-def]
        return py(a, b)

    return g


def divmod_helper(which: int, libdevice: Any | None = None) -> Callable:
    # NumPy's npy_divmod, in float64 (exact for float16/float32 operands)
    # libdevice on the GPU; NumPy's scalar functions on the CPU (numba has no math.fmod) and in
    # the simulator
    fmod = libdevice.fmod if libdevice is not None else np.fmod
    floor = libdevice.floor if libdevice is not None else np.floor
    copysign = libdevice.copysign if libdevice is not None else np.copysign

    def f(a, b):  # type: ignore[no-untyped-def]
        a = np.float64(a)  # type: ignore[assignment]
        b = np.float64(b)  # type: ignore[assignment]
        if b == 0:
            return a / b if which == 0 else fmod(a, b)
        mod = fmod(a, b)
        div = (a - mod) / b
        if mod != 0:
            if (b < 0) != (mod < 0):
                mod += b
                div -= 1.0
        else:
            mod = copysign(0.0, b)
        if div != 0:
            fl = np.float64(floor(div))
            if div - fl > 0.5:
                fl += 1.0
        else:
            fl = copysign(0.0, a / b)  # type: ignore[assignment]
        return fl if which == 0 else mod

    return f
