"""Realize pending values: group -> plan (cached) -> executor. Stores: ``target[...] = value``.

The live-value rule: when values are realized (``evaluate``, ``np.asarray``, a GEMM operand,
``out[...] =``...), every other *live* pending fusetree array that is a subexpression of one of them
and has the same shape and device is stored by the same kernel. So in
``c2 = f*c + i*g; h2 = o*tanh(c2)``, realizing ``h2`` also stores ``c2`` if the caller still holds
it, and nothing is computed twice. Values that were dropped are never stored.

A cache hit costs: the scan of the live pending arrays (none but the values realized, in a step
function's natural code), one dict lookup for the plan, and the executor's binding and launch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import backends, config
from ..errors import DeviceError
from ..ir.node import (
    EXPAND,
    REDUCE,
    Node,
    address,
    layout_class,
    make_buffer,
    make_contiguous,
    make_op,
    merge_leaves,
    span_of,
)
from ..schedule import planner
from ..schedule.plan import Plan
from . import executor, kernels
from .kernels import TICK
from .state import HOOK, LOCK, PENDING, STATS, STORES, recent_pending

_ref = weakref.ref


class _Context:
    """Per device: the backend, its cache tag and planning target for the options in force, and
    the plan cache (one per tag)."""

    __slots__ = ("be", "opts", "plans", "tag", "target")

    def __init__(self, be: Any) -> None:
        self.be = be
        self.opts: Any = None
        self.tag = ""
        self.target: Any = None
        self.plans: dict[tuple, Plan] = {}


_CONTEXTS: dict[str, _Context] = {}
_PLAN_CACHES: dict[str, dict[tuple, Plan]] = {}


def context(device: str) -> _Context:
    ctx = _CONTEXTS.get(device)
    if ctx is None:
        ctx = _CONTEXTS[device] = _Context(backends.get(device))
    opts = config.current
    if ctx.opts is not opts:
        be = ctx.be
        ctx.opts = opts
        ctx.tag = be.cache_tag()
        ctx.target = planner.PlanTarget(be.target.name, ctx.tag, opts.max_kernel_params, be.frame_chunks,
                                        be.count_params)  # fmt: skip
        ctx.plans = _PLAN_CACHES.setdefault(f"{ctx.tag}|{opts.max_kernel_params}", {})
    return ctx


def clear_cache() -> None:
    """Drop compiled kernels and plans from memory (the disk cache is kept)."""
    kernels.clear()
    for plans in _PLAN_CACHES.values():
        plans.clear()


# ---------------------------------------------------------------------------------------------
# arrays <-> memory


def set_buffer(arr: Any, data: Any, device: str, node: Node | None = None) -> None:
    """Make ``arr`` a buffer over ``data``; its live views become views of ``data``."""
    old = arr._node
    arr._node = make_buffer(data, device) if node is None else node
    if HOOK.tape is not None:
        HOOK.tape(old, arr._node)
    arr._base = None
    r = arr._pref
    if r is not None:
        PENDING.pop(id(r), None)
        arr._pref = None
    views = arr._views
    if views is not None:  # live views of this array become views of its memory (NumPy aliasing)
        arr._views = None
        for r in views:
            v = r()
            if v is not None and v._node.op != "buffer" and v._base is not None and v._base[0]() is arr:
                set_buffer(v, v._base[1](data), device)


def _live_base(a: Any) -> Any:
    base = a._base
    if base is None:
        return None
    b = base[0]()
    if b is None:
        a._base = None
    return b


def realize(arrays: Sequence[Any]) -> None:
    """Make every array in ``arrays`` a buffer, in as few kernels as possible.

    A pending view of a live pending array is realized as a view of that array's memory: the
    viewed array is realized first (as NumPy would have computed it), so writes to either are
    seen through the other.
    """
    if _REALIZE_HIT is not None and _REALIZE_HIT(arrays):
        return  # (the C accelerator: a cached one-kernel plan storing nothing else, see _setup_native)
    if STORES:  # a read: deferred stores are written first
        HOOK.flush()
    if len(arrays) == 1:  # the common case: one value, not a view of a pending one, not a GEMM
        a = arrays[0]
        n = a._node
        if n.op == "buffer":
            return
        if a._base is None and n.op != "matmul":
            with LOCK:
                if a._node is n and (len(PENDING) <= 1 or _alone(n)):
                    if _realize_one(a, n):
                        return
                    if n.flags & _BY_SIZE:  # a reduction alone, not planned yet: no search for others
                        _realize_group((a,), n.device or "cpu", n.shape, search=False)
                        return
    elif len(arrays) > 1:
        # several pending values of one shape (an RNN step's h and c): straight to their group
        with LOCK:
            if _one_group(arrays):
                n = arrays[0]._node
                _realize_group(arrays, n.device or "cpu", n.shape)
                return
    todo = [a for a in arrays if a._node.op != "buffer"]
    if not todo:
        return
    with LOCK:
        bases = [b for b in (_live_base(a) for a in todo) if b is not None]
        if bases:
            realize(bases)  # their views become buffers in set_buffer
            todo = [a for a in todo if a._node.op != "buffer"]
        for a in todo:
            n = a._node
            if n.op == "matmul":
                set_buffer(a, compute_gemm(n), n.device)
        todo = [a for a in todo if a._node.op != "buffer"]
        if len(todo) == 1:
            n = todo[0]._node
            _realize_group(todo, n.device or "cpu", n.shape)
            return
        groups: dict[tuple, list] = {}
        for a in todo:
            n = a._node
            groups.setdefault((n.device or "cpu", n.shape), []).append(a)
        for (device, shape), group in groups.items():
            _realize_group(group, device, shape)


_BY_SIZE = REDUCE | EXPAND


def _one_group(arrays: Sequence[Any]) -> bool:
    """Whether ``arrays`` are pending elementwise values (no GEMM or reduction at the root, not
    views of other pending arrays) of one device and shape: one group, nothing to sort first."""
    n0 = arrays[0]._node
    device, shape = n0.device, n0.shape
    for a in arrays:
        n = a._node
        if (
            not n.leaves
            or n.flags & _BY_SIZE
            or a._base is not None
            or n.device != device
            or n.shape != shape
        ):
            return False
    return True


def _alone(n: Node) -> bool:
    """Whether no other live pending value is inside ``n``'s tree (made between its oldest op node
    and itself): then realizing it stores nothing else. ``n``'s own array is not returned by the
    search (its node is ``top``)."""
    lo = n.lo
    for w in recent_pending(lo, n.uid):
        m = w._node
        if m.op != "buffer" and m.uid >= lo:
            return False
    return True


def _realize_one(a: Any, n: Node) -> bool:
    """Realize a single value whose plan is cached (no other live pending value can be inside its
    tree): a context check, one lookup (a reduction's plan is keyed by its leaves' sizes and
    strides too, as in :func:`run_group`), allocate, bind, launch. False: not cached."""
    device = n.device
    ctx = _CONTEXTS.get(device)
    if ctx is None or ctx.opts is not config.current:
        return False
    shape = n.shape
    plans = ctx.plans
    key = (n.key, len(shape))
    be = ctx.be
    if n.flags & _BY_SIZE:
        key += _geometry(shape, n.leaves)
        plan = plans.get(key)
        if plan is None:
            return False
        outs = [be.empty(s, dt) for s, dt in plan.outputs]
    else:
        plan = plans.get(key)
        if plan is None or plan is _BY_SHAPE:
            return False
        outs = [be.empty(shape, n.dtype)]
    STATS["plan_hits"] += 1
    STATS["cache_hits"] += 1
    plan.used = next(TICK)
    executor.run(plan, be, ctx.tag, n.leaves, shape, outs, (plans, key, plan))
    out = outs[0]
    a._node = make_contiguous(out, device, shape, n.dtype)
    if HOOK.tape is not None:
        HOOK.tape(n, a._node)
    r = a._pref
    if r is not None:
        PENDING.pop(id(r), None)
        a._pref = None
    if a._views is not None:
        set_buffer(a, out, device, a._node)
    return True


def _realize_group(arrays: Sequence[Any], device: str, shape: tuple[int, ...], search: bool = True) -> None:
    """Compute ``arrays`` (pending values of one device and ``shape``) in one plan, with the live
    pending values inside their trees (``search``: False when none can be there)."""
    if len(arrays) == 1:
        roots: list[Node] = [arrays[0]._node]
        owners: list[list[Any]] = [[arrays[0]]]
    else:
        roots, owners = _unique_nodes(arrays)
    extras = find_extras(roots, shape, device, arrays) if search and len(PENDING) > len(arrays) else []
    outs = run_group(roots, [(e.root, e.path) for e in extras], device, shape)
    for ws, o, r in zip(owners + [e.arrays for e in extras], outs, roots + [e.node for e in extras]):
        node = make_contiguous(o, device, r.shape, r.dtype)
        for w in ws:
            set_buffer(w, o, device, node)


def run_group(roots: list[Node], extra_paths: list[tuple[int, tuple]], device: str, shape: tuple[int, ...],
              targets: Sequence[Any] | None = None, layouts: Sequence[str] | None = None) -> list[Any]:  # fmt: skip
    """Compute ``roots`` (and the nodes at ``extra_paths``) in one plan; ``targets`` are output
    views (None: fresh C-contiguous arrays, allocated here). Returns the output arrays."""
    ctx = context(device)
    if len(roots) == 1:
        root = roots[0]
        leaves: tuple = root.leaves
        sharing = None
    else:
        leaves, sharing = merge_leaves(tuple(roots))
    n_out = len(roots) + len(extra_paths)
    paths = [(i, ()) for i in range(len(roots))] + list(extra_paths)
    if layouts is None:
        layouts = ("C",) * n_out
    if n_out == 1 and targets is None:
        key: tuple = (roots[0].key, len(shape))
    else:
        key = (tuple([r.key for r in roots]), sharing, tuple(paths), tuple(layouts), len(shape))
    flags = 0
    for r in roots:
        flags |= r.flags
    by_shape = bool(flags & (REDUCE | EXPAND))  # reduction plans are made for the exact sizes and strides
    plans = ctx.plans
    if by_shape:
        key += _geometry(shape, leaves)
        plan = plans.get(key)
    else:
        plan = plans.get(key)
        if plan is _BY_SHAPE:  # a split elementwise plan: made for the exact sizes too
            by_shape = True
            key += _geometry(shape, leaves)
            plan = plans.get(key)
    if plan is None:
        plan = planner.plan(roots, paths, layouts, leaves, shape, ctx.target)
        if plan.keyed_by_shape and not by_shape:
            plans[key] = _BY_SHAPE
            key += _geometry(shape, leaves)
        if len(plans) > 4 * config.current.max_cached_kernels:
            plans.pop(next(iter(plans)))
        plans[key] = plan
        STATS["plans"] += 1
    else:
        STATS["plan_hits"] += 1
        STATS["cache_hits"] += 1
    plan.used = next(TICK)
    be = ctx.be
    if not plan.keyed_by_shape:  # an elementwise plan: every output has the call's shape
        if targets is None:
            outs = [be.empty(shape, dt) for _, dt in plan.outputs]
        else:
            outs = [be.empty(shape, dt) if t is None else t for (_, dt), t in zip(plan.outputs, targets)]
    elif targets is None:
        outs = [be.empty(s, dt) for s, dt in plan.outputs]
    else:
        outs = [be.empty(s, dt) if t is None else t for (s, dt), t in zip(plan.outputs, targets)]
    executor.run(plan, be, ctx.tag, leaves, shape, outs, (plans, key, plan))
    return outs


_BY_SHAPE: Any = Plan()  # marks a structure whose plans depend on the call's sizes


def _geometry(shape: tuple[int, ...], leaves: Sequence[Node]) -> tuple:
    return (shape, tuple([(x.shape, x.data.strides) if x.op == "buffer" else x.shape for x in leaves]))  # type: ignore[attr-defined]


def _unique_nodes(arrays: Sequence[Any]) -> tuple[list[Node], list[list[Any]]]:
    if len(arrays) == 2:  # (an RNN step's h and c)
        a, b = arrays
        if a._node is not b._node:
            return [a._node, b._node], [[a], [b]]
        return [a._node], [[a, b]]
    nodes: list[Node] = []
    owners: list[list[Any]] = []
    where: dict[int, int] = {}
    for a in arrays:
        i = where.get(id(a._node))
        if i is None:
            where[id(a._node)] = len(nodes)
            nodes.append(a._node)
            owners.append([a])
        else:
            owners[i].append(a)
    return nodes, owners


class Extra(NamedTuple):
    """A live pending value inside a realized tree: stored by the same kernel."""

    arrays: list[Any]  # the live Arrays holding it
    root: int  # which root's tree
    path: tuple[int, ...]  # child positions from that root
    node: Node


def find_extras(roots: Sequence[Node], shape: tuple, device: str, exclude: Sequence[Any]) -> list[Extra]:
    """Live pending arrays inside ``roots``' trees with the same shape and device. A candidate is
    walked for only if its node was made between the oldest op node of the roots' trees and the
    newest root (``lo <= uid < top``); only arrays registered since ``lo`` are looked at."""
    top = max(r.uid for r in roots)
    lo = min(r.lo for r in roots)
    root_ids = {id(r) for r in roots}
    skip = {id(a) for a in exclude}
    cands: dict[int, list[Any]] = {}
    for w in recent_pending(lo, top):
        n = w._node
        if n.op == "buffer" or n.op == "matmul" or n.uid < lo or id(w) in skip or id(n) in root_ids:
            continue  # (recent_pending checked uid < top)
        if n.shape != shape or (n.device or "cpu") != device:
            continue
        cands.setdefault(id(n), []).append(w)
    if not cands:
        return []
    found = []
    seen: set[int] = set()
    for ri, r in enumerate(roots):
        stack: list[tuple[Node, tuple]] = [(r, ())]
        while stack and cands:
            n, p = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            ws = cands.pop(id(n), None)
            if ws is not None:
                found.append(Extra(ws, ri, p, n))
            for i, a in enumerate(n.args):
                if a.leaves:
                    stack.append((a, p + (i,)))
    found.sort(key=lambda e: (e.root, e.path))
    return found


def realize_node(n: Node) -> Any:
    """The value of an IR node (no wrapper) as backend data. Deferred stores are not flushed: a
    pending tree reads a queued store's target only as it was before the store (engine.stores)."""
    if n.op == "buffer":
        return n.data  # type: ignore[attr-defined]
    if n.op == "matmul":
        return compute_gemm(n)
    with LOCK:
        return run_group([n], [], n.device or "cpu", n.shape)[0]


