"""Realize pending values: fuse -> key -> cache hit or compile -> bind arguments -> launch.

The rule for multi-output kernels: when values are realized (``evaluate``, ``np.asarray``, a GEMM
operand, ``out[...] =``...), every other *live* pending fusetree array that is a subexpression of one
of them and has the same shape and device is stored by the same kernel. So in
``c2 = f*c + i*g; h2 = o*tanh(c2)``, realizing ``h2`` also stores ``c2`` if the caller still holds
it, and nothing is computed twice. Values that were dropped are never stored.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import backends, codegen, config, fuser, ir
from .errors import CompileError, DeviceError, ShapeError
from .ir import Node

# Live pending arrays (see module docstring): id(array) -> weakref(array)
PENDING: dict[int, weakref.ref] = {}

_stats: Counter[str] = Counter()
RECORDER: Any = None  # a fusetree.jit trace being recorded (see jit.py), else None
_lock = threading.RLock()


def stats() -> dict[str, int]:
    """Counters since the last :func:`reset_stats`.

    ``compiles`` kernels generated and compiled; ``cache_hits`` kernels found in the cache;
    ``launches`` every kernel fusetree launched, GEMMs included (a CUDA graph counts once);
    ``kernels`` fused elementwise and reduction launches; ``gemms`` GEMM calls; ``copies`` staging
    copies; ``traces``/``replays`` ft.jit traces and replays; ``graph_launches`` CUDA graph replays.

    >>> import fusetree as ft
    >>> ft.reset_stats(); sorted(ft.stats())[:3]
    ['cache_hits', 'compiles', 'copies']
    """
    out = {
        k: 0
        for k in (
            "compiles",
            "cache_hits",
            "launches",
            "kernels",
            "gemms",
            "copies",
            "disk_hits",
            "traces",
            "replays",
            "graph_launches",
        )
    }
    out.update(_stats)
    return out


def reset_stats() -> None:
    """Zero the counters of :func:`stats`."""
    _stats.clear()


@dataclass
class Plan:
    """A compiled kernel and what a launch needs; the second-level cache entry."""

    spec: codegen.KernelSpec
    source: str
    params: list[str]
    kernel: Any  # backend object
    extra: dict = field(default_factory=dict)

    @property
    def flat(self) -> bool:
        return self.spec.flat


_CACHE: dict[tuple, Plan] = {}  # least recently used first: evicted first


def cache_info() -> dict[str, int]:
    """Entries in the in-memory kernel cache and its bound (``options(max_cached_kernels=...)``)."""
    return {"entries": len(_CACHE), "max_entries": config.current.max_cached_kernels}


def clear_cache() -> None:
    """Drop compiled kernels from memory (the disk cache is kept)."""
    _CACHE.clear()


def _set_buffer(arr: Any, data: Any, device: str) -> None:
    arr._node = ir.make_buffer(data, device)
    arr._base = None
    PENDING.pop(id(arr), None)
    views = arr._views
    if views is not None:  # live views of this array become views of its memory (NumPy aliasing)
        arr._views = None
        for ref in views:
            v = ref()
            if v is not None and v._node.op != "buffer" and v._base is not None and v._base[0]() is arr:
                _set_buffer(v, v._base[1](data), device)


def realize(arrays: Sequence[Any]) -> None:
    """Make every array in ``arrays`` a buffer, in as few kernels as possible.

    A pending view of a live pending array is realized as a view of that array's memory: the
    viewed array is realized first (as NumPy would have computed it), so writes to either are
    seen through the other.
    """
    todo = [a for a in arrays if a._node.op != "buffer"]
    if not todo:
        return
    with _lock:
        bases = [b for b in (_live_base(a) for a in todo) if b is not None]
        if bases:
            realize(bases)  # their views become buffers in _set_buffer
            todo = [a for a in todo if a._node.op != "buffer"]
            if not todo:
                return
        for a in todo:
            if a._node.op == "matmul":
                _set_buffer(a, compute_matmul(a._node), a._node.device)
        todo = [a for a in todo if a._node.op != "buffer"]
        for (device, shape), group in fuser.group_by_shape(todo).items():
            _realize_group(group, device, shape)


def _live_base(a: Any) -> Any:
    base = a._base
    if base is None:
        return None
    b = base[0]()
    if b is None:
        a._base = None
    return b


def _unique_nodes(arrays: Sequence[Any]) -> tuple[list[Node], list[list[Any]]]:
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


def find_extras(
    roots: Sequence[Node], shape: tuple, device: str, exclude: set[int]
) -> list[tuple[list[Any], int, tuple]]:
    """Live pending arrays inside ``roots``' trees with the same shape/device: (arrays, root, path)."""
    top = max(r.uid for r in roots)
    root_ids = {id(r) for r in roots}
    cands: dict[int, list[Any]] = {}
    for k, ref in list(PENDING.items()):
        w = ref()
        if w is None or w._node.op == "buffer":
            PENDING.pop(k, None)
            continue
        n = w._node
        if n.op == "matmul":  # a pending GEMM is not inside an elementwise tree (but stays pending)
            continue
        if id(w) in exclude or n.uid >= top or n.shape != shape or n.device != device or id(n) in root_ids:
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
                found.append((ws, ri, p))
            for i, a in enumerate(n.args):
                if not a.is_leaf:
                    stack.append((a, p + (i,)))
    found.sort(key=lambda t: (t[1], t[2]))
    return found


