"""The IR: dtypes and their promotion rules, the op table, and the nodes lazy values are built of.

Nothing here imports numba or cupy, and nothing here runs anything: :mod:`fusetree.frontend` builds
nodes, :mod:`fusetree.schedule` plans them into kernels.
"""

from . import dtypes, ops
from .node import Buffer, Node, Scalar

__all__ = ["Buffer", "Node", "Scalar", "dtypes", "ops"]
