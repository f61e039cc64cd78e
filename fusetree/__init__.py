"""fusetree: lazy NumPy-style array expressions fused into single kernels.

>>> import numpy as np, fusetree as ft
>>> a = ft.asarray(np.linspace(-1, 1, 8, dtype=np.float32))
>>> b = ft.sigmoid(a) * ft.tanh(a) + 1      # one fused kernel, compiled once per structure
>>> np.allclose(b.numpy(), 1 / (1 + np.exp(-a.numpy())) * np.tanh(a.numpy()) + 1, atol=1e-6)
True

Layers (data flows down; nothing imports upward): ``frontend`` (lazy arrays build IR nodes) ->
``ir`` (nodes, op table, dtypes) -> ``schedule`` (plans: kernels, GEMMs, temporaries) ->
``codegen`` (kernel source, one ABI) -> ``engine`` (plan cache, executor, jit) -> ``backends``
(numba CPU loops, CUDA driver launches, cuBLAS).
"""

from __future__ import annotations

from .api import evaluate, explain, synchronize, to_dot, to_networkx
from .config import get as get_options
from .config import options
from .engine import cache_info, clear_cache, reset_stats, stats
from .engine.jit import jit
from .errors import (
    CompileError,
    DeviceError,
    DTypeError,
    FusetreeError,
    ShapeError,
    UnsupportedError,
)
from .frontend import (
    Array,
    asarray,
    astype,
    clip,
    empty,
    empty_like,
    full,
    full_like,
    matmul,
    ones,
    ones_like,
    power,
    where,
    zeros,
    zeros_like,
)
from .frontend.functions import FUNCTIONS as _FUNCTIONS
from .frontend.reductions import FUNCTIONS as _REDUCTIONS
from .ir import ops as _ops

__version__ = "0.2.0"

globals().update({k: v for k, v in _FUNCTIONS.items() if k not in globals()})
globals().update(_REDUCTIONS)
divide = _FUNCTIONS["true_divide"]
abs = _FUNCTIONS["absolute"]  # noqa: A001
ndarray = Array

OP_NAMES = tuple(sorted(_ops.OPS))
FUNCTIONS_BY_NAME = dict(_FUNCTIONS, where=where)

__all__ = [
    "Array", "ndarray", "asarray", "astype", "clip", "empty", "empty_like", "full", "full_like",
    "matmul", "ones", "ones_like", "power", "where", "zeros", "zeros_like", "evaluate", "explain",
    "synchronize", "to_dot", "to_networkx", "jit", "options", "get_options", "stats", "reset_stats", "clear_cache",
    "cache_info", "FusetreeError", "ShapeError", "DTypeError", "DeviceError", "UnsupportedError",
    "CompileError", "divide", "abs", "OP_NAMES", "FUNCTIONS_BY_NAME",
    *sorted(k for k in _FUNCTIONS if k != "power"), *sorted(_REDUCTIONS),
]  # fmt: skip


def __getattr__(name: str) -> object:
    raise AttributeError(f"module 'fusetree' has no attribute {name!r}")