def _realize_group(arrays: Sequence[Any], device: str, shape: tuple) -> None:
    roots, owners = _unique_nodes(arrays)
    extras = find_extras(roots, shape, device, {id(a) for a in arrays})
    paths = [(i, ()) for i in range(len(roots))] + [(ri, p) for _, ri, p in extras]
    datas = run(roots, paths, device, shape, [None] * len(paths))
    for ws, d in zip(owners + [e[0] for e in extras], datas):
        for w in ws:
            _set_buffer(w, d, device)


def realize_node(n: Node) -> Any:
    """The value of an IR node (no wrapper) as backend data."""
    if n.op == "buffer":
        return n.data
    if n.op == "matmul":
        return compute_matmul(n)
    return run([n], [(0, ())], n.device, n.shape, [None])[0]


def compute_matmul(n: Node) -> Any:
    """Run a pending GEMM once (memoized on the node)."""
    if n.memo is not None:
        return n.memo
    be = backends.get(n.device)
    ops = [realize_node(x) for x in n.args]
    out = be.matmul(ops[0], ops[1])
    if len(ops) == 4:  # a folded x@W + h@U: the second GEMM adds into the first's output
        out = be.matmul(ops[2], ops[3], out=out, accumulate=True)
    k = len(ops) // 2
    _stats["launches"] += k
    _stats["gemms"] += k
    if RECORDER is not None:
        RECORDER.gemm(be, ops, out)
    n.set_memo(out)
    return out


