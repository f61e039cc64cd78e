"""``ft.jit``: trace a step function once per input signature, replay its launches afterwards.

The first call with a given signature (each argument's device, shape, dtype, strides and how the
arguments' memory overlaps) runs the function eagerly while the executor describes every GEMM,
fused kernel and copy it launches, with arguments addressed as (root, byte offset, shape, strides):
roots are the call's array arguments, buffers the trace allocated, and constants (arrays the
function captured). Later calls with the same signature rebind the new arguments' memory and
re-launch the recorded kernels through the same launchers: no IR nodes, no plans.

Scalars and Python control flow are frozen at trace time (as in JAX): a function whose kernels
depend on argument *values* (``if float(x) > 0``) cannot be traced and raises.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from dataclasses import dataclass, field
from operator import is_
from typing import Any, NamedTuple

import numpy as np

from .. import backends
from ..errors import DeviceError, UnsupportedError
from ..frontend.array import Array, wrap
from ..frontend.creation import asarray
from ..ir.node import make_buffer, make_contiguous
from . import executor, horizontal, pytree, replay
from . import realization as _realize
from .state import HOOK, LOCK, STATS, STORES

_lock = threading.RLock()


class Desc(NamedTuple):
    """Memory relative to a root of the trace."""

    root: int  # index into the replay's root list
    offset: int  # bytes from the root's element [0, ..., 0]
    shape: tuple
    strides: tuple  # bytes
    dtype: np.dtype


class Arg(NamedTuple):
    """A recorded kernel input: a scalar value, or memory bound flat/strided or with a frame map."""

    desc: Desc | None
    form: Any  # strided (bool) or a reduction kernel's stride map
    value: Any = None


class Out(NamedTuple):
    """A recorded output: a buffer the trace allocated (a new root per call) or a view of memory."""

    new: bool
    root: int
    desc: Desc | None
    shape: tuple
    dtype: np.dtype


class Kernel(NamedTuple):
    launcher: Any
    inputs: tuple[Arg, ...]
    outputs: tuple[Out, ...]
    layouts: tuple[str, ...]
    shape: tuple[int, ...]


class FrameKernel(NamedTuple):
    launcher: Any
    inputs: tuple[Arg, ...]
    outputs: tuple[Out, ...]
    omaps: tuple
    geometry: tuple


class HKernel(NamedTuple):
    """A horizontal kernel (engine.horizontal): per array slot, each tensor's memory."""

    launcher: Any
    spec: Any
    sizes: tuple[int, ...]
    slots: tuple[tuple[Desc, ...], ...]  # [slot][tensor]
    scalars: tuple
    last: list  # [addresses, launch arguments] of the last replay (a replay with the same reuses them)


class Gemm(NamedTuple):
    operands: tuple[Desc, ...]  # (a, b) or (a, b, c, d): the second product accumulates
    out: int  # root


class Copy(NamedTuple):
    target: Desc
    src: Desc | None
    value: Any = None


@dataclass
class Trace:
    """What a traced call did, as ops over roots; what a replay runs."""

    device: str
    n_inputs: int
    ops: list = field(default_factory=list)
    constants: list = field(default_factory=list)  # (root index, array)
    allocs: list = field(default_factory=list)  # (root index, shape, dtype): ft.empty & co. in the trace
    n_roots: int = 0
    results: list = field(default_factory=list)  # (Desc | None, python value) per returned item
    out_tree: Any = pytree.LEAF  # the structure of what the function returns
    graph: Any = None  # a _Graph once captured (ft.jit(graph=True))
    prepared: list | None = None  # per op: a replay.Launch (kernels), else None
    replayed: Any = None  # the _LastCall of the arguments the last complete ft.jit replay ran on
    whole: list[bool] = field(default_factory=list)  # per result: a kernel's fresh output, entire
    private: set[int] = field(default_factory=set)  # staged arguments whose address changed: copied
    # a replay on the previous replay's very arguments (see _fast_program): None undecided, False
    # not possible, else the host program (run by _replay_fast unless ``quick`` runs it) or True
    # (a CUDA trace: ``quick`` runs it)
    fast: Any = None
    quick: Any = None  # the fast program as a closure, where there is one (see _fast_program)
    fixed: frozenset[int] = frozenset()  # roots that are arguments or constants (set by _prepare)
    # per GEMM op (by position in ops): its operands as the last general replay bound them, None
    # for those over memory the replay made (a fast replay re-views those)
    gemm_bound: dict[int, list] = field(default_factory=dict)

    @property
    def written_inputs(self) -> tuple[int, ...]:
        """Indices of the array arguments the trace writes into (``out[...] = ...``, ``x += 1``)."""
        roots: set[int] = set()
        for op in self.ops:
            if isinstance(op, Kernel | FrameKernel):
                roots.update(o.desc.root for o in op.outputs if o.desc is not None)
            elif isinstance(op, Copy):
                roots.add(op.target.root)
            elif isinstance(op, HKernel):  # its last slots are the outputs
                roots.update(d.root for slot in op.slots[len(op.slots) - len(op.spec.outs) :] for d in slot)
        return tuple(sorted(r for r in roots if r < self.n_inputs))


class _Recorder:
    """Receives the executor's launches during a trace (``HOOK.recorder``)."""

    def __init__(self, device: str, inputs: list[Any], horizontal: bool = True) -> None:
        self.be = backends.get(device)
        self.horizontal = horizontal  # record horizontal kernels
        self.trace = Trace(device, len(inputs))
        self.spans: list[tuple[int, int, int, Any]] = []  # (lo, hi, root index, array)
        self.root_ptr: list[int] = []
        for a in inputs:
            self._add_root(a)

    def _add_root(self, a: Any) -> int:
        k = len(self.root_ptr)
        self.root_ptr.append(self.be.ptr(a))
        lo, hi = self.be.nbytes_span(a)
        self.spans.append((lo, hi, k, a))
        self.trace.n_roots = k + 1
        return k

    def _find(self, a: Any) -> Desc | None:
        p = self.be.ptr(a)
        for lo, hi, k, _ in reversed(self.spans):
            if lo <= p < hi or (lo == p == hi):
                return Desc(k, p - self.root_ptr[k], tuple(a.shape), tuple(a.strides), a.dtype)
        return None

    def desc(self, a: Any) -> Desc:
        d = self._find(a)
        if d is None:  # memory fusetree did not allocate: a constant the trace keeps alive
            k = self._add_root(a)
            self.trace.constants.append((k, a))
            d = Desc(k, 0, tuple(a.shape), tuple(a.strides), a.dtype)
        return d

    def _args(self, described: list) -> tuple[Arg, ...]:
        return tuple(Arg(None, None, d[1]) if d[0] == "s" else Arg(self.desc(d[1]), d[2]) for d in described)

    def _outs(self, outs: list) -> tuple[Out, ...]:
        """Outputs inside known memory are views; others were allocated by the engine: new roots
        (the recorder holds every root, so no allocation can reuse a root's memory)."""
        res = []
        for o in outs:
            d = self._find(o)
            if d is None:
                res.append(Out(True, self._add_root(o), None, tuple(o.shape), o.dtype))
            else:
                res.append(Out(False, d.root, d, d.shape, d.dtype))
        return tuple(res)

    def kernel(
        self, be: Any, launcher: Any, described: list, outs: list, layouts: tuple, shape: tuple
    ) -> None:
        self.trace.ops.append(
            Kernel(launcher, self._args(described), self._outs(outs), tuple(layouts), tuple(shape))
        )

    def frame_kernel(
        self, be: Any, launcher: Any, described: list, outs: list, omaps: list, geometry: tuple
    ) -> None:
        self.trace.ops.append(
            FrameKernel(launcher, self._args(described), self._outs(outs), tuple(omaps), tuple(geometry))
        )

    def hkernel(
        self, launcher: Any, spec: Any, sizes: tuple, slot_arrays: list[list[Any]], scalars: tuple
    ) -> None:
        slots = tuple(tuple(self.desc(a) for a in arrays) for arrays in slot_arrays)
        self.trace.ops.append(HKernel(launcher, spec, sizes, slots, scalars, [None, None]))

    def alloc(self, a: Any) -> None:
        """An array the traced function created (``ft.empty``/``zeros``...): a new root per call."""
        self.trace.allocs.append((self._add_root(a), tuple(a.shape), a.dtype))

    def gemm(self, be: Any, operands: list[Any], out: Any) -> None:
        descs = tuple(self.desc(x) for x in operands)
        self.trace.ops.append(Gemm(descs, self._add_root(out)))

    def copy(self, be: Any, target: Any, src: Any) -> None:
        t = self.desc(target)
        if hasattr(src, "shape"):
            self.trace.ops.append(Copy(t, self.desc(src)))
        else:
            self.trace.ops.append(Copy(t, None, src))