def compute_gemm(n: Node) -> Any:
    """Run a pending GEMM once (memoized on the node); no flush, as :func:`realize_node`."""
    with LOCK:
        return executor.compute_gemm(n, backends.get(n.device))


def fold_sliced_sum(arr: Any) -> bool:
    """Before ``arr`` is sliced: when its value is ``GEMM + array`` (either order, one float dtype)
    on a backend with ``fold_sliced_sums``, compute the sum into memory (``arr`` becomes a buffer,
    as a GEMM is before a view of it) and return True; False changes nothing. Not while a jit
    recording, a gradient trace or deferred stores are active (they see the plain slices)."""
    n = arr._node
    if n.op != "add" or len(n.args) != 2 or arr._base is not None:
        return False
    if HOOK.recorder is not None or HOOK.tape is not None or STORES:
        return False
    g, b = n.args
    if g.op == "buffer" and b.op == "matmul":
        g, b = b, g
    if g.op != "matmul" or b.op != "buffer" or n.dtype.kind != "f" or not (g.dtype == b.dtype == n.dtype):
        return False
    be = context(n.device).be
    if not be.fold_sliced_sums:
        return False
    with LOCK:
        # a GEMM sum computed here is this array's memory: the bias is added into it (not memoized
        # on the GEMM node: another tree reading it computes it again); one computed before is read
        fresh = g.memo is None
        out = executor.compute_gemm(g, be)
        if fresh:
            g.memo = None
            out += b.data  # type: ignore[attr-defined]
        else:
            out = out + b.data  # type: ignore[attr-defined]
        set_buffer(arr, out, n.device, make_contiguous(out, n.device, n.shape, n.dtype))
    return True


