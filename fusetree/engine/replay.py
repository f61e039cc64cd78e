"""Recorded launches prepared for replay: argument templates with patch lists.

A kernel launch ``ft.jit`` recorded addresses its memory as (root, byte offset): on replay only the
roots change. :func:`prepare` lays the launch's arguments out once - every size, stride and scalar
fixed - and lists the slots that depend on a root (a device pointer on CUDA; a host array and its
element offset on the CPU). On CUDA each prepared launch owns its parameter buffer: a replay writes
only the pointers that changed since its last launch (none, in a loop over the same arrays), then
makes one ``cuLaunchKernel``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..backends.base import mapped


class Patch(NamedTuple):
    slot: int  # argument position
    root: int
    offset: int  # bytes from the root's element 0
    kind: str  # "ptr" (device address), "base" (host allocation), "eoff" (element offset), "flat" (1-D host view)
    size: int = 0  # "flat": elements
    item: int = 1  # element size, for "eoff" and "flat"


class Launch:
    """One recorded kernel launch, ready to replay (see :func:`prepare`)."""

    __slots__ = ("block", "fresh", "grid", "last", "launcher", "n", "new", "params", "patches", "reads",
                 "static", "template", "vals")  # fmt: skip

    def __init__(self, launcher: Any, template: list, patches: list[Patch], new: list[tuple], n: int,
                 grid: int, block: int) -> None:  # fmt: skip
        self.launcher = launcher
        self.template = template
        self.patches = patches
        self.new = new  # (root, shape, dtype) of the outputs the launch allocates
        self.n = n
        self.grid = grid
        self.block = block
        self.params: Any = None  # CUDA: the launch's own parameter buffer
        self.last: list | None = None  # CUDA: the pointers last written into it
        # every pointer it takes is an argument's (or a trace constant's) and it allocates nothing:
        # a replay on the very arrays of the previous one launches it as it is (set by the jit)
        self.static = False
        # host: every slot but its fresh outputs' is an argument's or a constant's. ``vals`` keeps
        # the bound argument list of a replay (fresh slots cleared) for the next one on the very
        # same arrays, which only allocates the outputs: ``fresh`` = [(slot, root, shape, dtype,
        # conv)], ``conv`` the backend's conversion of the new array into the argument (None: as is)
        self.fresh: list[tuple] | None = None
        self.vals: list | None = None
        # host, with ``fresh``: the slots over memory an earlier op of the replay made (a GEMM's
        # product, another launch's output), re-bound per replay: [(slot, root, conv, lo, hi)],
        # the value ``conv(roots[root])`` (1-D), sliced [lo:hi] unless lo is None
        self.reads: list[tuple] = []


def _c_strides(shape: tuple, item: int) -> tuple:
    out = []
    s = item
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def prepare(be: Any, op: Any, frame: bool) -> Launch | None:
    """``op`` (a recorded Kernel or FrameKernel) as a :class:`Launch`, or None when this backend
    replays it the generic way."""
    host = be.target.name == "cpu"
    if not host and be.target.name != "cuda":
        return None
    template: list = []
    patches: list[Patch] = []

    def array(root: int, offset: int, shape: tuple, strides: tuple, item: int, form: Any) -> None:
        estr = tuple(s // item for s in strides)
        if any(s % item for s in strides):
            raise ValueError("strides not a multiple of the element size")
        k = len(template)
        if host:
            if not frame and form is False:  # a C-contiguous array: a 1-D view
                patches.append(Patch(k, root, offset, "flat", math.prod(shape), item))
                template.append(None)
                return
            patches.append(Patch(k, root, offset, "base"))
            patches.append(Patch(k + 1, root, offset, "eoff", 0, item))
            template.extend((None, 0))
        else:
            patches.append(Patch(k, root, offset, "ptr"))
            template.append(0)
        if frame:
            template.extend(mapped(estr, form))
        elif form:
            template.extend(estr)

    try:
        for a in op.inputs:
            if a.desc is None:
                template.append(a.value)
            else:
                d = a.desc
                array(d.root, d.offset, d.shape, d.strides, d.dtype.itemsize, a.form)
        new = []
        forms = op.omaps if frame else [lay != "C" for lay in op.layouts]
        for o, form in zip(op.outputs, forms):
            item = o.dtype.itemsize
            if o.new:
                new.append((o.root, o.shape, o.dtype))
                array(o.root, 0, o.shape, _c_strides(o.shape, item), item, form)
            else:
                d = o.desc
                array(d.root, d.offset, d.shape, d.strides, item, form)
    except ValueError:
        return None
    k = op.launcher
    if frame:
        geometry = op.geometry
        template.extend(geometry)
        n = geometry[-4] * geometry[-3]
        if host:
            template.append(1)
            return Launch(k, template, patches, new, n, 1, 1)
        tpr, grid, block = be.frame_config(k, geometry)
        template.append(tpr)
        return _with_params(be, Launch(k, template, patches, new, n, grid, block))
    shape = op.shape
    n = math.prod(shape)
    if k.flat:
        template.append(n)
    else:
        template.extend(shape if shape else (1,))
    if host:
        return Launch(k, template, patches, new, n, 1, 1)
    template.append(n)
    grid, block = be.elementwise_config(k, shape, n)
    return _with_params(be, Launch(k, template, patches, new, n, grid, block))


def _with_params(be: Any, launch: Launch) -> Launch:
    launch.params = be.param_buffer(launch.launcher, launch.template, launch.grid, launch.block)
    return launch


def run(be: Any, launch: Launch, roots: list[Any], nodes: list[Any], fixed: bool, same: bool = False,
        stream: Any = None) -> bool:  # fmt: skip
    """Replay ``launch`` on ``roots`` (allocating the outputs it makes unless ``fixed``); False
    when a root's memory cannot be addressed this way (replay that launch the generic way).
    ``same``: the arguments are the previous replay's (a static launch's parameters hold)."""
    if launch.params is not None:  # CUDA: patch the pointers that changed, launch
        if not (same and launch.static):
            if not fixed:
                for r, shape, dtype in launch.new:
                    roots[r] = be.empty(shape, dtype)
            ptrs = [(nodes[p.root].ptr if nodes[p.root] is not None else be.ptr(roots[p.root])) + p.offset
                    for p in launch.patches]  # fmt: skip
            if ptrs != launch.last:
                be.patch_params(launch.params, launch.patches, ptrs, launch.last)
                launch.last = ptrs
        be.launch_params(launch.params, stream)
        return True
    fresh = launch.fresh
    if same and launch.vals is not None and fresh is not None and not fixed:
        vals = launch.vals  # the previous replay's binding: only the outputs are new
        for slot, r, shape, dtype, conv in fresh:
            o = roots[r] = be.empty(shape, dtype)
            vals[slot] = o if conv is None else conv(o)
        reads = launch.reads
        if reads:
            bind_reads(vals, reads, roots)
        launch.launcher(launch.n, vals)
        for slot, *_ in fresh:
            vals[slot] = None  # (the caller owns the result; the list must not keep it alive)
        for slot, *_ in reads:
            vals[slot] = None
        return True
    if not fixed:
        for r, shape, dtype in launch.new:
            roots[r] = be.empty(shape, dtype)
    vals = launch.template.copy()
    info: dict[int, tuple] = {}
    for r, _, _ in launch.new:  # fresh C-contiguous outputs: their own 1-D views
        info[r] = be.replay_root_fresh(roots[r])
    for p in launch.patches:
        bi = info.get(p.root)
        if bi is None:
            node = nodes[p.root]
            bi = argument_root(be, node) if node is not None else be.replay_root(roots[p.root])
            if bi is None or (bi[0].itemsize != p.item and p.kind != "base"):
                return False
            info[p.root] = bi
        bind_patch(vals, p, *bi)
    launch.launcher(launch.n, vals)
    if fresh is not None and not fixed:
        for slot, *_ in fresh:
            vals[slot] = None
        for slot, *_ in launch.reads:
            vals[slot] = None
        launch.vals = vals
    return True


def argument_root(be: Any, node: Any) -> tuple | None:
    """``be.replay_root`` of an argument's buffer node (its 1-D base and element offset),
    cached on the node: a loop passing the same array, or feeding back a result, binds it once."""
    bound = node.bound
    if bound is None:
        bound = node.bound = {}
    bi = bound.get("replay")
    if bi is None:
        bi = bound["replay"] = be.replay_root(node.data)
    return bi


def bind_patch(vals: list, p: Patch, base: Any, eoff: int) -> None:
    """Bind host slot ``p`` on its root's 1-D ``base`` whose element ``eoff`` is the root's first."""
    if p.kind == "flat":
        e = eoff + p.offset // p.item
        # the whole allocation (an argument or output used entire): the base itself
        vals[p.slot] = base if e == 0 and p.size == base.shape[0] else base[e : e + p.size]
    elif p.kind == "base":
        vals[p.slot] = base
    else:
        vals[p.slot] = eoff + p.offset // p.item


def bind_reads(vals: list, reads: list[tuple], roots: Any) -> None:
    """Bind a host launch's ``reads`` (see :class:`Launch`) on this replay's ``roots``."""
    for slot, r, conv, lo, hi in reads:
        a = roots[r]
        if conv is not None:
            a = conv(a)
        vals[slot] = a if lo is None else a[lo:hi]
