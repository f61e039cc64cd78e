"""The Array API standard (2023.12) names: ``import fusetree as xp`` for array-API-generic code.

Elementwise functions, operators and reductions are fusetree's own (lazy, fused). Functions that
are not elementwise (``sort``, ``concat``, ``unique_values``, ``nonzero``, ``take``...) are *fusion
boundaries*: their array arguments are realized and the backend's own implementation runs (NumPy
on the CPU, CuPy on CUDA: no host round trip), its results wrapped as fusetree arrays without a
copy. Complex dtypes are held as memory and computed unfused (fusetree's kernels are real-valued):
each op on a complex array is the backend's own function (see :mod:`fusetree.frontend.unfused`).

>>> import numpy as np, fusetree as xp
>>> x = xp.asarray([3.0, 1.0, 2.0], dtype=xp.float32)
>>> xp.sort(x * 2).numpy().tolist(), xp.concat([x, x]).shape, xp.finfo(xp.float32).bits
([2.0, 4.0, 6.0], (6,), 32)
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends, config
from ..engine.state import HOOK
from ..errors import DeviceError, ShapeError, UnsupportedError
from ..ir import dtypes
from ..ir.node import make_buffer
from . import array as _arr
from .array import Array, elementwise, wrap
from .creation import asarray as _asarray
from .creation import empty as _empty
from .reductions import sum as _sum

__array_api_version__ = "2023.12"

# dtypes: NumPy's dtype objects (``x.dtype == xp.float32``); complex arrays are computed unfused
DTYPES = {d.name: d for d in dtypes.SUPPORTED + dtypes.COMPLEX}
e, pi, inf, nan, newaxis = np.e, np.pi, np.inf, np.nan, None
iinfo = np.iinfo


class finfo:
    """Machine limits of a floating dtype, as Python floats (``numpy.finfo``'s values)."""

    def __init__(self, dtype: Any) -> None:
        f = np.finfo(dtype.dtype if isinstance(dtype, Array) else dtype)
        self.bits = int(f.bits)
        self.eps, self.max, self.min = float(f.eps), float(f.max), float(f.min)
        self.smallest_normal = float(f.smallest_normal)
        self.dtype = f.dtype

    def __repr__(self) -> str:
        return f"finfo(bits={self.bits}, eps={self.eps}, max={self.max}, dtype={self.dtype})"


def isdtype(dtype: Any, kind: Any) -> bool:
    """Whether ``dtype`` is of ``kind`` (a dtype, a kind name such as ``"real floating"``, or a
    tuple of them), as ``numpy.isdtype``."""
    return bool(np.isdtype(np.dtype(dtype), kind))


def result_type(*args: Any) -> np.dtype:
    """The promoted dtype of arrays and dtypes (NumPy's rules, Python scalars weak)."""
    return np.result_type(*[a.dtype if isinstance(a, Array) else a for a in args])


def can_cast(from_: Any, to: Any) -> bool:
    """Whether ``from_`` (a dtype or an array) casts safely to ``to``."""
    return bool(np.can_cast(from_.dtype if isinstance(from_, Array) else from_, to))


def asarray(obj: Any, /, dtype: Any = None, device: str | None = None, copy: bool | None = None) -> Array:
    """An array from ``obj`` (an array, a NumPy/CuPy/DLPack array, a scalar or nested sequences).
    ``copy=True`` always copies, ``copy=False`` raises ``ValueError`` when a copy is needed,
    ``None`` copies only when needed."""
    if isinstance(obj, Array):
        src: Array = obj
    elif backends.device_of(obj) is not None:  # NumPy/CuPy/DLPack memory: wrapped, moved, cast
        if copy is False and (
            (dtype is not None and np.dtype(dtype) != obj.dtype)
            or (device is not None and device.split("-")[0] != str(backends.device_of(obj)).split("-")[0])
        ):  # fmt: skip
            raise ValueError("asarray(copy=False): the array cannot be returned without a copy")
        out = _asarray(obj, dtype=dtype, device=device)
        return _copy(out) if copy and out._node.op == "buffer" else out
    else:
        if obj is None or isinstance(obj, str | bytes | dict | set):
            return _asarray(obj)  # raises UnsupportedError naming the type
        if copy is False:
            raise ValueError("asarray(copy=False): a Python object cannot be wrapped without a copy")
        data = np.asarray(obj, dtype=dtype)
        if data.dtype == np.float64 and dtype is None and _all_ints(obj):
            data = data.astype(np.int64)
        return _asarray(data, device=device or config.current.device)
    needs = (dtype is not None and np.dtype(dtype) != src.dtype) or (
        device is not None and device != src.device
    )
    if copy is False and (needs or src._node.op != "buffer"):
        raise ValueError("asarray(copy=False): the array cannot be returned without a copy")
    out = _asarray(src, dtype=dtype, device=device)
    if copy and out is src:
        out = _copy(src)
    return out


def _all_ints(obj: Any) -> bool:
    if isinstance(obj, builtins.bool | np.bool_):
        return False
    if isinstance(obj, int):
        return True
    if isinstance(obj, list | tuple):
        return builtins.all(_all_ints(x) for x in obj) and len(obj) > 0
    return False


def _copy(x: Array) -> Array:
    be = backends.get(x.device)
    return wrap(make_buffer(be.xp.array(x.data, copy=True), x.device))


def _device(*args: Any) -> str:
    for a in args:
        if isinstance(a, Array):
            return a.device
        if isinstance(a, list | tuple):
            d = _device(*a)
            if d != "cpu":
                return d
        elif backends.device_of(a) not in (None, "cpu"):
            return str(backends.device_of(a))
    return "cpu"


def _data(a: Any) -> Any:
    if isinstance(a, Array):
        return a.data
    if isinstance(a, list | tuple):
        return type(a)(_data(x) for x in a)
    return a


def _wrap(r: Any, device: str, as_list: bool = False) -> Any:
    if isinstance(r, tuple):
        items = [_wrap(x, device) for x in r]
        if as_list:
            return items
        return type(r)(*items) if hasattr(r, "_fields") else tuple(items)
    if isinstance(r, list):
        return [_wrap(x, device) for x in r]
    if backends.device_of(r) is not None or isinstance(r, np.generic):
        return _asarray(np.asarray(r) if isinstance(r, np.generic) else r)
    return r


def boundary(
    np_name: str, name: str | None = None, module: str = "", as_list: bool = False
) -> Callable[..., Any]:
    """A fusion boundary: realize the array arguments, run the backend's ``np_name`` (in its
    ``module``: "linalg", "fft"), wrap the results."""

    def f(*args: Any, **kwargs: Any) -> Any:
        if HOOK.recorder is not None:  # the backend's call would run once, at trace time
            raise UnsupportedError(
                f"{name or np_name} inside an ft.jit function: it runs in the backend, outside the "
                "recorded kernels, so a replay would not repeat it; call it outside ft.jit"
            )
        device = _device(*args, *kwargs.values())
        xp = backends.get(device).xp
        fn = getattr(getattr(xp, module) if module else xp, np_name, None)
        if fn is None:
            raise UnsupportedError(
                f"{name or np_name}: the {device} backend ({xp.__name__}) has no {np_name}"
            )
        out = fn(*[_data(a) for a in args], **{k: _data(v) for k, v in kwargs.items()})
        res = _wrap(out, device, as_list)
        if _arr.TAPE is not None:  # no gradient rule: an error if a gradient must pass through
            ins = tuple(a._node for a in _flat(args, kwargs) if isinstance(a, Array))
            for r in _flat((res,), {}):
                if isinstance(r, Array):
                    _arr.record("boundary", ins, (name or np_name,), r._node)
        return res

    f.__name__ = name or np_name
    f.__doc__ = (
        f"``{name or np_name}`` (Array API): a fusion boundary - the inputs are realized and the "
        f"backend's ``{np_name}`` runs (NumPy on the CPU, CuPy on CUDA)."
    )
    return f


def _flat(args: Any, kwargs: dict) -> list:
    out: list = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, list | tuple):
            out.extend(_flat(a, {}))
        else:
            out.append(a)
    return out