# ---------------------------------------------------------------------------------------------
# stores


def reads(n: Node, span: tuple[int, int]) -> bool:
    """Whether pending ``n`` reads memory in ``span`` (through a buffer leaf or a pending GEMM's
    operands)."""
    lo, hi = span
    for x in n.leaves or (n,):
        if x.op == "buffer":
            a, b = x.span  # type: ignore[attr-defined]
            if a < hi and lo < b:
                return True
        elif x.op == "matmul":
            m = x.memo
            if m is not None:  # computed already: its result is memory a store may overwrite
                a, b = span_of(address(m), m.shape, m.strides, m.itemsize)
                if a < hi and lo < b:
                    return True
                continue
            for y in x.args:
                a, b = y.span  # type: ignore[attr-defined]
                if a < hi and lo < b:
                    return True
    return False


def write_barrier(be: Any, target: Any, owner: Any = None) -> tuple[int, int]:
    """Realize the pending values that read ``target``'s memory (they must see it before a write);
    returns the target's byte span."""
    tspan = span_of(be.ptr(target), tuple(target.shape), tuple(target.strides), target.dtype.itemsize)
    readers = []
    for r in list(PENDING.values()):
        w = r()
        if w is None or w is owner or w._node.op == "buffer":
            continue
        if reads(w._node, tspan):
            readers.append(w)
    realize(readers)
    return tspan