def _signature(args: Any) -> tuple:
    """Device, shape, dtype and strides of each array argument, the hashable values, and how the
    arrays' memory overlaps (which earlier argument, at what byte offset): a replay is valid for
    exactly the calls whose arguments overlap the same way. (Addresses and spans are cached on the
    arguments' buffer nodes; overlaps are found by a sweep over the spans sorted by their start,
    so many arguments cost n log n, not n².)"""
    sig: list[Any] = []
    spans: list[tuple[int, int, int, int]] = []  # (lo, hi, ptr, position in sig) per array argument
    for a in args:
        if isinstance(a, Array):
            n = a._node
            if n.op != "buffer":
                _realize.realize((a,))
                n = a._node
            lo, hi = n.span  # type: ignore[attr-defined]
            spans.append((lo, hi, n.ptr, len(sig)))  # type: ignore[attr-defined]
            sig.append((n.device, n.shape, n.dtype, n.data.strides, ()))  # type: ignore[attr-defined]
        else:
            try:
                hash(a)
            except TypeError:
                raise UnsupportedError(
                    f"ft.jit: argument of type {type(a).__name__} is neither an array nor hashable"
                ) from None
            sig.append(("value", type(a), a))
    if len(spans) > 1:
        for k, pairs in _overlaps(spans).items():
            dev, shape, dt, strides, _ = sig[spans[k][3]]
            sig[spans[k][3]] = (dev, shape, dt, strides, tuple(pairs))
    return tuple(sig)


def _overlaps(spans: list[tuple[int, int, int, int]]) -> dict[int, list[tuple[int, int]]]:
    """For each array argument overlapping earlier ones: [(earlier argument, byte offset)] in
    argument order. Two spans [lo, hi) overlap when each starts before the other ends."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    found: dict[int, list[tuple[int, int]]] = {}
    active: list[int] = []  # spans started so far that may still reach the current start
    for i in order:
        lo, hi, p, _ = spans[i]
        if active:
            active = [j for j in active if spans[j][1] > lo]
            for j in active:
                lo_j, _, p_j, _ = spans[j]
                if lo_j < hi:
                    a, b = (i, j) if j < i else (j, i)
                    found.setdefault(a, []).append((b, spans[a][2] - spans[b][2]))
        active.append(i)
    for pairs in found.values():
        pairs.sort()
    return found


_node_of = operator.attrgetter("_node")


class _LastCall(NamedTuple):
    """The previous call's arguments' buffer nodes: a call passing arrays over the very same nodes
    (same memory, shape and strides) skips the signature, checked at C speed by identity. The nodes
    are held strongly: the last replay's roots hold their memory anyway."""

    tree: Any
    static: tuple
    nodes: tuple  # the array arguments' buffer nodes
    trace: Trace
    flat: bool  # positional arrays only, no static arguments: checked before any flattening
    apart: bool = False  # no two arguments' memory overlaps (the signature lists no overlap)

    @staticmethod
    def of(tree: Any, static: tuple, leaves: list, trace: Trace, apart: bool = False) -> _LastCall | None:
        if not all(isinstance(a, Array) and a._node.op == "buffer" for a in leaves):
            return None  # Python values or pending arrays: the full signature every call
        flat = not static and tree == pytree.flat_call_tree(len(leaves))
        return _LastCall(tree, static, tuple(map(_node_of, leaves)), trace, flat, apart)

    def near(self, args: tuple, fed: tuple = ()) -> list[int] | None:
        """The positions of ``args`` (positional arrays, as in this call) whose buffer node is new
        but has this call's signature: the same device, shape, dtype and strides, and memory
        apart from every other argument's as this call's was (an RNN step fed its previous
        outputs). None when some argument differs otherwise (the full signature decides).
        ``fed``: buffer nodes of memory allocated by the call just made (its results): such an
        argument overlaps no other unless another new argument is a view of it, and the other
        new arguments are checked against every argument."""
        if not self.apart:
            return None
        changed = []
        nodes = self.nodes
        for k, a in enumerate(args):
            n = getattr(a, "_node", None)
            o = nodes[k]
            if n is o:
                continue
            if (
                n is None
                or n.op != "buffer"
                or n.shape != o.shape
                or n.dtype != o.dtype
                or n.device != o.device
                or n.data.strides != o.data.strides
            ):
                return None
            changed.append(k)
        check = changed
        if fed:  # the previous call's own results need no span check, unless one is passed twice
            check, seen = [], set()  # (or two results of one value: the same array)
            for k in changed:
                n = args[k]._node
                if any(n is f for f in fed):
                    if id(n.data) in seen:
                        return None
                    seen.add(id(n.data))
                else:
                    check.append(k)
        if check:
            spans = [a._node.span for a in args]
            for k in check:
                lo, hi = spans[k]
                for j, (lo_j, hi_j) in enumerate(spans):
                    if lo < hi_j and lo_j < hi and j != k:
                        return None
        return changed

    def same(self, args: Any) -> bool:
        """Whether ``args`` are arrays over this call's very nodes."""
        try:
            return all(map(is_, map(_node_of, args), self.nodes))
        except AttributeError:  # not an Array
            return False


