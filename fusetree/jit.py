"""``ft.jit``: trace a step function once per input signature, replay its launches afterwards.

The first call with a given signature (each argument's device, shape, dtype, strides and which
arguments alias) runs the function eagerly while recording every GEMM, fused kernel and copy with
its arguments expressed as (root buffer, byte offset, shape, strides): roots are the call's array
arguments, buffers the trace allocated, and constants (arrays the function captured). Later calls
with the same signature rebind the new arguments' memory and re-launch the recorded kernels
directly: no IR nodes, no keys, no fusion. Outputs are fresh arrays each call.

Scalars and Python control flow are frozen at trace time (as in JAX): a function whose kernels
depend on argument *values* (``if float(x) > 0``) cannot be traced and raises.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import backends, ir, runtime
from .errors import UnsupportedError
from .lazy import Array, asarray

_lock = threading.RLock()


@dataclass
class _Desc:
    root: int  # index into the replay's root list
    offset: int  # bytes from the root's element [0, ..., 0]
    shape: tuple
    strides: tuple
    dtype: np.dtype


@dataclass
class _Plan:
    device: str
    n_inputs: int
    ops: list = field(default_factory=list)
    constants: list = field(default_factory=list)
    n_roots: int = 0
    results: list = field(default_factory=list)  # (_Desc | None, python value) per returned item
    single: bool = False
    graph: Any = None  # a _Graph once captured (ft.jit(graph=True) on CUDA)

    @property
    def written_inputs(self) -> tuple[int, ...]:
        """Indices of the array arguments the plan writes into (``out[...] = ...``, ``x += 1``)."""
        roots: set[int] = set()
        for op in self.ops:
            if op[0] in ("kernel", "frame"):
                roots.update(o[1].root for o in op[3] if o[0] == "view")
            elif op[0] == "copy":
                roots.add(op[1].root)
        return tuple(sorted(r for r in roots if r < self.n_inputs))


class _Recorder:
    def __init__(self, device: str, inputs: list[Any]) -> None:
        self.be = backends.get(device)
        self.device = device
        self.plan = _Plan(device, len(inputs))
        self.spans: list[tuple[int, int, int, Any]] = []  # (lo, hi, root index, array)
        self.root_ptr: list[int] = []
        for a in inputs:
            self._add_root(a)

    def _add_root(self, a: Any) -> int:
        k = len(self.root_ptr)
        self.root_ptr.append(self.be.ptr(a))
        lo, hi = self.be.nbytes_span(a)
        self.spans.append((lo, hi, k, a))
        self.plan.n_roots = k + 1
        return k

    def desc(self, a: Any) -> _Desc:
        p = self.be.ptr(a)
        for lo, hi, k, _ in reversed(self.spans):
            if lo <= p < hi or (lo == p == hi):
                return _Desc(k, p - self.root_ptr[k], tuple(a.shape), tuple(a.strides), a.dtype)
        k = self._add_root(a)  # memory fusetree did not allocate: a constant the plan keeps alive
        self.plan.constants.append((k, a))
        return _Desc(k, 0, tuple(a.shape), tuple(a.strides), a.dtype)

    def kernel(
        self, be: Any, plan: Any, leaves: Any, targets: Any, outs: Any, layouts: Any, shape: Any
    ) -> None:
        args: list[Any] = []
        for leaf in leaves:
            if leaf.op == "scalar":
                args.append(("s", be.scalar_arg(leaf)))
            else:
                data = leaf.data if leaf.op == "buffer" else runtime.compute_matmul(leaf)
                args.append(("b", self.desc(data), leaf.layout))
        self.plan.ops.append(
            ("kernel", plan, args, self._out_descs(targets, outs), tuple(layouts), tuple(shape))
        )

    def frame_kernel(self, be: Any, plan: Any, leaves: Any, datas: Any, maps: Any, targets: Any, outs: Any,
                     omaps: Any, geometry: tuple) -> None:  # fmt: skip
        args: list[Any] = []
        for leaf, data, m in zip(leaves, datas, maps):
            if leaf.op == "scalar":
                args.append(("s", be.scalar_arg(leaf)))
            else:
                args.append(("b", self.desc(data), m))
        self.plan.ops.append(
            ("frame", plan, args, self._out_descs(targets, outs), tuple(omaps), tuple(geometry))
        )

    def _out_descs(self, targets: Any, outs: Any) -> list[Any]:
        """Fresh outputs become new roots; outputs written into targets are views."""
        return [
            ("new", self._add_root(o), tuple(o.shape), o.dtype) if t is None else ("view", self.desc(o))
            for t, o in zip(targets, outs)
        ]

    def gemm(self, be: Any, operands: list[Any], out: Any) -> None:
        descs = [self.desc(x) for x in operands]
        self.plan.ops.append(("gemm", descs, self._add_root(out), tuple(out.shape), out.dtype))

    def copy(self, be: Any, target: Any, src: Any) -> None:
        s = ("b", self.desc(src)) if hasattr(src, "shape") else ("s", src)
        self.plan.ops.append(("copy", self.desc(target), s))


def _signature(args: tuple) -> tuple:
    """Device, shape, dtype and strides of each array argument, the hashable values, and how the
    arrays' memory overlaps (which earlier argument, at what byte offset): a replay is valid for
    exactly the calls whose arguments overlap the same way."""
    sig: list[Any] = []
    spans: list[tuple[int, int, int]] = []  # (lo, hi, ptr) per array argument
    for a in args:
        if isinstance(a, Array):
            runtime.realize([a])
            d = a._node.data
            be = backends.get(a.device)
            p = be.ptr(d)
            lo, hi = be.nbytes_span(d)
            overlaps = tuple(
                (j, p - pj) for j, (lo_j, hi_j, pj) in enumerate(spans) if lo < hi_j and lo_j < hi
            )
            spans.append((lo, hi, p))
            sig.append(("array", a.device, d.shape, d.dtype.str, d.strides, overlaps))
        elif backends.device_of(a) is not None:
            x = asarray(a)
            return _signature(tuple(x if b is a else b for b in args))
        else:
            try:
                hash(a)
            except TypeError:
                raise UnsupportedError(
                    f"ft.jit: argument of type {type(a).__name__} is neither an array nor hashable"
                ) from None
            sig.append(("value", type(a).__name__, a))
    return tuple(sig)


class JitFunction:
    """A traced function; see :func:`jit`."""

    def __init__(self, fn: Any, graph: bool = False) -> None:
        self.fn = fn
        self.graph = graph
        self.plans: dict[tuple, _Plan] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any) -> Any:
        args = tuple(asarray(a) if backends.device_of(a) is not None else a for a in args)
        sig = _signature(args)
        plan = self.plans.get(sig)
        if plan is None:
            return self._trace(sig, args)
        if self.graph:
            return self._graph_replay(plan, args)
        return self._replay(plan, args)

    def _trace(self, sig: tuple, args: tuple) -> Any:
        arrays = [a for a in args if isinstance(a, Array)]
        devices = {a.device for a in arrays}
        if len(devices) > 1:
            from .errors import DeviceError

            raise DeviceError(f"ft.jit: arguments on several devices {sorted(devices)}")
        device = devices.pop() if devices else "cpu"
        with _lock:
            if runtime.RECORDER is not None:
                raise UnsupportedError("ft.jit: nested traced calls are not supported")
            rec = _Recorder(device, [a._node.data for a in arrays])
            runtime.RECORDER = rec
            try:
                # fresh wrappers, so realizing inside the trace never rewrites the caller's arrays
                inner = tuple(
                    Array(ir.make_buffer(a._node.data, a.device)) if isinstance(a, Array) else a for a in args
                )
                out = self.fn(*inner)
                single = not isinstance(out, tuple | list)
                items = [out] if single else list(out)
                runtime.realize([x for x in items if isinstance(x, Array)])
                rec.plan.single = single
                for x in items:
                    rec.plan.results.append(
                        (rec.desc(x._node.data), None) if isinstance(x, Array) else (None, x)
                    )
            finally:
                runtime.RECORDER = None
        self.plans[sig] = rec.plan
        runtime._stats["traces"] += 1
        return out if single else type(out)(items) if isinstance(out, tuple) else items

    def _graph_replay(self, plan: _Plan, args: tuple) -> Any:
        """Copy the inputs into the graph's static buffers (skipped when they are those buffers),
        launch the graph, and copy the static buffers of arguments the function writes back into
        the caller's arrays. Returned arrays the function allocated are the graph's static
        buffers: the next call overwrites them (as with torch.cuda.graphs); copy what must
        survive. A returned argument is the caller's array."""
        g = plan.graph
        if g is None:
            g = plan.graph = _capture(self, plan, args)
        be = backends.get(plan.device)
        datas = [a._node.data for a in args if isinstance(a, Array)]
        st = runtime._stats
        for d, s in zip(datas, g.inputs):
            if be.ptr(d) != be.ptr(s):
                be.copy(s, d)
                st["copies"] += 1
        g.launch()
        for k in g.written:
            d, s = datas[k], g.inputs[k]
            if be.ptr(d) != be.ptr(s):
                be.copy(d, s)
                st["copies"] += 1
        st["replays"] += 1
        st["graph_launches"] += 1
        st["launches"] += 1
        results = []
        for (desc, value), r in zip(plan.results, g.results):
            if desc is not None and desc.root < plan.n_inputs:
                results.append(Array(ir.make_buffer(_as_array(be, datas, desc), plan.device)))
            else:
                results.append(r if desc is not None else value)
        return results[0] if plan.single else tuple(results)

    def _replay(self, plan: _Plan, args: tuple, fixed: list[Any] | None = None, count: bool = True) -> Any:
        """Re-launch the recorded ops on ``args``' memory. With ``fixed`` (a previous replay's
        roots), buffers the plan allocates are reused instead: what a graph capture needs."""
        be = backends.get(plan.device)
        roots: list[Any] = [None] * plan.n_roots if fixed is None else list(fixed)
        k = 0
        for a in args:
            if isinstance(a, Array):
                roots[k] = a._node.data
                k += 1
        for i, c in plan.constants:
            roots[i] = c
        st = runtime._stats if count else Counter()
        for op in plan.ops:
            kind = op[0]
            if kind == "kernel":
                _, kplan, adescs, odescs, layouts, shape = op
                flat = kplan.spec.flat
                kargs = _bind_args(adescs, roots, lambda r, d, lay: be.bind_view(
                    r, d.offset, d.shape, d.strides, d.dtype, lay, flat))  # fmt: skip
                outs = _outputs(be, roots, odescs, fixed is not None)
                be.launch(kplan, kargs, outs, layouts, shape)
                st["launches"] += 1
                st["kernels"] += 1
            elif kind == "frame":
                _, kplan, adescs, odescs, omaps, geometry = op
                kargs = _bind_args(adescs, roots, lambda r, d, smap: be.bind_frame_view(
                    r, d.offset, d.shape, d.strides, d.dtype, smap))  # fmt: skip
                outs = _outputs(be, roots, odescs, fixed is not None)
                be.launch_frame(kplan, kargs, outs, list(omaps), geometry)
                st["launches"] += 1
                st["kernels"] += 1
            elif kind == "gemm":
                _, descs, oroot, oshape, odt = op
                ops = [_as_array(be, roots, d) for d in descs]
                out = be.matmul(ops[0], ops[1], out=roots[oroot] if fixed is not None else None)
                if len(ops) == 4:
                    out = be.matmul(ops[2], ops[3], out=out, accumulate=True)
                roots[oroot] = out
                st["launches"] += len(ops) // 2
                st["gemms"] += len(ops) // 2
            else:
                _, tdesc, src = op
                target = be.view(roots[tdesc.root], tdesc.offset, tdesc.shape, tdesc.strides, tdesc.dtype)
                be.copy(target, _as_array(be, roots, src[1]) if src[0] == "b" else src[1])
                st["launches"] += 1
                st["copies"] += 1
        st["replays"] += 1
        self._last_roots = roots
        results = []
        for d, v in plan.results:
            if d is None:
                results.append(v)
            else:
                results.append(Array(ir.make_buffer(_as_array(be, roots, d), plan.device)))
        return results[0] if plan.single else tuple(results)


