"""Codegen: a :class:`~fusetree.schedule.spec.KernelSpec` rendered as source for a target.

Pure string work: :mod:`.abi` defines every kernel's parameters (one definition for all targets),
:mod:`.elementwise` renders fused elementwise kernels, :mod:`.frame` fused reduction kernels.
The backends compile the source (numba ``njit`` on the CPU, ``numba.cuda.compile_ptx`` for CUDA).
"""

from __future__ import annotations

from .. import config
from ..schedule.spec import KernelSpec
from . import abi, elementwise, frame, horizontal
from .common import Target


def render(spec: KernelSpec, target: Target, opts: config.Options | None = None) -> tuple[str, list[str]]:
    """Source of ``spec`` for ``target`` and its parameter names (see :mod:`.abi`), under the
    code-shaping options ``opts`` (default: the current ones): ``cuda_unroll``, ``cuda_vector`` and
    ``cuda_tile`` (:func:`.elementwise.render`), ``reduce_held`` and ``reduce_remat``
    (:func:`.frame.render`)."""
    o = config.current if opts is None else opts
    if spec.frame is not None:
        return frame.render(spec, target, o.reduce_held, o.reduce_remat)
    if spec.horizontal:
        return horizontal.render(spec, target, o.cuda_vector)
    unroll = o.cuda_unroll if target.cuda else 1
    return elementwise.render(spec, target, unroll, o.cuda_vector, o.cuda_tile)


__all__ = ["Target", "abi", "render"]
