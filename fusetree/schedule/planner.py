"""Plan pending values into steps, without launching anything.

The partition: values of one shape and device realized together share one kernel with several
outputs, every elementwise node of their trees inside it (plus the live pending values inside the
trees: the engine passes them as extra output paths). A pending GEMM leaf becomes a GEMM step before
the kernel. A kernel whose parameters would pass ``max_params`` (CUDA's 4 KB parameter space) is
split: its largest subtree (for a reduction kernel: its largest elementwise part) is computed into
a temporary first.

Trees with reductions are planned in a *frame* (the full shape and the reduced axes, see
:mod:`fusetree.codegen.frame`): whatever does not fit the frame (a reduction over other axes, a
reduction of a reduction, an incompatible broadcast) is computed into a temporary by steps of its
own first, and rows too long for one thread group are reduced in two stages (per-chunk partials,
then their reduction). ``softmax``, ``log_softmax``, layernorm and ``x - x.max(-1, keepdims=True)``
are one kernel each. Reduction plans depend on sizes (the two-stage choice) and are made for the
exact shapes and strides of a call; elementwise plans only on structure.
"""

from __future__ import annotations

import builtins
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .. import config
from ..errors import ShapeError
from ..ir.node import (
    EXPAND,
    REDUCE,
    Buffer,
    Node,
    PlanLeaf,
    c_strides,
    make_op,
    make_plan_leaf,
    merge_leaves,
)
from ..ir.ops import REDUCTIONS, reduce_dtypes
from . import graph
from .plan import GemmStep, InRef, KernelStep, OutRef, Plan, Temp
from .spec import FrameKey, KernelSpec, LeafSpec, OpSpec, OutSpec, Ref

Path = tuple[int, tuple[int, ...]]  # (root index, child positions from the root)
Frame = tuple[tuple[int, ...], tuple[int, ...]]  # (full shape, reduced axes)


@dataclass(frozen=True)
class PlanTarget:
    """What planning needs to know of the backend: its codegen target, its parameter budget
    and how it splits long rows (``chunks(nrows, rowlen)`` for a two-stage reduction)."""

    name: str
    tag: str  # cache tag: target plus options that change generated code
    max_params: int
    chunks: Callable[[int, int], int]
    count_params: Callable[[KernelSpec], int]


def node_at(root: Node, path: tuple[int, ...]) -> Node:
    n = root
    for i in path:
        n = n.args[i]
    return n


def dtype_name(dt: np.dtype) -> str:
    return dt.str.lstrip("<>|=")


def spec_for(roots: Sequence[Node], paths: Sequence[Path], leaves: Sequence[Node], out_layouts: Sequence[str],
             target: str, tag: str, frame: FrameKey | None = None,
             leaf_layouts: Sequence[str] | None = None, ndim: int | None = None,
             out_dtypes: Sequence[np.dtype] | None = None) -> KernelSpec:  # fmt: skip
    """The KernelSpec computing ``roots`` (all of one shape) and the nodes at ``paths``.

    For a reduction kernel, ``frame`` is its :class:`FrameKey`, ``leaf_layouts`` each buffer
    leaf's level ("full"/"row") and ``ndim`` the frame's rank.
    """
    leaf_index = {id(x): i for i, x in enumerate(leaves)}
    g = graph.build(roots, leaf_index)
    ids = g.graph["ids"]
    ref: dict[int, Ref] = {}
    ops: list[OpSpec] = []
    for gid in graph.topological_order(g):
        d = g.nodes[gid]
        n: Node = d["ir"]
        if "leaf" in d:
            ref[gid] = ("x", d["leaf"])
            continue
        args = tuple(ref[ids[id(a)]] for a in n.args)
        ref[gid] = ("t", len(ops))
        ops.append(OpSpec(n.op, n.dtype, n.attrs, args))
    outs = []
    for k, ((ri, path), lay) in enumerate(zip(paths, out_layouts)):
        n = node_at(roots[ri], path)
        dt = n.dtype if out_dtypes is None else out_dtypes[k]
        outs.append(OutSpec(ref[ids[id(n)]], dt, lay))
    lays = list(leaf_layouts) if leaf_layouts is not None else [leaf_layout(x) for x in leaves]
    leaf_specs = tuple(
        LeafSpec("scalar", x.dtype, "", x.weak) if x.op == "scalar" else LeafSpec("buffer", x.dtype, lay)  # type: ignore[attr-defined]
        for x, lay in zip(leaves, lays)
    )
    nd = len(roots[0].shape) if ndim is None else ndim
    text = spec_text(tag, nd, leaf_specs, ops, outs, frame)
    name = "ft_" + hashlib.sha1(text.encode()).hexdigest()[:12]
    return KernelSpec(name, text, nd, leaf_specs, tuple(ops), tuple(outs), frame)


