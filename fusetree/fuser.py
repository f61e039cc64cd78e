"""Partition pending values into kernels and describe each kernel as a :class:`KernelSpec`.

Views and broadcasts were pushed to the leaves when nodes were built, and GEMMs are leaves, so the
partition is: one kernel per (device, shape) among the values realized together, every elementwise
node of their trees inside it, as many outputs as values requested (plus live pending values inside
the trees, see :mod:`fusetree.runtime`). A kernel whose parameters would pass
``config.MAX_KERNEL_PARAMS`` is split by the runtime (largest subtrees first).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from . import graph
from .codegen import KernelSpec, LeafSpec, OpSpec, OutSpec, Ref
from .ir import KEY_DESCRIPTIONS, Node


def group_by_shape(items: Sequence) -> dict[tuple, list]:
    """Group arrays (objects with ``_node``) by (device, shape): one kernel each."""
    groups: dict[tuple, list] = {}
    for a in items:
        n = a._node
        groups.setdefault((n.device, n.shape), []).append(a)
    return groups


def node_at(root: Node, path: tuple[int, ...]) -> Node:
    n = root
    for i in path:
        n = n.args[i]
    return n


def key_text(k: int) -> str:
    """The full structural key behind int key ``k``, as readable stable text."""
    t = KEY_DESCRIPTIONS[k]
    if t[0] in ("buffer", "scalar", "matmul"):
        return ":".join(str(x) for x in t)
    op, dt, attrs, kids, sharing = t
    a = ("," + ",".join(str(x) for x in attrs)) if attrs else ""
    s = ("|share=" + str(sharing)) if sharing else ""
    return f"{op}[{dt}{a}]({', '.join(key_text(c) for c in kids)}{s})"


def spec_for(roots: Sequence[Node], paths: Sequence[tuple[int, tuple[int, ...]]], leaves: Sequence[Node],
             out_layouts: Sequence[str], target: str, sharing: object = None,
             frame: tuple | None = None, leaf_layouts: Sequence[str] | None = None,
             ndim: int | None = None) -> KernelSpec:  # fmt: skip
    """KernelSpec computing ``roots`` (all of one shape) and the nodes at ``paths`` below them.

    For a reduction kernel, ``frame`` is (reduced axes, partial), ``leaf_layouts`` each buffer
    leaf's level ("full"/"row") and ``ndim`` the frame's rank (see :mod:`fusetree.codegen_frame`).
    """
    leaf_index = {id(x): i for i, x in enumerate(leaves)}
    g = graph.build(roots, leaf_index)
    ids = g.graph["ids"]
    order = graph.topological_order(g)
    ref: dict[int, Ref] = {}
    ops: list[OpSpec] = []
    for gid in order:
        d = g.nodes[gid]
        n: Node = d["ir"]
        if "leaf" in d:
            ref[gid] = ("x", d["leaf"])
            continue
        args = tuple(ref[ids[id(a)]] for a in n.args)
        ref[gid] = ("t", len(ops))
        ops.append(OpSpec(n.op, n.dtype, n.attrs, args))
    outs = []
    for (ri, path), lay in zip(paths, out_layouts):
        n = node_at(roots[ri], path)
        outs.append(OutSpec(ref[ids[id(n)]], n.dtype, lay))
    lays = list(leaf_layouts) if leaf_layouts is not None else [x.layout for x in leaves]
    leaf_specs = tuple(
        LeafSpec("scalar", x.dtype, "", x.weak) if x.op == "scalar" else LeafSpec("buffer", x.dtype, lay)
        for x, lay in zip(leaves, lays)
    )
    text = (
        f"{target};v{_version()};roots=[{'; '.join(key_text(r.key) for r in roots)}];"
        f"outs={list(paths)};layouts={list(out_layouts)};share={sharing}"
    )
    if frame is not None:
        text += f";frame={frame};leaves={lays}"
    name = "ft_" + hashlib.sha1(text.encode()).hexdigest()[:12]
    nd = len(roots[0].shape) if ndim is None else ndim
    return KernelSpec(name, text, nd, leaf_specs, tuple(ops), tuple(outs), frame)


def _version() -> int:
    from .config import CODEGEN_VERSION

    return CODEGEN_VERSION
