"""Render an elementwise kernel as Python source in numba's kernel dialect (pure string work).

* ``cpu``: a function of 1-D arrays, element offsets and strides, looping with ``prange`` over the
  outer dimension and ``range`` inside (compiled by numba ``njit``);
* ``cuda``: a kernel over raw pointers, strides and sizes as int64 arguments (compiled by
  ``numba.cuda.compile_ptx``), loaded and launched by the driver, in one of three shapes: *flat*
  (16-byte ``vld``/``vst`` groups when aligned), *rows* (a 2-D grid of rows x the inner axis,
  offsets once per row) and *tiled* (transposed inputs through shared memory); see
  :func:`_render_cuda` and :func:`_render_tiled`. ``cuda-sim`` runs the same source in numba's
  CUDA simulator.

The body (loads, one line per op, stores) is shared. Names are stable: ``in3`` is leaf 3, ``s2`` a
scalar argument, ``t5`` the value of op 5, ``out0`` output 0; the header lists the key and the
parameters (:mod:`fusetree.codegen.abi`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..ir import dtypes
from ..schedule.spec import KernelSpec, OutSpec, Ref
from . import abi
from .common import Target, Writer, aligned_check, begin, op_value, wide_load
from .common import vector_width as _width


class Vector(NamedTuple):
    """Wide accesses in :func:`body`: ``width`` elements per ``vld``/``vst``; ``leaves`` and ``outs``
    map the arrays accessed that way to the index expression of a group's first element (with
    ``{e}`` standing for the group's element offset); ``groups`` lists (offset expression, copy
    suffixes of the group's elements)."""

    width: int
    leaves: dict[int, str]
    outs: dict[int, str]
    groups: list[tuple[str, list[str]]]


def body(spec: KernelSpec, w: Writer, target: Target, load, store, preloaded: frozenset | set = frozenset(),
         copies: tuple[str, ...] = ("",), vector: Vector | None = None, late: frozenset | set = frozenset(),
         between: str = "", guard: Callable[[str], str] | None = None) -> None:  # fmt: skip
    """Loads, one assignment per op, stores. ``load(i, sfx)``/``store(k, sfx)`` give array element
    expressions. Several ``copies`` (name suffixes, for unrolled loops) emit every copy's loads
    first, then every copy's ops, then the stores, so loads are in flight together; with a
    ``vector``, the copies of a group load and store the arrays it names with one wide access.
    ``late`` leaves are loaded after the others, with the line ``between`` in between (a barrier);
    ``guard(sfx)``: a condition each copy's stores are made under (a vector group's: its first
    copy's)."""
    reg: dict[Ref, np.dtype] = {}
    desc: dict[Ref, dtypes.Desc] = {}
    name: dict[Ref, str] = {}
    used = {r for o in spec.ops for r in o.args} | {o.ref for o in spec.outs}
    fixed = {("x", i) for i, lf in enumerate(spec.leaves) if lf.kind == "scalar" or i in preloaded}
    wide = vector.leaves if vector is not None else {}
    loads = []
    for i, lf in enumerate(spec.leaves):
        r: Ref = ("x", i)
        desc[r] = lf.desc
        if lf.kind == "scalar":
            reg[r] = target.scalar_storage(lf.dtype)  # the dtype the scalar parameter is passed as
            name[r] = f"s{i}"
        elif r in used:
            reg[r] = dtypes.register(lf.dtype)
            name[r] = f"x{i}"
            if i not in preloaded:
                loads.append((i, lf))
    if vector is not None:
        for e, sfxs in vector.groups:
            for i, lf in loads:
                if i in wide:
                    wide_load(w, target, i, lf.dtype, sfxs, vector.width, wide[i].format(e=e))
    for sfx in copies:
        for i, lf in loads:
            if i not in wide and i not in late:
                w(f"x{i}{sfx} = {target.load(load(i, sfx), lf.dtype)}")
    if between:
        w(between)
    for sfx in copies:
        for i, lf in loads:
            if i in late:
                w(f"x{i}{sfx} = {target.load(load(i, sfx), lf.dtype)}")
    lines = []
    for j, o in enumerate(spec.ops):
        args = [name[a] + "{sfx}" * (a not in fixed) for a in o.args]
        value, out_reg = op_value(o, args, [reg[a] for a in o.args], [desc[a] for a in o.args])
        r = ("t", j)
        lines.append(f"t{j}{{sfx}} = {value}")
        reg[r], desc[r], name[r] = out_reg, o.dtype, f"t{j}"
    for sfx in copies:
        for line in lines:
            w(line.replace("{sfx}", sfx))

    def stored(out: OutSpec, sfx: str) -> str:
        src = name[out.ref] + ("" if out.ref in fixed else sfx)
        return target.store(src, reg[out.ref], out.dtype)

    wide_outs = vector.outs if vector is not None else {}
    for sfx in copies:
        plain = [(k, out) for k, out in enumerate(spec.outs) if k not in wide_outs]
        if guard is not None and plain:
            w(f"if {guard(sfx)}:")
            w.indent()
        for k, out in plain:
            w(f"{store(k, sfx)} = {stored(out, sfx)}")
        if guard is not None and plain:
            w.dedent()
    if vector is not None and wide_outs:
        for e, sfxs in vector.groups:
            if guard is not None:  # a group is all in or all out: its first element's condition
                w(f"if {guard(sfxs[0])}:")
                w.indent()
            for k, out in enumerate(spec.outs):
                if k in wide_outs:
                    vals = ", ".join(stored(out, s) for s in sfxs)
                    w(f"vst{vector.width}(out{k}, {wide_outs[k].format(e=e)}, ({vals}))")
            if guard is not None:
                w.dedent()