def spec_text(tag: str, ndim: int, leaves: Sequence[LeafSpec], ops: Sequence[OpSpec], outs: Sequence[OutSpec],
              frame: FrameKey | None) -> str:  # fmt: skip
    """A kernel's key in every cache: the spec itself written out (everything code generation
    reads, so equal texts render equal kernels), one entry per distinct op: its length grows with
    the DAG, not with the tree it unfolds to (a value used twice per level doubles the tree)."""

    def leaf(lf: LeafSpec) -> str:
        if lf.kind == "scalar":
            return f"s:{lf.weak.__name__}" if lf.weak is not None else f"s:{dtype_name(lf.dtype)}"
        return f"{dtype_name(lf.dtype)}:{lf.layout}"

    def op(o: OpSpec) -> str:
        a = ("," + ",".join(str(x) for x in o.attrs)) if o.attrs else ""
        return f"{o.op}[{dtype_name(o.dtype)}{a}]({','.join(f'{k}{i}' for k, i in o.args)})"

    body = "; ".join(f"t{j}={op(o)}" for j, o in enumerate(ops))
    out = ", ".join(f"{o.ref[0]}{o.ref[1]}:{dtype_name(o.dtype)}:{o.layout}" for o in outs)
    text = (
        f"{tag};v{config.CODEGEN_VERSION};ndim={ndim};leaves=[{', '.join(leaf(x) for x in leaves)}];"
        f"ops=[{body}];outs=[{out}]"
    )
    return text if frame is None else text + f";frame={frame.text}"


def leaf_layout(x: Node) -> str:
    """A leaf's layout class: a pending GEMM's result is C-contiguous; scalars have none."""
    if x.op == "matmul":
        return "C"
    return getattr(x, "layout", "")


def plan(roots: Sequence[Node], paths: Sequence[Path], out_layouts: Sequence[str], leaves: Sequence[Node],
         shape: tuple[int, ...], target: PlanTarget) -> Plan:  # fmt: skip
    """The plan computing the nodes at ``paths`` under ``roots`` (one shape and device) into the
    group's outputs ``("out", k)`` (``out_layouts[k]``: "C" for a fresh array, else the target
    view's layout class). ``leaves`` is the group's leaf tuple (what the plan's ``("leaf", i)``
    refs index)."""
    ctx = _Planner(leaves, target, shape)
    for (ri, p), _ in zip(paths, out_layouts):
        n = node_at(roots[ri], p)
        ctx.plan.outputs.append((n.shape, n.dtype))
    ctx.group(list(roots), list(paths), [("out", k) for k in range(len(paths))], list(out_layouts), shape)
    ctx.plan.keyed_by_shape = any(r.flags & (REDUCE | EXPAND) for r in roots) or ctx.split
    return ctx.plan


