"""The executor: runs a plan's steps on a call's memory. The only place kernels are launched from.

Per step it binds arguments (a leaf's arguments are computed once and cached on the leaf: its memory
never changes), allocates what the step writes, and launches through the backend's prepared
launcher. Eager evaluation, ``ft.jit``'s trace and its replays all go through here; while a trace
is recorded (``HOOK.recorder``) every launch is also described to the recorder in terms of memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from ..ir.node import Buffer, Node, ViewLeaf
from ..schedule.plan import GemmStep, KernelStep, Plan
from . import kernels
from .state import HOOK, STATS


def bind_leaf(be: Any, leaf: Node, strided: bool) -> tuple:
    """Kernel arguments of one leaf (cached on a buffer leaf: its memory is fixed)."""
    if leaf.op == "scalar":
        return (be.scalar_arg(leaf),)
    assert isinstance(leaf, Buffer)
    b = leaf.bound
    if b is None:
        b = leaf.bound = {}
    else:
        a = b.get(strided)
        if a is not None:
            return a
    if type(leaf) is ViewLeaf:  # a view described by arithmetic: bound without a view object
        src = leaf.src_bound
        if src is None:
            src = leaf.src_bound = source_bound(be, leaf)
        if src:
            a = be.bind_offset(src, leaf.offset, leaf.estrides, leaf.dtype.itemsize, strided)
            if a is not None:
                b[strided] = a
                return a
    a = b[strided] = be.bind(leaf.data, strided)
    return a


RECENT_SOURCES: list[tuple] = []  # (a weak reference to a viewed array, its binding), newest first


def source_bound(be: Any, leaf: ViewLeaf) -> Any:
    """The strided binding of ``leaf``'s source (False when views of it are bound as view objects:
    the backend binds none, or it would bind a copy with other strides). The last four are
    remembered: a GEMM output's gate slices are bound one after another (a GRU's two GEMM outputs
    alternately)."""
    source = leaf.source
    for ref, src in RECENT_SOURCES:
        if ref() is source:
            return src
    vs = be.view_source(source)
    src = vs[0] if vs is not None and vs[1] == leaf.src_strides else False
    try:
        RECENT_SOURCES.insert(0, (weakref.ref(source), src))
    except TypeError:  # (an array type without weak references: not remembered)
        pass
    del RECENT_SOURCES[4:]
    return src


def ensure_launcher(step: KernelStep, be: Any, tag: str, user: tuple | None = None) -> Any:
    if step.launcher is None:
        step.launcher = kernels.launcher_for(be, tag, step.spec, user)
        spec = step.spec
        step.forms = tuple(spec.strided(lf.layout) for lf in spec.leaves)  # type: ignore[attr-defined]
        step.out_layouts = tuple(o.layout for o in spec.outs)  # type: ignore[attr-defined]
    return step.launcher


def run(plan: Plan, be: Any, tag: str, leaves: Sequence[Node], shape: tuple[int, ...], outs: list[Any],
        user: tuple | None = None) -> None:  # fmt: skip
    """Run ``plan`` for a group of ``shape`` whose leaf tuple is ``leaves``, writing ``outs``."""
    rec = HOOK.recorder
    single = plan.single
    if single is not None and rec is None:  # the common case: one elementwise kernel
        launcher = single.launcher or ensure_launcher(single, be, tag, user)
        if single.geometry is None:
            if 0 in shape:
                return
            args: list[Any] = []
            for x, strided in zip(leaves, single.forms):
                if x.op == "buffer":
                    b = x.bound  # type: ignore[attr-defined]
                    a = b.get(strided) if b is not None else None
                    if a is None:
                        a = bind_leaf(be, x, strided)
                    args.extend(a)
                else:
                    args.append(be.scalar_arg(x))
            be.launch(launcher, args, outs, single.out_layouts, shape)
            STATS["launches"] += 1
            STATS["kernels"] += 1
            return
    temps: list[Any] = [None] * len(plan.temps)
    for step in plan.steps:
        if type(step) is GemmStep:
            temps[step.out] = compute_gemm(leaves[step.leaf], be)
            continue
        assert isinstance(step, KernelStep)
        launcher = step.launcher or ensure_launcher(step, be, tag, user)
        geo = step.geometry
        out_arrays = []
        for kind, k in step.outputs:
            if kind == "out":
                out_arrays.append(outs[k])
            else:
                t = temps[k]
                if t is None:
                    spec_t = plan.temps[k]
                    t = temps[k] = be.empty(spec_t.shape, spec_t.dtype)
                out_arrays.append(t)
        if geo is not None and geo[0] == "frame":
            _, full, nrows, rowlen, chunks, clen, imaps, omaps = geo
            if nrows == 0 or rowlen == 0:
                continue
            args = []
            described: list | None = [] if rec is not None else None
            for ref, m in zip(step.inputs, imaps):
                if m is None:
                    v = be.scalar_arg(leaves[ref[1]])
                    args.append(v)
                    if described is not None:
                        described.append(("s", v))
                    continue
                if described is None and ref[0] == "leaf":  # memory of a leaf: bound once per map
                    x = leaves[ref[1]]
                    b = x.bound  # type: ignore[attr-defined]
                    if b is None:
                        b = x.bound = {}  # type: ignore[attr-defined]
                    a = b.get(("frame", m))
                    if a is None:
                        a = b[("frame", m)] = be.bind_frame(x.data, m)  # type: ignore[attr-defined]
                    args.extend(a)
                    continue
                data = _array_of(ref, leaves, temps, be)
                args.extend(be.bind_frame(data, m))
                if described is not None:
                    described.append(("b", data, m))
            geometry = (*full, nrows, rowlen, chunks, clen)
            if rec is not None:
                rec.frame_kernel(be, launcher, described, out_arrays, list(omaps), geometry)
            be.launch_frame(launcher, args, out_arrays, list(omaps), geometry)
        else:
            kshape = shape if geo is None else geo[1]
            if 0 in kshape:
                continue
            args = []
            described = [] if rec is not None else None
            for ref, strided in zip(step.inputs, step.forms):  # type: ignore[attr-defined]
                if ref[0] == "leaf":
                    x = leaves[ref[1]]
                    if x.op == "scalar":
                        v = be.scalar_arg(x)
                        args.append(v)
                        if described is not None:
                            described.append(("s", v))
                        continue
                    args.extend(bind_leaf(be, x, strided))
                    if described is not None:
                        described.append(("b", x.data, strided))  # type: ignore[attr-defined]
                    continue
                data = _array_of(ref, leaves, temps, be)
                args.extend(be.bind(data, strided))
                if described is not None:
                    described.append(("b", data, strided))
            if rec is not None:
                rec.kernel(be, launcher, described, out_arrays, step.out_layouts, kshape)  # type: ignore[attr-defined]
            be.launch(launcher, args, out_arrays, step.out_layouts, kshape)  # type: ignore[attr-defined]
        STATS["launches"] += 1
        STATS["kernels"] += 1


def _array_of(ref: tuple, leaves: Sequence[Node], temps: list[Any], be: Any) -> Any:
    kind = ref[0]
    if kind == "leaf":
        return leaves[ref[1]].data  # type: ignore[attr-defined]
    if kind == "temp":
        return temps[ref[1]]
    if kind == "view":
        return be.restride(leaves[ref[1]].data, ref[2], ref[3])  # type: ignore[attr-defined]
    return be.restride(temps[ref[1]], ref[2], ref[3])  # "tview"


def gemm_sum(be: Any, ops: list[Any], out: Any = None) -> Any:
    """``ops[0] @ ops[1] + ops[2] @ ops[3] + ...`` (into ``out``): a folded ``x@W + h@U`` is one
    output the later products accumulate into."""
    out = be.gemm(ops[0], ops[1], out=out)
    for k in range(2, len(ops), 2):
        out = be.gemm(ops[k], ops[k + 1], out=out, accumulate=True)
    return out


def compute_gemm(n: Node, be: Any) -> Any:
    """Run a pending GEMM once (memoized on the node)."""
    if n.memo is not None:
        return n.memo
    ops = [x.data for x in n.args]  # type: ignore[attr-defined]
    out = gemm_sum(be, ops)
    k = len(ops) // 2
    STATS["launches"] += k
    STATS["gemms"] += k
    rec = HOOK.recorder
    if rec is not None:
        rec.gemm(be, ops, out)
    n.memo = out
    return out


def copy(be: Any, target: Any, src: Any) -> None:
    """``target[...] = src`` (an array or a scalar)."""
    rec = HOOK.recorder
    if rec is not None:
        rec.copy(be, target, src)
    be.copy(target, src)
    STATS["launches"] += 1
    STATS["copies"] += 1