TILE = 32  # scalar tiled path: tiles of TILE x TILE elements (or 2 TILE: ``cuda_tile``), threads as TILE x TILE_ROWS
TILE_ROWS = 8
# tiled kernels are launched with blocks of 16 x 16 threads, one tile per block: the wide path
# tiles 16 x 16 vectors (a 64 x 64 tile of 4-byte and narrower types), the scalar path sees the
# same 256 threads as TILE x TILE_ROWS. H100, 8192^2 ``a.T + b`` (benchmarks/probe_transpose.py,
# % of copy, float32 / 2-byte): 32 x 32 scalar tiles, one per block 94.8 / 71.8, a grid of 8 blocks
# per SM 89.6 / 77.3; 64 x 64 tiles with 16-byte float32 accesses 99.0, 4-byte pairs of 2-byte
# elements 89.1 (this kernel: 8-byte quads)
TILE_BLOCK = (16, 16)


def vector_width(spec: KernelSpec) -> int:
    """Elements per wide access of a CUDA elementwise kernel (:func:`.common.vector_width` of its
    arrays)."""
    return _width([lf.dtype.itemsize for lf in spec.leaves if lf.kind == "buffer"]
                  + [o.dtype.itemsize for o in spec.outs])  # fmt: skip


def tiled_width(spec: KernelSpec, vector: bool = True) -> int:
    """Elements per wide access of a tiled kernel's wide path (1: none): at most 4, so that a tile
    of ``16 * width`` squared stays within shared memory for 8-byte types and several inputs."""
    return min(4, vector_width(spec)) if vector else 1


def tile_edge(spec: KernelSpec, vector: bool, tile: int) -> int:
    """Edge of the tile one block of a tiled kernel covers at a time (the launch's grid unit)."""
    v = tiled_width(spec, vector)
    return TILE_BLOCK[0] * v if v > 1 else tile


def render(spec: KernelSpec, target: Target, unroll: int = 1, vector: bool = True,
           tile: int = TILE) -> tuple[str, list[str]]:  # fmt: skip
    """Source of elementwise kernel ``spec`` for ``target`` and its parameter names. CUDA targets:
    ``unroll`` groups (vectors, or elements without ``vector``) per thread and grid-stride step;
    ``vector``: wide accesses where the arrays allow (see :func:`_render_cuda`); ``tile``: the
    tile edge of the scalar path of kernels reading a transposed input (32 or 64,
    :func:`_render_tiled`)."""
    params = [p.name for p in abi.params(spec, target.name)]
    w = begin(spec, target.name, params)
    if target.cuda and tiled(spec):
        if tile not in (TILE, 2 * TILE):
            raise ValueError(f"cuda_tile must be {TILE} or {2 * TILE}, got {tile}")
        _render_tiled(spec, target, w, tile, tiled_width(spec, vector))
    elif target.cuda:
        _render_cuda(spec, target, w, max(1, unroll), vector_width(spec) if vector else 1)
    else:
        _render_cpu(spec, target, w)
    return w.text(), params


