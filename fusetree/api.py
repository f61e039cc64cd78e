"""evaluate / explain / DOT export: the user-facing entry points into the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from . import backends, codegen, fuser, graph, ir, runtime
from .lazy import Array, asarray


def evaluate(*arrays: Any) -> tuple[Array, ...]:
    """Realize several values in as few kernels as possible; returns them (now buffers).

    Values of the same shape and device share one kernel with several outputs.

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.ones(4, np.float32))
    >>> a, b = ft.evaluate(x + 1, x * 3)
    >>> a.numpy().tolist(), b.numpy().tolist()
    ([2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0])
    """
    arrs = [a if isinstance(a, Array) else asarray(a) for a in arrays]
    runtime.realize(arrs)
    return tuple(arrs)


@dataclass
class KernelInfo:
    """One kernel group: its name, structural key, generated source (and PTX for CUDA)."""

    name: str
    key: str
    shape: tuple[int, ...]
    source: str
    ptx: str | None = None
    outputs: int = 1
    inputs: int = 0


@dataclass
class Explanation:
    """What realizing some values would run. ``str()`` lists GEMMs and kernels with their source."""

    kernels: list[KernelInfo] = field(default_factory=list)
    gemms: list[str] = field(default_factory=list)
    graph: nx.DiGraph | None = None

    def __str__(self) -> str:
        out = [f"{len(self.gemms)} GEMM(s), {len(self.kernels)} fused kernel(s)"]
        out += [f"GEMM {g}" for g in self.gemms]
        for k in self.kernels:
            out.append(f"--- kernel {k.name}: shape {k.shape}, {k.inputs} input(s), {k.outputs} output(s)")
            out.append(k.source.rstrip())
        return "\n".join(out) + "\n"

    def dot(self) -> str:
        return graph.to_dot(self.graph) if self.graph is not None else ""


def explain(*arrays: Any, target: str | None = None) -> Explanation:
    """Describe the kernels realizing ``arrays`` would launch, without running them.

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.ones((2, 3), np.float32))
    >>> e = ft.explain(ft.exp(x) + 1)
    >>> len(e.kernels), "def ft_" in e.kernels[0].source
    (1, True)
    """
    arrs = [a for a in arrays if isinstance(a, Array) and a._node.op != "buffer"]
    ex = Explanation()
    for a in arrs:
        for leaf in a._node.leaves if a._node.op != "matmul" else (a._node,):
            if leaf.op == "matmul" and leaf.memo is None:
                pairs = [f"{x.shape} @ {y.shape}" for x, y in zip(leaf.args[::2], leaf.args[1::2])]
                how = " + ".join(pairs) + (" (second accumulates, beta=1)" if len(pairs) > 1 else "")
                ex.gemms.append(f"{how} -> {leaf.shape} {leaf.dtype}")
    elementwise = [a for a in arrs if a._node.op != "matmul"]
    ex.graph = to_networkx(*elementwise) if elementwise else nx.DiGraph()
    for (device, shape), group in fuser.group_by_shape(elementwise).items():
        be = backends.get(device)
        tgt = target or be.target
        roots, _ = runtime._unique_nodes(group)
        if any(ir.has_reduce(r) for r in roots):
            for r in roots:
                ex.kernels.append(_explain_reduction(r, tgt))
            continue
        extras = runtime.find_extras(roots, shape, device, {id(a) for a in group})
        paths = [(i, ()) for i in range(len(roots))] + [(ri, p) for _, ri, p in extras]
        if len(roots) == 1:
            leaves, sharing = roots[0].leaves, None
        else:
            from .ir import merge_leaves

            leaves, sharing = merge_leaves(tuple(roots))
        spec = fuser.spec_for(roots, paths, leaves, ["C"] * len(paths), tgt, sharing)
        storage, scalar_storage, ptx_fn = backends.codegen_target(tgt)
        src, _ = codegen.render(spec, tgt, storage, scalar_storage)
        ptx = ptx_fn(spec, src)[0] if ptx_fn is not None else None
        ex.kernels.append(KernelInfo(spec.name, spec.key_text, shape, src, ptx, len(paths), len(leaves)))
    return ex


def _explain_reduction(root: Any, tgt: str) -> KernelInfo:
    from . import reductions

    spec = reductions.frame_spec(root, tgt)
    if spec is None:
        return KernelInfo("(planned at run time)", "", root.shape,
                          "# parts of this reduction tree are computed by kernels of their own first\n")  # fmt: skip
    storage, scalar_storage, ptx_fn = backends.codegen_target(tgt)
    src, _ = codegen.render(spec, tgt, storage, scalar_storage)
    ptx = ptx_fn(spec, src)[0] if ptx_fn is not None else None
    return KernelInfo(spec.name, spec.key_text, root.shape, src, ptx, 1, len(spec.leaves))


def to_networkx(*arrays: Any) -> nx.DiGraph:
    """The pending op-tree of ``arrays`` as a networkx DiGraph (CSE applied)."""
    nodes = [a._node if isinstance(a, Array) else asarray(a)._node for a in arrays]
    return graph.build(nodes)


def to_dot(*arrays: Any) -> str:
    """Graphviz DOT text of the pending op-tree of ``arrays``."""
    return graph.to_dot(to_networkx(*arrays))