class JitFunction:
    """A traced function; see :func:`jit`."""

    def __init__(self, fn: Any, graph: bool = False, static_argnums: tuple[int, ...] = (),
                 static_argnames: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.fn = fn
        self.graph = graph
        self.static_argnums = frozenset(static_argnums)
        self.static_argnames = frozenset(static_argnames)
        self.plans: dict[tuple, Trace] = {}
        self._last: _LastCall | None = None
        self._last_roots: list[Any] = []  # the last replay's roots and argument buffer nodes
        self._last_nodes: list[Any] = []
        # the buffer nodes of the previous call's results when they are memory that call
        # allocated (a short replay's): fed back as arguments, they need no overlap check
        self._fed: tuple = ()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        last = self._last
        fed, self._fed = self._fed, ()
        if last is not None and last.flat and not kwargs and not STORES and len(args) == len(last.nodes):
            trace = last.trace
            if last.same(args):  # arrays over the previous call's positional buffers: nothing to flatten
                if self.graph:
                    return self._graph_replay(trace, args, last)
                if trace.fast and trace.replayed is last:  # and the previous replay ran to the end
                    quick = trace.quick
                    return quick() if quick is not None else self._replay_fast(trace, trace.fast)
                return self._replay_call(trace, args, last)
            if not self.graph and trace.fast is not False and trace.replayed is last:
                # some arguments are new arrays like the previous call's (an RNN's state fed back)
                changed = last.near(args, fed)
                if changed is not None and (trace.fast or _fast_program(trace)):
                    out = self._replay_changed(last, args, changed)
                    if out is not _GENERAL:
                        self._fed = _fresh_nodes(out)
                        return out
        nums, names = self.static_argnums, self.static_argnames
        if nums or names:
            static: tuple[tuple[Any, Any], ...] = tuple((i, a) for i, a in enumerate(args) if i in nums)
            static += tuple(sorted((k, v) for k, v in kwargs.items() if k in names))
            for _, v in static:
                try:
                    hash(v)
                except TypeError:
                    raise UnsupportedError(
                        f"ft.jit: a static argument must be hashable, got {type(v).__name__}"
                    ) from None
            dyn = (
                tuple(a for i, a in enumerate(args) if i not in nums),
                {k: v for k, v in kwargs.items() if k not in names},
            )
        else:
            static = ()
            dyn = (args, kwargs)
        if STORES:  # the call reads memory: deferred stores are written first
            HOOK.flush()
        if not kwargs and not static and not any(isinstance(a, pytree.CONTAINERS) for a in args):
            leaves, tree = list(args), pytree.flat_call_tree(len(args))  # positional leaves only
        else:
            leaves, tree = pytree.flatten(dyn)
        last = self._last
        if (
            last is not None
            and len(leaves) == len(last.nodes)
            and tree == last.tree
            and static == last.static
            and last.same(leaves)
        ):  # arrays over the previous call's buffers: the same signature
            trace = last.trace
        else:
            leaves = [
                a if isinstance(a, Array) or backends.device_of(a) is None else asarray(a) for a in leaves
            ]
            sig = (tree, static, _signature(leaves))
            found = self.plans.get(sig)
            if found is None:
                self._last = None
                return self._trace(sig, tuple(leaves), tree, static)
            trace = found
            last = self._last = _LastCall.of(
                tree, static, leaves, trace, not any(e[0] != "value" and e[-1] for e in sig[2])
            )
        if self.graph:
            return self._graph_replay(trace, tuple(leaves), last)
        return self._replay_call(trace, tuple(leaves), last)

    def _replay_changed(self, last: _LastCall, args: tuple, changed: list[int]) -> Any:
        """Replay ``last.trace`` (whose short program ran last on ``last``'s arguments) on
        ``args``, which are those but for new arrays of the same signature at ``changed``
        positions: the short program re-binds their slots only. _GENERAL (nothing run) when a new
        array's memory cannot be bound so."""
        trace = last.trace
        be = backends.get(trace.device)
        new: dict[int, tuple] = {}
        host = trace.fast is not True
        for k in changed:
            node = args[k]._node
            if host:
                bi = replay.argument_root(be, node)
                if bi is None or bi[0].itemsize != node.dtype.itemsize:
                    return _GENERAL
                new[k] = (node.data, *bi)
            else:
                new[k] = (node.data, node.ptr)
        now = last._replace(nodes=tuple(map(_node_of, args)))
        trace.replayed = None  # (stays None if the replay fails: the next one re-binds everything)
        if host:
            out = self._replay_fast(trace, trace.fast, new)
        else:
            out = trace.quick(new)
            roots = self._last_roots
            for k, (data, _) in new.items():
                roots[k] = data
        nodes = self._last_nodes
        for k in changed:
            nodes[k] = args[k]._node
        self._last = trace.replayed = now
        return out

    def _replay_call(self, trace: Trace, args: tuple, last: _LastCall | None) -> Any:
        """Replay ``trace`` on ``args`` (``last``: their _LastCall record, if any)."""
        same = last is not None and trace.replayed is last
        trace.replayed = None  # (stays None if the replay fails: the next one re-patches everything)
        out = self._replay(trace, args, same=same)
        trace.replayed = last
        return out

    def _trace(self, sig: tuple, args: tuple, tree: Any, static: tuple) -> Any:
        arrays = [a for a in args if isinstance(a, Array)]
        devices = {a.device for a in arrays}
        if len(devices) > 1:
            raise DeviceError(f"ft.jit: arguments on several devices {sorted(devices)}")
        device = devices.pop() if devices else "cpu"
        with _lock, LOCK:
            if HOOK.recorder is not None:
                raise UnsupportedError("ft.jit: nested traced calls are not supported")
            rec = _Recorder(device, [a._node.data for a in arrays])  # type: ignore[attr-defined]
            HOOK.recorder = rec
            try:
                # fresh wrappers, so realizing inside the trace never rewrites the caller's arrays
                inner = [
                    wrap(make_buffer(a._node.data, a.device)) if isinstance(a, Array) else a  # type: ignore[attr-defined]
                    for a in args
                ]
                dyn_args, dyn_kwargs = pytree.unflatten(tree, inner)
                pos = list(dyn_args)
                kw = dict(dyn_kwargs)
                for key, v in static:
                    if isinstance(key, int):
                        pos.insert(key, v)
                    else:
                        kw[key] = v
                out = self.fn(*pos, **kw)
                items, out_tree = pytree.flatten(out)
                _realize.realize([x for x in items if isinstance(x, Array)])
                if STORES:  # stores into arguments the function does not return
                    HOOK.flush()
                rec.trace.out_tree = out_tree
                for x in items:
                    rec.trace.results.append(
                        (rec.desc(x._node.data), None) if isinstance(x, Array) else (None, x)  # type: ignore[attr-defined]
                    )
            finally:
                HOOK.recorder = None
        self.plans[sig] = rec.trace
        STATS["traces"] += 1
        return out

    def _graph_replay(self, trace: Trace, args: tuple, last: _LastCall | None = None) -> Any:
        """Launch the trace's graph. Arguments only fusetree's kernels touch are *bound*: the graph
        reads and writes the caller's memory, and when an argument's address differs from the last
        call's, the kernel nodes using it are re-pointed (no copy). Arguments a GEMM or a copy
        reads are *staged*: copied into a static buffer the graph reads (and copied back when the
        function writes them). Returned arrays the function allocated are the graph's static
        buffers: the next call overwrites them (as with torch.cuda.graphs); copy what must
        survive. A returned argument is the caller's array.

        Host devices have no graphs: the trace replays on the caller's memory as ``ft.jit`` does
        (every argument bound, nothing copied; results are fresh arrays)."""
        if trace.device != "cuda":  # (its kernel launches count themselves)
            out = self._replay(trace, args, count=False)
            STATS["replays"] += 1
            STATS["graph_launches"] += 1
            return out
        g = trace.graph
        if g is None:
            g = trace.graph = _capture(self, trace, args)
            STATS["graph_captures"] += 1
        be = backends.get(trace.device)
        if g.borrowed and (last is None or g.seen is not last):
            moved = _moved_borrowed(be, g, args)
            if moved:  # a borrowed argument at another address: it gets a private copy from now on
                trace.private |= moved
                g = trace.graph = _capture(self, trace, args)
                STATS["graph_captures"] += 1
        if last is not None and g.seen is last:  # the arguments of the last launch: bound nodes hold
            datas = g.datas
            for k in g.staged:
                d, s = datas[k], g.inputs[k]
                if be.ptr(d) != be.ptr(s):
                    be.copy(s, d)
                    STATS["copies"] += 1
        else:
            datas = []
            changed = []
            k = 0
            for a in args:
                if isinstance(a, Array):
                    d = a._node.data  # type: ignore[attr-defined]
                    datas.append(d)
                    s = g.inputs[k]
                    if s is None:  # bound: the graph reads and writes the caller's memory
                        p = a._node.ptr  # type: ignore[attr-defined]
                        if p != g.addresses[k]:
                            g.addresses[k] = p
                            g.roots[k] = d
                            changed.append(k)
                    elif be.ptr(d) != be.ptr(s):  # staged: a private copy the graph reads
                        be.copy(s, d)
                        STATS["copies"] += 1
                    k += 1
            if changed:
                STATS["graph_node_updates"] += g.repoint(be, changed)
            g.datas, g.seen = datas, last
        g.launch()
        for k in g.written:
            d, s = datas[k], g.inputs[k]
            if be.ptr(d) != be.ptr(s):
                be.copy(d, s)
                STATS["copies"] += 1
        STATS["replays"] += 1
        STATS["graph_launches"] += 1
        STATS["launches"] += 1
        results = []
        for (desc, value), r in zip(trace.results, g.results):
            if desc is not None and desc.root < trace.n_inputs:
                results.append(wrap(make_buffer(_as_array(be, datas, desc), trace.device)))
            else:
                results.append(r if desc is not None else value)
        return pytree.unflatten(trace.out_tree, results)

    def _replay(self, trace: Trace, args: tuple, fixed: list[Any] | None = None, count: bool = True,
                same: bool = False) -> Any:  # fmt: skip
        """Re-launch the recorded ops on ``args``' memory. With ``fixed`` (a previous replay's
        roots), buffers the trace allocates are reused instead: what a graph capture needs.
        ``same``: ``args`` are the very arrays of the previous replay, which ran to the end (a
        launch that reads and writes only arguments is launched without re-patching)."""
        if same and fixed is None and count:
            fast = trace.fast
            if fast is None:
                fast = _fast_program(trace)
            if fast:
                quick = trace.quick
                return quick() if quick is not None else self._replay_fast(trace, fast)
        be = backends.get(trace.device)
        if same and fixed is None:  # the previous replay's arguments and constants, as they were
            roots: list[Any] = list(self._last_roots)
            nodes: list[Any] = self._last_nodes
        else:
            roots = [None] * trace.n_roots if fixed is None else list(fixed)
            nodes = [None] * trace.n_roots  # the arguments' buffer nodes (cached addresses)
            k = 0
            for a in args:
                if isinstance(a, Array):
                    roots[k] = a._node.data  # type: ignore[attr-defined]
                    nodes[k] = a._node
                    k += 1
            for i, c in trace.constants:
                roots[i] = c
        if trace.allocs:
            _allocate_created(trace, be, roots)
        n_launch = n_kernel = n_gemm = n_copy = 0
        prepared = trace.prepared or _prepare(trace, be)
        is_fixed = fixed is not None
        run = replay.run
        stream = be.stream_ptr()
        fixed_roots = trace.fixed
        for i, (op, launch) in enumerate(zip(trace.ops, prepared)):
            if launch is not None and run(be, launch, roots, nodes, is_fixed, same, stream):
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, Kernel):
                kargs = _bind_args(be, op.inputs, roots, False)
                outs = _outputs(be, roots, op.outputs, fixed is not None)
                be.launch(op.launcher, kargs, outs, op.layouts, op.shape)
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, FrameKernel):
                kargs = _bind_args(be, op.inputs, roots, True)
                outs = _outputs(be, roots, op.outputs, fixed is not None)
                be.launch_frame(op.launcher, kargs, outs, list(op.omaps), op.geometry)
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, HKernel):
                addrs = [[be.ptr(roots[d.root]) + d.offset for d in slot] for slot in op.slots]
                last = op.last
                if last[0] != addrs:
                    last[1] = horizontal.table(be, op.spec, list(op.sizes), addrs, list(op.scalars), roots)
                    last[0] = addrs
                horizontal.launch(be, op.launcher, last[1], sum(op.sizes))  # counts its launch
            elif isinstance(op, Gemm):
                ops = [_as_array(be, roots, d) for d in op.operands]
                trace.gemm_bound[i] = [o if d.root in fixed_roots else None for o, d in zip(ops, op.operands)]
                roots[op.out] = executor.gemm_sum(be, ops, roots[op.out] if fixed is not None else None)
                n_launch += len(ops) // 2
                n_gemm += len(ops) // 2
            else:
                target = _as_array(be, roots, op.target)
                be.copy(target, _as_array(be, roots, op.src) if op.src is not None else op.value)
                n_launch += 1
                n_copy += 1
        if count:
            STATS["launches"] += n_launch
            STATS["kernels"] += n_kernel
            STATS["gemms"] += n_gemm
            STATS["copies"] += n_copy
            STATS["replays"] += 1
        self._last_roots = roots
        self._last_nodes = nodes
        results = []
        device = trace.device
        for (d, v), whole in zip(trace.results, trace.whole):
            if d is None:
                results.append(v)
            elif whole:  # a kernel's fresh output, entire
                results.append(wrap(make_contiguous(roots[d.root], device, d.shape, d.dtype)))
            else:
                r = roots[d.root]
                if d.offset == 0 and r.shape == d.shape and r.strides == d.strides:  # a whole root
                    results.append(wrap(make_contiguous(r, trace.device, d.shape, d.dtype)
                                        if r.flags.c_contiguous else make_buffer(r, trace.device)))  # fmt: skip
                else:
                    results.append(
                        wrap(make_buffer(be.view_at(r, d.offset, d.shape, d.strides, d.dtype), trace.device))
                    )
        return pytree.unflatten(trace.out_tree, results)

    def _replay_fast(self, trace: Trace, prog: list[tuple], new: dict[int, tuple] | None = None) -> Any:
        """:meth:`_replay` on the previous replay's very arguments, for a trace of host launches
        whose bound argument lists hold but for their fresh outputs and the memory earlier ops
        made (re-bound), and of GEMMs (operands as the last general replay bound them): run them
        in order, wrap the results. ``new``: arguments that are new arrays like the previous
        ones, {position: (array, 1-D base, element offset)}: their slots are re-bound too."""
        roots = list(self._last_roots)
        if new:
            for k, (data, _, _) in new.items():
                roots[k] = data
        n_gemm = n_kernel = 0
        flat: dict[int, Any] = {}  # fresh outputs' 1-D views (as a replay binds them)
        for step in prog:
            if type(step) is _GemmStep:
                roots[step.out] = executor.gemm_sum(step.be, _gemm_operands(trace, step, roots, new))
                n_gemm += step.products
                continue
            n_kernel += 1
            launch, call, fresh, reads, by_arg = step
            vals = launch.vals
            if new:
                for k, (_, base, eoff) in new.items():
                    for p in by_arg.get(k, ()):
                        replay.bind_patch(vals, p, base, eoff)
            for slot, r, shape, dtype, conv in fresh:
                o = roots[r] = np.empty(shape, dtype)
                vals[slot] = flat[r] = o if conv is None else conv(o)
            if reads:
                replay.bind_reads(vals, reads, roots)
            if call is None:
                launch.launcher(launch.n, vals)
            else:
                call(*vals)
            for slot, *_ in fresh:
                vals[slot] = None  # (the caller owns the result; the list must not keep it alive)
            for slot, *_ in reads:
                vals[slot] = None
        STATS["launches"] += n_kernel + n_gemm
        STATS["kernels"] += n_kernel
        STATS["gemms"] += n_gemm
        STATS["replays"] += 1
        self._last_roots = roots
        device = trace.device
        results = []
        for d, v in trace.results:
            if d is None:
                results.append(v)
                continue
            n = make_contiguous(roots[d.root], device, d.shape, d.dtype)
            n.bound = {"replay": (flat[d.root], 0)}  # how a replay binds it, if it is fed back
            results.append(wrap(n))
        return results[0] if trace.out_tree is pytree.LEAF else pytree.unflatten(trace.out_tree, results)


