"""Deferred stores: ``x[...] = value`` recorded now, written later, several per kernel.

With deferral on (``ft.options(defer_stores=True)``, for eager code and ``ft.jit`` traces) a
whole-array store of a pending elementwise value is *queued*: the array becomes its pending value
(later expressions read it from registers, not memory) and the memory is written at the next
*flush*. A flush writes every queued store: stores (and pending values that read their targets)
of one shape that read each other's targets are computed by one kernel with several outputs, so
an AdamW update of ``m``, ``v`` and ``p`` is one launch reading each array once.

NumPy's semantics are kept exactly:

- a value built before a store reads the old data (it is computed in the flush, before or in the
  kernel that writes the target: a kernel loads every input of an element before storing it);
- a value built after a store reads the new data: the stored-to array *is* the new value, and an
  expression reading the target's memory another way (a view taken earlier, a second wrapper of
  the same NumPy/CuPy memory) flushes first (``WATCH``, called when op nodes are made);
- reading an array (``.numpy()``, ``float()``, ``.data``, a GEMM operand, ``ft.evaluate``), a
  store that is not deferred, ``ft.synchronize()``, the end of a jit trace and ``MAX_QUEUED``
  queued stores flush;
- when reads and writes cannot be ordered inside kernels (a target read through another view, or
  by a value of another shape), the flush computes every value first and copies them in after.

Memory read directly (the NumPy/CuPy array a fusetree array wraps, held by the caller) sees a
deferred store after a flush point, as a lazy value is seen after it is realized.
"""

from __future__ import annotations

import bisect
import os
import sys
from typing import Any

from .. import config
from ..errors import FusetreeError
from ..ir import node as _node_mod
from ..ir.node import EXPAND, REDUCE, Node, address, span_of
from . import executor, horizontal
from . import realization as _r
from .state import HOOK, LOCK, PENDING, STATS, STORES

MAX_QUEUED = 4096  # a flush when this many stores are queued
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Store:
    """A queued store: ``target`` (the whole memory of the array ``owner``) gets ``node``."""

    __slots__ = ("device", "node", "owner", "span", "target", "tnode", "where")

    def __init__(self, owner: Any, tnode: Any, node: Node, span: tuple[int, int], where: tuple) -> None:
        # held until the flush: a pending view of the owner must become a view of the target's
        # memory, even when the owner itself is dropped first (``v = a[...]; v[...] = x; w = v[...];
        # del v`` leaves ``w`` aliasing ``a``; fuzzer seed 280401)
        self.owner = owner
        self.tnode = tnode  # the owner's buffer node before the store (restored by the flush)
        self.target = tnode.data
        self.device = tnode.device
        self.node = node
        self.span = span
        self.where = where  # (code object, bytecode offset) of the statement that queued it

    @property
    def site(self) -> tuple[str, int]:
        """(file, line) of the statement that queued this store (found when asked: an error, explain)."""
        return site_of(self.where)


def site_of(where: tuple) -> tuple[str, int]:
    """(file, line) of a store's ``where``: (code object, bytecode offset), or (None, 0)."""
    code, lasti = where
    if code is None:
        return ("?", 0)
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return (code.co_filename, line if line is not None else code.co_firstlineno)
    return (code.co_filename, code.co_firstlineno)


_OWNERS: dict[int, Store] = {}  # id(owner Array) -> its queued store
_LOS: list[int] = []  # queued targets' spans, sorted by start (targets never overlap each other)
_HIS: list[int] = []


def deferring() -> bool:
    """Whether whole-array stores are queued: ``ft.options(defer_stores=True)`` (eager code and
    ft.jit traces alike; off by default while the program fuzzer still finds cases to fix)."""
    return config.current.defer_stores and config.current.fuse


def queued_store(arr: Any) -> Store | None:
    s = _OWNERS.get(id(arr))
    return s if s is not None and s.owner is arr else None


def _overlapping(lo: int, hi: int) -> bool:
    i = bisect.bisect_left(_LOS, hi) - 1
    return i >= 0 and _HIS[i] > lo


def _watch(node: Any) -> None:
    """Called with each buffer operand of an op node made while stores are queued: an operand
    reading a queued target's memory (a view taken before the store, another wrapper) flushes
    first, so the new expression sees the stored data."""
    lo, hi = node.span
    if _overlapping(lo, hi):
        flush()