def run(roots: Sequence[Node], paths: Sequence[tuple[int, tuple]], device: str, shape: tuple,
        targets: Sequence[Any]) -> list[Any]:  # fmt: skip
    """Compute the nodes at ``paths`` under ``roots`` in one kernel; ``targets`` are output views
    (None: allocate a fresh C-contiguous buffer). Returns the output arrays."""
    be = _BACKENDS.get(device) or backends.get(device)
    if ir.has_reduce(roots[0]) or (len(roots) > 1 and any(ir.has_reduce(r) for r in roots)):
        from . import reductions

        return reductions.run(roots, paths, device, shape, targets)
    if len(roots) == 1:
        leaves, sharing = roots[0].leaves, None
    else:
        leaves, sharing = ir.merge_leaves(tuple(roots))
    if len(targets) == 1:
        t0 = targets[0]
        layouts: tuple[str, ...] = _C1 if t0 is None else (_out_layout(t0),)
    else:
        layouts = tuple(["C" if t is None else _out_layout(t) for t in targets])
    # the rank is in the key: a tree of scalars broadcast to a strided target has no buffer leaf
    # whose key would carry it
    key = (be.cache_tag(), tuple([r[5] for r in roots]), sharing, tuple(paths), layouts, len(shape))
    plan = lookup(key)
    if plan is None:
        spec = fuser.spec_for(roots, paths, leaves, layouts, be.target, sharing)
        if spec.param_count(be.target) > config.current.max_kernel_params:
            return _split(roots, paths, device, shape, targets)
        plan = _compile(be, spec)
        _store(key, plan)
    outs = [be.empty(shape, fuser_dtype(roots, p)) if t is None else t for p, t in zip(paths, targets)]
    if 0 in shape:
        return outs
    flat = plan.spec.flat
    args: list[Any] = []
    for leaf in leaves:
        op = leaf[0]
        if op == "buffer":
            box = leaf[12]  # a buffer leaf's box caches its kernel arguments (its data is fixed)
            b = box[0]
            if b is None:
                b = be.bind(leaf[9], leaf[11], flat)
                if be.cache_bindings and leaf[1].char != "e":
                    box[0] = b
            args.extend(b)
        elif op == "scalar":
            args.append(be.scalar_arg(leaf))
        else:
            args.extend(be.bind(compute_matmul(leaf), "C", flat))
    if RECORDER is not None:
        RECORDER.kernel(be, plan, leaves, targets, outs, layouts, shape)
    be.launch(plan, args, outs, layouts, shape)
    _stats["launches"] += 1
    _stats["kernels"] += 1
    return outs


def lookup(key: tuple) -> Plan | None:
    """The cached plan for ``key`` (counted as a hit; moved to the young end: LRU), or None."""
    plan = _CACHE.pop(key, None)
    if plan is not None:
        _CACHE[key] = plan
        _stats["cache_hits"] += 1
    return plan


def _store(key: tuple, plan: Plan) -> None:
    while _CACHE and len(_CACHE) >= config.current.max_cached_kernels:  # bounded: evict the least recent
        del _CACHE[next(iter(_CACHE))]
    _CACHE[key] = plan


_C1 = ("C",)
_BACKENDS = backends._backends


def _out_layout(t: Any) -> str:
    lay = ir.layout_class(tuple(t.shape), tuple(t.strides), t.itemsize)
    return "S" if lay == "R" else lay


def fuser_dtype(roots: Sequence[Node], path: tuple[int, tuple]) -> Any:
    return fuser.node_at(roots[path[0]], path[1]).dtype


def _compile(be: Any, spec: codegen.KernelSpec) -> Plan:
    source, params = codegen.render(spec, be.target, be.storage_dtype, be.scalar_storage)
    if config.current.debug:
        print(source)
    try:
        kernel, extra = be.compile(spec, source, params)
    except CompileError:
        raise
    except Exception as e:
        path = be.save_source(spec, source) if hasattr(be, "save_source") else "(not saved)"
        raise CompileError(
            f"kernel {spec.name} ({', '.join(o.op for o in spec.ops)}) failed to compile for "
            f"{be.target}: {type(e).__name__}: {e}\n  generated source: {path}"
        ) from e
    _stats["compiles"] += 1
    if extra.get("disk_hit"):
        _stats["disk_hits"] += 1
    return Plan(spec, source, params, kernel, extra)


def _split(roots: Sequence[Node], paths: Sequence[tuple[int, tuple]], device: str, shape: tuple,
           targets: Sequence[Any]) -> list[Any]:  # fmt: skip
    """Too many parameters for one kernel: run roots separately, then cut the largest subtrees."""
    if len(roots) > 1 or any(p for _, p in paths):
        out = []
        for (ri, p), t in zip(paths, targets):
            out.extend(run([fuser.node_at(roots[ri], p)], [(0, ())], device, shape, [t]))
        return out
    root = roots[0]
    kids = [a for a in root.args if not a.is_leaf]
    if not kids:
        raise ShapeError(f"{root.op}: a single op has more parameters than a kernel can take")
    big = max(kids, key=lambda a: len(a.leaves))
    buf = ir.make_buffer(realize_node(big), device)
    args = tuple(buf if a is big else a for a in root.args)
    new = ir.make_op(root.op, args, root.dtype, root.shape, root.device, root.attrs)
    return run([new], paths, device, shape, targets)


