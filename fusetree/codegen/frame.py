"""Render a reduction kernel: reductions fused with their elementwise producers and consumers.

A reduction kernel works in a *frame*: a full shape ``F`` (the reduced input's shape) and the reduced
axes ``R``. Every value in the kernel is either

* ``full``: one per element of ``F`` (the leaves of shape ``F``, elementwise ops over them, and
  ``expand`` nodes, which broadcast a row value back over ``R``), or
* ``row``: one per *row*, a position on the kept axes (reductions, row-shaped leaves, and ops over
  them; a row value has the reduction's shape, with or without the kept size-1 axes).

The kernel runs one row at a time (CPU: ``prange`` over rows; CUDA: ``tpr`` threads per row, a warp
butterfly and, for rows wider than a warp, one shared-memory exchange, so every thread of the row
holds the result). Inside a row it makes one pass per *phase*: phase ``p`` accumulates the
reductions whose inputs need row values from phases before ``p`` (softmax: max, then sum; layernorm:
mean, then var); row values are computed when their phase is done; a last pass computes and stores
the full outputs. Full values are recomputed in each pass that needs them (the inputs are re-read:
cheap for rows that stay in cache). Order of accumulation is fixed, so results are deterministic.

A *partial* kernel (``FrameKey.partial``) splits every row into ``nchunks`` chunks and stores the
accumulator of its one reduction per chunk: the first stage of a two-stage reduction.

Each array parameter is a pointer (plus an element offset on the CPU and in the simulator) and one
element stride per frame axis; a row array's strides are 0 on the reduced axes.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
from ..ir.ops import REDUCTIONS, identity_value, reduce_dtypes
from ..schedule.spec import KernelSpec, Ref
from . import abi
from .common import Target, Writer, aligned_check, begin, cast, convert, op_value, vector_width, wide_load

UNROLL = 4  # CUDA: elements per thread per step of an element loop (independent loads in flight)
# CPU: partial accumulators of a reduction loop over computed values (one carried add per element
# bounds a loop by the add's latency). 2-core VM, 128 x 512 float32: sum(-1) 70 -> 48 us
REDUCE_LANES = 4


class _Levels:
    """Levels, phases and readiness of a reduction kernel's values."""

    def __init__(self, spec: KernelSpec) -> None:
        self.level: dict[Ref, str] = {}
        self.ready: dict[Ref, int] = {}  # row values: the phase after which they are known
        self.need: dict[Ref, int] = {}  # full values: the last phase whose row values they read
        for i, lf in enumerate(spec.leaves):
            r: Ref = ("x", i)
            self.level[r] = "" if lf.kind == "scalar" else lf.layout
            self.ready[r] = self.need[r] = 0
        for j, o in enumerate(spec.ops):
            r = ("t", j)
            if o.op == "reduce":
                self.level[r] = "row"
                self.ready[r] = 1 + self.need[o.args[0]]
            elif o.op == "expand":
                self.level[r] = "full"
                self.need[r] = self.ready[o.args[0]]
            else:
                levels = {self.level[a] for a in o.args} - {""}
                lev = "full" if "full" in levels else "row"
                self.level[r] = lev
                if lev == "row":
                    self.ready[r] = max(self.ready[a] for a in o.args)
                else:
                    self.need[r] = max(
                        self.need[a] if self.level[a] == "full" else self.ready[a] for a in o.args
                    )
        self.phases = max([self.ready[("t", j)] for j, o in enumerate(spec.ops) if o.op == "reduce"] or [0])


def _cone(spec: KernelSpec, lev: _Levels, roots: list[Ref]) -> list[int]:
    """Full-level ops (indices, in order) needed to compute ``roots`` inside an element loop."""
    return _cone_until(spec, lev, roots, set())[0]


def _cone_until(
    spec: KernelSpec, lev: _Levels, roots: list[Ref], done: set[int]
) -> tuple[list[int], set[int]]:
    """:func:`_cone`, stopping at ops in ``done`` (computed by an earlier pass): (ops to compute,
    in order; the ``done`` ops they read)."""
    need: set[int] = set()
    boundary: set[int] = set()
    stack = [r for r in roots if r[0] == "t" and lev.level[r] == "full"]
    while stack:
        r = stack.pop()
        j = r[1]
        if j in need or j in boundary:
            continue
        if j in done:
            boundary.add(j)
            continue
        need.add(j)
        o = spec.ops[j]
        if o.op == "expand":
            continue
        stack.extend(a for a in o.args if a[0] == "t" and lev.level[a] == "full")
    return sorted(need), boundary