def tiled(spec: KernelSpec) -> bool:
    """Whether a CUDA elementwise kernel reads a transposed ("T") input through shared-memory tiles
    (False for reduction and horizontal kernels)."""
    return (
        spec.frame is None
        and not spec.horizontal
        and spec.ndim >= 2
        and any(lf.layout == "T" for lf in spec.leaves)
    )


def _render_tiled(spec: KernelSpec, target: Target, w: Writer, tile: int = TILE, width: int = 1) -> None:
    """A kernel over tiles of the last two axes (rows ``i``, columns ``j``; leading axes are a
    batch), blocks of 16 x 16 threads, each block one tile at a time (a grid-stride loop over
    tiles). A transposed input ("T": contiguous along ``i``) is read coalesced along ``i`` into a
    padded shared-memory tile; then every thread computes its elements reading the tile
    transposed and the other arrays (and writing the outputs) coalesced along ``j``.

    *Wide path* (``width`` > 1, taken when the sizes, strides and pointers allow: checked once, in
    the kernel): ``16 width`` square tiles; the transposed inputs are read as ``width``-element
    vectors along ``i``, the contiguous ("C", "I") arrays as vectors along ``j``; each thread
    holds ``width`` rows x ``width`` columns. *Scalar path* (else): ``tile`` square tiles, the
    threads seen as ``TILE x TILE_ROWS``, each ``(tile/TILE) x (tile/TILE_ROWS)`` elements (a 64
    tile makes a warp's row segments 128 bytes for 2-byte types)."""
    nd = spec.ndim
    ia, ja = nd - 2, nd - 1
    arrays = _arrays(spec)
    trans = [i for i, lf in enumerate(spec.leaves) if lf.kind == "buffer" and lf.layout == "T"]
    wide_edge = TILE_BLOCK[0] * width if width > 1 else 0
    edge = max(tile, wide_edge)
    w(f"nI = n{ia}")
    w(f"nJ = n{ja}")
    w("plane = nI * nJ")
    w("nb = ntotal // plane if plane > 0 else 0")
    w(f"lin = cuda.threadIdx.y * {TILE_BLOCK[0]} + cuda.threadIdx.x")
    for i in trans:  # one array for both paths (the larger tile), rows padded by one element
        st = target.storage(spec.leaves[i].dtype)
        w(f"sh{i} = cuda.shared.array(({edge}, {edge + 1}), {dtypes.CTOR[st]})")

    def tile_loop(t: int, tx: str, ty: str) -> dict[str, str]:
        """The loop over ``t``-square tiles and each tile's position; returns each array's index
        expression (``{I}``, ``{J}`` standing for the element's row and column)."""
        w(f"tx = {tx}")
        w(f"ty = {ty}")
        w(f"tI = (nI + {t - 1}) // {t}")
        w(f"tJ = (nJ + {t - 1}) // {t}")
        w("ntiles = nb * tI * tJ")
        w("tile = cuda.blockIdx.x")
        w("while tile < ntiles:")
        w.indent()
        w("q = tile")
        w("cj = q % tJ")
        w("q = q // tJ")
        w("ci = q % tI")
        w("b = q // tI")
        w(f"I0 = ci * {t}")
        w(f"J0 = cj * {t}")
        if nd > 2:
            w("q = b")
            for d in range(ia - 1, 0, -1):
                w(f"i{d} = q % n{d}")
                w(f"q = q // n{d}")
            w("i0 = q")
        idx: dict[str, str] = {}
        for a, lay in arrays:
            if lay == "C":
                idx[a] = "(b * nI + {I}) * nJ + {J}"
                continue
            terms = ([f"{a}_o"] if target.offsets else []) + [f"i{d} * {a}_s{d}" for d in range(ia)]
            w(f"{a}_p = {' + '.join(terms) or '0'}")
            # "T": contiguous along i (stride 1); "I": along j; "R": j broadcast
            idx[a] = {"T": f"{a}_p + {{I}} + {{J}} * {a}_s{ja}", "I": f"{a}_p + {{I}} * {a}_s{ia} + {{J}}",
                      "R": f"{a}_p + {{I}} * {a}_s{ia}"}.get(lay, f"{a}_p + {{I}} * {a}_s{ia} + {{J}} * {a}_s{ja}")  # fmt: skip
        return idx

    def end_tile() -> None:
        if trans:
            w("cuda.syncthreads()")
        w("tile += cuda.gridDim.x")
        w.dedent()

    def tile_body(
        idx: dict[str, str], cells: dict[str, tuple[str, str, str, str]], vec: Vector | None = None
    ) -> None:
        """A tile's loads, ops and stores, and the loop's end. ``cells``: each copy suffix's element
        (row, column: clamped into the array; the unclamped row and column its stores are
        guarded by)."""

        def at(a: str, sfx: str) -> str:
            row, col, _, _ = cells[sfx]
            return f"{a}[{idx[a].format(I=row, J=col)}]"

        def load(i: int, sfx: str) -> str:
            if i in trans:  # the transposed input from the shared tile
                row, col, _, _ = cells[sfx]
                return f"sh{i}[{col} - J0, {row} - I0]"
            return at(f"in{i}", sfx)

        def guard(sfx: str) -> str:
            _, _, row, col = cells[sfx]
            return f"{col} < nJ and {row} < nI"

        body(spec, w, target, load=load, store=lambda k, sfx: at(f"out{k}", sfx), copies=tuple(cells), vector=vec,
             late=set(trans), between="cuda.syncthreads()" if trans else "", guard=guard)  # fmt: skip
        end_tile()

    def wide_path() -> None:
        v, t = width, wide_edge
        rows = TILE_BLOCK[1]
        idx = tile_loop(t, "cuda.threadIdx.x", "cuda.threadIdx.y")
        for i in trans:  # rows jj of the input, vectors along i, stored as sh[j][i]
            regs = ", ".join(f"v{i}_{e}" for e in range(v))
            for k in range(t // rows):
                w(f"jj = J0 + ty + {k * rows}")
                w(f"ii = I0 + {v} * tx")
                w("if ii < nI and jj < nJ:")
                w.indent()
                w(f"{regs} = vld{v}(in{i}, {idx[f'in{i}'].format(I='ii', J='jj')})")
                for e in range(v):
                    w(f"sh{i}[ty + {k * rows}, {v} * tx + {e}] = v{i}_{e}")
                w.dedent()
        # a thread's elements: rows I_k (clamped into the array: every load is valid), columns
        # Jv .. Jv + width - 1 (nJ is a multiple of width: a vector is all in or all out)
        per = t // rows
        w(f"Jv = min(J0 + {v} * tx, nJ - {v})")
        for k in range(per):
            w(f"I_{k} = min(I0 + ty + {k * rows}, nI - 1)")
        where = {f"_{k}_{e}": (k, e) for k in range(per) for e in range(v)}
        wide = [a for a, lay in arrays if lay in ("C", "I")]
        vec = Vector(v, {}, {}, [(f"I_{k}", [f"_{k}_{e}" for e in range(v)]) for k in range(per)])
        for i in range(len(spec.leaves)):
            if f"in{i}" in wide:
                vec.leaves[i] = idx[f"in{i}"].format(I="{e}", J="Jv")
        for k in range(len(spec.outs)):
            if f"out{k}" in wide:
                vec.outs[k] = idx[f"out{k}"].format(I="{e}", J="Jv")

        cells = {sfx: (f"I_{k}", f"(Jv + {e})" if e else "Jv", f"I0 + ty + {k * rows}", f"J0 + {v} * tx")
                 for sfx, (k, e) in where.items()}  # fmt: skip
        tile_body(idx, cells, vec)

    def scalar_path() -> None:
        per = tile // TILE_ROWS  # rows per thread
        cols = tile // TILE  # columns per thread
        idx = tile_loop(tile, f"lin % {TILE}", f"lin // {TILE}")

        def plus(c: int) -> str:  # column block c of a thread: tx + 32c
            return f" + {c * TILE}" if c else ""

        for i in trans:  # coalesced along i into the tile, stored as [j][i]
            for c in range(cols):
                for k in range(per):
                    w(f"jj = J0 + ty + {k * TILE_ROWS}")
                    w(f"ii = I0 + tx{plus(c)}")
                    w("if ii < nI and jj < nJ:")
                    w(
                        f"    sh{i}[ty + {k * TILE_ROWS}, tx{plus(c)}] = in{i}[{idx[f'in{i}'].format(I='ii', J='jj')}]"
                    )
        # each thread's elements (I_k, J_c): positions clamped into the array, so every load is
        # valid and the other operands are in flight with the tile's loads, before the barrier
        jname = {c: "J" if cols == 1 else f"J_{c}" for c in range(cols)}
        for c in range(cols):
            w(f"{jname[c]} = min(J0 + tx{plus(c)}, nJ - 1)")
        for k in range(per):
            w(f"I_{k} = min(I0 + ty + {k * TILE_ROWS}, nI - 1)")
        cells = {(f"_{k}" if cols == 1 else f"_{c}_{k}"): (f"I_{k}", jname[c], f"I0 + ty + {k * TILE_ROWS}",
                                                          f"J0 + tx{plus(c)}")
                 for c in range(cols) for k in range(per)}  # fmt: skip
        tile_body(idx, cells)

    if width == 1:
        scalar_path()
        return
    # the wide path's condition (uniform across threads): sizes, strides and pointers in vectors
    wide = [(a, lay) for a, lay in arrays if lay in ("C", "I", "T")]
    conds = [f"nI % {width} == 0", f"nJ % {width} == 0", aligned_check(_pointers(spec, target, wide), width)]
    for a, lay in wide:
        if lay == "T":
            conds += [f"{a}_s{d} % {width} == 0" for d in range(nd) if d != ia]
        elif lay == "I":
            conds += [f"{a}_s{d} % {width} == 0" for d in range(ja)]
    w(f"if {' and '.join(conds)}:")
    w.indent()
    wide_path()
    w.dedent()
    w("else:")
    w.indent()
    scalar_path()
    w.dedent()


def _itemsizes(spec: KernelSpec) -> dict[str, int]:
    """Each array parameter's element size (``in<i>``, ``out<k>``)."""
    item = {f"in{i}": lf.dtype.itemsize for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"}
    item.update({f"out{k}": o.dtype.itemsize for k, o in enumerate(spec.outs)})
    return item


def _pointers(spec: KernelSpec, target: Target, arrays: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """(address expression of element 0, item size) of each ``(array, layout)``, for
    :func:`.common.aligned_check` (targets passing element offsets add them)."""
    item = _itemsizes(spec)
    return [(f"(addr({a}) + {a}_o * {item[a]})" if target.offsets and spec.strided(lay) else f"addr({a})", item[a])
            for a, lay in arrays]  # fmt: skip


def _arrays(spec: KernelSpec) -> list[tuple[str, str]]:
    arrays = [(f"in{i}", lf.layout) for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"]
    return arrays + [(f"out{k}", o.layout) for k, o in enumerate(spec.outs)]


def _render_cpu(spec: KernelSpec, target: Target, w: Writer) -> None:
    """Flat kernels: one ``prange`` loop. Others: nested loops (``prange`` outermost) carrying each
    array's position; the innermost loop reads rows sliced out of the 1-D arrays, so LLVM sees
    unit-stride accesses and vectorizes them without gathers; inner-broadcast ("R") leaves are
    loaded once per row."""
    arrays = _arrays(spec)
    nd = max(spec.ndim, 1)
    preloaded: set[int] = set()
    idx: dict[str, str] = {}
    rows: dict[str, str] = {}  # arrays read through a row slice
    if spec.flat:
        idx = {a: "i" for a, _ in arrays}
        w("for i in prange(n):")
        w.indent()
    else:
        last = nd - 1
        for d in range(last):
            w(f"for i{d} in {'prange' if d == 0 else 'range'}(n{d}):")
            w.indent()
            w(f"lin{d} = {'i0' if d == 0 else f'lin{d - 1} * n{d} + i{d}'}")
            for a, lay in arrays:
                if lay != "C":
                    prev = f"{a}_o" if d == 0 else f"{a}_p{d - 1}"
                    w(f"{a}_p{d} = {prev} + i{d} * {a}_s{d}")
        if last:
            w(f"row = lin{last - 1} * n{last}")
        for a, lay in arrays:
            pos = f"{a}_o" if last == 0 else f"{a}_p{last - 1}"
            if last == 0:
                idx[a] = {"C": "i0", "I": f"{pos} + i0", "R": pos}.get(lay, f"{pos} + i0 * {a}_s0")
            elif lay in ("C", "I"):
                start = "row" if lay == "C" else pos
                w(f"{a}_r = {a}[{start}:{start} + n{last}]")
                idx[a] = f"i{last}"
                rows[a] = f"{a}_r"
            elif lay == "R":
                idx[a] = pos
            else:
                idx[a] = f"{pos} + i{last} * {a}_s{last}"
        for i, lf in enumerate(spec.leaves):
            if lf.kind == "buffer" and lf.layout == "R":  # hoisted out of the inner loop
                element = f"in{i}[{idx['in' + str(i)]}]"
                w(f"x{i} = {target.load(element, lf.dtype)}")
                preloaded.add(i)
        w(f"for i{last} in {'prange' if last == 0 else 'range'}(n{last}):")
        w.indent()

    def elem(a: str, sfx: str = "") -> str:
        return f"{rows.get(a, a)}[{idx[a]}{sfx}]"

    body(spec, w, target, load=lambda i, sfx: elem(f"in{i}", sfx), store=lambda k, sfx: elem(f"out{k}", sfx),
         preloaded=preloaded)  # fmt: skip


def _render_cuda(spec: KernelSpec, target: Target, w: Writer, unroll: int, width: int) -> None:
    """CUDA kernels, in one of two shapes.

    *Flat* (every array C-contiguous): a grid-stride loop over groups of ``width`` elements, each
    array read and written with one 16-byte (or 8-byte) access per group, when every pointer is
    aligned to it (checked once per thread, in the kernel: no host work); a scalar loop takes the
    tail, or everything when a pointer is misaligned.

    *Rows* (anything else): the shape as ``nrows`` rows of the inner axis ``n<last>``, launched as
    a 2-D grid (x: along the row, y: rows). A thread finds its row's position in every array once
    per row (the only div/mod), then walks the row: inner-contiguous arrays ("C", "I") with wide
    accesses when the row length, their row strides and pointers allow; inner-broadcast ("R")
    leaves are loaded once per row; strided ("S") arrays one element at a time.
    """
    arrays = _arrays(spec)
    nd = max(spec.ndim, 1)
    last = nd - 1
    flat = spec.flat
    layout = dict(arrays)
    wide_arrays = [a for a, lay in arrays if flat or lay in ("C", "I")] if width > 1 else []
    idx: dict[str, str] = {}  # each array's element index, ``{J}`` standing for the element
    preloaded: set[int] = set()

    def aligned() -> str:
        """The kernel's condition for wide accesses (uniform across threads)."""
        conds = [] if flat else [f"nin % {width} == 0"]
        conds.append(aligned_check(_pointers(spec, target, [(a, layout[a]) for a in wide_arrays]), width))
        for a in wide_arrays:
            if not flat and layout[a] == "I":
                conds += [f"{a}_s{d} % {width} == 0" for d in range(last)]
        return " and ".join(conds)

    def group_loop(bound: str, start: str, step: str, elem0: str, unroll: int = unroll) -> None:
        """A grid-stride loop over groups ``j`` (of ``width`` elements, ``unroll`` per step, then
        one per step for the rest) whose first element is ``elem0`` (``{j}`` standing for ``j``)."""
        sfx = [[f"_{u}_{c}" if unroll > 1 else f"_{c}" for c in range(width)] for u in range(unroll)]
        w(f"j = {start}")
        if unroll > 1:
            w(f"while j + {unroll - 1} * {step} < {bound}:")
            w.indent()
            for u in range(1, unroll):
                w(f"j_{u} = j + {u} * {step}")
        else:
            w(f"while j < {bound}:")
            w.indent()
        groups = []
        for u in range(unroll):
            e = f"e_{u}" if unroll > 1 else "e"
            w(f"{e} = {elem0.format(j='j' if u == 0 else f'j_{u}')}")
            groups.append((e, sfx[u]))
        vec = Vector(width, {}, {}, groups)
        for i in range(len(spec.leaves)):
            if f"in{i}" in wide_arrays:
                vec.leaves[i] = idx[f"in{i}"].format(J="{e}")
        for k in range(len(spec.outs)):
            if f"out{k}" in wide_arrays:
                vec.outs[k] = idx[f"out{k}"].format(J="{e}")
        element = {s: f"({e} + {c})" for e, ss in groups for c, s in enumerate(ss)}

        def at(a: str, s: str) -> str:
            return f"{a}[{idx[a].format(J=element[s])}]"

        body(spec, w, target, load=lambda i, s: at(f"in{i}", s), store=lambda k, s: at(f"out{k}", s),
             preloaded=preloaded, copies=tuple(s for ss in sfx for s in ss), vector=vec)  # fmt: skip
        w(f"j += {unroll} * {step}" if unroll > 1 else f"j += {step}")
        w.dedent()
        if unroll > 1:
            group_loop(bound, "j", step, elem0, 1)

    def scalar_loop(bound: str, start: str, step: str) -> None:
        w(f"j = {start}")
        w(f"while j < {bound}:")
        w.indent()

        def at(a: str) -> str:
            return f"{a}[{idx[a].format(J='j')}]"

        body(spec, w, target, load=lambda i, s: at(f"in{i}"), store=lambda k, s: at(f"out{k}"),
             preloaded=preloaded)  # fmt: skip
        w(f"j += {step}")
        w.dedent()

    if flat:
        idx = {a: "{J}" for a, _ in arrays}
        w("t = cuda.grid(1)")
        w("step = cuda.gridsize(1)")
        tail = "t"
        if wide_arrays:
            w(f"if {aligned()}:")
            w.indent()
            w(f"nv = n // {width}")
            group_loop("nv", "t", "step", f"{{j}} * {width}")
            w(f"tail = nv * {width} + t")
            w.dedent()
            w("else:")
            w("    tail = t")
            tail = "tail"
        elif unroll > 1:
            group_loop("n", "t", "step", "{j}")
            return
        scalar_loop("n", tail, "step")
        return
    # rows x inner
    w(f"nin = n{last}")
    w("nrows = ntotal // nin if nin > 0 else 0")
    w("tx = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x")
    w("sx = cuda.gridDim.x * cuda.blockDim.x")
    w("r = cuda.threadIdx.y + cuda.blockIdx.y * cuda.blockDim.y")
    w("sy = cuda.gridDim.y * cuda.blockDim.y")
    if wide_arrays:
        w(f"wide = {aligned()}")
    w("while r < nrows:")
    w.indent()
    if last:
        w("q = r")
        for d in range(last - 1, 0, -1):
            w(f"i{d} = q % n{d}")
            w(f"q = q // n{d}")
        w("i0 = q")
    for a, lay in arrays:
        if lay == "C":
            idx[a] = "r * nin + {J}" if last else "{J}"
            continue
        terms = ([f"{a}_o"] if target.offsets else []) + [f"i{d} * {a}_s{d}" for d in range(last)]
        w(f"{a}_p = {' + '.join(terms) or '0'}")
        idx[a] = {"I": f"{a}_p + {{J}}", "R": f"{a}_p"}.get(lay, f"{a}_p + {{J}} * {a}_s{last}")
    for i, lf in enumerate(spec.leaves):
        if lf.kind == "buffer" and lf.layout == "R":  # once per row
            w(f"x{i} = {target.load(f'in{i}[in{i}_p]', lf.dtype)}")
            preloaded.add(i)
    if wide_arrays:
        w("if wide:")
        w.indent()
        group_loop(f"nin // {width}", "tx", "sx", f"{{j}} * {width}")
        w.dedent()
        w("else:")
        w.indent()
        scalar_loop("nin", "tx", "sx")
        w.dedent()
    elif unroll > 1:
        group_loop("nin", "tx", "sx", "{j}")
    else:
        scalar_loop("nin", "tx", "sx")
    w("r += sy")
