"""Short replay programs of ``ft.jit`` (``Trace.fast``/``Trace.quick``): what a call on the previous
call's very arguments, or on new arrays with their signature (an RNN's state fed back), runs
instead of the general replay. Host: per op a prepared launch whose bound argument list holds but
for its fresh outputs (and the memory earlier ops made), called directly; CUDA: prepared parameter
buffers of which only the pointers of new memory are re-written before each ``cuLaunchKernel``."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import backends
from ..frontend.array import wrap
from ..ir.node import make_contiguous
from . import executor, pytree, replay
from .state import STATS
from .trace import Desc, FrameKernel, Gemm, Kernel, Trace, as_array


class GemmStep(NamedTuple):
    """A GEMM of a fast replay (see :func:`fast_program`)."""

    op_index: int  # the op's position in the trace (its bound operands: Trace.gemm_bound[op_index])
    out: int  # the root it makes
    made: tuple[tuple[int, Desc], ...]  # (operand position, desc) over memory made in the replay
    products: int
    be: Any
    by_arg: dict[int, tuple[tuple[int, Desc], ...]]  # argument root -> (operand position, desc)


def gemm_operands(trace: Trace, step: GemmStep, roots: Any, new: dict | None = None) -> list[Any]:
    """A fast replay's GEMM operands: as the last general replay bound them, but those over
    memory this replay made and over ``new`` arguments (re-viewed on ``roots``; the latter kept
    for the next replay)."""
    bound = trace.gemm_bound[step.op_index]
    ops = bound
    if step.made:
        ops = list(ops)
        for k, d in step.made:
            ops[k] = as_array(step.be, roots, d)
    if new:
        for r in new:
            for k, d in step.by_arg.get(r, ()):
                if ops is bound:
                    ops = list(ops)
                ops[k] = bound[k] = as_array(step.be, roots, d)
    return ops


def fast_program(trace: Trace) -> list[tuple] | bool | None:
    """What a replay on the previous replay's very arguments runs (``Trace.fast``), and the
    closure that runs it (``Trace.quick``). Host: per op a :class:`GemmStep` or (launch, its
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
            if gemm_made(op) is None:
                trace.fast = False
                return False
            if i not in trace.gemm_bound:
                return None
            made = tuple((k, d) for k, d in enumerate(op.operands) if d.root not in trace.fixed)
            by_arg: dict[int, tuple] = {}
            for k, d in enumerate(op.operands):
                if d.root < trace.n_inputs:
                    by_arg[d.root] = (*by_arg.get(d.root, ()), (k, d))
            gemms.append(GemmStep(i, op.out, made, len(op.operands) // 2, be, by_arg))
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
    if type(prog[0]) is GemmStep:
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


def _device_quick(trace: Trace, gemms: list[GemmStep]) -> Any:
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
            if type(step) is GemmStep:
                a = made[step.out] = gemm_sum(be, gemm_operands(trace, step, made, args))
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
    if len(prog) != 1 or not leaf or len(results) != 1 or type(prog[0]) is GemmStep:
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


def prepare(trace: Trace, be: Any) -> list:
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
                product = gemm_made(op)
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


def gemm_made(op: Gemm) -> tuple | None:
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