def _bind_args(adescs: list, roots: list[Any], bind: Any) -> list[Any]:
    """Kernel arguments of recorded inputs: scalars as recorded, buffers rebound on ``roots``
    by ``bind(root, desc, layout or stride map)``."""
    args: list[Any] = []
    for a in adescs:
        if a[0] == "s":
            args.append(a[1])
        else:
            args.extend(bind(roots[a[1].root], a[1], a[2]))
    return args


def _outputs(be: Any, roots: list[Any], odescs: list, fixed: bool = False) -> list[Any]:
    outs = []
    for o in odescs:
        if o[0] == "new":
            arr = roots[o[1]] if fixed else be.empty(o[2], o[3])
            roots[o[1]] = arr
        else:
            d = o[1]
            arr = be.view(roots[d.root], d.offset, d.shape, d.strides, d.dtype)
        outs.append(arr)
    return outs


@dataclass
class _Graph:
    """A plan captured as a CUDA graph: static inputs, the buffers it writes, the executable."""

    inputs: list[Any]  # static input arrays (the graph reads these)
    roots: list[Any]  # every buffer of the plan, kept alive with the graph
    results: list  # what a call returns: Arrays over static buffers (or Python values)
    launch: Any  # runs the graph once on the current stream
    written: tuple[int, ...] = ()  # arguments the graph writes: copied back after each launch
    exec: Any = None  # the cupy.cuda.Graph (CUDA)