class _Planner:
    def __init__(self, leaves: Sequence[Node], target: PlanTarget, shape: tuple[int, ...]) -> None:
        self.leaves = leaves
        self.shape = shape
        self.index = {id(x): i for i, x in enumerate(leaves)}
        self.target = target
        self.plan = Plan()
        self.gemm_temp: dict[int, int] = {}
        self.split = False

    # -- refs -----------------------------------------------------------------------------------
    def temp(self, shape: tuple[int, ...] | None, dtype: np.dtype | None) -> int:
        self.plan.temps.append(Temp(shape, dtype))
        return len(self.plan.temps) - 1

    def input_ref(self, x: Node) -> InRef:
        op = x.op
        if op == "matmul":
            i = self.index[id(x)]
            j = self.gemm_temp.get(i)
            if j is None:
                j = self.gemm_temp[i] = self.temp(None, None)
                self.plan.steps.append(GemmStep(i, j))
            return ("temp", j)
        if op == "temp":
            assert isinstance(x, PlanLeaf)
            t = self.plan.temps[x.index]
            if t.shape == x.shape and x.estrides == c_strides(x.shape):
                return ("temp", x.index)
            return ("tview", x.index, x.shape, x.estrides)
        if op == "derived":
            assert isinstance(x, PlanLeaf)
            return ("view", x.index, x.shape, x.estrides)
        return ("leaf", self.index[id(x)])

    # -- groups ---------------------------------------------------------------------------------
    def group(self, roots: list[Node], paths: list[Path], outs: list[OutRef], layouts: list[str],
              shape: tuple[int, ...]) -> None:  # fmt: skip
        """Steps computing the nodes at ``paths`` into ``outs``."""
        if any(r.flags & (REDUCE | EXPAND) for r in roots):
            self.reduce_group(roots, paths, outs, layouts, shape)
            return
        self.kernel(roots, paths, outs, layouts, shape)

    def kernel(self, roots: list[Node], paths: list[Path], outs: list[OutRef], layouts: list[str],
               shape: tuple[int, ...], geometry: tuple | None = None) -> None:  # fmt: skip
        leaves, _ = merge_leaves(tuple(roots))
        spec = spec_for(roots, paths, leaves, layouts, self.target.name, self.target.tag)
        if self.target.count_params(spec) > self.target.max_params:
            self.split_kernel(roots, paths, outs, layouts, shape)
            return
        inputs = tuple(self.input_ref(x) for x in leaves)
        if geometry is None and shape != self.shape:  # None: the call's shape (any size)
            geometry = ("shape", shape)
        self.plan.steps.append(KernelStep(spec, inputs, tuple(outs), geometry))

    def split_kernel(self, roots: list[Node], paths: list[Path], outs: list[OutRef], layouts: list[str],
                     shape: tuple[int, ...]) -> None:  # fmt: skip
        """Too many parameters for one kernel: outputs one by one, then the largest subtrees first."""
        self.split = True
        if len(roots) > 1 or any(p for _, p in paths):
            self.outputs_apart(roots, paths, outs, layouts)
            return
        root = roots[0]
        kids = [a for a in root.args if a.leaves]
        if not kids:
            raise ShapeError(f"{root.op}: a single op has more parameters than a kernel can take")
        big = max(kids, key=lambda a: len(a.leaves))
        t = self.materialize(big)
        args = tuple(t if a is big else a for a in root.args)
        self.group([make_op(root.op, args, root.dtype, root.shape, root.device, root.attrs)], paths, outs,
                   layouts, shape)  # fmt: skip

    def outputs_apart(
        self, roots: list[Node], paths: list[Path], outs: list[OutRef], layouts: list[str]
    ) -> None:
        """Each output of a group too large for one kernel planned on its own (split further if
        it still does not fit)."""
        for (ri, p), o, lay in zip(paths, outs, layouts):
            n = node_at(roots[ri], p)
            self.group([n], [(0, ())], [o], [lay], n.shape)

    def materialize(self, n: Node) -> Node:
        """A leaf holding ``n``'s value, computed by steps added now (an ``expand`` becomes a
        broadcast view of its row)."""
        if n.op == "expand":
            return self.broadcast(self.materialize(n.args[0]), n.shape)
        if not n.leaves:  # memory or a pending GEMM already
            return n
        j = self.temp(n.shape, n.dtype)
        self.group([n], [(0, ())], [("temp", j)], ["C"], n.shape)
        return make_plan_leaf("temp", j, n.dtype, n.shape, n.device)

    def broadcast(self, node: Node, shape: tuple[int, ...]) -> Node:
        """``node`` broadcast to ``shape``: an ``expand`` node over a tree with a reduction, else the
        tree rebuilt over broadcast leaves (derived views of the group's leaves, or temporaries)."""
        if node.shape == shape:
            return node
        if node.leaves and node.flags & (REDUCE | EXPAND):
            return make_op("expand", (node,), node.dtype, shape, node.device)
        memo: dict[int, Node] = {}
        stack: list[tuple[Node, bool]] = [(node, False)]
        while stack:
            n, ready = stack.pop()
            if id(n) in memo:
                continue
            if n.op == "scalar":
                memo[id(n)] = n
            elif not n.leaves:
                memo[id(n)] = self._broadcast_leaf(n, shape)
            elif not ready:
                stack.append((n, True))
                stack.extend((a, False) for a in n.args if id(a) not in memo)
            else:
                args = tuple(memo[id(a)] for a in n.args)
                memo[id(n)] = make_op(n.op, args, n.dtype, shape, n.device, n.attrs)
        return memo[id(node)]

    def _broadcast_leaf(self, x: Node, shape: tuple[int, ...]) -> Node:
        if x.op == "matmul":
            x = make_plan_leaf("temp", self._gemm_temp_index(x), x.dtype, x.shape, x.device)
        if isinstance(x, PlanLeaf):
            op, index, estr = x.op, x.index, x.estrides
        else:
            assert isinstance(x, Buffer)
            d = x.data
            op, index, estr = "derived", self.index[id(x)], tuple(s // d.itemsize for s in d.strides)
        return make_plan_leaf(op, index, x.dtype, shape, x.device, broadcast_strides(x.shape, estr, shape))

    def _gemm_temp_index(self, x: Node) -> int:
        ref = self.input_ref(x)
        return ref[1]

    # -- reductions ----------------------------------------------------------------------------------
    def reduce_group(self, roots: list[Node], paths: list[Path], outs: list[OutRef], layouts: list[str],
                     shape: tuple[int, ...]) -> None:  # fmt: skip
        if len(roots) > 1:
            for ri, r in enumerate(roots):
                idx = [k for k, (i, _) in enumerate(paths) if i == ri]
                self.group([r], [(0, paths[k][1]) for k in idx], [outs[k] for k in idx],
                           [layouts[k] for k in idx], shape)  # fmt: skip
            return
        root = roots[0]
        new, frame = self.prepare(root)
        if new is not root:
            # the tree changed: its live subexpressions are computed on their own
            if frame is None:
                self.kernel([new], [(0, ())], [outs[0]], [layouts[0]], shape, ("shape", shape))
            else:
                self.frame_kernel(new, frame, [(0, ())], [outs[0]], [layouts[0]])
            for (_, p), o, lay in zip(paths[1:], outs[1:], layouts[1:]):
                self.group([node_at(root, p)], [(0, ())], [o], [lay], shape)
            return
        if frame is None:  # one of several roots realized together needs no reduction
            self.kernel([root], paths, outs, layouts, shape, ("shape", shape))
            return
        self.frame_kernel(root, frame, paths, outs, layouts)

    def prepare(self, root: Node) -> tuple[Node, Frame | None]:
        """``root`` rewritten so its tree is one reduction kernel in the returned frame (or a plain
        elementwise tree, frame None): what does not fit is planned into temporaries first."""
        for _ in range(64):
            if not root.flags & (REDUCE | EXPAND):
                return root, None
            frame = choose_frame(root)
            if frame is None:
                subs = {id(r): self.materialize(r) for r in reductions(root, top=True)}
                assert subs, "an expand node without a reduction below it"
            else:
                subs = incompatible(root, frame, self.materialize)
                if not subs:
                    subs = self.two_stage(root, frame)
                    if not subs:
                        return root, frame
            root = self.substitute(root, subs)
        raise RuntimeError("fusetree: reduction planning did not converge")  # pragma: no cover

    def substitute(self, root: Node, subs: dict[int, Node]) -> Node:
        """``root``'s tree with nodes replaced (by id); nodes above a replacement are rebuilt."""
        memo: dict[int, Node] = dict(subs)
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if id(n) in memo:
                continue
            if not n.leaves:
                memo[id(n)] = n
            elif not ready:
                stack.append((n, True))
                stack.extend((a, False) for a in n.args if id(a) not in memo)
            else:
                args = tuple(memo[id(a)] for a in n.args)
                if builtins.all(a is b for a, b in zip(args, n.args)):
                    memo[id(n)] = n
                elif n.op == "expand":
                    memo[id(n)] = self.broadcast(args[0], n.shape)
                else:
                    memo[id(n)] = make_op(n.op, args, n.dtype, n.shape, n.device, n.attrs)
        return memo[id(root)]

    def two_stage(self, root: Node, frame: Frame) -> dict[int, Node]:
        full = frame[0]
        chunks = self.target.chunks(*frame_sizes(frame))
        if chunks <= 1:
            return {}
        reds = [r for r in reductions(root) if frame_of(r) == frame]
        first = [r for r in reds if not r.args[0].flags & REDUCE and REDUCTIONS[r.attrs[0]].two_stage]
        if root.shape != full and len(first) == len(reds):
            return {id(r): self.stage2(r, chunks) for r in first}  # row-level result: stage 2 fuses the rest
        return {id(r): self.materialize(r) for r in first}

    def stage2(self, r: Node, chunks: int) -> Node:
        """Two-stage form of reduction ``r``: per-chunk partial accumulators, then their reduction."""
        acc = reduce_dtypes(r.attrs[0], r.args[0].dtype, self.target.name)[1]
        part_shape = r.shape + (chunks,)
        j = self.temp(part_shape, acc)
        self.frame_kernel(r, frame_of(r), [(0, ())], [("temp", j)], ["acc"], partial=chunks, acc=acc)
        leaf = make_plan_leaf("temp", j, acc, part_shape, r.device)
        kind2 = REDUCTIONS[r.attrs[0]].stage2
        dt = reduce_dtypes(kind2, acc)[0]
        node = make_op("reduce", (leaf,), dt, r.shape, r.device, (kind2, (len(r.shape),), False))
        if dt != r.dtype:
            node = make_op("astype", (node,), r.dtype, r.shape, r.device, (r.dtype,))
        return node

    def frame_kernel(self, root: Node, frame: Frame, paths: list[Path], outs: list[OutRef], layouts: list[str],
                     partial: int = 0, acc: np.dtype | None = None) -> None:  # fmt: skip
        full, axes = frame
        leaves = root.leaves
        lays = ["" if x.op == "scalar" else ("full" if x.shape == full else "row") for x in leaves]
        nodes = [node_at(root, p) for _, p in paths]
        if partial:
            olays = ["acc"]
        else:
            olays = ["full" if n.shape == full else "row" for n in nodes]
        # CPU: rows of unit stride (one reduced axis, the last, contiguous in every full array) get
        # element loops LLVM vectorizes (codegen.frame); the key tells them apart
        unit = (
            self.target.name == "cpu"
            and list(axes) == [len(full) - 1]
            and all(leaf_layout(x) in ("C", "I") for x, lay in zip(leaves, lays) if lay == "full")
            and all(lay in ("C", "I") for lay, olay in zip(layouts, olays) if olay == "full")
        )
        frame_key = FrameKey(axes, bool(partial), unit)
        spec = spec_for([root], paths, leaves, olays, self.target.name, self.target.tag,
                        frame_key, lays, len(full), [acc] if acc is not None else None)  # fmt: skip
        n_params = self.target.count_params(spec)
        if n_params > self.target.max_params:
            self.split_frame_kernel(root, frame, paths, outs, layouts, partial, acc, n_params)
            return
        nrows, rowlen = frame_sizes(frame)
        if partial:
            chunks, clen = partial, -(-rowlen // partial)
            omaps: list[tuple] = [(-1,) * len(full)]
        else:
            chunks, clen = 1, rowlen
            omaps = [stride_map(n.shape, frame) for n in nodes]
        imaps = [None if x.op == "scalar" else stride_map(x.shape, frame) for x in leaves]
        inputs = tuple(self.input_ref(x) for x in leaves)
        geometry = ("frame", full, nrows, rowlen, chunks, clen, tuple(imaps), tuple(omaps))
        self.plan.steps.append(KernelStep(spec, inputs, tuple(outs), geometry))

    def split_frame_kernel(self, root: Node, frame: Frame, paths: list[Path], outs: list[OutRef],
                           layouts: list[str], partial: int, acc: np.dtype | None, n_params: int) -> None:  # fmt: skip
        """Too many parameters for one reduction kernel (views of pending values multiply a tree's
        leaves): outputs one by one, then the largest elementwise subtree is computed into a
        temporary first, until the kernel fits."""
        self.split = True
        if len(paths) > 1 or paths[0][1]:
            self.outputs_apart([root], paths, outs, layouts)
            return
        big = largest_elementwise(root)
        if big is None:
            n_in = len(root.leaves)
            raise ShapeError(
                f"a reduction kernel over {n_in} input{'' if n_in == 1 else 's'} needs {n_params} "
                f"parameters (at most {self.target.max_params}) and has no elementwise part to compute first"
            )
        root = self.substitute(root, {id(big): self.materialize(big)})
        self.frame_kernel(root, frame, paths, outs, layouts, partial, acc)


def largest_elementwise(root: Node) -> Node | None:
    """The subtree of ``root`` (not ``root`` itself) with the most leaves, at least two, and no
    reduction or expand inside: computing it first removes the most kernel parameters."""
    best: Node | None = None
    seen: set[int] = set()
    stack = list(root.args)
    while stack:
        n = stack.pop()
        if id(n) in seen or not n.leaves:
            continue
        seen.add(id(n))
        if n.flags & (REDUCE | EXPAND):
            stack.extend(n.args)
        elif len(n.leaves) > 1 and (best is None or len(n.leaves) > len(best.leaves)):
            best = n
    return best


# ---------------------------------------------------------------------------------------------
# frames


def broadcast_strides(src: tuple[int, ...], estr: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of an array of shape ``src`` (strides ``estr``) broadcast to ``dst``."""
    pad = len(dst) - len(src)
    out = [0] * pad
    for d, (n, s) in enumerate(zip(src, estr)):
        out.append(0 if n == 1 and dst[pad + d] != 1 else s)
    return tuple(out)


def row_shapes(full: tuple[int, ...], axes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of a reduction of ``full`` over ``axes`` with and without keepdims."""
    keep = tuple(1 if d in axes else s for d, s in enumerate(full))
    return keep, tuple(s for d, s in enumerate(full) if d not in axes)


def frame_of(r: Node) -> Frame:
    return r.args[0].shape, r.attrs[1]


def frame_sizes(frame: Frame) -> tuple[int, int]:
    """(rows, row length) of a frame."""
    full, axes = frame
    return math.prod(s for d, s in enumerate(full) if d not in axes), math.prod(full[d] for d in axes)


def reductions(root: Node, top: bool = False) -> list[Node]:
    """Reductions in ``root``'s tree; with ``top``, only those reachable without passing through
    another reduction."""
    out: list[Node] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen or not n.leaves or not n.flags & REDUCE:
            continue
        seen.add(id(n))
        if n.op == "reduce":
            out.append(n)
            if top:
                continue
        stack.extend(reversed(n.args))
    return out


def choose_frame(root: Node) -> Frame | None:
    if root.op == "reduce":
        return frame_of(root)
    for r in reductions(root, top=True):
        full, axes = frame_of(r)
        if root.shape == full or root.shape in row_shapes(full, axes):
            return full, axes
    return None


def incompatible(root: Node, frame: Frame, materialize: Callable[[Node], Node]) -> dict[int, Node]:
    """Replacements (``materialize(node)``) for the nodes of ``root``'s tree that do not fit ``frame``."""
    full, axes = frame
    keep, squeezed = row_shapes(full, axes)
    subs: dict[int, Node] = {}
    seen: set[tuple[int, str]] = set()
    stack = [(root, "full" if root.shape == full else "row")]
    while stack:
        n, level = stack.pop()
        if n.op == "scalar" or (id(n), level) in seen or id(n) in subs:
            continue
        seen.add((id(n), level))
        if not n.leaves:
            continue
        if level == "full":
            if n.op == "reduce" or n.shape != full:
                subs[id(n)] = materialize(n)
            elif n.op == "expand":
                a = n.args[0]
                if (1,) * (len(full) - len(a.shape)) + a.shape == keep:
                    stack.append((a, "row"))
                else:
                    subs[id(n)] = materialize(n)
            else:
                stack.extend((a, "full") for a in n.args)
        else:
            if n.shape not in (keep, squeezed) or n.op == "expand":
                subs[id(n)] = materialize(n)
            elif n.op == "reduce":
                if frame_of(n) == frame:
                    stack.append((n.args[0], "full"))
                else:
                    subs[id(n)] = materialize(n)
            else:
                stack.extend((a, "row") for a in n.args)
    return subs


def stride_map(shape: tuple[int, ...], frame: Frame) -> tuple[int, ...]:
    """For each frame axis, which axis of an array of ``shape`` it reads (-1: stride 0)."""
    full, axes = frame
    if shape == full:
        return tuple(range(len(full)))
    keep, squeezed = row_shapes(full, axes)
    if shape == keep:
        return tuple(-1 if d in axes else d for d in range(len(full)))
    assert shape == squeezed, (shape, frame)
    out, k = [], 0
    for d in range(len(full)):
        if d in axes:
            out.append(-1)
        else:
            out.append(k)
            k += 1
    return tuple(out)


__all__ = ["PlanTarget", "node_at", "plan", "replace", "spec_for"]
