"""NumPy-named elementwise functions, one per op-table row, and a few compositions."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..ir.ops import OPS
from .array import Array, elementwise, unary_function
from .creation import asarray


def _fn(name: str) -> Callable[..., Array]:
    arity = OPS[name].arity
    if arity == 1:
        f = unary_function(name)
    else:

        def f(*args: Any) -> Array:
            if len(args) != arity:
                raise TypeError(f"{name}() takes {arity} argument(s), got {len(args)}")
            return elementwise(name, *args)

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` with NumPy semantics (see fusetree.ir.ops.OPS['{name}'])."
    # the Array API's signature: positional-only operands, ``(x, /)`` or ``(x1, x2, /)``
    names = ("x",) if arity == 1 else tuple(f"x{k + 1}" for k in range(arity))
    f.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]
    )
    return f


FUNCTIONS = {name: _fn(name) for name in OPS if name != "astype"}


def where(cond: Any, a: Any, b: Any) -> Array:
    """``a`` where ``cond`` else ``b`` (like ``np.where`` with three arguments)."""
    return elementwise("where", cond, a, b)


def clip(x: Any, min: Any = None, max: Any = None) -> Array:  # noqa: A002 (the standard's names)
    """``minimum(maximum(x, min), max)``, as NumPy defines ``np.clip`` (None: no bound)."""
    y = asarray(x) if min is None else elementwise("maximum", x, min)
    return y if max is None else elementwise("minimum", y, max)


def astype(x: Any, dtype: Any) -> Array:
    """Cast to ``dtype`` (NumPy's ``astype`` with unsafe casting)."""
    return asarray(x).astype(dtype)


def power(a: Any, b: Any) -> Array:
    """``a ** b``."""
    return elementwise("power", a, b)