def _capture(self: JitFunction, plan: _Plan, args: tuple) -> _Graph:
    be = backends.get(plan.device)
    datas = [a._node.data for a in args if isinstance(a, Array)]
    statics, groups = _static_inputs(be, datas)
    hit = {groups[k] for k in plan.written_inputs}  # overlapping arguments are copied back together
    written = tuple(k for k in range(len(datas)) if groups[k] in hit)
    new_args = []
    k = 0
    for a in args:
        if isinstance(a, Array):
            new_args.append(Array(ir.make_buffer(statics[k], a.device)))
            k += 1
        else:
            new_args.append(a)
    self._replay(plan, tuple(new_args), count=False)  # allocates every buffer the plan needs
    roots = self._last_roots
    if plan.device != "cuda":
        # no graphs on host devices: replay into the same fixed buffers, so graph=True behaves
        # (static buffers, copies in and back) as it does on a GPU
        fixed_args = tuple(new_args)

        def launch() -> None:
            self._replay(plan, fixed_args, fixed=roots, count=False)

        first = self._replay(plan, fixed_args, fixed=roots, count=False)
        results = [first] if plan.single else list(first)
        return _Graph(statics, roots, results, launch, written)
    cp = be.xp
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            results = self._replay(plan, tuple(new_args), fixed=roots, count=False)
            results = [results] if plan.single else list(results)
        finally:
            graph = stream.end_capture()
    if hasattr(graph, "upload"):
        graph.upload(cp.cuda.get_current_stream())
    return _Graph(statics, roots, results, lambda: graph.launch(cp.cuda.get_current_stream()), written,
                  graph)  # fmt: skip


