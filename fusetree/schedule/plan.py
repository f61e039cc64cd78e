"""Plans: what realizing a group of pending values runs, as named steps, made without launching.

A :class:`Plan` is built once per structure (see :mod:`.planner`) and cached by the engine; running
it binds only pointers, sizes, strides and scalar values. Its steps read and write through refs:

inputs (one per kernel leaf)
    ``("leaf", i)`` the group's leaf ``i`` as it is; ``("view", i, shape, estrides)`` leaf ``i``'s
    memory seen with another geometry (a broadcast made while planning); ``("temp", j)`` plan
    temporary ``j`` (C-contiguous); ``("tview", j, shape, estrides)`` a temporary seen with another
    geometry.
outputs
    ``("out", k)`` the group's output ``k`` (a fresh array, or a store's target view);
    ``("temp", j)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .spec import KernelSpec

InRef = tuple
OutRef = tuple[str, int]


@dataclass(frozen=True)
class GemmStep:
    """``temps[out] = leaves[leaf]`` for a pending-GEMM leaf (skipped when it was computed
    already: its memo)."""

    leaf: int
    out: int

    def describe(self, plan: Plan) -> str:
        return f"GEMM leaf {self.leaf} -> temp {self.out}"


@dataclass(eq=False)
class KernelStep:
    """One fused kernel launch. ``geometry`` is None for an elementwise kernel over the group's
    shape (bound per call), else fixed: ``("shape", shape)`` or a reduction frame's
    ``("frame", full_shape, nrows, rowlen, nchunks, clen)``."""

    spec: KernelSpec
    inputs: tuple[InRef, ...]
    outputs: tuple[OutRef, ...]
    geometry: tuple | None = None
    launcher: Any = None  # the compiled kernel, set by the engine on first run
    forms: tuple[bool, ...] = ()  # per input: passed with strides (set with the launcher)
    out_layouts: tuple[str, ...] = ()  # per output (set with the launcher)

    def describe(self, plan: Plan) -> str:
        return f"kernel {self.spec.name}: {len(self.inputs)} input(s) -> {', '.join(map(str, self.outputs))}"


@dataclass(frozen=True)
class Temp:
    shape: tuple[int, ...] | None  # None: the shape of the GEMM leaf that fills it
    dtype: np.dtype | None


@dataclass(eq=False)
class Plan:
    """Steps in order, the temporaries they use, and each output's shape and dtype."""

    steps: list[Any] = field(default_factory=list)
    temps: list[Temp] = field(default_factory=list)
    outputs: list[tuple[tuple[int, ...], np.dtype]] = field(default_factory=list)
    keyed_by_shape: bool = False  # the plan was made for the exact shapes of the call (reductions)
    used: int = 0  # when it last ran (engine.kernels.TICK): the kernel cache's recency
    _single: Any = field(default=False, repr=False)  # memo of ``single`` (False: not yet asked)

    @property
    def single(self) -> KernelStep | None:
        """The one kernel of a plan that is nothing else (the common elementwise case); asked
        only of finished plans (memoized)."""
        s = self._single
        if s is False:
            ok = len(self.steps) == 1 and not self.temps and isinstance(self.steps[0], KernelStep)
            s = self._single = self.steps[0] if ok else None
        return s

    def kernels(self) -> list[KernelStep]:
        return [s for s in self.steps if isinstance(s, KernelStep)]

    def describe(self) -> str:
        lines = [f"plan: {len(self.steps)} step(s), {len(self.temps)} temporary buffer(s)"]
        lines += [f"  {k}. {s.describe(self)}" for k, s in enumerate(self.steps)]
        return "\n".join(lines)
