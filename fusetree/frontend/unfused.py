"""Complex arrays: every op on one runs the backend's own function, unfused.

``complex64`` and ``complex128`` arrays are memory only: fusetree's kernels are real-valued. An
operator, elementwise function, reduction, cast or store that involves a complex array realizes
its real operands and runs NumPy's function (CPU) or CuPy's (CUDA) eagerly, one call per op, and
wraps the result without a copy. So complex code is correct and stays on its device, at the
unfused baseline's speed; it cannot be traced by ``ft.jit``.

>>> import numpy as np, fusetree as ft
>>> z = ft.asarray(np.array([1 + 1j, -2j]))
>>> (ft.exp(z * 0) + 1).numpy().tolist(), ft.abs(z).numpy().tolist()
([(2+0j), (2+0j)], [1.4142135623730951, 2.0])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DTypeError

# op-table names whose backend function is named differently
_BACKEND_NAMES = {"true_divide": "divide"}
# reductions (op-table kinds) the backends run directly
_REDUCTIONS = ("sum", "prod", "max", "min", "any", "all")


def involves_complex(nodes: Any, attrs: tuple = ()) -> bool:
    """Whether an op over ``nodes`` (IR nodes) with ``attrs`` takes or makes a complex value."""
    for n in nodes:
        if n.dtype.kind == "c":
            return True
    return bool(attrs) and isinstance(attrs[0], np.dtype) and attrs[0].kind == "c"


def compute(be: Any, name: str, values: list[Any], attrs: tuple = ()) -> Any:
    """Op ``name`` of the op table on ``values`` (backend arrays and scalars) by the backend ``be``:
    a backend array (0-d for a scalar result)."""
    xp = be.xp
    if name == "astype":
        out = xp.asarray(values[0]).astype(attrs[0])
    elif name == "expm1" and getattr(values[0], "dtype", None) is not None and values[0].dtype.kind == "c":
        out = _expm1(xp, values[0])
    else:
        fn = getattr(xp, _BACKEND_NAMES.get(name, name), None)
        if fn is None:
            raise DTypeError(f"{name}: not defined for complex operands")
        try:
            with np.errstate(all="ignore"):
                out = fn(*values)
        except TypeError as e:  # e.g. floor, maximum, < of complex values
            kinds = ", ".join(str(getattr(v, "dtype", type(v).__name__)) for v in values)
            raise DTypeError(f"{name}: not supported for operands of dtype {kinds} ({e})") from None
    return xp.asarray(out)


def reduce(be: Any, kind: str, data: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Reduction ``kind`` of complex ``data`` over ``axes`` by the backend (a backend array)."""
    if kind not in _REDUCTIONS:
        raise DTypeError(f"{kind}: not defined for complex arrays")
    kw: dict[str, Any] = {"axis": axes, "keepdims": keepdims}
    fn = getattr(be.xp, kind)
    try:
        with np.errstate(all="ignore"):
            return be.xp.asarray(fn(data, **kw))
    except TypeError as e:
        raise DTypeError(f"{kind}: not supported for a complex array ({e})") from None


def _expm1(xp: Any, z: Any) -> Any:
    """``exp(z) - 1`` of complex ``z`` without cancellation near 0 (the backends compute it as
    ``exp(z) - 1``): ``expm1(x) cos(y) - 2 sin(y/2)^2 + i e^x sin(y)`` where ``z = x + iy`` is
    finite, C99's ``cexp(z) - 1`` (the Array API's special cases) elsewhere."""
    with np.errstate(all="ignore"):
        x, y = z.real, z.imag
        s = xp.sin(y / 2)
        re = xp.expm1(x) * xp.cos(y) - 2 * s * s
        im = xp.where(y == 0, y, xp.exp(x) * xp.sin(y))  # (e^x sin(+-0) is +-0, also for large x)
        precise = (re + 1j * im).astype(z.dtype)
        return xp.where(xp.isfinite(x) & xp.isfinite(y), precise, xp.exp(z) - 1)