def assign(target: Any, device: str, value: Any) -> None:
    """``target[...] = value`` where ``target`` is a backend array view (NumPy semantics).

    Pending values that read ``target``'s memory are computed first (so they see the old data); a
    value that reads ``target`` through a different view is staged through a temporary.
    """
    import numpy as np

    from . import lazy

    with _lock:
        be = backends.get(device)
        owner = value if isinstance(value, lazy.Array) and value._node.op != "buffer" else None
        vnode = lazy.as_node(value)
        if vnode.op != "scalar" and vnode.device != device:
            raise DeviceError(f"assignment: value is on {vnode.device!r}, target on {device!r}")
        tshape = tuple(target.shape)
        if vnode.op != "scalar" and vnode.shape != tshape:
            try:
                ok = tuple(np.broadcast_shapes(vnode.shape, tshape)) == tshape
            except ValueError:
                ok = False
            if not ok:
                raise ShapeError(
                    f"could not broadcast input array from shape {vnode.shape} into shape {tshape}"
                )
        readers = []
        for ref in list(PENDING.values()):
            w = ref()
            if w is None or w is owner or w._node.op == "buffer":
                continue
            if _reads(be, w._node, target):
                readers.append(w)
        realize(readers)  # write barrier
        if vnode.op == "scalar":
            _copy(be, target, vnode.data)
            return
        if owner is not None and vnode.shape == tshape and vnode.dtype == target.dtype:
            pass  # the value itself is computed (and kept, if it reads the target) below
        elif owner is not None and _reads(be, vnode, target):
            realize([owner])
            vnode = owner._node
            owner = None
        else:
            owner = None
        if vnode.shape != tshape:
            vnode = lazy._broadcast(vnode, tshape)
        if vnode.dtype != target.dtype:
            vnode = lazy.astype(lazy.Array(vnode), target.dtype)._node
        if vnode.op == "matmul":
            vnode = ir.make_buffer(compute_matmul(vnode), device)
        if vnode.op == "buffer":
            _copy(be, target, vnode.data)
            return
        overlaps = [x for x in vnode.leaves if x.op == "buffer" and be.may_share_memory(x.data, target)]
        keep = owner is not None and bool(overlaps)  # a live value reading the target must survive it
        extras = find_extras([vnode], tshape, device, {id(owner)} if owner is not None else set())
        if any(not be.same_view(x.data, target) for x in overlaps):
            # read-after-write hazard (x[1:] = x[:-1] + 1, a[:] = a.T): stage through a temporary
            paths = [(0, ())] + [(0, p) for _, _, p in extras]
            datas = run([vnode], paths, device, tshape, [None] * len(paths))
            _copy(be, target, datas[0])
            fresh = datas[0]
            rest = datas[1:]
        else:
            paths = [(0, ())] * (2 if keep else 1) + [(0, p) for _, _, p in extras]
            datas = run([vnode], paths, device, tshape, [target] + [None] * (len(paths) - 1))
            fresh = datas[1] if keep else None
            rest = datas[2:] if keep else datas[1:]
        if keep and owner is not None:
            _set_buffer(owner, fresh, device)
        for (ws, _, _), d in zip(extras, rest):
            for w in ws:
                _set_buffer(w, d, device)


def _copy(be: Any, target: Any, src: Any) -> None:
    if RECORDER is not None:
        RECORDER.copy(be, target, src)
    be.copy(target, src)
    _stats["launches"] += 1
    _stats["copies"] += 1


def _reads(be: Any, n: Node, target: Any) -> bool:
    """Whether pending ``n`` reads memory of ``target`` (through a buffer leaf or a pending GEMM's
    operands)."""
    for x in n.leaves:
        if x.op == "buffer":
            if be.may_share_memory(x.data, target):
                return True
        elif x.op == "matmul" and x.memo is None:
            if any(a.op == "buffer" and be.may_share_memory(a.data, target) for a in x.args):
                return True
    return False