def concat(arrays: Any, /, *, axis: int | None = 0) -> Array:
    """Join arrays along an existing axis (``axis=None``: flattened first), like ``np.concat``.

    Written by fusetree kernels (each piece is stored into its slice of the result), so it works
    inside ``ft.jit`` and has a gradient (the result's cotangent is sliced back).

    >>> import numpy as np, fusetree as ft
    >>> ft.concat([ft.asarray(np.zeros((1, 2))), ft.asarray(np.ones((2, 2)))]).numpy().tolist()
    [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    """
    arrs = [a if isinstance(a, Array) else _asarray(a) for a in arrays]
    if not arrs:
        raise ShapeError("concat: need at least one array")
    if axis is None:
        arrs = [a.reshape(-1) for a in arrs]
        axis = 0
    nd = arrs[0].ndim
    if nd == 0 or builtins.any(a.ndim != nd for a in arrs):
        raise ShapeError(
            f"concat: arrays must have the same number of dimensions (>= 1), got shapes {[a.shape for a in arrs]}"
        )
    ax = axis + nd if axis < 0 else axis
    if not 0 <= ax < nd:
        raise ShapeError(f"concat: axis {axis} is out of bounds for {nd}-d arrays")
    rest = [a.shape[:ax] + a.shape[ax + 1 :] for a in arrs]
    if builtins.any(r != rest[0] for r in rest):
        raise ShapeError(f"concat: shapes {[a.shape for a in arrs]} differ outside axis {axis}")
    devices = {a.device for a in arrs}
    if len(devices) > 1:
        raise DeviceError(f"concat: arrays are on different devices {sorted(devices)}")
    dt = np.result_type(*[a.dtype for a in arrs])
    shape = arrs[0].shape[:ax] + (builtins.sum(a.shape[ax] for a in arrs),) + arrs[0].shape[ax + 1 :]
    out = _empty(shape, dt, arrs[0].device)
    with _arr.untraced() as tape:  # the stores are the concat's own (one entry for it below)
        off = 0
        for a in arrs:
            n = a.shape[ax]
            out[(slice(None),) * ax + (slice(off, off + n),)] = a
            off += n
    if tape is not None:
        _arr.record("concat", tuple(a._node for a in arrs), (ax,), out._node)
    return out


