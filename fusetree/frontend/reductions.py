"""Reductions (``sum``, ``max``, ``argmax``, ``mean``, ``var``...): building their nodes.

A reduction is an IR node ``reduce`` (attrs: kind, reduced axes, keepdims) over one child of the
full shape. Broadcasting a value that contains a reduction back to a larger shape makes an
``expand`` node (the view cannot be pushed to the leaves through a reduction). The planner
(:mod:`fusetree.schedule.planner`) fuses a reduction with its elementwise producers and consumers:
``softmax``, ``log_softmax``, layernorm and ``x - x.max(-1, keepdims=True)`` each launch once.

>>> import numpy as np, fusetree as ft
>>> x = ft.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
>>> ft.reset_stats(); y = ft.softmax(x, axis=-1).numpy(); ft.stats()["launches"]
1
>>> np.allclose(y.sum(-1), 1)
True
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import backends, config, engine
from ..errors import DTypeError, ShapeError, UnsupportedError
from ..ir import node as _nm
from ..ir.node import Node, make_buffer, make_op
from ..ir.ops import REDUCTIONS, reduce_dtypes
from . import array as _arr
from . import creation, unfused
from .array import Array, wrap
from .creation import asarray
from .functions import FUNCTIONS as _FNS
from .functions import where

# ---------------------------------------------------------------------------------------------
# building


def normalize_axes(axis: Any, ndim: int, what: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints, negative allowed) as sorted non-negative axes."""
    if type(axis) is int and -ndim <= axis < ndim:  # the common call (mean's count, axis=-1)
        return (axis % ndim,)
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple | list) else (axis,)
    out = []
    for a in items:
        if isinstance(a, builtins.bool) or not isinstance(a, int | np.integer):
            raise UnsupportedError(f"{what}: axis must be an int or a tuple of ints, got {a!r}")
        a = int(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"{what}: axis {a} is out of bounds for array of dimension {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: duplicate value in 'axis': {axis!r}")
    return tuple(sorted(out))


