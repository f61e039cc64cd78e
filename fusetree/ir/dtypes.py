"""Dtypes fusetree supports, NumPy 2 (NEP 50) promotion, and how each dtype is computed in a kernel.

Python scalars are *weak*: ``x_float32 * 2.5`` stays float32, as in NumPy 2. The rule for every op
comes from running the op's NumPy reference on one-element samples (see :mod:`fusetree.ops`), so
fusetree's promotion is NumPy's by construction.
"""

from __future__ import annotations

from typing import Union

import numpy as np

from ..errors import DTypeError

SUPPORTED = tuple(
    np.dtype(n)
    for n in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
)  # fmt: skip
_SUPPORTED_SET = frozenset(SUPPORTED)
# complex dtypes are held and computed *unfused*: arrays of them are memory only, and every op on
# them runs the backend's own function (frontend.unfused); they never reach a kernel
COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))
_STORAGE_SET = _SUPPORTED_SET | frozenset(COMPLEX)

# A weak Python scalar is described by its Python type, a strong operand by its dtype.
Desc = Union[np.dtype, type]
WEAK_TYPES = (bool, int, float)

# Short, stable names used in kernel keys, generated identifiers and helper names.
SHORT = {d: d.str.lstrip("<>|=").replace("b1", "b1") for d in SUPPORTED + COMPLEX}
# numpy-style constructor names available in the generated-code namespace
CTOR = {d: ("bool_" if d.kind == "b" else d.name) for d in SUPPORTED}


def check(dtype: object, what: str = "array") -> np.dtype:
    """Return ``dtype`` as a supported np.dtype or raise DTypeError naming it."""
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as e:
        raise DTypeError(f"{what}: {dtype!r} is not a dtype") from e
    if dt not in _STORAGE_SET:
        names = ", ".join(d.name for d in SUPPORTED + COMPLEX)
        raise DTypeError(f"{what}: dtype {dt} is not supported by fusetree (supported: {names})")
    return dt


def register(dt: np.dtype) -> np.dtype:
    """The dtype a value of ``dt`` is held in inside a kernel: float16 is computed in float32."""
    return np.dtype(np.float32) if dt == np.float16 else dt


def weak_default(t: type) -> np.dtype:
    """The dtype a weak Python scalar has on its own (bool, int64, float64)."""
    return np.dtype({bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}[t])


def sample(desc: Desc) -> object:
    """A one-element NumPy sample (or a Python scalar for weak operands) with value 1."""
    if isinstance(desc, np.dtype):
        return np.ones(1, dtype=desc)
    return desc(1)


def describe(desc: Desc) -> str:
    return desc.name if isinstance(desc, np.dtype) else f"Python {desc.__name__}"


def result_type(*descs: Desc) -> np.dtype:
    """NumPy 2 promotion of the operands (weak scalars included)."""
    return np.result_type(*[sample(d) for d in descs])  # type: ignore[arg-type]


_BOUNDS = {d: (int(np.iinfo(d).min), int(np.iinfo(d).max)) for d in SUPPORTED if d.kind in "iu"}


def fits(value: int, dt: np.dtype) -> bool:
    b = _BOUNDS.get(dt)
    return b is None or b[0] <= value <= b[1]


def check_weak_int(value: int, partner: np.dtype, op: str) -> None:
    """NumPy 2 refuses a Python int that does not fit the integer dtype it combines with."""
    b = _BOUNDS.get(partner)
    if b is not None and not (b[0] <= value <= b[1]):
        raise OverflowError(f"{op}: Python integer {value} out of bounds for {partner.name}")