def assign(target: Any, device: str, vnode: Node, owner: Any,
           prepare: Callable[[Node, tuple[int, ...], Any], Node], held: bool = True) -> None:  # fmt: skip
    """``target[...] = value`` where ``target`` is a backend array view (NumPy semantics).

    ``vnode`` is the value's node, ``owner`` the pending Array holding it (or None) and ``held``
    whether anything but the statement holds that Array (a temporary need not survive the
    store: no extra output keeps it), ``prepare``
    broadcasts and casts a node to the target (the frontend's). Pending values that read
    ``target``'s memory are computed first (so they see the old data); a value that reads
    ``target`` through a different view is staged through a temporary.
    """
    if STORES:
        HOOK.flush()
    with LOCK:
        ctx = context(device)
        be = ctx.be
        if vnode.op != "scalar" and vnode.device and vnode.device != device:
            raise DeviceError(f"assignment: value is on {vnode.device!r}, target on {device!r}")
        tshape = tuple(target.shape)
        tspan = write_barrier(be, target, owner)
        if not held:
            owner = None
        if vnode.op == "scalar":
            executor.copy(be, target, vnode.value)  # type: ignore[attr-defined]
            return
        if owner is not None and vnode.shape == tshape and vnode.dtype == target.dtype:
            pass  # the value itself is computed (and kept, if it reads the target) below
        elif owner is not None and reads(vnode, tspan):
            realize((owner,))
            vnode = owner._node
            owner = None
        else:
            owner = None
        vnode = prepare(vnode, tshape, target.dtype)
        if vnode.op == "matmul":
            vnode = make_buffer(compute_gemm(vnode), device)
        if vnode.op == "buffer":
            executor.copy(be, target, vnode.data)  # type: ignore[attr-defined]
            return
        overlaps = [x for x in vnode.leaves if x.op == "buffer" and _overlap(x.span, tspan)]  # type: ignore[attr-defined]
        keep = owner is not None and bool(overlaps)  # a live value reading the target must survive it
        extras = find_extras([vnode], tshape, device, [owner] if owner is not None else [])
        extra_paths = [(0, e.path) for e in extras]
        if any(not be.same_view(x.data, target) for x in overlaps):  # type: ignore[attr-defined]
            # read-after-write hazard (x[1:] = x[:-1] + 1, a[:] = a.T): stage through a temporary
            datas = run_group([vnode], extra_paths, device, tshape)
            executor.copy(be, target, datas[0])
            fresh = datas[0]
            rest = datas[1:]
        else:
            lay = target_layout(target)
            paths = [(0, ())] if keep else []
            n_extra = len(paths) + len(extra_paths)
            datas = run_group([vnode], paths + extra_paths, device, tshape, [target] + [None] * n_extra,
                              [lay] + ["C"] * n_extra)  # fmt: skip
            fresh = datas[1] if keep else None
            rest = datas[2:] if keep else datas[1:]
        if keep and owner is not None:
            set_buffer(owner, fresh, device)
        for e, d in zip(extras, rest):
            for w in e.arrays:
                set_buffer(w, d, device)