def defer(arr: Any, value: Any, prepare: Any) -> bool:
    """Queue ``arr[...] = value``; False when it is not deferrable (the caller stores now)."""
    vnode = value._node
    if vnode.op in ("buffer", "scalar", "matmul") or vnode.flags & (REDUCE | EXPAND):
        return False
    for x in vnode.leaves:
        if x.op != "scalar":
            break
    else:  # a fill: written now (a tree of scalars broadcast to the target would reach
        return False  # reduction kernels with no array leaf)
    with LOCK:
        rec = queued_store(arr)
        n = arr._node if rec is None else rec.tnode
        if n.op != "buffer" or (vnode.device or n.device) != n.device:
            return False
        if rec is not None and arr._views and any(r() is not None for r in arr._views):
            return False  # live views of the queued value: they must alias the new one (store now)
        if rec is None:
            lo, hi = n.span  # (cached on the buffer node)
            if _overlapping(lo, hi):  # another array over this memory has a queued store: the
                return False  # caller flushes (a read) and stores now
        pnode = prepare(vnode, n.shape, n.dtype)
        if pnode.flags & (REDUCE | EXPAND):
            return False
        f: Any = sys._getframe(2)
        while f is not None and f.f_code.co_filename.startswith(_PACKAGE):  # the user's statement
            f = f.f_back
        where = (f.f_code, f.f_lasti) if f is not None else (None, 0)  # (the line: site_of, on demand)
        if rec is not None:  # a second store to the array: its value already reads the first
            rec.node = pnode
            rec.where = where
        else:
            rec = Store(arr, n, pnode, (lo, hi), where)
            STORES.append(rec)
            _OWNERS[id(arr)] = rec
            i = bisect.bisect_left(_LOS, lo)
            _LOS.insert(i, lo)
            _HIS.insert(i, hi)
            _node_mod.WATCH = _watch
        arr._node = pnode
        STATS["stores"] += 1
        if len(STORES) >= MAX_QUEUED:
            flush()
    return True


def flush() -> None:
    """Write every queued store (see the module docstring)."""
    if not STORES:
        return
    with LOCK:
        stores = list(STORES)
        STORES.clear()
        _OWNERS.clear()
        _LOS.clear()
        _HIS.clear()
        _node_mod.WATCH = None
        STATS["flushes"] += 1
        try:
            _flush(stores)
        except FusetreeError as e:
            lines = ", ".join(f"{f}:{ln}" for f, ln in sorted({s.site for s in stores}))[:500]
            raise type(e)(f"{e} (while writing deferred stores queued at {lines})") from e


def describe() -> list[str]:
    """How the next flush would write the queued stores (for :func:`fusetree.explain`): one line per
    launch, nothing run."""
    if not STORES:
        return []
    with LOCK:
        stores = list(STORES)
        readers = _readers(stores, {id(s.owner): s.owner for s in stores})
        groups = _plan_groups(stores, readers)
    where = {}
    for s in stores:
        file, line = s.site
        where[id(s.target)] = f"{os.path.basename(file)}:{line}"
    if groups is None:
        return [f"{len(stores)} deferred store(s), staged: every value computed first, then copied "
                f"(a target is read through another view or by a value of another shape)"]  # fmt: skip
    lines = [f"{len(stores)} deferred store(s), {len(readers)} pending value(s) reading their targets:"]
    hgroups: dict[tuple, list] = {}
    for (device, shape), comps in groups.items():
        for comp in comps:
            hm = horizontal.key_of(comp, shape, device)
            hgroups.setdefault(hm[0] if hm is not None else ("plain", id(comp)), []).append((shape, comp))
    for hk, members in hgroups.items():
        n_out = len(members[0][1])
        at = sorted({where[id(e[1])] for _, comp in members for e in comp if e[1] is not None})
        src = f" (queued at {', '.join(at[:4])}{', ...' if len(at) > 4 else ''})" if at else ""
        if hk[0] != "plain" and len(members) > 1:
            shapes = ", ".join(str(s) for s, _ in members[:6]) + (", ..." if len(members) > 6 else "")
            lines.append(
                f"  horizontal launch: {len(members)} tensors [{shapes}], {n_out} output(s) each{src}"
            )
        else:
            for shape, comp in members:
                dts = sorted({str(e[0].dtype) for e in comp})
                lines.append(f"  kernel: {n_out} output(s) of shape {shape} {'/'.join(dts)}{src}")
    return lines


def _readers(stores: list[Store], owners: dict[int, Any]) -> list:
    """Live pending arrays reading a queued target (not the owners, not views of owners/readers)."""
    spans = [s.span for s in stores]
    readers = []
    for r in list(PENDING.values()):
        w = r()
        if w is None or w._node.op == "buffer" or id(w) in owners:
            continue
        if any(_r.reads(w._node, sp) for sp in spans):
            readers.append(w)
    if readers:  # views of owners and readers become views of their memory (set_buffer), not copies
        bases = set(owners) | {id(w) for w in readers}
        readers = [w for w in readers if not (w._base is not None and id(w._base[0]()) in bases)]
    return readers


