"""evaluate / explain / DOT export: the user-facing entry points into the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from . import backends, codegen, config, engine
from .codegen import abi
from .engine import realization as _realization
from .engine.realization import find_extras
from .engine.stores import describe as stores_describe
from .frontend import Array, asarray
from .ir.node import merge_leaves
from .schedule import graph, planner
from .schedule.plan import GemmStep, KernelStep


def synchronize() -> None:
    """Write every deferred store (``ft.options(defer_stores=True)``) and wait for the devices.

    >>> import numpy as np, fusetree as ft
    >>> buf = np.zeros(3, np.float32)
    >>> with ft.options(defer_stores=True):
    ...     x = ft.asarray(buf)
    ...     x[...] = x + 1          # queued: the array is its new value, the memory not yet written
    ...     float(buf[0]), float(x[0])
    ...     ft.synchronize()
    ...     float(buf[0])
    (0.0, 1.0)
    1.0
    """
    engine.flush()
    for device in backends.loaded():
        be = backends.get(device)
        sync = getattr(be, "synchronize", None)
        if sync is not None:
            sync()


def flush() -> None:
    """Write every deferred store (``ft.options(defer_stores=True)``) without waiting for the
    devices: their kernels are launched, and the host goes on while a GPU runs them (a training
    loop prepares the next step meanwhile). ``ft.synchronize()`` also waits.

    >>> import numpy as np, fusetree as ft
    >>> buf = np.zeros(2, np.float32)
    >>> with ft.options(defer_stores=True):
    ...     x = ft.asarray(buf)
    ...     x[...] = x + 2
    ...     ft.flush()
    >>> ft.synchronize(); buf.tolist()
    [2.0, 2.0]
    """
    engine.flush()


def evaluate(*arrays: Any) -> tuple[Array, ...]:
    """Realize several values in as few kernels as possible; returns them (now buffers).

    Values of the same shape and device share one kernel with several outputs.

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.ones(4, np.float32))
    >>> a, b = ft.evaluate(x + 1, x * 3)
    >>> a.numpy().tolist(), b.numpy().tolist()
    ([2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0])
    """
    hit = _realization._REALIZE_HIT  # (the C accelerator's cached one-kernel plan: no Python frame more)
    if hit is not None and hit(arrays):
        return arrays
    for a in arrays:  # the common call, arrays only: no conversion pass
        if type(a) is not Array:
            break
    else:
        engine.realize(arrays)
        return arrays
    arrs = tuple(a if isinstance(a, Array) else asarray(a) for a in arrays)
    engine.realize(arrs)
    return arrs


@dataclass
class KernelInfo:
    """One kernel of a plan: its name, structural key, generated source (and PTX for CUDA)."""

    name: str
    key: str
    shape: tuple[int, ...]
    source: str
    ptx: str | None = None
    outputs: int = 1
    inputs: int = 0


@dataclass
class Explanation:
    """What realizing some values would run. ``str()`` lists the plans' steps, GEMMs and kernels
    with their source."""

    kernels: list[KernelInfo] = field(default_factory=list)
    gemms: list[str] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    graph: nx.DiGraph | None = None
    stores: list[str] = field(default_factory=list)  # the queued deferred stores' next flush

    def __str__(self) -> str:
        out = [f"{len(self.gemms)} GEMM(s), {len(self.kernels)} fused kernel(s)"]
        out += self.stores
        out += self.plans
        out += [f"GEMM {g}" for g in self.gemms]
        for k in self.kernels:
            out.append(f"--- kernel {k.name}: shape {k.shape}, {k.inputs} input(s), {k.outputs} output(s)")
            out.append(k.source.rstrip())
        return "\n".join(out) + "\n"

    def dot(self) -> str:
        return graph.to_dot(self.graph) if self.graph is not None else ""


def _gemm_text(leaf: Any) -> str:
    pairs = [f"{x.shape} @ {y.shape}" for x, y in zip(leaf.args[::2], leaf.args[1::2])]
    how = " + ".join(pairs) + (" (second accumulates, beta=1)" if len(pairs) > 1 else "")
    return f"{how} -> {leaf.shape} {leaf.dtype}"


def explain(*arrays: Any, target: str | None = None) -> Explanation:
    """Describe what realizing ``arrays`` would launch - the plans the engine would run, their
    GEMMs and kernels with generated source (and PTX for ``target="cuda"``) - without running.
    ``stores`` describes how queued deferred stores would be written (kernels, horizontal launches).

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.ones((2, 3), np.float32))
    >>> e = ft.explain(ft.exp(x) + 1)
    >>> len(e.kernels), "def ft_" in e.kernels[0].source
    (1, True)
    """
    arrs = [a for a in arrays if isinstance(a, Array) and a._node.op != "buffer"]
    ex = Explanation()
    ex.stores = stores_describe()
    for a in arrs:
        if a._node.op == "matmul" and a._node.memo is None:
            ex.gemms.append(_gemm_text(a._node))
    elementwise = [a for a in arrs if a._node.op != "matmul"]
    ex.graph = to_networkx(*elementwise) if elementwise else nx.DiGraph()
    groups: dict[tuple, list] = {}
    for a in elementwise:
        groups.setdefault((a._node.device, a._node.shape), []).append(a)
    for (device, shape), group in groups.items():
        be = backends.get(device)
        tname = target or be.target.name
        tgt, ptx_fn = backends.codegen_target(tname)
        roots: list[Any] = []
        for a in group:
            if not any(a._node is r for r in roots):
                roots.append(a._node)
        extras = find_extras(roots, shape, device, group)
        paths = [(i, ()) for i in range(len(roots))] + [(e.root, e.path) for e in extras]
        leaves = merge_leaves(tuple(roots))[0]
        opts = config.current
        ptarget = planner.PlanTarget(tname, f"{tname}/explain", opts.max_kernel_params, be.frame_chunks,
                                     lambda spec: abi.count(spec, tname))  # fmt: skip
        plan = planner.plan(roots, paths, ["C"] * len(paths), leaves, shape, ptarget)
        ex.plans.append(plan.describe())
        for step in plan.steps:
            if isinstance(step, GemmStep):
                ex.gemms.append(_gemm_text(leaves[step.leaf]))
            elif isinstance(step, KernelStep):
                spec = step.spec
                src, _ = codegen.render(spec, tgt, opts)
                ptx = ptx_fn(spec, src)[0] if ptx_fn is not None else None
                kshape = shape if step.geometry is None else step.geometry[1]
                ex.kernels.append(KernelInfo(spec.name, spec.key_text, kshape, src, ptx, len(spec.outs),
                                             len(spec.leaves)))  # fmt: skip
    return ex


def to_networkx(*arrays: Any) -> nx.DiGraph:
    """The pending op-tree of ``arrays`` as a networkx DiGraph (CSE applied)."""
    nodes = [a._node if isinstance(a, Array) else asarray(a)._node for a in arrays]
    return graph.build(nodes)


def to_dot(*arrays: Any) -> str:
    """Graphviz DOT text of the pending op-tree of ``arrays``."""
    return graph.to_dot(to_networkx(*arrays))
