"""``ft.jit(graph=True)`` on CUDA: a trace as a CUDA graph, built node by node through the driver
(fusetree's kernels as kernel nodes over the caller's memory, GEMMs and copies as captured child
graphs), or stream-captured over static copies when a kernel cannot be prepared for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import backends
from ..frontend.array import Array, wrap
from ..ir.node import make_buffer
from . import executor, pytree
from .quick import prepare
from .trace import Copy, FrameKernel, Gemm, HKernel, Kernel, Trace, allocate, as_array, hkernel_table

if TYPE_CHECKING:
    from .jit import JitFunction


@dataclass
class Graph:
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


def moved_borrowed(be: Any, g: Graph, args: tuple) -> set[int]:
    """The borrowed arguments of graph ``g`` that this call passes at another address."""
    moved: set[int] = set()
    k = 0
    for a in args:
        if isinstance(a, Array):
            if k in g.borrowed and be.ptr(a._node.data) != be.ptr(g.inputs[k]):  # type: ignore[attr-defined]
                moved.add(k)
            k += 1
    return moved


def capture(self: JitFunction, trace: Trace, args: tuple) -> Graph:
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
    return Graph(statics, roots, results, lambda: graph.launch(cp.cuda.get_current_stream()), written,
                  graph)  # fmt: skip


def _build_graph(self: JitFunction, trace: Trace, args: tuple, be: Any) -> Graph | None:
    """The trace as a graph built node by node: fusetree's kernels as kernel nodes over the
    caller's memory (bound arguments), GEMMs and copies as stream-captured child graphs over
    static copies (staged arguments). None when a kernel cannot be prepared for it."""
    from ..backends.cudagraph import GraphBuilder

    prepared = prepare(trace, be)
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
    allocate(trace, be, roots)
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
                    executor.gemm_sum(be, [as_array(be, roots, d) for d in op.operands], roots[op.out])
                else:
                    target = as_array(be, roots, op.target)
                    be.copy(target, as_array(be, roots, op.src) if op.src is not None else op.value)
            finally:
                child = stream.end_capture()
        builder.child(child.graph, child)
    ex = builder.instantiate()
    results = []
    for d, v in trace.results:
        results.append(v if d is None else wrap(make_buffer(as_array(be, roots, d), trace.device)))
    addresses = [be.ptr(datas[k]) if inputs[k] is None else 0 for k in range(n_in)]

    def launch_graph() -> None:
        ex.launch(cp.cuda.get_current_stream().ptr)

    borrowed = frozenset(k for k in staged if groups[k] not in private_groups)
    return Graph(inputs, roots, results, launch_graph, written, ex, addresses, users, borrowed=borrowed)


def _hkernel_params(be: Any, op: HKernel, roots: list[Any]) -> tuple[int, int, int, int]:
    """(function, grid, block, parameter pointers) of a horizontal kernel over ``roots``' memory;
    its chunk table and parameter buffer are kept in ``op.last``."""
    table = hkernel_table(be, op, roots)
    k = op.launcher
    params = be.param_buffer(k, list(table[0]))
    op.last[2:] = [params]  # kept with the trace (the node copied the values)
    return k.func, max(1, table[1]), min(k.block, 1024), params.ptr


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