def write_group(values: Sequence[Any], targets: Sequence[Any], device: str) -> None:
    """Compute pending arrays ``values`` into ``targets`` (backend views of fresh memory nothing
    else reads; None: new memory, and the array becomes a buffer over it), one kernel per shape.
    The autodiff's scatter of several cotangents into the slices of one gradient (an LSTM's four
    gates) is one launch this way."""
    if STORES:
        HOOK.flush()
    with LOCK:
        ctx = context(device)
        groups: dict[tuple, list] = {}
        for v, t in zip(values, targets):
            n = v._node
            if n.op == "buffer" or n.op == "matmul":
                data = n.data if n.op == "buffer" else compute_gemm(n)  # type: ignore[attr-defined]
                if t is None:
                    set_buffer(v, data, device)
                else:
                    executor.copy(ctx.be, t, data)
                continue
            if t is not None and n.dtype != t.dtype:
                n = make_op("astype", (n,), t.dtype, n.shape, device, (t.dtype,))
            groups.setdefault(n.shape, []).append((n, t, v))
        for shape, items in groups.items():
            lays = ["C" if t is None else target_layout(t) for _, t, _ in items]
            outs = run_group([n for n, _, _ in items], [], device, shape, [t for _, t, _ in items], lays)
            for (_, t, v), o in zip(items, outs):
                if t is None:
                    set_buffer(v, o, device)


