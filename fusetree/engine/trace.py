"""What ``ft.jit`` records (see :mod:`.jit`): kernels, GEMMs and copies over *roots* (the call's
array arguments, buffers the trace allocated, constants it captured), addressed as (root, byte
offset, shape, strides); the recorder the executor reports its launches to while a function is
traced; and the helpers that bind a recorded op to a replay's roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import backends
from . import horizontal, pytree


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
    graph: Any = None  # a Graph once captured (ft.jit(graph=True))
    prepared: list | None = None  # per op: a replay.Launch (kernels), else None
    replayed: Any = None  # the _LastCall of the arguments the last complete ft.jit replay ran on
    whole: list[bool] = field(default_factory=list)  # per result: a kernel's fresh output, entire
    private: set[int] = field(default_factory=set)  # staged arguments whose address changed: copied
    # a replay on the previous replay's very arguments (see fast_program): None undecided, False
    # not possible, else the host program (run by _replay_fast unless ``quick`` runs it) or True
    # (a CUDA trace: ``quick`` runs it)
    fast: Any = None
    quick: Any = None  # the fast program as a closure, where there is one (see fast_program)
    fixed: frozenset[int] = frozenset()  # roots that are arguments or constants (set by prepare)
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


class Recorder:
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


def bind_args(be: Any, inputs: tuple[Arg, ...], roots: list[Any], frame: bool) -> list[Any]:
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


def bind_outputs(be: Any, roots: list[Any], outs: tuple[Out, ...], fixed: bool = False) -> list[Any]:
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


def allocate_created(trace: Trace, be: Any, roots: list[Any]) -> None:
    """Fresh memory for the arrays the traced function created (``ft.empty`` & co.)."""
    for i, shape, dt in trace.allocs:
        if roots[i] is None:
            roots[i] = be.empty(shape, dt)


def allocate(trace: Trace, be: Any, roots: list[Any]) -> None:
    """Allocate every buffer the trace makes (kernel outputs, GEMM results) into ``roots``."""
    allocate_created(trace, be, roots)
    for op in trace.ops:
        if isinstance(op, Kernel | FrameKernel):
            for o in op.outputs:
                if o.new and roots[o.root] is None:
                    roots[o.root] = be.empty(o.shape, o.dtype)
        elif isinstance(op, Gemm) and roots[op.out] is None:
            a, b = op.operands[0], op.operands[1]
            shape = (a.shape[:-1] if len(a.shape) == 2 else ()) + (b.shape[1:] if len(b.shape) == 2 else ())
            roots[op.out] = be.empty(shape, np.result_type(a.dtype, b.dtype))


def as_array(be: Any, roots: list[Any], d: Desc) -> Any:
    r = roots[d.root]
    if d.offset == 0 and tuple(r.shape) == d.shape and tuple(r.strides) == d.strides:
        return r
    return be.view_at(r, d.offset, d.shape, d.strides, d.dtype)


def hkernel_table(be: Any, op: HKernel, roots: list[Any]) -> Any:
    """A recorded horizontal kernel's chunk table over ``roots``' memory (see
    :func:`.horizontal.table`), rebuilt only when an address moved: cached in ``op.last``."""
    addrs = [[be.ptr(roots[d.root]) + d.offset for d in slot] for slot in op.slots]
    last = op.last
    if last[0] != addrs:
        last[1] = horizontal.table(be, op.spec, list(op.sizes), addrs, list(op.scalars), roots)
        last[0] = addrs
    return last[1]