_GENERAL = object()  # _replay_changed's answer when the general replay must run


def _fresh_nodes(out: Any) -> tuple:
    """The buffer nodes of a short replay's results (a flat sequence or one array; else none)."""
    if isinstance(out, Array):
        return (out._node,)
    if type(out) is tuple or type(out) is list:
        return tuple([r._node for r in out if isinstance(r, Array)])
    return ()


class _GemmStep(NamedTuple):
    """A GEMM of a fast replay (see :func:`_fast_program`)."""

    op_index: int  # the op's position in the trace (its bound operands: Trace.gemm_bound[op_index])
    out: int  # the root it makes
    made: tuple[tuple[int, Desc], ...]  # (operand position, desc) over memory made in the replay
    products: int
    be: Any
    by_arg: dict[int, tuple[tuple[int, Desc], ...]]  # argument root -> (operand position, desc)


def _gemm_operands(trace: Trace, step: _GemmStep, roots: Any, new: dict | None = None) -> list[Any]:
    """A fast replay's GEMM operands: as the last general replay bound them, but those over
    memory this replay made and over ``new`` arguments (re-viewed on ``roots``; the latter kept
    for the next replay)."""
    bound = trace.gemm_bound[step.op_index]
    ops = bound
    if step.made:
        ops = list(ops)
        for k, d in step.made:
            ops[k] = _as_array(step.be, roots, d)
    if new:
        for r in new:
            for k, d in step.by_arg.get(r, ()):
                if ops is bound:
                    ops = list(ops)
                ops[k] = bound[k] = _as_array(step.be, roots, d)
    return ops