def _static_inputs(be: Any, datas: list[Any]) -> tuple[list[Any], list[int]]:
    """Private copies of the arguments for a graph to read and write. Arguments whose memory
    overlaps share one buffer, laid out as the caller's (the signature fixes that layout), and
    every copy keeps its original's address modulo 256 (alignment)."""
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
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for i, (a, b) in enumerate(spans):
        r = find(i)
        lo[r] = min(lo.get(r, a), a)
        hi[r] = max(hi.get(r, b), b)
    bufs = {r: be.xp.empty(hi[r] - lo[r] + 256, np.uint8) for r in lo}
    statics = []
    for i, d in enumerate(datas):
        r = find(i)
        pad = (lo[r] - be.ptr(bufs[r])) % 256
        v = be.view(bufs[r], pad + be.ptr(d) - lo[r], tuple(d.shape), tuple(d.strides), d.dtype)
        be.copy(v, d)
        statics.append(v)
    return statics, [find(i) for i in range(len(datas))]


def _as_array(be: Any, roots: list[Any], d: _Desc) -> Any:
    r = roots[d.root]
    if d.offset == 0 and tuple(r.shape) == d.shape and tuple(r.strides) == d.strides:
        return r
    return be.view(r, d.offset, d.shape, d.strides, d.dtype)


def jit(fn: Any = None, *, graph: bool = False) -> Any:
    """Trace ``fn`` on its first call per input signature; replay the recorded launches after.

    With ``graph=True`` (CUDA), the second call captures the plan as a CUDA graph (GEMMs
    included, through fusetree's own cuBLAS handle) and every later call copies its inputs into
    the graph's static buffers, launches the graph once, and copies the arguments the function
    writes (``m[...] = ...``, ``x += 1``) back into the caller's arrays. The new arrays it returns
    are static buffers: the next call overwrites them. Graphs are freed with the jitted function.
    On host devices ``graph=True`` replays the plan into fixed buffers with the same semantics
    (static buffers, copies in and back), so code can be checked there.

    >>> import numpy as np, fusetree as ft
    >>> @ft.jit
    ... def f(x, y):
    ...     return ft.tanh(x * y) + 1
    >>> a = ft.asarray(np.ones(4, np.float32))
    >>> ft.reset_stats(); _ = f(a, a); r = f(a, a)
    >>> ft.stats()["traces"], ft.stats()["replays"], r.numpy().round(3).tolist()
    (1, 1, [1.762, 1.762, 1.762, 1.762])
    """
    if fn is None:
        return functools.partial(jit, graph=graph)
    return JitFunction(fn, graph)
