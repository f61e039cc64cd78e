"""The kernel ABI: one definition of every generated kernel's parameters, for every target.

Every parameter is 8 bytes wide on CUDA (a pointer, an int64 or a float64), so a kernel's parameters
pack into one buffer with one ``struct`` format. In order:

* per leaf: a scalar ``s<i>``; or an array ``in<i>``, then - when the array is strided in this
  kernel - its element offset ``in<i>_o`` (host targets: arrays are 1-D NumPy arrays over the whole
  allocation) and one element stride per axis ``in<i>_s<d>``;
* per output ``out<k>``: the same;
* sizes: ``n`` (a flat kernel) or ``n0 .. n<nd-1>``, then ``ntotal`` on CUDA targets;
  a reduction kernel: ``n0 .. n<nd-1>, nrows, rowlen, nchunks, clen, tpr``;
* a horizontal kernel (:mod:`fusetree.codegen.horizontal`): per array leaf and output a *base*
  pointer (no strides), then the chunk table ``tab`` (int64, ``nrows`` rows of ``ncols``: the
  chunk's length, then per array leaf and output an element offset from its base) and
  ``nrows, ncols``.

:func:`params` is what codegen writes in the ``def`` line, what the backends build numba
signatures and parameter formats from, and what the engine's binder produces arguments for.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..schedule.spec import KernelSpec

# a reduction kernel's parameters after its sizes: rows, row length, chunks per row, chunk length,
# threads per row (CUDA; ignored elsewhere)
FRAME_GEOMETRY = ("nrows", "rowlen", "nchunks", "clen", "tpr")
HOST_TARGETS = ("cpu", "cuda-sim")  # arrays carry an element offset (1-D host arrays)

I64 = np.dtype(np.int64)


class Param(NamedTuple):
    name: str
    kind: str  # "array", "offset", "stride", "size", "scalar"
    dtype: np.dtype  # an array's logical element dtype, a scalar's dtype; int64 otherwise
    owner: tuple[str, int] | None = None  # ("in", leaf) / ("out", output) for array parameters


def _array(p: list[Param], name: str, dt: np.dtype, owner: tuple[str, int], strided: bool, nd: int,
           target: str) -> None:  # fmt: skip
    p.append(Param(name, "array", dt, owner))
    if strided:
        if target in HOST_TARGETS:
            p.append(Param(f"{name}_o", "offset", I64, owner))
        p.extend(Param(f"{name}_s{d}", "stride", I64, owner) for d in range(nd))


def params(spec: KernelSpec, target: str) -> tuple[Param, ...]:
    """The parameters of ``spec``'s kernel on ``target``, in order."""
    p: list[Param] = []
    if spec.horizontal:
        for i, lf in enumerate(spec.leaves):
            kind = "scalar" if lf.kind == "scalar" else "array"
            p.append(Param(f"s{i}" if kind == "scalar" else f"in{i}", kind, lf.dtype, ("in", i)))
        p.extend(Param(f"out{k}", "array", o.dtype, ("out", k)) for k, o in enumerate(spec.outs))
        return (*p, Param("tab", "array", I64), Param("nrows", "size", I64), Param("ncols", "size", I64))
    frame = spec.frame is not None
    nd = spec.ndim if frame else (1 if spec.flat else max(spec.ndim, 1))
    for i, lf in enumerate(spec.leaves):
        if lf.kind == "scalar":
            p.append(Param(f"s{i}", "scalar", lf.dtype, ("in", i)))
        else:
            _array(p, f"in{i}", lf.dtype, ("in", i), spec.strided(lf.layout), nd, target)
    for k, o in enumerate(spec.outs):
        _array(p, f"out{k}", o.dtype, ("out", k), spec.strided(o.layout), nd, target)
    if frame:
        p.extend(Param(f"n{d}", "size", I64) for d in range(nd))
        p.extend(Param(g, "size", I64) for g in FRAME_GEOMETRY)
        return tuple(p)
    p.extend([Param("n", "size", I64)] if spec.flat else [Param(f"n{d}", "size", I64) for d in range(nd)])
    if target != "cpu":
        p.append(Param("ntotal", "size", I64))
    return tuple(p)


def count(spec: KernelSpec, target: str) -> int:
    """Number of kernel parameters (each 8 bytes on CUDA)."""
    return len(params(spec, target))
