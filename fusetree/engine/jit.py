"""``ft.jit``: trace a step function once per input signature, replay its launches afterwards.

The first call with a given signature (each argument's device, shape, dtype, strides and how the
arguments' memory overlaps) runs the function eagerly while the executor describes every GEMM,
fused kernel and copy it launches, with arguments addressed as (root, byte offset, shape, strides):
roots are the call's array arguments, buffers the trace allocated, and constants (arrays the
function captured). Later calls with the same signature rebind the new arguments' memory and
re-launch the recorded kernels through the same launchers: no IR nodes, no plans.

Scalars and Python control flow are frozen at trace time (as in JAX): a function whose kernels
depend on argument *values* (``if float(x) > 0``) cannot be traced and raises.

This module holds the front of it (signatures, the call path, the general replay); what a trace
records is in :mod:`.trace`, the short replay programs in :mod:`.quick`, CUDA graphs in
:mod:`.graphs`.
"""

from __future__ import annotations

import functools
import operator
import threading
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
from .graphs import capture, moved_borrowed
from .quick import GemmStep, fast_program, gemm_operands, prepare
from .state import HOOK, LOCK, STATS, STORES
from .trace import (
    FrameKernel,
    Gemm,
    HKernel,
    Kernel,
    Recorder,
    Trace,
    allocate_created,
    as_array,
    bind_args,
    bind_outputs,
    hkernel_table,
)

_lock = threading.RLock()


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
                if changed is not None and (trace.fast or fast_program(trace)):
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
            rec = Recorder(device, [a._node.data for a in arrays])  # type: ignore[attr-defined]
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
            g = trace.graph = capture(self, trace, args)
            STATS["graph_captures"] += 1
        be = backends.get(trace.device)
        if g.borrowed and (last is None or g.seen is not last):
            moved = moved_borrowed(be, g, args)
            if moved:  # a borrowed argument at another address: it gets a private copy from now on
                trace.private |= moved
                g = trace.graph = capture(self, trace, args)
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
                results.append(wrap(make_buffer(as_array(be, datas, desc), trace.device)))
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
                fast = fast_program(trace)
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
            allocate_created(trace, be, roots)
        n_launch = n_kernel = n_gemm = n_copy = 0
        prepared = trace.prepared or prepare(trace, be)
        is_fixed = fixed is not None
        run = replay.run
        stream = be.stream_ptr()
        fixed_roots = trace.fixed
        for i, (op, launch) in enumerate(zip(trace.ops, prepared)):
            if launch is not None and run(be, launch, roots, nodes, is_fixed, same, stream):
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, Kernel):
                kargs = bind_args(be, op.inputs, roots, False)
                outs = bind_outputs(be, roots, op.outputs, fixed is not None)
                be.launch(op.launcher, kargs, outs, op.layouts, op.shape)
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, FrameKernel):
                kargs = bind_args(be, op.inputs, roots, True)
                outs = bind_outputs(be, roots, op.outputs, fixed is not None)
                be.launch_frame(op.launcher, kargs, outs, list(op.omaps), op.geometry)
                n_launch += 1
                n_kernel += 1
            elif isinstance(op, HKernel):
                horizontal.launch(
                    be, op.launcher, hkernel_table(be, op, roots), sum(op.sizes)
                )  # counts its launch
            elif isinstance(op, Gemm):
                ops = [as_array(be, roots, d) for d in op.operands]
                trace.gemm_bound[i] = [o if d.root in fixed_roots else None for o, d in zip(ops, op.operands)]
                roots[op.out] = executor.gemm_sum(be, ops, roots[op.out] if fixed is not None else None)
                n_launch += len(ops) // 2
                n_gemm += len(ops) // 2
            else:
                target = as_array(be, roots, op.target)
                be.copy(target, as_array(be, roots, op.src) if op.src is not None else op.value)
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
            if type(step) is GemmStep:
                roots[step.out] = executor.gemm_sum(step.be, gemm_operands(trace, step, roots, new))
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