def _fast_program(trace: Trace) -> list[tuple] | bool | None:
    """What a replay on the previous replay's very arguments runs (``Trace.fast``), and the
    closure that runs it (``Trace.quick``). Host: per op a :class:`_GemmStep` or (launch, its
    kernel function to call directly or None for the launcher, its fresh outputs and reads:
    ``Launch.fresh``, ``Launch.reads``), run by :meth:`JitFunction._replay_fast` (or the
    one-launch closure). CUDA: :func:`_device_quick`. None while a launch or GEMM has not been
    bound by a general replay yet; False (kept) for a trace that needs the general replay: a
    copy, a horizontal kernel, a batched product, a host launch reading memory neither an
    argument nor made by an earlier op, a created array, or a result that is not a fresh kernel
    output entire."""
    prepared = trace.prepared
    if prepared is None:
        return None
    if trace.allocs or not all(d is None or w for (d, _), w in zip(trace.results, trace.whole)):
        trace.fast = False
        return False
    be = backends.get(trace.device)
    gemms = []
    for i, op in enumerate(trace.ops):
        if isinstance(op, Gemm):
            if _gemm_made(op) is None:
                trace.fast = False
                return False
            if i not in trace.gemm_bound:
                return None
            made = tuple((k, d) for k, d in enumerate(op.operands) if d.root not in trace.fixed)
            by_arg: dict[int, tuple] = {}
            for k, d in enumerate(op.operands):
                if d.root < trace.n_inputs:
                    by_arg[d.root] = (*by_arg.get(d.root, ()), (k, d))
            gemms.append(_GemmStep(i, op.out, made, len(op.operands) // 2, be, by_arg))
        elif prepared[i] is None:
            trace.fast = False
            return False
    launches = [launch for launch in prepared if launch is not None]
    if launches and all(launch.params is not None for launch in launches):
        if any(launch.last is None and not launch.static for launch in launches):
            return None
        trace.quick = _device_quick(trace, gemms)
        trace.fast = trace.quick is not None
        return trace.fast
    prog: list[tuple] = []
    steps = iter(gemms)
    for launch in prepared:
        if launch is None:
            prog.append(next(steps))
            continue
        if launch.params is not None or launch.fresh is None:
            trace.fast = False
            return False
        if launch.vals is None:
            return None
        prog.append((launch, launch.launcher.direct(launch.n), launch.fresh, launch.reads,
                     _by_argument(trace, launch, lambda p: p)))  # fmt: skip
    trace.fast = prog
    trace.quick = _one_launch(trace, prog)
    return prog


def _one_launch(trace: Trace, prog: list[tuple]) -> Any:
    """:meth:`JitFunction._replay_fast` as a closure for the commonest small host program: one
    kernel called directly whose one fresh output is the function's one result (``ft.jit(lambda
    a, b, c: a * b + c)``): allocate, call, wrap, nothing walked. None for any other program."""
    if len(prog) != 1 or trace.out_tree is not pytree.LEAF or len(trace.results) != 1:
        return None
    if type(prog[0]) is _GemmStep:
        return None
    launch, call, fresh, reads, _ = prog[0]
    (d, _), whole = trace.results[0], trace.whole[0]
    if call is None or len(fresh) != 1 or reads or d is None or not whole:
        return None
    slot, root, shape, dtype, conv = fresh[0]
    if d.root != root:
        return None
    device, rshape, rdtype, empty = trace.device, d.shape, d.dtype, np.empty

    def one() -> Any:
        vals = launch.vals  # (a replay on other arguments binds a new list)
        o = empty(shape, dtype)
        vals[slot] = o if conv is None else conv(o)
        call(*vals)
        vals[slot] = None  # (the caller owns the result; the list must not keep it alive)
        STATS["launches"] += 1
        STATS["kernels"] += 1
        STATS["replays"] += 1
        return wrap(make_contiguous(o, device, rshape, rdtype))

    return one


def _by_argument(trace: Trace, launch: replay.Launch, item: Any) -> dict[int, tuple]:
    """A launch's patches on argument roots, grouped by root (``item`` of each patch)."""
    out: dict[int, tuple] = {}
    for p in launch.patches:
        if p.root < trace.n_inputs:
            out[p.root] = (*out.get(p.root, ()), item(p))
    return out


def _device_quick(trace: Trace, gemms: list[_GemmStep]) -> Any:
    """A replay on the previous replay's very arguments for a trace of prepared CUDA launches and
    GEMMs: the launches' parameter buffers hold every argument's and constant's pointer already,
    so per launch it allocates the outputs the launch makes, writes their pointers (and those of
    memory earlier ops made that it reads) into its buffer, and launches; a GEMM takes the
    operands the last general replay bound. None when a launch reads memory that is neither an
    argument, a constant nor made by an earlier op."""
    prepared = trace.prepared
    assert prepared is not None
    be = backends.get(trace.device)
    fixed = trace.fixed
    fresh: set[int] = set()
    prog: list[tuple] = []
    steps = iter(gemms)
    for launch in prepared:
        if launch is None:
            step = next(steps)
            if any(d.root not in fresh for _, d in step.made):
                return None
            fresh.add(step.out)
            prog.append(step)
            continue
        fresh.update(r for r, _, _ in launch.new)
        patches = []
        for p in launch.patches:
            if p.root in fresh:
                patches.append((p.slot, p.root, p.offset))
            elif p.root not in fixed:
                return None
        by_arg = _by_argument(trace, launch, lambda p: (p.slot, p.offset))
        prog.append((launch, launch.params, tuple(launch.new), tuple(patches), by_arg))
    results = []
    for (d, v), whole in zip(trace.results, trace.whole):
        if d is not None and (not whole or d.root not in fresh):
            return None
        results.append((d, v))
    n_gemm = sum(step.products for step in gemms)
    n_kernel = len(prog) - len(gemms)
    device, leaf, out_tree = trace.device, trace.out_tree is pytree.LEAF, trace.out_tree
    empty, ptr, set_ptr, launch_params, stream_ptr = (
        be.empty,
        be.ptr,
        be.set_param,
        be.launch_params,
        be.stream_ptr,
    )
    gemm_sum = executor.gemm_sum

    def quick(args: dict[int, tuple] | None = None) -> Any:
        """``args``: arguments that are new arrays like the previous call's, {position: (array,
        address)}: their pointers are written too."""
        stream = stream_ptr()
        made: dict[int, Any] = {}  # root -> the array this replay made (or a new argument)
        addr: dict[int, int] = {}  # and its address
        if args:
            for k, (data, address) in args.items():
                made[k] = data
                addr[k] = address
        for step in prog:
            if type(step) is _GemmStep:
                a = made[step.out] = gemm_sum(be, _gemm_operands(trace, step, made, args))
                addr[step.out] = ptr(a)
                continue
            launch, params, new, patches, by_arg = step
            for r, shape, dtype in new:
                a = made[r] = empty(shape, dtype)
                addr[r] = ptr(a)
            if args:
                for k, (_, address) in args.items():
                    for slot, offset in by_arg.get(k, ()):
                        set_ptr(params, slot, address + offset)
                launch.last = None
            if patches:
                for slot, r, offset in patches:
                    set_ptr(params, slot, addr[r] + offset)
                launch.last = None  # (the general replay re-writes every pointer)
            launch_params(params, stream)
        STATS["launches"] += n_kernel + n_gemm
        STATS["kernels"] += n_kernel
        STATS["gemms"] += n_gemm
        STATS["replays"] += 1
        out = [
            # (the address given: a result fed back as the next call's argument is bound by it)
            v if d is None else wrap(make_contiguous(made[d.root], device, d.shape, d.dtype, addr[d.root]))
            for d, v in results
        ]
        return out[0] if leaf else pytree.unflatten(out_tree, out)

    return _device_one_launch(prog, results, leaf, quick, be, device) or quick


def _device_one_launch(prog: list[tuple], results: list[tuple], leaf: bool, quick: Any, be: Any,
                       device: str) -> Any:  # fmt: skip
    """:func:`_device_quick`'s closure for the commonest device trace: one launch whose one
    fresh output is the function's one result (``ft.jit(ft.softmax)``): allocate, write its
    pointer, launch, wrap; no dicts, no loops over steps. ``quick`` runs calls with new
    arguments. None for any other program."""
    if len(prog) != 1 or not leaf or len(results) != 1 or type(prog[0]) is _GemmStep:
        return None
    launch, params, new, patches, _ = prog[0]
    d = results[0][0]
    if d is None or len(new) != 1 or new[0][0] != d.root or any(r != d.root for _, r, _ in patches):
        return None
    _, shape, dtype = new[0]
    slots = tuple((slot, offset) for slot, _, offset in patches)
    rshape, rdtype = d.shape, d.dtype
    empty, ptr, set_ptr = be.empty, be.ptr, be.set_param
    launch_params, stream_ptr = be.launch_params, be.stream_ptr

    def one(args: dict[int, tuple] | None = None) -> Any:
        if args:
            return quick(args)
        a = empty(shape, dtype)
        p = ptr(a)
        for slot, offset in slots:
            set_ptr(params, slot, p + offset)
        launch.last = None  # (the general replay re-writes every pointer)
        launch_params(params, stream_ptr())
        STATS["launches"] += 1
        STATS["kernels"] += 1
        STATS["replays"] += 1
        return wrap(make_contiguous(a, device, rshape, rdtype, p))

    return one


def _bind_args(be: Any, inputs: tuple[Arg, ...], roots: list[Any], frame: bool) -> list[Any]:
    """Kernel arguments of recorded inputs: scalars as recorded, memory rebound on ``roots``."""
    args: list[Any] = []
    for a in inputs:
        d = a.desc
        if d is None:
            args.append(a.value)
            continue
        data = be.view_at(roots[d.root], d.offset, d.shape, d.strides, d.dtype)
        args.extend(be.bind_frame(data, a.form) if frame else be.bind(data, a.form))
    return args


def _outputs(be: Any, roots: list[Any], outs: tuple[Out, ...], fixed: bool = False) -> list[Any]:
    res = []
    for o in outs:
        if o.new:
            arr = roots[o.root] if fixed else be.empty(o.shape, o.dtype)
            roots[o.root] = arr
        else:
            d = o.desc
            assert d is not None
            arr = be.view_at(roots[d.root], d.offset, d.shape, d.strides, d.dtype)
        res.append(arr)
    return res


@dataclass
class _Graph:
    """A trace as a CUDA graph."""

    inputs: list[Any]  # per array argument: its static copy (staged), or None (bound)
    roots: list[Any]  # every buffer of the trace (bound arguments: the last call's)
    results: list  # what a call returns: Arrays over static buffers (or Python values)
    launch: Any  # runs the graph once on the current stream
    written: tuple[int, ...] = ()  # staged arguments the graph writes: copied back after a launch
    exec: Any = None  # the executable graph (CUDA)
    addresses: list[int] = field(default_factory=list)  # bound arguments: the address the nodes use
    users: dict[int, list] = field(default_factory=dict)  # bound argument -> [(node, Launch)]
    datas: list = field(default_factory=list)  # the last launch's argument arrays
    seen: Any = None  # the jit's _LastCall record of that launch (its arguments, by identity)
    borrowed: frozenset[int] = frozenset()  # staged arguments whose "static copy" is the caller's array

    staged: list[int] = field(default_factory=list)  # arguments with a static copy (see __post_init__)

    def __post_init__(self) -> None:
        self.staged = [k for k, s in enumerate(self.inputs) if s is not None]

    def repoint(self, be: Any, changed: list[int]) -> int:
        """Re-point the kernel nodes that use the ``changed`` bound arguments; how many."""
        todo: dict[int, Any] = {}
        for k in changed:
            for node, launch in self.users.get(k, ()):
                todo[node] = launch
        for node, launch in todo.items():
            if isinstance(launch, HKernel):
                self.exec.set_kernel(node, *_hkernel_params(be, launch, self.roots))
                continue
            ptrs = [be.ptr(self.roots[p.root]) + p.offset for p in launch.patches]
            be.patch_params(launch.params, launch.patches, ptrs, launch.last)
            launch.last = ptrs
            self.exec.set_kernel(node, launch.launcher.func, launch.grid, launch.block, launch.params.ptr)
        return len(todo)


def _moved_borrowed(be: Any, g: _Graph, args: tuple) -> set[int]:
    """The borrowed arguments of graph ``g`` that this call passes at another address."""
    moved: set[int] = set()
    k = 0
    for a in args:
        if isinstance(a, Array):
            if k in g.borrowed and be.ptr(a._node.data) != be.ptr(g.inputs[k]):  # type: ignore[attr-defined]
                moved.add(k)
            k += 1
    return moved


def _capture(self: JitFunction, trace: Trace, args: tuple) -> _Graph:
    be = backends.get(trace.device)  # CUDA (host devices replay without a graph: _graph_replay)
    g = _build_graph(self, trace, args, be)
    if g is not None:
        return g
    datas = [a._node.data for a in args if isinstance(a, Array)]  # type: ignore[attr-defined]
    statics, groups = _static_inputs(be, datas)
    hit = {groups[k] for k in trace.written_inputs}  # overlapping arguments are copied back together
    written = tuple(k for k in range(len(datas)) if groups[k] in hit)
    new_args = []
    k = 0
    for a in args:
        if isinstance(a, Array):
            new_args.append(wrap(make_buffer(statics[k], a.device)))
            k += 1
        else:
            new_args.append(a)
    self._replay(trace, tuple(new_args), count=False)  # allocates every buffer the trace needs
    roots = self._last_roots
    # a trace the driver-built graph cannot hold: stream capture over static copies of every argument
    cp = be.xp
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            res = self._replay(trace, tuple(new_args), fixed=roots, count=False)
            results = pytree.flatten(res)[0]
        finally:
            graph = stream.end_capture()
    if hasattr(graph, "upload"):
        graph.upload(cp.cuda.get_current_stream())
    return _Graph(statics, roots, results, lambda: graph.launch(cp.cuda.get_current_stream()), written,
                  graph)  # fmt: skip


def _build_graph(self: JitFunction, trace: Trace, args: tuple, be: Any) -> _Graph | None:
    """The trace as a graph built node by node: fusetree's kernels as kernel nodes over the
    caller's memory (bound arguments), GEMMs and copies as stream-captured child graphs over
    static copies (staged arguments). None when a kernel cannot be prepared for it."""
    from ..backends.cudagraph import GraphBuilder

    prepared = _prepare(trace, be)
    if any(
        isinstance(op, Kernel | FrameKernel) and launch is None for op, launch in zip(trace.ops, prepared)
    ):
        return None
    n_in = trace.n_inputs
    datas = [a._node.data for a in args if isinstance(a, Array)]  # type: ignore[attr-defined]
    other: set[int] = set()  # roots GEMMs and copies touch
    for op in trace.ops:
        if isinstance(op, Gemm):
            other.update(d.root for d in op.operands)
        elif isinstance(op, Copy):
            other.add(op.target.root)
            if op.src is not None:
                other.add(op.src.root)
    groups = _overlap_groups(be, datas)
    staged_groups = {groups[k] for k in range(n_in) if k in other}
    staged = [k for k in range(n_in) if groups[k] in staged_groups]
    # staged arguments are borrowed (the graph reads and writes this call's arrays, kept alive by
    # the graph: no copy while later calls pass the same memory, e.g. a model's parameters);
    # those that were passed at another address once get private static copies (trace.private)
    private_groups = {groups[k] for k in staged if k in trace.private}
    private = [k for k in staged if groups[k] in private_groups]
    statics, _ = _static_inputs(be, [datas[k] for k in private])
    inputs: list[Any] = [None] * n_in
    for k in staged:
        inputs[k] = datas[k]
    for k, st in zip(private, statics):
        inputs[k] = st
    written_all = set(trace.written_inputs)
    hit = {groups[k] for k in staged if k in written_all}
    written = tuple(k for k in staged if groups[k] in hit)
    roots: list[Any] = [None] * trace.n_roots
    for k in range(n_in):
        roots[k] = inputs[k] if inputs[k] is not None else datas[k]
    for i, c in trace.constants:
        roots[i] = c
    _allocate(trace, be, roots)
    builder = GraphBuilder(be.driver)
    users: dict[int, list] = {}
    cp = be.xp
    for op, launch in zip(trace.ops, prepared):
        if launch is not None:
            ptrs = [be.ptr(roots[p.root]) + p.offset for p in launch.patches]
            be.patch_params(launch.params, launch.patches, ptrs, None)
            launch.last = ptrs
            node = builder.kernel(launch.launcher.func, launch.grid, launch.block, launch.params.ptr)
            for r in {p.root for p in launch.patches}:
                if r < n_in and inputs[r] is None:
                    users.setdefault(r, []).append((node, launch))
            continue
        if isinstance(op, HKernel):  # a kernel node over its chunk table (rebuilt when re-pointed)
            func, grid, block, params = _hkernel_params(be, op, roots)
            node = builder.kernel(func, grid, block, params)
            for r in {d.root for slot in op.slots for d in slot}:
                if r < n_in and inputs[r] is None:
                    users.setdefault(r, []).append((node, op))
            continue
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                if isinstance(op, Gemm):
                    executor.gemm_sum(be, [_as_array(be, roots, d) for d in op.operands], roots[op.out])
                else:
                    target = _as_array(be, roots, op.target)
                    be.copy(target, _as_array(be, roots, op.src) if op.src is not None else op.value)
            finally:
                child = stream.end_capture()
        builder.child(child.graph, child)
    ex = builder.instantiate()
    results = []
    for d, v in trace.results:
        results.append(v if d is None else wrap(make_buffer(_as_array(be, roots, d), trace.device)))
    addresses = [be.ptr(datas[k]) if inputs[k] is None else 0 for k in range(n_in)]

    def launch_graph() -> None:
        ex.launch(cp.cuda.get_current_stream().ptr)

    borrowed = frozenset(k for k in staged if groups[k] not in private_groups)
    return _Graph(inputs, roots, results, launch_graph, written, ex, addresses, users, borrowed=borrowed)


def _hkernel_params(be: Any, op: HKernel, roots: list[Any]) -> tuple[int, int, int, int]:
    """(function, grid, block, parameter pointers) of a horizontal kernel over ``roots``' memory;
    its chunk table and parameter buffer are kept in ``op.last``."""
    addrs = [[be.ptr(roots[d.root]) + d.offset for d in slot] for slot in op.slots]
    last = op.last
    if last[0] != addrs:
        last[1] = horizontal.table(be, op.spec, list(op.sizes), addrs, list(op.scalars), roots)
        last[0] = addrs
    k = op.launcher
    params = be.param_buffer(k, list(last[1][0]))
    last[2:] = [params]  # kept with the trace (the node copied the values)
    return k.func, max(1, last[1][1]), min(k.block, 1024), params.ptr


def _prepare(trace: Trace, be: Any) -> list:
    """The trace's kernels as replay.Launch records (once per trace), which results are a kernel's
    fresh output entire, and which launches touch only arguments and constants (static)."""
    if trace.prepared is None:
        prepared = [
            replay.prepare(be, op, isinstance(op, FrameKernel))
            if isinstance(op, Kernel | FrameKernel)
            else None
            for op in trace.ops
        ]
        made = {o.root: (o.shape, o.dtype) for op in trace.ops if isinstance(op, Kernel | FrameKernel)
                for o in op.outputs if o.new}  # fmt: skip
        trace.whole = [d is not None and d.offset == 0 and made.get(d.root) == (d.shape, d.dtype)
                       for d, _ in trace.results]  # fmt: skip
        fixed_roots = trace.fixed = frozenset(range(trace.n_inputs)) | {i for i, _ in trace.constants}
        earlier: dict[int, tuple] = {}  # roots made by the ops before: (shape, dtype) of a fresh C array
        for op, launch in zip(trace.ops, prepared):
            if isinstance(op, Gemm):
                product = _gemm_made(op)
                if product is not None:
                    earlier[op.out] = product
            if launch is None:
                continue
            launch.static = not launch.new and all(p.root in fixed_roots for p in launch.patches)
            own = {r: (shape, dtype) for r, shape, dtype in launch.new}
            if launch.params is None and all(
                p.root in fixed_roots
                or (p.root in own and p.offset == 0)  # (a frame kernel's output: "base" and "eoff" 0)
                or (p.root in earlier and p.root not in own)
                for p in launch.patches
            ):  # host: its binding holds for a replay on the same arrays but for its outputs
                launch.fresh = [(p.slot, p.root, *own[p.root], be.fresh_arg(*own[p.root]))
                                for p in launch.patches if p.root in own and p.kind != "eoff"]  # fmt: skip
                launch.reads = [_host_read(be, p, *earlier[p.root]) for p in launch.patches
                                if p.root in earlier and p.root not in own and p.kind != "eoff"]  # fmt: skip
            earlier.update(own)
        trace.prepared = prepared
    return trace.prepared


def _gemm_made(op: Gemm) -> tuple | None:
    """(shape, dtype) of the fresh C-contiguous array a replay's GEMM op makes (its products of
    2-D operands), or None for other products (a replay on the same arguments takes the
    general path for launches reading them)."""
    ds = op.operands
    if any(len(d.shape) != 2 for d in ds):
        return None
    shape = (ds[0].shape[0], ds[1].shape[1])
    dtype = np.result_type(ds[0].dtype, ds[1].dtype)
    if any((a.shape[0], b.shape[1]) != shape or np.result_type(a.dtype, b.dtype) != dtype
           for a, b in zip(ds[::2], ds[1::2])):  # fmt: skip
        return None
    return shape, dtype


def _host_read(be: Any, p: replay.Patch, shape: tuple, dtype: np.dtype) -> tuple:
    """(slot, root, conversion, lo, hi) binding a host launch's slot ``p`` to a root an earlier op
    of the replay made (a fresh C-contiguous array of ``shape`` and ``dtype``): the conversion's
    1-D view, whole ("base"; its element offset slot is fixed) or [lo:hi] ("flat")."""
    conv = be.fresh_arg(shape, dtype)
    if p.kind == "flat":
        lo = p.offset // p.item
        if not (lo == 0 and p.size == math.prod(shape)):
            return (p.slot, p.root, conv, lo, lo + p.size)
    return (p.slot, p.root, conv, None, None)


def _allocate_created(trace: Trace, be: Any, roots: list[Any]) -> None:
    """Fresh memory for the arrays the traced function created (``ft.empty`` & co.)."""
    for i, shape, dt in trace.allocs:
        if roots[i] is None:
            roots[i] = be.empty(shape, dt)


def _allocate(trace: Trace, be: Any, roots: list[Any]) -> None:
    """Allocate every buffer the trace makes (kernel outputs, GEMM results) into ``roots``."""
    _allocate_created(trace, be, roots)
    for op in trace.ops:
        if isinstance(op, Kernel | FrameKernel):
            for o in op.outputs:
                if o.new and roots[o.root] is None:
                    roots[o.root] = be.empty(o.shape, o.dtype)
        elif isinstance(op, Gemm) and roots[op.out] is None:
            a, b = op.operands[0], op.operands[1]
            shape = (a.shape[:-1] if len(a.shape) == 2 else ()) + (b.shape[1:] if len(b.shape) == 2 else ())
            roots[op.out] = be.empty(shape, np.result_type(a.dtype, b.dtype))


def _overlap_groups(be: Any, datas: list[Any]) -> list[int]:
    """For each argument, a representative of the arguments whose memory overlaps it."""
    spans = [be.nbytes_span(d) for d in datas]
    group = list(range(len(datas)))

    def find(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i in range(len(datas)):
        for j in range(i):
            if spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]:
                group[find(i)] = find(j)
    return [find(i) for i in range(len(datas))]


def _static_inputs(be: Any, datas: list[Any]) -> tuple[list[Any], list[int]]:
    """Private copies of the arguments for a graph to read and write. Arguments whose memory
    overlaps share one buffer, laid out as the caller's (the signature fixes that layout), and
    every copy keeps its original's address modulo 256 (alignment)."""
    spans = [be.nbytes_span(d) for d in datas]
    groups = _overlap_groups(be, datas)
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for r, (a, b) in zip(groups, spans):
        lo[r] = min(lo.get(r, a), a)
        hi[r] = max(hi.get(r, b), b)
    bufs = {r: be.xp.empty(hi[r] - lo[r] + 256, np.uint8) for r in lo}
    statics = []
    for r, d in zip(groups, datas):
        pad = (lo[r] - be.ptr(bufs[r])) % 256
        v = be.view_at(bufs[r], pad + be.ptr(d) - lo[r], tuple(d.shape), tuple(d.strides), d.dtype)
        be.copy(v, d)
        statics.append(v)
    return statics, groups


def _as_array(be: Any, roots: list[Any], d: Desc) -> Any:
    r = roots[d.root]
    if d.offset == 0 and tuple(r.shape) == d.shape and tuple(r.strides) == d.strides:
        return r
    return be.view_at(r, d.offset, d.shape, d.strides, d.dtype)


def jit(fn: Any = None, *, graph: bool = False, static_argnums: Any = (), static_argnames: Any = ()) -> Any:
    """Trace ``fn`` on its first call per input signature; replay the recorded launches after.

    Arguments and results may be pytrees: nested lists, tuples, named tuples and dicts of arrays
    (JAX's convention; an optimizer's parameters, a model's state). Non-array leaves and the
    arguments named by ``static_argnums``/``static_argnames`` are static: hashable values frozen
    into the trace (a new value traces again). The signature is the tree structure, the static
    values, each array's device, shape, dtype and strides, and how the arrays' memory overlaps.
    The cheapest calls pass positional arrays only: the very arrays of the previous call, or those
    but for new arrays with the same layout (a step fed its own results, ``h, c = step(x, h, c)``)
    replay without computing the signature, re-binding only what changed.

    With ``graph=True`` (CUDA), the second call builds a CUDA graph of the trace (GEMMs included,
    through fusetree's own cuBLAS handle) and every later call launches it once. Arguments only
    fusetree's kernels touch are bound: the graph works in the caller's memory, in-place updates
    included, and a new address re-points the kernel nodes using it (``stats()["graph_node_updates"]``)
    - no copy. Arguments a GEMM or a copy reads are copied into static buffers
    (``stats()["copies"]``) and copied back when the function writes them. The new arrays it
    returns are static buffers: the next call overwrites them. Graphs are freed with the jitted
    function. On host devices ``graph=True`` replays the trace as plain ``ft.jit`` does (arguments
    bound, no copies, fresh result arrays), so graph code runs there with the same in-place
    semantics.

    >>> import numpy as np, fusetree as ft
    >>> @ft.jit
    ... def f(x, y):
    ...     return ft.tanh(x * y) + 1
    >>> a = ft.asarray(np.ones(4))
    >>> ft.reset_stats(); _ = f(a, a); r = f(a, a)
    >>> ft.stats()["traces"], ft.stats()["replays"], r.numpy().round(3).tolist()
    (1, 1, [1.762, 1.762, 1.762, 1.762])
    >>> @ft.jit(static_argnames=("lr",))
    ... def sgd(params, grads, lr):
    ...     for p, g in zip(params, grads):
    ...         p -= lr * g
    ...     return {"n": len(params)}
    >>> ps = [ft.asarray(np.ones(3)), ft.asarray(np.ones(2))]
    >>> sgd(ps, [ft.asarray(np.ones(3)), ft.asarray(np.ones(2))], lr=0.5)["n"], ps[1].numpy().tolist()
    (2, [0.5, 0.5])
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    if fn is None:
        return functools.partial(
            jit, graph=graph, static_argnums=static_argnums, static_argnames=static_argnames
        )
    return JitFunction(fn, graph, tuple(static_argnums), tuple(static_argnames))