def target_layout(t: Any) -> str:
    """The layout class a kernel writes output view ``t`` with (a broadcast inner axis, "R", is
    written through its strides, "S")."""
    lay = layout_class(tuple(t.shape), tuple(t.strides), t.dtype.itemsize)
    return "S" if lay == "R" else lay


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# The C accelerator's realize of a plan hit (ir.node.NATIVE): values of one shape and device whose
# one-kernel plan is cached, with no other live pending value, no queued store and no trace or
# gradient tape recording, are realized in one C call doing what realize -> _realize_group ->
# run_group -> executor.run do for them (key, lookup, allocation, binding, launch, the arrays made
# buffers); it declines everything else, changing nothing, and the Python above runs.
_REALIZE_HIT: Any = None


def _setup_native() -> None:
    global _REALIZE_HIT
    from ..ir import node as _nm

    native = _nm.NATIVE
    if native is None or not hasattr(native, "setup_engine"):
        return
    try:
        native.setup_engine({
            "CONTEXTS": _CONTEXTS, "STATS": STATS, "TICK": TICK, "HOOK": HOOK, "STORES": STORES,
            "LOCK": LOCK, "BY_SHAPE": _BY_SHAPE, "BY_SIZE": _BY_SIZE, "bind_leaf": executor.bind_leaf,
            "make_contiguous": make_contiguous, "set_buffer": set_buffer, "source_bound": executor.source_bound,
            "RECENT_SOURCES": executor.RECENT_SOURCES, "FLOAT16": np.dtype(np.float16),
        })  # fmt: skip
    except (TypeError, KeyError, RuntimeError) as e:  # a stale build or a front end left in Python
        import warnings

        warnings.warn(f"fusetree._native's engine part does not fit ({e}); realizing in Python", stacklevel=1)
        return
    _REALIZE_HIT = native.realize_hit


_setup_native()