def render(spec: KernelSpec, target: Target, held: int = 16, remat: bool = False) -> tuple[str, list[str]]:
    """Source of reduction kernel ``spec`` for ``target`` and its parameter names. ``held``: CUDA
    elements per thread of a row held in registers (the host picks threads per row as
    ``pow2_at_least(row length / held)``, so rows up to ``held * 1024`` elements are held).
    ``remat``: phases after the first recompute their values from the held leaves (kept as loaded:
    float16 as packed pairs) instead of keeping every value of earlier phases live."""
    assert spec.frame is not None
    axes, partial, unit = spec.frame
    # CPU: every full array has unit stride along the one reduced axis (schedule.planner)
    unit_rows = not target.cuda and unit
    cuda = target.cuda
    sim_loop = target.name == "cuda-sim"  # the simulator: a grid-stride loop over rows (below)
    offsets = target.offsets
    nd = spec.ndim
    kept = [d for d in range(nd) if d not in axes]
    params = [p.name for p in abi.params(spec, target.name)]
    lev = _Levels(spec)
    w = begin(spec, target.name, params,
              f"# frame: reduced axes {tuple(axes)}, {lev.phases} phase(s){', partial' if partial else ''}")  # fmt: skip

    reg: dict[Ref, np.dtype] = {}
    desc: dict[Ref, dtypes.Desc] = {}
    name: dict[Ref, str] = {}
    arrays = [f"in{i}" for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"]
    arrays += [f"out{k}" for k in range(len(spec.outs))]
    full_arrays = [
        f"in{i}" for i, lf in enumerate(spec.leaves) if lf.kind == "buffer" and lf.layout == "full"
    ]
    full_outs = [k for k, o in enumerate(spec.outs) if o.layout == "full"]
    full_arrays += [f"out{k}" for k in full_outs]
    # -- the row held in registers (CUDA, one reduced axis): ``groups`` vectors of ``width``
    # elements per thread, loaded once with wide accesses and kept across the phases
    itemsize = {f"in{i}": lf.dtype.itemsize for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"}
    itemsize.update({f"out{k}": o.dtype.itemsize for k, o in enumerate(spec.outs)})
    width = vector_width([itemsize[a] for a in full_arrays])
    groups = max(1, held // width)
    held = cuda and len(axes) == 1 and not partial and width > 1 and bool(full_arrays)
    loaded: set[Ref] = set()  # in the held path: leaves loaded and full ops computed so far

    def held_condition() -> str:
        """Whether rows are held: the same for every row of the launch (rows of one warp must take
        the same branch: the row exchange shuffles across the whole warp), so alignment is checked
        on the base pointers and the row strides, not per row."""
        ax = axes[0]
        conds = [
            f"rowlen > 0 and nchunks == 1 and rowlen <= {groups * width} * tpr and rowlen % {width} == 0"
        ]
        for a in full_arrays:
            conds.append(f"{a}_s{ax} == 1")
            conds += [f"{a}_s{d} % {width} == 0" for d in kept]
        ptrs = [
            (f"(addr({a}) + {a}_o * {itemsize[a]})" if offsets else f"addr({a})", itemsize[a])
            for a in full_arrays
        ]
        return " and ".join([*conds, aligned_check(ptrs, width)])

    for i, lf in enumerate(spec.leaves):
        r: Ref = ("x", i)
        desc[r] = lf.desc
        if lf.kind == "scalar":
            reg[r], name[r] = target.scalar_storage(lf.dtype), f"s{i}"
        else:  # full values carry a copy suffix "{s}" (unrolled element loops), row values none
            reg[r], name[r] = dtypes.register(lf.dtype), f"x{i}" + ("{s}" if lf.layout == "full" else "")
    # accumulators of the reductions
    accs: dict[int, tuple[str, np.dtype, np.dtype]] = {}  # op index -> (kind, input reg, acc dtype)
    for j, o in enumerate(spec.ops):
        if o.op == "reduce":
            src = spec.ops[o.args[0][1]].dtype if o.args[0][0] == "t" else spec.leaves[o.args[0][1]].dtype
            kind = o.attrs[0]
            accs[j] = (kind, dtypes.register(src), reduce_dtypes(kind, src, target.name)[1])

    def comb(kind: str, a: str, b: str) -> str:
        return REDUCTIONS[kind].combine.format(a, b)

    def acc_value(j: int) -> str:
        """Reduction ``j``'s input as its accumulator takes it (not for index reductions)."""
        kind, src_reg, acc = accs[j]
        v = name[spec.ops[j].args[0]]
        return f"int32({v} != 0)" if kind in ("any", "all") else cast(v, src_reg, acc)

    if cuda:
        w("tid = cuda.threadIdx.x")
        # tpr is a power of two (frame_config): shifts and masks, not 64-bit divisions, which
        # cost ~30 instructions each in every thread (softmax at (4096, 4096) float16 held 32:
        # ~300 prologue instructions per thread beside ~1,050 for its 32 elements, ptxas sm_90).
        # The kernel was issue-bound (Nsight Compute, H100: DRAM 45% of peak, issue on 76% of
        # cycles); with this and float16 conversions LLVM folds (backends/vector.py) it went
        # 35.7 -> 28.9 us, 72% -> 89% of copy (docs/probe_reductions_stop36.txt)
        w("tsh = cuda.ffs(tpr) - 1")
        w("lane = tid & (tpr - 1)")
        w("gpb = cuda.blockDim.x >> tsh")
        w("rr0 = cuda.blockIdx.x * gpb")
        if sim_loop:
            w("rstep = cuda.gridDim.x * gpb")
        w("wid = tid // 32")
        w("wl = tid % 32")
        w("nw = tpr // 32")  # warps per row (rows of more than a warp)
        w("w0 = (tid >> tsh) * nw")  # the row's first warp in the block
        w("width = min(tpr, 32)")
        for j, (kind, _, acc) in accs.items():
            w(f"sh{j} = cuda.shared.array(32, {dtypes.CTOR[acc]})")
            if REDUCTIONS[kind].index:
                w(f"sh{j}_i = cuda.shared.array(32, int64)")
            if target.name == "cuda-sim":
                w(f"sx{j} = cuda.shared.array(1024, {dtypes.CTOR[acc]})")
                if REDUCTIONS[kind].index:
                    w(f"sx{j}_i = cuda.shared.array(1024, int64)")
        w("nkeep = nrows * nchunks")
        if held:
            w(f"held = {held_condition()}")
        # one group of rows per block, no grid-stride loop: a loop over rows kept its invariants
        # (offsets, the held condition) live across iterations, e.g. softmax at (4096, 4096) held 16
        # float32: 120 registers with the loop, 56 without (ptxas -v, sm_90); the host launches a
        # block per group of rows. The simulator keeps the loop over a few blocks (each simulated
        # thread is a Python thread: a block per row made its reduction tests 30x slower)
        w("while rr0 < nkeep:" if sim_loop else "if rr0 < nkeep:")
        w.indent()
        w("rr = rr0 + (tid >> tsh)")
        w("act = rr < nkeep")
        w("if not act:")
        w("    rr = nkeep - 1")
    else:
        w("nkeep = nrows * nchunks")
        w("for rr in prange(nkeep):")
        w.indent()
    w("row = rr if nchunks == 1 else rr // nchunks")  # (whole rows: no division)
    w("lo = 0 if nchunks == 1 else (rr - row * nchunks) * clen")
    w("hi = min(lo + clen, rowlen)")
    # kept indices -> each array's row offset (row < nrows: the outermost index needs no modulo)
    w("q = row")
    for d in reversed(kept[1:]):
        w(f"i{d} = q % n{d}")
        w(f"q = q // n{d}")
    if kept:
        w(f"i{kept[0]} = q")
    for a in arrays:
        terms = ([f"{a}_o"] if offsets else []) + [f"i{d} * {a}_s{d}" for d in kept]
        w(f"{a}_w = {' + '.join(terms) or '0'}")

    cur = {"s": "", "J": "j"}  # the element-loop copy being written: name suffix, index variable

    def wc(line: str) -> None:
        w(line.replace("{s}", cur["s"]).replace("{J}", cur["J"]))

    def load_leaf(i: int, where: str) -> None:
        lf = spec.leaves[i]
        wc(f"{name[('x', i)]} = {target.load(f'in{i}[{where}]', lf.dtype)}")

    used_row_leaves = sorted(
        {a[1] for o in spec.ops for a in o.args if a[0] == "x" and lev.level[a] == "row"}
        | {o.ref[1] for o in spec.outs if o.ref[0] == "x" and lev.level[o.ref] == "row"}
    )
    for i in used_row_leaves:
        load_leaf(i, f"in{i}_w")

    def emit_op(j: int) -> None:
        o = spec.ops[j]
        r = ("t", j)
        if o.op == "expand":
            reg[r], desc[r], name[r] = reg[o.args[0]], desc[o.args[0]], name[o.args[0]]
            return
        value, out_reg = op_value(o, [name[a] for a in o.args], [reg[a] for a in o.args],
                                  [desc[a] for a in o.args])  # fmt: skip
        nm = f"t{j}" + ("{s}" if lev.level[r] == "full" else "")
        wc(f"{nm} = {value}")
        reg[r], desc[r], name[r] = out_reg, o.dtype, nm

    def emit_row_ops(phase: int) -> None:
        for j, o in enumerate(spec.ops):
            r = ("t", j)
            if o.op != "reduce" and lev.level[r] == "row" and lev.ready[r] == phase:
                emit_op(j)

    def element_copy(ops_needed: list[int], leaves_needed: list[int], outs: bool = False) -> None:
        """One element's positions in the leaves it loads (and the full outputs), its loads and
        its ops (CUDA: positions in every full array, as always)."""
        arrays = full_arrays
        if not cuda:
            wanted = {f"in{i}" for i in leaves_needed} | ({f"out{k}" for k in full_outs} if outs else set())
            arrays = [a for a in full_arrays if a in wanted]
        if len(axes) == 1:
            for a in arrays:
                # unit-stride rows: an index LLVM sees as contiguous (it vectorizes the loop; it
                # does not version loops on a stride argument): a 128 x 512 softmax 498 -> 162 us
                wc(
                    f"{a}_e{{s}} = {a}_w + {{J}}"
                    if unit_rows
                    else f"{a}_e{{s}} = {a}_w + {{J}} * {a}_s{axes[0]}"
                )
        elif arrays:
            wc("q = {J}")
            for d in reversed(axes[1:]):
                wc(f"i{d} = q % n{d}")
                wc(f"q = q // n{d}")
            wc(f"i{axes[0]} = q")  # (j < rowlen)
            for a in arrays:
                wc(f"{a}_e{{s}} = {a}_w + {' + '.join(f'i{d} * {a}_s{d}' for d in axes)}")
        for i in leaves_needed:
            load_leaf(i, f"in{i}_e{{s}}")
        for j in ops_needed:
            emit_op(j)

    def element_loop(ops_needed: list[int], leaves_needed: list[int], body_after, outs: bool = False) -> None:  # type: ignore[no-untyped-def]
        if not cuda:
            w("for j in range(lo, hi):")
            w.indent()
            element_copy(ops_needed, leaves_needed, outs)
            body_after()
            w.dedent()
            return
        # CUDA: UNROLL elements per thread and step, all loads before all stores
        w("j = lo + lane")
        w(f"while act and j + {UNROLL - 1} * tpr < hi:")
        w.indent()
        for c in range(UNROLL):
            w(f"j_{c} = j + {c} * tpr")
        for c in range(UNROLL):
            cur["s"], cur["J"] = f"_{c}", f"j_{c}"
            element_copy(ops_needed, leaves_needed)
        for c in range(UNROLL):
            cur["s"], cur["J"] = f"_{c}", f"j_{c}"
            body_after()
        w(f"j += {UNROLL} * tpr")
        w.dedent()
        cur["s"], cur["J"] = "", "j"
        w("while act and j < hi:")
        w.indent()
        element_copy(ops_needed, leaves_needed)
        body_after()
        w("j += tpr")
        w.dedent()

    def full_leaves(ops_needed: list[int], extra: list[Ref]) -> list[int]:
        refs = [a for j in ops_needed if spec.ops[j].op != "expand" for a in spec.ops[j].args] + extra
        return sorted({a[1] for a in refs if a[0] == "x" and lev.level[a] == "full"})

    def group_position(g: int, base: str | None) -> None:
        """Group ``g``'s first element ``c_g`` in the held row (from the thread's first, ``base``)
        and whether it is inside the row."""
        w(f"c_{g} = {base} + {g} * tpr * {width}" if base else f"c_{g} = lo + (lane + {g} * tpr) * {width}")
        w(f"ok_{g} = act and c_{g} < hi")
        w(f"c_{g} = min(c_{g}, hi - {width})")  # every thread loads inside the row

    def held_loop(ops_needed: list[int], leaves_needed: list[int], body_after, group_after=None) -> None:  # type: ignore[no-untyped-def]
        """One phase over the held row: leaves not loaded yet are loaded (every thread, clamped
        addresses), full ops not computed yet are computed, then ``body_after`` runs for the
        elements inside the row (and ``group_after(g)`` after each group of ``width``)."""
        # with ``remat``, a phase after the first recomputes its ops (and each group's position)
        # from the held leaves, one group at a time: only the leaves stay live across the row
        # exchanges (``opaque`` hides the recomputation from LLVM's value numbering, which would
        # otherwise reuse the first phase's values and keep them live)
        recompute = remat and any(("x", i) in loaded for i in leaves_needed)

        def after(g: int) -> None:
            if body_after is not None:
                w(f"if ok_{g}:")
                w.indent()
                for k in range(width):
                    cur["s"], cur["J"] = f"_{g}_{k}", f"(c_{g} + {k})"
                    body_after()
                w.dedent()
            if group_after is not None:
                group_after(g)

        for g in range(groups):
            sfxs = [f"_{g}_{k}" for k in range(width)]
            if recompute:
                group_position(g, "opaque(cl)")
            for i in leaves_needed:
                dt = spec.leaves[i].dtype
                first = ("x", i) not in loaded
                if not (first or recompute):
                    continue
                if remat and dt == np.float16 and width == 8:  # halves held as uint32 pairs
                    words = [f"u{i}_{g}_{m}" for m in range(4)]
                    if first:
                        w(f"{', '.join(words)} = vld8w(in{i}, in{i}_w + c_{g})")
                    else:
                        for u in words:
                            w(f"{u} = opaque({u})")
                    for k, sf in enumerate(sfxs):
                        w(f"x{i}{sf} = half_of({words[k // 2]}, {k % 2})")
                elif first:
                    wide_load(w, target, i, dt, sfxs, width, f"in{i}_w + c_{g}")
                elif target.load("v", dt) == "v":  # held as loaded
                    for sf in sfxs:
                        w(f"x{i}{sf} = opaque(x{i}{sf})")
                else:  # held as loaded (v), converted where used
                    for sf in sfxs:
                        w(f"x{i}{sf} = {target.load(f'opaque(v{i}{sf})', dt)}")
            for k, sf in enumerate(sfxs):
                cur["s"], cur["J"] = sf, f"(c_{g} + {k})"
                for j in ops_needed:
                    if recompute or ("t", j) not in loaded:
                        emit_op(j)
            if recompute:
                after(g)
        loaded.update(("x", i) for i in leaves_needed)
        loaded.update(("t", j) for j in ops_needed)
        if not recompute:
            for g in range(groups):
                after(g)
        cur["s"], cur["J"] = "", "j"

    def use_buffers(p: int) -> None:
        """Pass ``p`` reads the ops it needs from earlier passes out of their row buffers."""
        for k in loads[p]:
            name[("t", k)] = f"h{k}[{{J}} - lo]"

    def staged_pass(p: int, red: list[int], update) -> None:  # type: ignore[no-untyped-def]
        """CPU phase pass ``p`` (reductions ``red``): when it computes ops, an element loop
        computing them and writing the buffered ones (row buffers allocated before it); then the
        reduction loop over the buffers and leaves (:func:`reduce_loop`)."""
        use_buffers(p)
        inputs = [spec.ops[j].args[0] for j in red]
        ops = computed[p]
        keep = [j for j in ops if j in stored]
        if keep:
            mark, level = len(w.lines), w.level

            def write() -> None:
                for k in keep:
                    wc(f"h{k}[{{J}} - lo] = {name[('t', k)]}")

            element_loop(ops, full_leaves(ops, inputs), write)
            for n, k in enumerate(keep):  # the buffers' dtypes are known once the ops are written
                alloc = f"h{k} = np.empty(hi - lo, {dtypes.CTOR[reg[('t', k)]]})"
                w.lines.insert(mark + n, "    " * level + alloc)
            for k in keep:
                name[("t", k)] = f"h{k}[{{J}} - lo]"
        elif ops:  # (only row broadcasts: nothing worth a buffer)
            element_loop(ops, full_leaves(ops, inputs), update)
            return
        reduce_loop(red, sorted({r[1] for r in inputs if r[0] == "x"}), update)

    def reduce_loop(red: list[int], leaves_needed: list[int], update) -> None:  # type: ignore[no-untyped-def]
        """CPU: the reductions ``red`` over values already computed (leaves, row buffers), with
        ``REDUCE_LANES`` partial accumulators in turn (one carried add per element would bound the
        loop by its latency), combined in order at the end; index reductions (argmax) in one."""
        if any(REDUCTIONS[accs[j][0]].index for j in red):
            element_loop([], leaves_needed, update)
            return
        lanes = REDUCE_LANES
        for j in red:
            kind, _, acc = accs[j]
            for c in range(lanes):
                w(f"a{j}_{c} = {identity_value(kind, acc)}")
        w(f"jm = lo + (hi - lo) // {lanes} * {lanes}")
        w(f"for jb in range(lo, jm, {lanes}):")
        w.indent()
        for c in range(lanes):
            cur["s"], cur["J"] = f"_{c}", f"(jb + {c})"
            element_copy([], leaves_needed)
        for c in range(lanes):
            cur["s"], cur["J"] = f"_{c}", f"(jb + {c})"
            for j in red:
                wc(f"a{j}_{c} = {comb(accs[j][0], f'a{j}_{c}', acc_value(j))}")
        w.dedent()
        cur["s"], cur["J"] = "", "j"
        w("for j in range(jm, hi):")
        w.indent()
        element_copy([], leaves_needed)
        update()
        w.dedent()
        for j in red:
            kind = accs[j][0]
            for c in range(lanes):
                w(f"a{j} = {comb(kind, f'a{j}', f'a{j}_{c}')}")

    # CPU: a pass does not recompute what an earlier pass of the row computed: values read again
    # later (softmax's exp, layernorm's centred x) are kept in row buffers ``h<op>``, and a pass
    # whose reduction inputs are computed first writes them (an element loop with no carried
    # value, which LLVM vectorizes) and then reduces the buffer (a loop of one combine each)
    passes: list[list[Ref]] = [
        [spec.ops[j].args[0] for j in accs if lev.ready[("t", j)] == phase]
        for phase in range(1, lev.phases + 1)
    ] + [[spec.outs[k].ref for k in full_outs]]
    computed: list[list[int]] = []  # per pass: the full ops it computes
    loads: list[set[int]] = []  # per pass: the ops it reads from row buffers
    stored: set[int] = set()  # ops kept in row buffers
    if not cuda:
        done: set[int] = set()
        for p, roots in enumerate(passes):
            ops, boundary = _cone_until(spec, lev, roots, done)
            last = p == len(passes) - 1  # (the outputs' pass: nothing reduced after it)
            staged_inputs = set() if last else {r[1] for r in roots if r[0] == "t" and r[1] in ops}
            computed.append(ops)
            loads.append(boundary)
            stored |= boundary | staged_inputs
            done.update(j for j in ops if spec.ops[j].op != "expand")

    def emit_all(in_registers: bool) -> None:
        loop = held_loop if in_registers else element_loop
        if in_registers:
            if remat:
                w(f"cl = lo + lane * {width}")
            for g in range(groups):
                group_position(g, "cl" if remat else None)
        emit_row_ops(0)
        for phase in range(1, lev.phases + 1):
            red = [j for j in accs if lev.ready[("t", j)] == phase]
            inputs = [spec.ops[j].args[0] for j in red]
            for j in red:
                kind, _, acc = accs[j]
                w(f"a{j} = {identity_value(kind, acc)}")
                if REDUCTIONS[kind].index:
                    w(f"a{j}_i = int64(0)")

            def update(red=red) -> None:  # type: ignore[no-untyped-def]
                for j in red:
                    kind, src_reg, acc = accs[j]
                    v = name[spec.ops[j].args[0]]
                    if REDUCTIONS[kind].index:
                        cmp = ">" if kind == "argmax" else "<"
                        wc(f"v{j} = {cast(v, src_reg, acc)}")
                        wc(f"if v{j} {cmp} a{j} or (v{j} != v{j} and a{j} == a{j}):")
                        wc(f"    a{j} = v{j}")
                        wc(f"    a{j}_i = {{J}}")
                        continue
                    wc(f"a{j} = {comb(kind, f'a{j}', acc_value(j))}")

            if cuda:
                ops_needed = _cone(spec, lev, inputs)
                loop(ops_needed, full_leaves(ops_needed, inputs), update)
                _group_combine(w, red, accs, comb, sim=target.name == "cuda-sim")
            else:
                staged_pass(phase - 1, red, update)
            for j in red:
                kind, _, acc = accs[j]
                o = spec.ops[j]
                r = ("t", j)
                out_reg = dtypes.register(o.dtype)
                accv = f"a{j}_i" if REDUCTIONS[kind].index else f"a{j}"
                value = convert(accv, out_reg) if kind not in ("any", "all") else f"({accv} != 0)"
                if o.dtype == np.float16:
                    value = f"f16_round({value})"
                if not partial:
                    w(f"t{j} = {value}")
                reg[r], desc[r], name[r] = out_reg, o.dtype, f"t{j}"
            emit_row_ops(phase)

        # the last pass: full outputs
        if full_outs:
            refs = [spec.outs[k].ref for k in full_outs]
            if cuda:
                ops_needed = _cone(spec, lev, refs)
            else:
                use_buffers(len(passes) - 1)
                ops_needed = computed[-1]

            def store() -> None:
                for k in full_outs:
                    o = spec.outs[k]
                    wc(f"out{k}[out{k}_e{{s}}] = {target.store(name[o.ref], reg[o.ref], o.dtype)}")

            if not in_registers:
                if cuda:
                    loop(ops_needed, full_leaves(ops_needed, refs), store)
                else:
                    element_loop(ops_needed, full_leaves(ops_needed, refs), store, outs=True)
            else:  # wide stores of the held elements

                def wide_store(g: int) -> None:
                    w(f"if ok_{g}:")
                    w.indent()
                    for k in full_outs:
                        out = spec.outs[k]
                        vals = ", ".join(target.store(name[out.ref].replace("{s}", f"_{g}_{e}"), reg[out.ref],
                                                      out.dtype) for e in range(width))  # fmt: skip
                        w(f"vst{width}(out{k}, out{k}_w + c_{g}, ({vals}))")
                    w.dedent()

                held_loop(ops_needed, full_leaves(ops_needed, refs), None, wide_store)
        row_outs = [k for k, o in enumerate(spec.outs) if o.layout != "full"]
        if row_outs:
            guard = "act and lane == 0" if cuda else ""
            if guard:
                w(f"if {guard}:")
                w.indent()
            for k in row_outs:
                out = spec.outs[k]
                if out.layout == "acc":  # partial: the raw accumulator of the chunk, at position rr
                    j = out.ref[1]
                    acc = accs[j][2]
                    at = f"out{k}_o + rr" if offsets else "rr"
                    w(f"out{k}[{at}] = {target.store(f'a{j}', acc, out.dtype)}")
                else:
                    w(f"out{k}[out{k}_w] = {target.store(name[out.ref], reg[out.ref], out.dtype)}")
            if guard:
                w.dedent()

    if held:
        w("if held:")
        w.indent()
        emit_all(True)
        w.dedent()
        w("else:")
        w.indent()
        loaded.clear()
        emit_all(False)
        w.dedent()
    else:
        emit_all(False)
    if sim_loop:
        w("rr0 += rstep")
    return w.text(), params


def _group_combine(w: Writer, red: list[int], accs: dict, comb, sim: bool = False) -> None:  # type: ignore[no-untyped-def]
    """CUDA: combine the accumulators of the ``tpr`` threads of a row; all of them get the result.
    A butterfly within each warp; for rows of several warps (``nw``) each warp's partial goes to
    shared memory, every lane takes partial ``wl % nw`` and a second butterfly over ``nw`` lanes
    combines them (each aligned group of ``nw`` lanes holds every partial once, so every lane ends
    with the same value). Before stop 36 every thread looped over the ``nw`` partials: ~27
    instructions an iteration, 3 iterations for a 4096-wide row (ptxas sm_90), ~5 instructions per
    element of the ~40 in a float16 softmax. (numba's simulator has no warp shuffles: there the
    butterfly goes through shared memory.)"""
    _butterfly(w, red, accs, comb, sim, "width // 2")
    w("if tpr > 32:")
    w.indent()
    w("if wl == 0:")
    for j in red:
        w(f"    sh{j}[wid] = a{j}")
        if REDUCTIONS[accs[j][0]].index:
            w(f"    sh{j}_i[wid] = a{j}_i")
    w("cuda.syncthreads()")
    w("k = w0 + (wl & (nw - 1))")
    for j in red:
        w(f"a{j} = sh{j}[k]")
        if REDUCTIONS[accs[j][0]].index:
            w(f"a{j}_i = sh{j}_i[k]")
    _butterfly(w, red, accs, comb, sim, "nw // 2")
    w("cuda.syncthreads()")
    w.dedent()


def _butterfly(w: Writer, red: list[int], accs: dict, comb, sim: bool, start: str) -> None:  # type: ignore[no-untyped-def]
    """Combine each accumulator with the lanes ``off`` apart, for ``off`` from ``start`` down to 1."""
    w(f"off = {start}")
    w("while off > 0:")
    w.indent()
    for j in red:
        kind = accs[j][0]
        index = REDUCTIONS[kind].index
        if sim:
            w(f"sx{j}[tid] = a{j}")
            if index:
                w(f"sx{j}_i[tid] = a{j}_i")
            w("cuda.syncthreads()")
            got, got_i = f"sx{j}[tid ^ off]", f"sx{j}_i[tid ^ off]"
        else:
            got, got_i = _shfl(f"a{j}", accs[j][2]), _shfl(f"a{j}_i", np.dtype(np.int64))
        w(f"b{j} = {got}")
        if index:
            w(f"b{j}_i = {got_i}")
        if sim:
            w("cuda.syncthreads()")
        if index:
            _better(w, j, kind, f"b{j}", f"b{j}_i")
        else:
            w(f"a{j} = {comb(kind, f'a{j}', f'b{j}')}")
    w("off = off // 2")
    w.dedent()


def _shfl(var: str, acc: np.dtype) -> str:
    """Butterfly exchange of ``var`` (numba shuffles signed ints and floats: unsigned go as int64)."""
    if acc.kind == "u":
        return f"{dtypes.CTOR[acc]}(cuda.shfl_xor_sync(0xFFFFFFFF, int64({var}), off))"
    return f"cuda.shfl_xor_sync(0xFFFFFFFF, {var}, off)"


def _better(w: Writer, j: int, kind: str, v: str, i: str) -> None:
    """argmax/argmin merge: NaN wins (the first one), then the larger (smaller), ties: first index."""
    cmp = ">" if kind == "argmax" else "<"
    w(f"c{j} = {v}")
    w(f"ci{j} = {i}")
    w(f"if (c{j} != c{j} and (a{j} == a{j} or ci{j} < a{j}_i)) or (a{j} == a{j} and (c{j} {cmp} a{j} or (c{j} == a{j} and ci{j} < a{j}_i))):")  # fmt: skip
    w(f"    a{j} = c{j}")
    w(f"    a{j}_i = ci{j}")
