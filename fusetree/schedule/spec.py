"""What one kernel computes: its leaves, its ops in topological order, its outputs.

A :class:`KernelSpec` is pure data, built by the planner from IR nodes and rendered by
:mod:`fusetree.codegen` for a target. Its ``key_text`` names it in every cache (memory and disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..ir import dtypes

Ref = tuple[str, int]  # ("x", leaf index) or ("t", op index)


@dataclass(frozen=True)
class LeafSpec:
    kind: str  # "buffer" or "scalar"
    dtype: np.dtype  # logical dtype
    layout: str  # "C", "I", "R", "T", "S" ("full"/"row" in a reduction kernel); "" for scalars
    weak: type | None = None

    @property
    def desc(self) -> dtypes.Desc:
        return self.weak if self.weak is not None else self.dtype


@dataclass(frozen=True)
class OpSpec:
    op: str
    dtype: np.dtype
    attrs: tuple
    args: tuple[Ref, ...]


@dataclass(frozen=True)
class OutSpec:
    ref: Ref
    dtype: np.dtype
    layout: str


class FrameKey(NamedTuple):
    """What makes a reduction kernel (see codegen.frame) besides its ops and arrays."""

    axes: tuple[int, ...]  # the frame's reduced axes
    partial: bool  # a partial kernel: per-chunk accumulators (two-stage reductions)
    unit_rows: bool = False  # CPU: one reduced axis, the last, contiguous in every full array

    @property
    def text(self) -> str:
        """The frame in a kernel's key (the form kernel caches have used since before unit rows)."""
        return str((self.axes, self.partial, True) if self.unit_rows else (self.axes, self.partial))


@dataclass(frozen=True)
class KernelSpec:
    name: str
    key_text: str
    ndim: int
    leaves: tuple[LeafSpec, ...]
    ops: tuple[OpSpec, ...]
    outs: tuple[OutSpec, ...]
    # a reduction kernel (see codegen.frame); leaves' and outputs' layouts are then their level,
    # "full" or "row" ("acc" for a partial kernel's accumulator)
    frame: FrameKey | None = None
    # a horizontal kernel (codegen.horizontal): one launch over a table of chunks of many
    # same-structure tensors; leaves' layouts are "C" (the chunk's elements) or "B" (one element)
    horizontal: bool = False

    @property
    def flat(self) -> bool:
        """All arrays C-contiguous: the kernel runs over one flat index."""
        if self.frame is not None or self.horizontal:
            return False
        return all(lf.layout in ("C", "") for lf in self.leaves) and all(o.layout == "C" for o in self.outs)

    def strided(self, layout: str) -> bool:
        """Whether an array of ``layout`` is passed with its strides (else one flat pointer)."""
        return not self.horizontal and (self.frame is not None or not (self.flat or layout == "C"))