# Flush plans: a loop that queues the same stores every step (an optimizer: the same targets, trees
# of the same structure over the same arrays, the same scalars) flushes the same way. The plan of a
# flush without readers is kept under its signature (per store: the target's and the non-scalar
# leaves' node uids, never reused, the tree's key, the scalars' values), so the next such flush
# launches it without grouping the stores, keying components or building chunk tables.
_PLANS: dict[tuple, list] = {}
_MAX_PLANS = 8


def _signature(stores: list[Store]) -> tuple | None:
    """The flush plan key of ``stores`` (None: not cached, a pending GEMM is read)."""
    sig: list[Any] = []
    for s in stores:
        n = s.node
        sig.append(s.tnode.uid)
        sig.append(n.key)
        for x in n.leaves:
            op = x.op
            if op == "buffer":
                sig.append(x.uid)
            elif op == "scalar":  # (its type is in the tree's key; a float zero needs its sign)
                v = x.value  # type: ignore[attr-defined]
                sig.append(v if v or type(v) is not float else horizontal.scalar_id(v))
            else:
                return None
    return tuple(sig)


def _flush(stores: list[Store]) -> None:
    owners = {id(s.owner): s.owner for s in stores}
    readers = _readers(stores, owners)
    groups = _plan_groups(stores, readers) if readers else None
    if readers and groups is None:
        # a reader the store kernels cannot compute before their writes (a pending loss, a
        # reduction over a parameter): every reader first, on the old memory; then the stores
        # plan alone (the staged flush would cost a kernel and a copy per store)
        _compute_readers(readers)
        readers = []
    sig = None
    if not readers and HOOK.recorder is None:
        sig = _signature(stores)
        plan = _PLANS.get(sig) if sig is not None else None
        if plan is not None:
            STATS["flush_plan_hits"] += 1
            _run_plan(plan, stores)
            _restore(stores)
            return
    if groups is None:
        groups = _plan_groups(stores, readers)
    if groups is None:
        _flush_staged(stores, readers)
        _restore(stores)
        return
    plan = []  # what was launched: ("h", be, launcher, table, total) or ("k", device, shape, store indices)
    index = {id(s.target): i for i, s in enumerate(stores)}
    plain: list[tuple[str, tuple, list]] = []
    hgroups: dict[tuple, list] = {}
    many = len(groups) > 1 or any(len(c) > 1 for c in groups.values())
    tptr = {id(s.target): s.tnode.ptr for s in stores}  # known: no array interface call
    for (device, shape), comps in groups.items():
        for comp in comps:
            hm = None
            if many and (HOOK.recorder is None or HOOK.recorder.horizontal):
                hm = horizontal.key_of(comp, shape, device, lambda t: tptr.get(id(t)) or address(t))
            if hm is None:
                plain.append((device, shape, comp))
            else:
                hgroups.setdefault(hm[0], []).append((shape, hm[1]))
    for hk, members in hgroups.items():
        device = hk[0]
        ctx = _r.context(device)
        if len(members) > 1 and hasattr(ctx.be, "launch_table"):
            try:
                launch = horizontal.run(ctx.be, ctx.tag, ctx.target.name, hk, [m for _, m in members])
                plan.append(("h", ctx.be, *launch))
                continue
            except ValueError:  # misaligned memory: one kernel per component
                pass
        plain.extend((device, shape, m.comp) for shape, m in members)
    for device, shape, comp in plain:
        nodes = [e[0] for e in comp]
        targets = [e[1] for e in comp]
        layouts = ["C" if t is None else _r.target_layout(t) for t in targets]
        outs = _r.run_group(nodes, [], device, shape, targets, layouts)
        for (_, t, w), o in zip(comp, outs):
            if t is None:
                _r.set_buffer(w, o, device)
        plan.append(("k", device, shape, [index[id(t)] if t is not None else -1 for t in targets]))
    if sig is not None and all(step[0] == "h" or -1 not in step[3] for step in plan):
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[sig] = plan
    _restore(stores)


def _run_plan(plan: list, stores: list[Store]) -> None:
    """Launch a cached flush plan for ``stores`` (their signature matched the plan's)."""
    for step in plan:
        if step[0] == "h":
            horizontal.launch(step[1], step[2], step[3], step[4])
        else:
            _, device, shape, idx = step
            targets = [stores[i].target for i in idx]
            _r.run_group([stores[i].node for i in idx], [], device, shape, targets,
                         [_r.target_layout(t) for t in targets])  # fmt: skip


def _restore(stores: list[Store]) -> None:
    """Each stored-to array is its memory again (unless a later store rebound it)."""
    for s in stores:
        if s.owner._node is s.node:
            _r.set_buffer(s.owner, s.target, s.device, s.tnode)


