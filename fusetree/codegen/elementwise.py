"""Render an elementwise kernel as Python source in numba's kernel dialect (pure string work).

* ``cpu``: a function of 1-D arrays, element offsets and strides, looping with ``prange`` over the
  outer dimension and ``range`` inside (compiled by numba ``njit``);
* ``cuda``: a grid-stride kernel over raw pointers, strides and sizes as int64 arguments (compiled
  by ``numba.cuda.compile_ptx``), loaded and launched by the driver; ``cuda-sim`` runs the same
  source in numba's CUDA simulator.

The body (loads, one line per op, stores) is shared. Names are stable: ``in3`` is leaf 3, ``s2`` a
scalar argument, ``t5`` the value of op 5, ``out0`` output 0; the header lists the key and the
parameters (:mod:`fusetree.codegen.abi`).
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
from ..schedule.spec import KernelSpec, Ref
from . import abi
from .common import Target, Writer, begin, op_value


def body(spec: KernelSpec, w: Writer, target: Target, load, store, preloaded: frozenset | set = frozenset(),
         copies: tuple[str, ...] = ("",)) -> None:  # fmt: skip
    """Loads, one assignment per op, stores. ``load(i, sfx)``/``store(k, sfx)`` give array element
    expressions. Several ``copies`` (name suffixes, for unrolled loops) emit every copy's loads
    first, then every copy's ops, then the stores, so loads are in flight together."""
    reg: dict[Ref, np.dtype] = {}
    desc: dict[Ref, dtypes.Desc] = {}
    name: dict[Ref, str] = {}
    used = {r for o in spec.ops for r in o.args} | {o.ref for o in spec.outs}
    fixed = {("x", i) for i, lf in enumerate(spec.leaves) if lf.kind == "scalar" or i in preloaded}
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
    for sfx in copies:
        for i, lf in loads:
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
    for sfx in copies:
        for k, out in enumerate(spec.outs):
            src = name[out.ref] + ("" if out.ref in fixed else sfx)
            w(f"{store(k, sfx)} = {target.store(src, reg[out.ref], out.dtype)}")


def render(spec: KernelSpec, target: Target, unroll: int = 1) -> tuple[str, list[str]]:
    """Source of elementwise kernel ``spec`` for ``target`` and its parameter names. ``unroll``:
    elements per thread and grid-stride step of a flat CUDA kernel."""
    params = [p.name for p in abi.params(spec, target.name)]
    w = begin(spec, target.name, params)
    arrays = [(f"in{i}", lf.layout) for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"]
    arrays += [(f"out{k}", o.layout) for k, o in enumerate(spec.outs)]
    nd = max(spec.ndim, 1)
    preloaded: set[int] = set()
    idx: dict[str, str] = {}
    rows: dict[str, str] = {}  # CPU: arrays read through a row slice (unit stride for LLVM)
    if spec.flat:
        idx = {a: "i" for a, _ in arrays}
        if target.name == "cpu":
            w("for i in prange(n):")
        else:
            w("i = cuda.grid(1)")
            w("step = cuda.gridsize(1)")
            w("while i < n:")
        w.indent()
    elif target.name == "cpu":
        # Outer dimensions: nested loops (prange outermost) carrying each array's position. The
        # innermost loop reads rows sliced out of the 1-D arrays, so LLVM sees unit-stride
        # accesses and vectorizes them without gathers; inner-broadcast ("R") leaves are loaded
        # once per row.
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
    else:
        w("i = cuda.grid(1)")
        w("step = cuda.gridsize(1)")
        w("while i < ntotal:")
        w.indent()
        w("r = i")
        for d in range(nd - 1, -1, -1):
            w(f"i{d} = r % n{d}" if d else "i0 = r")
            if d:
                w(f"r = r // n{d}")
        for a, lay in arrays:
            if lay == "C":
                idx[a] = "i"
                continue
            terms = [f"i{d}" if lay == "I" and d == nd - 1 else f"i{d} * {a}_s{d}" for d in range(nd)]
            idx[a] = " + ".join(([f"{a}_o"] if target.offsets else []) + terms)

    def elem(a: str, sfx: str = "") -> str:
        return f"{rows.get(a, a)}[{idx[a]}{sfx}]"

    def emit(copies: tuple[str, ...]) -> None:
        body(spec, w, target, load=lambda i, sfx: elem(f"in{i}", sfx), store=lambda k, sfx: elem(f"out{k}", sfx),
             preloaded=preloaded, copies=copies)  # fmt: skip

    unroll = unroll if target.cuda and spec.flat else 1
    if unroll > 1:
        # flat grid-stride loop, ``unroll`` elements (one grid stride apart) per thread and step
        w.lines.pop()
        w.dedent()
        w(f"while i + {unroll - 1} * step < n:")
        w.indent()
        for u in range(1, unroll):
            w(f"i_{u} = i + {u} * step")
        emit(("",) + tuple(f"_{u}" for u in range(1, unroll)))
        w(f"i += {unroll} * step")
        w.dedent()
        w("while i < n:")
        w.indent()
    emit(("",))
    if target.name != "cpu":
        w("i += step")
    return w.text(), params