def stack(arrays: Any, /, *, axis: int = 0) -> Array:
    """Join same-shape arrays along a new axis, like ``np.stack`` (see :func:`concat`)."""
    arrs = [a if isinstance(a, Array) else _asarray(a) for a in arrays]
    if not arrs:
        raise ShapeError("stack: need at least one array")
    if builtins.any(a.shape != arrs[0].shape for a in arrs):
        raise ShapeError(f"stack: arrays must have one shape, got {[a.shape for a in arrs]}")
    nd = arrs[0].ndim + 1
    ax = axis + nd if axis < 0 else axis
    if not 0 <= ax < nd:
        raise ShapeError(f"stack: axis {axis} is out of bounds for {nd}-d results")
    s = arrs[0].shape
    return concat([a.reshape(s[:ax] + (1,) + s[ax:]) for a in arrs], axis=ax)


def unstack(x: Any, /, *, axis: int = 0) -> tuple[Array, ...]:
    """The slices of ``x`` along ``axis``, as a tuple of views (lazy, any device).

    >>> import numpy as np, fusetree as ft
    >>> [a.numpy().tolist() for a in ft.unstack(ft.asarray(np.arange(4).reshape(2, 2)), axis=1)]
    [[0, 2], [1, 3]]
    """
    a = _asarray(x)
    if a.ndim == 0:
        raise ShapeError("unstack: the array must have at least one dimension")
    ax = axis + a.ndim if axis < 0 else axis
    if not 0 <= ax < a.ndim:
        raise ShapeError(f"unstack: axis {axis} is out of bounds for a {a.ndim}-d array")
    return tuple(a[(slice(None),) * ax + (i,)] for i in range(a.shape[ax]))


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> Array:
    """``sum(conj(x1) * x2, axis)`` of the broadcast operands: a fused reduction (one kernel for
    real operands).

    >>> import numpy as np, fusetree as ft
    >>> ft.vecdot(ft.asarray(np.ones((2, 3))), ft.asarray(np.arange(3.0))).numpy().tolist()
    [3.0, 3.0]
    """
    a, b = _asarray(x1), _asarray(x2)
    n = builtins.max(a.ndim, b.ndim)
    if not -n <= axis < n:
        raise ShapeError(
            f"vecdot: axis {axis} is out of bounds for operands of shapes {a.shape} and {b.shape}"
        )
    ax = axis - n if axis >= 0 else axis  # counted from the end, as the shapes broadcast
    if -ax > a.ndim or -ax > b.ndim or a.shape[ax] != b.shape[ax]:
        raise ShapeError(f"vecdot: shapes {a.shape} and {b.shape} differ along axis {axis}")
    p = conj(a) * b
    return _sum(p, axis=ax, dtype=p.dtype)  # (the product's type: sum alone widens small integers)