def row_shapes(full: tuple[int, ...], axes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of a reduction of ``full`` over ``axes`` with and without keepdims."""
    keep = tuple(1 if d in axes else s for d, s in enumerate(full))
    return keep, tuple(s for d, s in enumerate(full) if d not in axes)


# (kind, shape, dtype, axis, keepdims) -> (reduced axes, result shape, result dtype) of a plain
# reduction (an array operand, no dtype argument, more than one element per result, not complex,
# an int or None axis): a reduction taken again (softmax's max and sum every step) skips the axis
# normalization, shape and dtype rules
_PLAIN: dict[tuple, tuple] = {}


def reduce(kind: str, x: Any, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Array:
    """Reduction ``kind`` (a row of :data:`fusetree.ops.REDUCTIONS`) of ``x`` over ``axis``."""
    if type(x) is Array and dtype is None and _nm.WATCH is None and (axis is None or type(axis) is int):
        n0 = x._node
        plain = _PLAIN.get((kind, n0.shape, n0.dtype, axis, keepdims))
        if plain is not None:
            axes, shape, out_dt = plain
            return _reduce_node(kind, n0, axes, shape, out_dt, builtins.bool(keepdims))
    a = asarray(x)
    if _nm.WATCH is not None and a._node.op == "buffer":  # stores are queued: see array._watch
        _nm.WATCH(a._node)
    if dtype is not None:
        a = a.astype(dtype)
    index = REDUCTIONS[kind].index
    if index and isinstance(axis, tuple | list):
        raise UnsupportedError(f"{kind}: axis must be None or an int, got {axis!r}")
    axes = normalize_axes(axis, a.ndim, kind)
    if a.dtype.kind == "c":  # complex: the backend's reduction, unfused (frontend.unfused)
        out = unfused.reduce(backends.get(a.device), kind, a.data, axes, builtins.bool(keepdims))
        return wrap(make_buffer(out, a.device))
    full = a.shape
    keep, squeezed = row_shapes(full, axes)
    shape = keep if keepdims else squeezed
    if index and axis is None and keepdims:
        shape = (1,) * a.ndim
    n = math.prod(full[d] for d in axes)
    out_dt = reduce_dtypes(kind, a.dtype)[0]
    if dtype is not None and kind in ("sum", "prod") and out_dt != np.dtype(dtype):
        # NumPy returns the requested dtype (an integer sum wraps in it): reduce, then cast
        return reduce(kind, a, axis, keepdims).astype(dtype)
    if n == 0:
        if kind in ("max", "min", "argmax", "argmin"):
            name = {"max": "maximum", "min": "minimum"}.get(kind, kind)
            raise ShapeError(
                f"zero-size array to reduction operation {name} which has no identity (shape {full}, axis {axis!r})"
            )
        fill = {"sum": 0, "prod": 1, "any": False, "all": True}[kind]
        return creation.full(shape, fill, dtype=out_dt, device=a.device)
    if n == 1:  # nothing to combine: an elementwise op
        if index:
            return creation.zeros(shape, dtype=out_dt, device=a.device)
        # a new value (NumPy's reductions never return a view of their input): a cast node even
        # when the dtype does not change
        if kind in ("any", "all"):
            v = a != 0
        else:
            v = wrap(make_op("astype", (a._node,), out_dt, a.shape, a.device, (out_dt,)))
            if _arr.TAPE is not None:
                _arr.record("astype", (a._node,), (out_dt,), v._node)
        return v.reshape(shape)
    if index and axis is None and a.ndim > 1:
        flat = a.reshape(-1)  # argmax over everything: the index into the flattened array
        r = reduce(kind, flat, 0)
        return r.reshape(shape) if keepdims else r
    if type(x) is Array and x is a and (axis is None or type(axis) is int):
        if len(_PLAIN) > 4096:
            _PLAIN.clear()
        _PLAIN[(kind, full, a.dtype, axis, keepdims)] = (axes, shape, out_dt)
    return _reduce_node(kind, a._node, axes, shape, out_dt, builtins.bool(keepdims))


def _reduce_node(kind: str, child: Node, axes: tuple[int, ...], shape: tuple[int, ...], out_dt: np.dtype,
                 keepdims: bool) -> Array:  # fmt: skip
    """The pending reduction of ``child`` (its rules applied by :func:`reduce`)."""
    node = make_op("reduce", (child,), out_dt, shape, child.device, (kind, axes, keepdims))
    out = wrap(node)
    if _arr.TAPE is not None:
        _arr.record("reduce", (child,), node.attrs, node)
    if not config.current.fuse:
        engine.realize((out,))
    return out


def expand(node: Node, shape: tuple[int, ...]) -> Node:
    """Broadcast a value containing a reduction to ``shape`` (a fusion-kernel ``expand`` node)."""
    return make_op("expand", (node,), node.dtype, shape, node.device)


# ---------------------------------------------------------------------------------------------
# NumPy-named functions


def sum(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Sum over ``axis`` (like ``np.sum``: integers accumulate in the platform integer).

    >>> import numpy as np, fusetree as ft
    >>> ft.sum(ft.asarray(np.ones((2, 3), np.int8)), axis=1).numpy().tolist()
    [3, 3]
    """
    return reduce("sum", x, axis, keepdims, dtype)


def prod(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
    """Product over ``axis`` (like ``np.prod``)."""
    return reduce("prod", x, axis, keepdims, dtype)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Maximum over ``axis``; NaN propagates (like ``np.max``)."""
    return reduce("max", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Minimum over ``axis``; NaN propagates (like ``np.min``)."""
    return reduce("min", x, axis, keepdims)


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """Index of the first maximum (of the first NaN) along ``axis`` (flattened when None)."""
    return reduce("argmax", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """Index of the first minimum (of the first NaN) along ``axis`` (flattened when None)."""
    return reduce("argmin", x, axis, keepdims)


def any(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Whether any element along ``axis`` is non-zero (NaN counts as true)."""
    return reduce("any", x, axis, keepdims)


def all(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Whether every element along ``axis`` is non-zero."""
    return reduce("all", x, axis, keepdims)


def _count(a: Array, axis: Any, what: str) -> int:
    return math.prod(a.shape[d] for d in normalize_axes(axis, a.ndim, what))


def mean(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
    """Arithmetic mean over ``axis`` with NumPy's dtypes (integers give float64; float16 is
    summed in float32 and returned as float16).

    >>> import numpy as np, fusetree as ft
    >>> ft.mean(ft.asarray(np.arange(6).reshape(2, 3)), axis=-1).numpy().tolist()
    [1.0, 4.0]
    """
    a = asarray(x)
    n = _count(a, axis, "mean")
    sum_dt = dtype
    if dtype is None and a.dtype.kind in "biu":
        sum_dt = np.float64
    elif dtype is None and a.dtype == np.float16:
        sum_dt = np.float32
    s = sum(a, axis, sum_dt, keepdims)
    m = s / n if n else s * np.nan
    out_dt = (
        np.dtype(dtype) if dtype is not None else (a.dtype if a.dtype.kind in "fc" else np.dtype(np.float64))
    )
    return m.astype(out_dt)


def var(x: Any, axis: Any = None, dtype: Any = None, ddof: float = 0, keepdims: bool = False, *,
        correction: float | None = None) -> Array:  # fmt: skip
    """Variance ``mean(abs(x - x.mean())**2)`` over ``axis``, divided by ``n - ddof`` (NumPy's
    formula and dtypes). The mean and the sum of squares fuse into one two-pass kernel. float16
    is summed in float32 and returned as float16, like :func:`mean` (NumPy sums the squares in
    float16, so 16384 values of variance 4 overflow to inf there; here they do not).

    >>> import numpy as np, fusetree as ft
    >>> ft.var(ft.asarray(np.array([1.0, 2.0, 3.0, 4.0])), ddof=1).numpy().item()
    1.6666666666666667
    """
    a = asarray(x)
    if a.dtype.kind == "c":
        raise DTypeError(
            "var/std: complex arrays are not supported (the Array API defines them for real values)"
        )
    n = _count(a, axis, "var")
    dt = dtype
    if dt is None and a.dtype.kind in "biu":
        dt = np.float64
    elif dt is None and a.dtype == np.float16:
        dt = np.float32
    m = sum(a, axis, dt, keepdims=True) / n if n else sum(a, axis, dt, keepdims=True) * np.nan
    d = a - m
    ss = sum(d * d, axis, dt, keepdims)
    if correction is not None:  # the Array API's name for ddof
        ddof = correction
    v = ss / builtins.max(n - ddof, 0)
    return v.astype(np.float16) if dtype is None and a.dtype == np.float16 else v


def std(x: Any, axis: Any = None, dtype: Any = None, ddof: float = 0, keepdims: bool = False, *,
        correction: float | None = None) -> Array:  # fmt: skip
    """Standard deviation: ``sqrt(var(x, axis, dtype, ddof, keepdims))`` (``correction``: ddof)."""
    return _FNS["sqrt"](var(x, axis, dtype, ddof, keepdims, correction=correction))


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """``log(sum(exp(x)))`` over ``axis``, computed stably (as ``scipy.special.logsumexp``)."""
    a = asarray(x)
    fns = _FNS
    m = max(a, axis, keepdims=True)
    m0 = where(fns["isfinite"](m), m, 0)
    s = sum(fns["exp"](a - m0), axis, keepdims=keepdims)
    mk = m0 if keepdims else where(fns["isfinite"](max(a, axis)), max(a, axis), 0)
    return fns["log"](s) + mk


def softmax(x: Any, axis: Any = -1) -> Array:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: one kernel. The division is a
    multiplication by the sum's reciprocal, taken once per row (as PyTorch's layer_norm does with
    ``rsqrt``): within an ulp of the quotient, and the per-element IEEE division was what kept
    float16 rows from memory speed.

    >>> import numpy as np, fusetree as ft
    >>> ft.softmax(ft.asarray(np.zeros((1, 4), np.float32))).numpy().tolist()
    [[0.25, 0.25, 0.25, 0.25]]
    """
    a, half = _widen(asarray(x))
    e = _FNS["exp"](a - max(a, axis, keepdims=True))
    return _narrow(e * (1.0 / sum(e, axis, keepdims=True)), half)


def log_softmax(x: Any, axis: Any = -1) -> Array:
    """``x - logsumexp(x, axis, keepdims=True)``: one kernel."""
    a, half = _widen(asarray(x))
    d = a - max(a, axis, keepdims=True)
    return _narrow(d - _FNS["log"](sum(_FNS["exp"](d), axis, keepdims=True)), half)


def _widen(a: Array) -> tuple[Array, bool]:
    """float16 input of softmax/log_softmax/layer_norm is computed in float32 (as PyTorch does;
    converted in registers, so the kernel reads and writes float16): rounding every step to
    float16 costs up to ulp(mean)/std in ``x - mean``."""
    if a.dtype == np.float16:
        return a.astype(np.float32), True
    return a, False


def _narrow(y: Array, half: bool) -> Array:
    return y.astype(np.float16) if half else y


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, axis: Any = -1) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over ``axis`` (layernorm): one kernel.
    float16 input is normalized in float32 and the result rounded to float16 (as in PyTorch)."""
    a = asarray(x)
    if a.dtype == np.float16 and builtins.all(
        v is None or type(v) in (int, float) or asarray(v).dtype == np.float16 for v in (weight, bias)
    ):  # a float16 result (wider weights would promote it): computed in float32
        a, half = _widen(a)
        weight = (
            weight if weight is None or type(weight) in (int, float) else asarray(weight).astype(np.float32)
        )
        bias = bias if bias is None or type(bias) in (int, float) else asarray(bias).astype(np.float32)
    else:
        half = False
    m = mean(a, axis, keepdims=True)
    d = a - m
    v = mean(d * d, axis, keepdims=True)
    y = d * _FNS["rsqrt"](v + eps) if "rsqrt" in _FNS else d / _FNS["sqrt"](v + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return _narrow(y, half)


FUNCTIONS = {
    f.__name__: f
    for f in (
        sum,
        prod,
        max,
        min,
        argmax,
        argmin,
        any,
        all,
        mean,
        var,
        std,
        logsumexp,
        softmax,
        log_softmax,
        layer_norm,
    )
}
FUNCTIONS["amax"], FUNCTIONS["amin"] = max, min


def _method(f: Any, name: str) -> Any:
    def m(self: Array, *args: Any, **kwargs: Any) -> Array:
        return f(self, *args, **kwargs)

    m.__name__ = name
    m.__doc__ = f"``fusetree.{name}`` of this array (see there)."
    return m


for _name in ("sum", "prod", "mean", "var", "std", "max", "min", "argmax", "argmin", "any", "all"):
    setattr(Array, _name, _method(FUNCTIONS[_name], _name))
