"""Array creation: wrapping NumPy/CuPy/DLPack arrays without copies, and the NumPy constructors."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends, config
from ..engine.state import HOOK
from ..errors import ShapeError
from ..ir import dtypes
from ..ir.node import make_buffer
from .array import Array, from_foreign, wrap


def asarray(a: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Wrap ``a`` without copying when possible.

    NumPy arrays live on "cpu"; CuPy arrays and other ``__cuda_array_interface__``/DLPack CUDA
    arrays on "cuda". ``device`` moves (copies) the data when it differs.

    >>> import numpy as np, fusetree as ft
    >>> ft.asarray(np.ones(3, np.float32)).device
    'cpu'
    """
    if isinstance(a, Array):
        arr = a
    else:
        if device is None and backends.device_of(a) is None:  # a Python object: the default device
            device = config.current.device
        leaf = from_foreign(a)
        if leaf.device == "cpu" and device == "cuda-sim":
            leaf = make_buffer(leaf.data, "cuda-sim")
        arr = wrap(leaf)
    if device is not None and device != arr.device:
        be = backends.get(device)
        arr = wrap(make_buffer(be.asarray(arr.numpy()), device))
    if dtype is not None:
        arr = arr.astype(dtype)
    return arr


def _creation(shape: Any, dtype: Any, device: str | None, fill: Any) -> Array:
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"negative dimensions are not allowed: {shape}")
    dt = dtypes.check(np.float64 if dtype is None else dtype, "array creation")
    be = backends.get(device or config.current.device)
    data = be.empty(shape, dt)
    rec = HOOK.recorder
    if rec is not None:  # inside ft.jit: fresh memory per call, the fill a recorded copy
        rec.alloc(data)
        if fill is not None:
            rec.copy(be, data, fill)
    if fill is not None:
        be.copy(data, fill)
    return wrap(make_buffer(data, be.device))


def empty(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Uninitialized array (like ``np.empty``)."""
    return _creation(shape, dtype, device, None)


def zeros(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array of zeros (like ``np.zeros``)."""
    return _creation(shape, dtype, device, 0)


def ones(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array of ones (like ``np.ones``)."""
    return _creation(shape, dtype, device, 1)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array filled with ``fill_value``; the dtype defaults to NumPy's choice for the value."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return _creation(shape, dtype, device, fill_value)


def _like(a: Any, dtype: Any, fill: Any, device: str | None = None) -> Array:
    x = asarray(a)
    return _creation(x.shape, dtype or x.dtype, device or x.device, fill)


def empty_like(x: Any, /, dtype: Any = None, *, device: str | None = None) -> Array:
    """Uninitialized array with the shape (and dtype, device) of ``a``."""
    return _like(x, dtype, None, device)


def zeros_like(x: Any, /, dtype: Any = None, *, device: str | None = None) -> Array:
    """Zeros with the shape (and dtype, device) of ``a``."""
    return _like(x, dtype, 0, device)


def ones_like(x: Any, /, dtype: Any = None, *, device: str | None = None) -> Array:
    """Ones with the shape (and dtype, device) of ``a``."""
    return _like(x, dtype, 1, device)


def full_like(x: Any, /, fill_value: Any, dtype: Any = None, *, device: str | None = None) -> Array:
    """``fill_value`` with the shape (and dtype, device) of ``a``."""
    return _like(x, dtype, fill_value, device)