BOUNDARIES = {
    name: boundary(np_name, name)
    for name, np_name in {
        "expand_dims": "expand_dims",
        "squeeze": "squeeze", "flip": "flip", "roll": "roll", "permute_dims": "permute_dims",
        "moveaxis": "moveaxis", "broadcast_to": "broadcast_to",
        "repeat": "repeat", "tile": "tile", "take": "take", "take_along_axis": "take_along_axis",
        "_sort": "sort", "_argsort": "argsort", "searchsorted": "searchsorted", "nonzero": "nonzero",
        "unique_all": "unique_all", "unique_counts": "unique_counts", "unique_inverse": "unique_inverse",
        "unique_values": "unique_values", "cumulative_sum": "cumulative_sum",
        "cumulative_prod": "cumulative_prod", "count_nonzero": "count_nonzero", "diff": "diff",
        "tensordot": "tensordot", "matrix_transpose": "matrix_transpose",
        "tril": "tril", "triu": "triu", "from_dlpack": "from_dlpack",
    }.items()
}  # fmt: skip


def _creation(np_name: str) -> Callable[..., Any]:
    def f(*args: Any, device: str | None = None, **kwargs: Any) -> Array:
        device = device or config.current.device
        xp = backends.get(device).xp
        return _asarray(getattr(xp, np_name)(*[_data(a) for a in args], **kwargs), device=device)

    f.__name__ = np_name
    f.__doc__ = f"``{np_name}`` (Array API) on ``device`` (default cpu)."
    return f


for _n in ("arange", "linspace", "eye"):
    BOUNDARIES[_n] = _creation(_n)
BOUNDARIES["concat"] = BOUNDARIES["concatenate"] = concat
BOUNDARIES["unstack"] = unstack
BOUNDARIES["vecdot"] = vecdot
BOUNDARIES["stack"] = stack
BOUNDARIES["meshgrid"] = boundary("meshgrid", as_list=True)
BOUNDARIES["broadcast_arrays"] = boundary("broadcast_arrays", as_list=True)


