"""Codegen: a :class:`~fusetree.schedule.spec.KernelSpec` rendered as source for a target.

Pure string work: :mod:`.abi` defines every kernel's parameters (one definition for all targets),
:mod:`.elementwise` renders fused elementwise kernels, :mod:`.frame` fused reduction kernels.
The backends compile the source (numba ``njit`` on the CPU, ``numba.cuda.compile_ptx`` for CUDA).
"""

from __future__ import annotations

from ..schedule.spec import KernelSpec
from . import abi, elementwise, frame, horizontal
from .common import Target


def render(spec: KernelSpec, target: Target, unroll: int = 1, vector: bool = True,
           held: int = 16, tile: int = 32, remat: bool = False) -> tuple[str, list[str]]:  # fmt: skip
    """Source of ``spec`` for ``target`` and its parameter names (see :mod:`.abi`); ``unroll``,
    ``vector`` and ``tile``: see :func:`.elementwise.render`; ``held`` and ``remat``:
    :func:`.frame.render`."""
    if spec.frame is not None:
        return frame.render(spec, target, held, remat)
    if spec.horizontal:
        return horizontal.render(spec, target, vector)
    return elementwise.render(spec, target, unroll, vector, tile)


__all__ = ["Target", "abi", "render"]
