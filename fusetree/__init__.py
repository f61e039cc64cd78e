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

from .api import evaluate, explain, flush, synchronize, to_dot, to_networkx
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
from .frontend import namespace as _ns
from .frontend.autodiff import grad, value_and_grad, vjp
from .frontend.functions import FUNCTIONS as _FUNCTIONS
from .frontend.namespace import (  # noqa: F401 (the namespace's names)
    __array_namespace_info__,
    argsort,
    asarray,
    astype,
    reshape,
    sort,
)
from .frontend.reductions import FUNCTIONS as _REDUCTIONS
from .ir import ops as _ops

__version__ = "0.2.0"

globals().update({k: v for k, v in _FUNCTIONS.items() if k not in globals()})
globals().update(_REDUCTIONS)
divide = _FUNCTIONS["true_divide"]
abs = _FUNCTIONS["absolute"]  # noqa: A001
ndarray = Array

# the Array API standard's names (fusetree.frontend.namespace)
globals().update(_ns.DTYPES)
globals().update({k: v for k, v in _ns.BOUNDARIES.items() if not k.startswith("_")})
globals().update({k: _FUNCTIONS[v] for k, v in _ns.ALIASES.items()})
__array_api_version__ = _ns.__array_api_version__
e, pi, inf, nan, newaxis = _ns.e, _ns.pi, _ns.inf, _ns.nan, _ns.newaxis
finfo, iinfo, isdtype, result_type, can_cast = (
    _ns.finfo,
    _ns.iinfo,
    _ns.isdtype,
    _ns.result_type,
    _ns.can_cast,
)
for _name in (
    "positive",
    "logical_xor",
    "signbit",
    "copysign",
    "hypot",
    "conj",
    "real",
    "imag",
    "linalg",
    "fft",
):
    globals()[_name] = getattr(_ns, _name)

OP_NAMES = tuple(sorted(_ops.OPS))
FUNCTIONS_BY_NAME = dict(_FUNCTIONS, where=where)

__all__ = [
    "Array", "ndarray", "asarray", "astype", "clip", "empty", "empty_like", "full", "full_like",
    "matmul", "ones", "ones_like", "power", "where", "zeros", "zeros_like", "evaluate", "explain",
    "synchronize", "flush", "to_dot", "to_networkx", "jit", "grad", "value_and_grad", "vjp", "options", "get_options", "stats", "reset_stats", "clear_cache",
    "cache_info", "FusetreeError", "ShapeError", "DTypeError", "DeviceError", "UnsupportedError",
    "CompileError", "divide", "abs", "OP_NAMES", "FUNCTIONS_BY_NAME",
    *sorted(k for k in _FUNCTIONS if k != "power"), *sorted(_REDUCTIONS),
]  # fmt: skip


def __getattr__(name: str) -> object:
    raise AttributeError(f"module 'fusetree' has no attribute {name!r}")