# the standard's signatures of the boundary and creation functions (introspection: what
# inspect.signature reports; the functions pass their arguments on to the backend's)
SIGNATURES = {
    "concat": "arrays, /, *, axis=0", "stack": "arrays, /, *, axis=0", "unstack": "x, /, *, axis=0",
    "expand_dims": "x, /, axis=0", "squeeze": "x, /, axis", "flip": "x, /, *, axis=None",
    "roll": "x, /, shift, *, axis=None", "permute_dims": "x, /, axes", "moveaxis": "x, source, destination, /",
    "broadcast_to": "x, /, shape", "repeat": "x, repeats, /, *, axis=None", "take": "x, indices, /, *, axis=None",
    "tensordot": "x1, x2, /, *, axes=2", "vecdot": "x1, x2, /, *, axis=-1",
    "searchsorted": "x1, x2, /, *, side='left', sorter=None",
    "cumulative_sum": "x, /, *, axis=None, dtype=None, include_initial=False",
    "cumulative_prod": "x, /, *, axis=None, dtype=None, include_initial=False",
    "tril": "x, /, *, k=0", "triu": "x, /, *, k=0", "meshgrid": "*arrays, indexing='xy'",
    "arange": "start, /, stop=None, step=1, *, dtype=None, device=None",
    "linspace": "start, stop, /, num, *, dtype=None, device=None, endpoint=True",
    "eye": "n_rows, n_cols=None, /, *, k=0, dtype=None, device=None",
    "from_dlpack": "x, /, *, device=None, copy=None",
}  # fmt: skip
for _n, _s in SIGNATURES.items():
    BOUNDARIES[_n].__signature__ = inspect.signature(eval(f"lambda {_s}: None"))  # type: ignore[attr-defined]


class _Submodule:
    """``fusetree.linalg`` / ``fusetree.fft``: the backend's functions as fusion boundaries."""

    def __init__(self, module: str, names: tuple[str, ...]) -> None:
        self.__name__ = f"fusetree.{module}"
        for n in names:
            setattr(self, n, boundary(n, f"{module}.{n}", module))


linalg = _Submodule("linalg", (
    "cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul", "matrix_norm",
    "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "qr", "slogdet", "solve", "svd",
    "svdvals", "tensordot", "trace", "vecdot", "vector_norm"))  # fmt: skip
fft = _Submodule("fft", (
    "fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft", "fftfreq",
    "rfftfreq", "fftshift", "ifftshift"))  # fmt: skip


def conj(x: Any, /) -> Array:
    """The complex conjugate (the backend's, unfused, for complex ``x``; a new value of a real one)."""
    a = _asarray(x)
    return BOUNDARIES["_conj"](a) if a.dtype.kind == "c" else positive(a)


def real(x: Any, /) -> Array:
    """The real part (the backend's, unfused, for complex ``x``; a new value of a real one)."""
    a = _asarray(x)
    return BOUNDARIES["_real"](a) if a.dtype.kind == "c" else positive(a)


def imag(x: Any, /) -> Array:
    """The imaginary part (the backend's, unfused, for complex ``x``; zeros for a real one)."""
    a = _asarray(x)
    return BOUNDARIES["_imag"](a) if a.dtype.kind == "c" else a * 0


def sort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Array:
    """``x`` sorted along ``axis`` (a fusion boundary; descending order keeps ties in order)."""
    b = BOUNDARIES
    if not descending:
        return b["_sort"](x, axis=axis, kind="stable" if stable else None)
    return b["flip"](b["_sort"](b["flip"](x, axis=axis), axis=axis, kind="stable"), axis=axis)


def argsort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Array:
    """Indices that sort ``x`` along ``axis`` (a fusion boundary; ties keep their order)."""
    b = BOUNDARIES
    if not descending:
        return b["_argsort"](x, axis=axis, kind="stable" if stable else None)
    a = _asarray(x)
    n = a.shape[axis] if a.ndim else 1
    idx = b["_argsort"](b["flip"](a, axis=axis), axis=axis, kind="stable")
    return b["flip"]((n - 1) - idx, axis=axis)


