"""Scheduling: pending IR trees planned into steps (GEMMs, fused kernels, temporaries).

Pure planning: nothing here launches or allocates. :mod:`.spec` describes one kernel,
:mod:`.plan` a sequence of steps, :mod:`.planner` makes plans (grouping, reduction frames,
splitting), :mod:`.graph` the networkx view of a tree (CSE, topological order, DOT).
"""

from .plan import GemmStep, KernelStep, Plan, Temp
from .planner import PlanTarget, plan
from .spec import KernelSpec, LeafSpec, OpSpec, OutSpec

__all__ = ["GemmStep", "KernelSpec", "KernelStep", "LeafSpec", "OpSpec", "OutSpec", "Plan", "PlanTarget",
           "Temp", "plan"]  # fmt: skip