def _plan_groups(stores: list[Store], readers: list) -> dict | None:
    """Kernels for the flush: {(device, shape): [[(node, target | None, reader | None)]]}, each
    inner list one kernel (the entries that read each other's targets, merged). None when reads
    and writes cannot be ordered inside kernels (then :func:`_flush_staged`)."""
    entries: list[tuple[Node, Any, Any]] = [(s.node, s.target, None) for s in stores]
    entries += [(w._node, None, w) for w in readers]
    keys = [(s.device or "cpu", s.node.shape) for s in stores]  # a value of scalars has no device
    keys += [(w._node.device or "cpu", w._node.shape) for w in readers]
    los = sorted(range(len(stores)), key=lambda i: stores[i].span[0])
    starts = [stores[i].span[0] for i in los]
    parent = list(range(len(entries)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for k, (node, _, _) in enumerate(entries):
        for x in node.leaves or (node,):
            if x.op == "buffer":
                lo, hi = x.span  # type: ignore[attr-defined]
                j = bisect.bisect_left(starts, hi) - 1
                if j < 0:
                    continue
                t = los[j]
                if stores[t].span[1] <= lo:
                    continue
                # x reads store t's target: same kernel, the same view (element i reads what i writes).
                # A reduction is planned as kernels of its own (one would write before another reads)
                if keys[t] != keys[k] or (node.flags | stores[t].node.flags) & (REDUCE | EXPAND):
                    return None
                tn = stores[t].tnode  # the same view: same address (both cached), shape, strides
                if x.ptr != tn.ptr or x.shape != tn.shape or x.data.strides != tn.data.strides:  # type: ignore[attr-defined]
                    return None
                parent[find(k)] = find(t)
            elif x.op == "matmul":
                m = x.memo
                if m is not None:  # a computed GEMM: its result is memory a store may overwrite
                    spans = [span_of(address(m), m.shape, m.strides, m.itemsize)]
                else:  # a pending GEMM: what it reads
                    spans = [y.span for y in x.args]  # type: ignore[attr-defined]
                for lo, hi in spans:
                    j = bisect.bisect_left(starts, hi) - 1
                    if j >= 0 and stores[los[j]].span[1] > lo:
                        return None  # read before any write: the staged flush
    groups: dict[tuple, dict[int, list]] = {}
    for k, e in enumerate(entries):
        groups.setdefault(keys[k], {}).setdefault(find(k), []).append(e)
    for comps in groups.values():
        for comp in comps.values():
            if len(comp) > 1 and any(e[0].flags & (REDUCE | EXPAND) for e in comp):
                return None  # reductions are realized one by one (the staged flush)
    return {key: list(comps.values()) for key, comps in groups.items()}


def _compute_readers(readers: list) -> None:
    """Each pending reader of a store's target computed now, on the old memory, one by one (not
    through ``realize``: its live-value rule would store a pending view of an owner as a separate
    array; it must become a view of the owner's memory)."""
    for w in readers:
        n = w._node
        if n.op == "buffer":
            continue
        dev = n.device or "cpu"
        data = _r.compute_gemm(n) if n.op == "matmul" else _r.run_group([n], [], dev, n.shape)[0]
        _r.set_buffer(w, data, dev)


def _flush_staged(stores: list[Store], readers: list) -> None:
    """Every reader and value first (old memory), then the copies into the targets, in queue order."""
    _compute_readers(readers)
    fresh = [_r.run_group([s.node], [], s.device or "cpu", s.node.shape)[0] for s in stores]
    for s, f in zip(stores, fresh):
        executor.copy(_r.context(s.device or "cpu").be, s.target, f)


HOOK.flush = flush


_signature_py, _restore_py = _signature, _restore  # (the Python definitions: tests compare them)


def _setup_native() -> None:
    """Hand the queue's tables to the C module: ``x[...] = value`` of a pending value of x's shape
    and dtype (Array.__setitem__'s fast path) is queued there as :func:`defer` queues it, the
    operand watch tests overlaps there, calling :func:`_watch` only to flush, and a flush's plan
    key and the arrays' return to memory (:func:`_signature`, :func:`_restore`) run there."""
    native = _node_mod.NATIVE
    if native is None or not hasattr(native, "setup_stores"):
        return
    native.setup_stores({
        "OWNERS": _OWNERS, "LOS": _LOS, "HIS": _HIS, "Store": Store, "watch": _watch, "flush": flush,
        "PACKAGE": _PACKAGE, "globals": globals(), "scalar_id": horizontal.scalar_id,
    })  # fmt: skip
    global _signature, _restore
    _signature, _restore = native.store_signature, native.restore_stores


_setup_native()