def reshape(x: Any, /, shape: Any, *, copy: bool | None = None) -> Array:
    """``x`` with a new shape (a view when the layout allows, as NumPy)."""
    r = _asarray(x).reshape(shape)
    return _copy(r) if copy else r


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: str | None = None) -> Array:
    """``x`` cast to ``dtype`` (a new array unless ``copy=False`` and nothing changes)."""
    a = _asarray(x, device=device)
    if not copy and a.dtype == np.dtype(dtype):
        return a
    return a.astype(dtype)


# Array API names of fusetree's elementwise ops (NumPy's names are kept too)
ALIASES = {
    "acos": "arccos", "asin": "arcsin", "atan": "arctan", "atan2": "arctan2", "pow": "power",
    "bitwise_left_shift": "left_shift", "bitwise_right_shift": "right_shift", "bitwise_invert": "invert",
}  # fmt: skip


def positive(x: Any, /) -> Array:
    """``+x`` (a new value)."""
    a = _asarray(x)
    return a.astype(a.dtype)


def logical_xor(x1: Any, x2: Any, /) -> Array:
    """``x1 != x2`` as booleans."""
    return elementwise("not_equal", _asarray(x1).astype(np.bool_), _asarray(x2).astype(np.bool_))


def signbit(x: Any, /) -> Array:
    """Whether the sign bit is set (-0.0 and -NaN included): a fusion boundary (the backend's)."""
    return BOUNDARIES["_signbit"](x)


def copysign(x1: Any, x2: Any, /) -> Array:
    """|x1| with the sign bit of x2: a fusion boundary (the backend's)."""
    return BOUNDARIES["_copysign"](x1, x2)


def hypot(x1: Any, x2: Any, /) -> Array:
    """sqrt(x1**2 + x2**2) (a fusion boundary: the backend's hypot avoids overflow)."""
    return BOUNDARIES["_hypot"](x1, x2)


BOUNDARIES["_hypot"] = boundary("hypot", "hypot")
BOUNDARIES["_conj"] = boundary("conj", "conj")
BOUNDARIES["_real"] = boundary("real", "real")
BOUNDARIES["_imag"] = boundary("imag", "imag")
BOUNDARIES["_signbit"] = boundary("signbit", "signbit")
BOUNDARIES["_copysign"] = boundary("copysign", "copysign")
BOUNDARIES["logaddexp"] = boundary("logaddexp")
BOUNDARIES["nextafter"] = boundary("nextafter")
BOUNDARIES["asinh"] = boundary("arcsinh", "asinh")
BOUNDARIES["acosh"] = boundary("arccosh", "acosh")
BOUNDARIES["atanh"] = boundary("arctanh", "atanh")


def array_function(name: str) -> Callable[..., Any] | None:
    """The fusetree function for NumPy function ``name`` (``__array_function__``), or None."""
    import fusetree

    return getattr(fusetree, name, None) if not name.startswith("_") else None


class _Info:
    """``__array_namespace_info__()``: what this namespace supports (Array API inspection)."""

    def capabilities(self) -> dict[str, Any]:
        return {"boolean indexing": False, "data-dependent shapes": True}

    def default_device(self) -> str:
        return config.current.device

    def devices(self) -> list[str]:
        return ["cpu"] + [d for d in ("cuda",) if _has(d)]

    def default_dtypes(self, *, device: str | None = None) -> dict[str, Any]:
        return {"real floating": np.dtype(np.float64), "complex floating": np.dtype(np.complex128),
                "integral": np.dtype(np.int64), "indexing": np.dtype(np.int64)}  # fmt: skip

    def dtypes(self, *, device: str | None = None, kind: Any = None) -> dict[str, Any]:
        names = [n for n in DTYPES if n != "float16"]
        if kind is not None:
            names = [n for n in names if np.isdtype(DTYPES[n], kind)]
        return {n: DTYPES[n] for n in names}


def _has(device: str) -> bool:
    try:
        backends.get(device)
        return True
    except Exception:
        return False


def __array_namespace_info__() -> _Info:
    """Inspection of the namespace (devices, default and supported dtypes)."""
    return _Info()
