"""The front end: lazy arrays and NumPy-named functions that build IR nodes (nothing runs here;
values are realized through :mod:`fusetree.engine`)."""

from . import reductions
from .array import Array, as_node, broadcast, elementwise, matmul, wrap
from .creation import asarray, empty, empty_like, full, full_like, ones, ones_like, zeros, zeros_like
from .functions import FUNCTIONS, astype, clip, power, where

__all__ = [
    "FUNCTIONS", "Array", "as_node", "asarray", "astype", "broadcast", "clip", "elementwise", "empty",
    "empty_like", "full", "full_like", "matmul", "ones", "ones_like", "power", "reductions", "where",
    "wrap", "zeros", "zeros_like",
]  # fmt: skip
