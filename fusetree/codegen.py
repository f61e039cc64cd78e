"""Render a kernel group as Python source in numba's kernel dialect (pure string work).

One :class:`KernelSpec` (leaves, ops in topological order, outputs) is rendered for a target:

* ``cpu``: a function of 1-D arrays, element offsets and strides, looping with ``prange`` over the
  outer dimension and ``range`` inside (compiled by numba ``njit(parallel=True)``);
* ``cuda``: a grid-stride kernel over raw pointers, one pointer per array, strides and sizes as
  int64 arguments (compiled by ``numba.cuda.compile_ptx``), loaded and launched by the driver.

The body (loads, one line per op, stores) is shared. Names are stable: ``in3`` is leaf 3, ``s2`` a
scalar argument, ``t5`` the value of op 5, ``out0`` output 0; the header lists the key and signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import config, dtypes
from .ops import OPS, operand_dtype

Ref = tuple[str, int]  # ("x", leaf index) or ("t", op index)
# a reduction kernel's parameters after its sizes: rows, row length, chunks per row, chunk length,
# threads per row (CUDA; ignored elsewhere)
FRAME_GEOMETRY = 5


@dataclass(frozen=True)
class LeafSpec:
    kind: str  # "buffer" or "scalar"
    dtype: np.dtype  # logical dtype
    layout: str  # "C", "I", "S"; "" for scalars
    weak: type | None = None

    @property
    def desc(self) -> dtypes.Desc:
        return self.weak if self.weak is not None else self.dtype


@dataclass(frozen=True)
class OpSpec:
    op: str
    dtype: np.dtype
    attrs: tuple
    args: tuple[Ref, ...]


@dataclass(frozen=True)
class OutSpec:
    ref: Ref
    dtype: np.dtype
    layout: str


@dataclass(frozen=True)
class KernelSpec:
    name: str
    key_text: str
    ndim: int
    leaves: tuple[LeafSpec, ...]
    ops: tuple[OpSpec, ...]
    outs: tuple[OutSpec, ...]
    # a reduction kernel (see codegen_frame): (reduced axes, partial); leaves' and outputs' layouts
    # are then their level, "full" or "row" ("acc" for a partial kernel's accumulator output)
    frame: tuple | None = None

    @property
    def flat(self) -> bool:
        """All arrays C-contiguous: the kernel runs over one flat index."""
        if self.frame is not None:
            return False
        return all(lf.layout in ("C", "") for lf in self.leaves) and all(o.layout == "C" for o in self.outs)

    def strided(self, layout: str) -> bool:
        """Whether an array of ``layout`` is passed with its strides (else one flat pointer)."""
        return self.frame is not None or not (self.flat or layout == "C")

    def trailing(self, target: str) -> int:
        """Number of int64 size parameters after the arrays."""
        nd = 1 if self.flat else max(self.ndim, 1)
        if self.frame is not None:
            return nd + FRAME_GEOMETRY
        return nd + (0 if target == "cpu" else 1)

    def param_count(self, target: str) -> int:
        """Number of kernel parameters (each 8 bytes on CUDA)."""
        if self.frame is not None:
            per = self.ndim + (2 if target in ("cpu", "cuda-sim") else 1)
            n = sum(1 if lf.kind == "scalar" else per for lf in self.leaves)
            return n + per * len(self.outs) + self.trailing(target)
        nd = 1 if self.flat else max(self.ndim, 1)
        per_array = 1 if self.flat else (nd + (1 if target in ("cpu", "cuda-sim") else 0))
        n = 0
        for lf in self.leaves:
            n += 1 if lf.kind == "scalar" or lf.layout == "C" else per_array
        n += sum(1 if o.layout == "C" else per_array for o in self.outs)
        return n + nd + (0 if target == "cpu" else 1)


class Writer:
    """A tiny indenting source writer."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append("    " * self.level + line if line else "")

    def indent(self) -> Writer:
        self.level += 1
        return self

    def dedent(self) -> None:
        self.level -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def cast(expr: str, src: np.dtype, dst: np.dtype) -> str:
    """Expression converting ``expr`` (of dtype ``src``) to ``dst``."""
    if src == dst:
        return expr
    if dst.kind == "b":
        return f"({expr} != 0)"
    if src.kind == "f" and dst.kind in "iu" and dst.itemsize < 8 and dst != np.int32:
        # out-of-range float -> small integer is undefined in C; NumPy's loops (x86-64) convert
        # through a wide signed integer and wrap (-1.5 -> uint16 65535): do the same
        return f"{dtypes.CTOR[dst]}(int64({expr}))"
    return f"{dtypes.CTOR[dst]}({expr})"


def convert(expr: str, dst: np.dtype) -> str:
    """Force an op template's result (whose numba type is not tracked) to ``dst``."""
    if dst.kind == "b":
        return f"(({expr}) != 0)"
    return f"{dtypes.CTOR[dst]}({expr})"


def _body(spec: KernelSpec, w: Writer, load, store, storage, scalar_storage,
          preloaded: frozenset | set = frozenset(), copies: tuple[str, ...] = ("",)) -> None:  # fmt: skip
    """Loads, one assignment per op, stores. ``load(i, sfx)``/``store(k, sfx)`` give array element
    expressions. Several ``copies`` (name suffixes, for unrolled loops) emit every copy's loads
    first, then every copy's ops, then the stores, so loads are in flight together."""
    reg: dict[Ref, np.dtype] = {}
    desc: dict[Ref, dtypes.Desc] = {}
    name: dict[Ref, str] = {}
    used = {r for o in spec.ops for r in o.args} | {o.ref for o in spec.outs}
    fixed = preloaded_refs(spec, preloaded)  # names without a copy suffix
    loads = []
    for i, lf in enumerate(spec.leaves):
        r: Ref = ("x", i)
        desc[r] = lf.desc
        if lf.kind == "scalar":
            reg[r] = scalar_storage(lf.dtype)  # the dtype the scalar parameter is passed as
            name[r] = f"s{i}"
        elif r in used:
            reg[r] = dtypes.register(lf.dtype)
            name[r] = f"x{i}"
            if i not in preloaded:
                loads.append((i, lf, reg[r]))
    for sfx in copies:
        for i, lf, rg in loads:
            w(f"x{i}{sfx} = {cast(load(i, sfx), storage(lf.dtype), rg)}")
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
            w(f"{store(k, sfx)} = {cast(src, reg[out.ref], storage(out.dtype))}")


def op_value(o: OpSpec, args: list[str], regs: list[np.dtype], descs: list) -> tuple[str, np.dtype]:
    """The expression computing elementwise op ``o`` from operand names ``args`` (held in register
    dtypes ``regs``, described by ``descs`` for the dtype rules), and its register dtype."""
    d = OPS[o.op]
    dd = tuple(descs)
    operands = [cast(a, rg, operand_dtype(o.op, dd, o.dtype, k)) for k, (a, rg) in enumerate(zip(args, regs))]
    out_reg = dtypes.register(o.dtype)
    kind = operand_dtype(o.op, dd, o.dtype, 0).kind if d.operands in ("keep", "common") else out_reg.kind
    expr = d.template_for(kind).format(
        *operands, T=dtypes.CTOR[out_reg], t=dtypes.SHORT[out_reg], bits=8 * out_reg.itemsize
    )
    value = convert(expr, out_reg)
    if o.dtype == np.float16:  # computed in float32, rounded to float16 like NumPy's result
        value = f"f16_round({value})"
    return value, out_reg


def preloaded_refs(spec: KernelSpec, preloaded: frozenset | set) -> set:
    """Refs whose names carry no copy suffix: scalars and loads hoisted out of the inner loop."""
    return {("x", i) for i, lf in enumerate(spec.leaves) if lf.kind == "scalar" or i in preloaded}


def header(spec: KernelSpec, target: str, params: list[str]) -> list[str]:
    sig = ", ".join(params)
    ins = ", ".join(
        f"in{i}:{lf.dtype.name}[{lf.layout}]"
        if lf.kind == "buffer"
        else f"s{i}:{lf.desc if lf.weak is None else 'weak ' + lf.weak.__name__}"
        for i, lf in enumerate(spec.leaves)
    )
    outs = ", ".join(f"out{k}:{o.dtype.name}[{o.layout}]" for k, o in enumerate(spec.outs))
    return [
        f"# fusetree kernel {spec.name}  target={target}  ndim={spec.ndim}  flat={spec.flat}",
        f"# key: {spec.key_text}",
        f"# inputs: {ins or '-'}",
        f"# outputs: {outs}",
        f"# signature: {spec.name}({sig})",
    ]


def _params(spec: KernelSpec, target: str) -> list[str]:
    flat = spec.flat
    nd = max(spec.ndim, 1)
    p: list[str] = []
    for i, lf in enumerate(spec.leaves):
        if lf.kind == "scalar":
            p.append(f"s{i}")
            continue
        p.append(f"in{i}")
        if flat or lf.layout == "C":
            continue
        if target in ("cpu", "cuda-sim"):
            p.append(f"in{i}_o")
        p += [f"in{i}_s{d}" for d in range(nd)]
    for k, o in enumerate(spec.outs):
        p.append(f"out{k}")
        if flat or o.layout == "C":
            continue
        if target in ("cpu", "cuda-sim"):
            p.append(f"out{k}_o")
        p += [f"out{k}_s{d}" for d in range(nd)]
    p += ["n"] if flat else [f"n{d}" for d in range(nd)]
    return p + ([] if target == "cpu" else ["ntotal"])


def render(
    spec: KernelSpec, target: str, storage=lambda dt: dt, scalar_storage=lambda dt: dt
) -> tuple[str, list[str]]:
    """Source of ``spec`` for ``target`` ("cpu", "cuda" or "cuda-sim") and its parameter names.

    ``storage(dtype)`` is the dtype a buffer of ``dtype`` is passed as (bool -> uint8 on CUDA,
    float16 -> float32 on the CPU); ``scalar_storage`` likewise for scalar parameters.
    """
    if spec.frame is not None:
        from .codegen_frame import render_frame

        return render_frame(spec, target, storage, scalar_storage)
    offsets = target in ("cpu", "cuda-sim")
    params = _params(spec, target)
    w = Writer()
    for line in header(spec, target, params):
        w(line)
    w(f"def {spec.name}({', '.join(params)}):")
    w.indent()
    arrays = [(f"in{i}", lf.layout) for i, lf in enumerate(spec.leaves) if lf.kind == "buffer"]
    arrays += [(f"out{k}", o.layout) for k, o in enumerate(spec.outs)]
    leaf_name = {i: f"in{i}" for i in range(len(spec.leaves))}
    nd = max(spec.ndim, 1)
    preloaded: set[int] = set()
    if spec.flat:
        idx = {a: "i" for a, _ in arrays}
        if target == "cpu":
            w("for i in prange(n):")
        else:
            w("i = cuda.grid(1)")
            w("step = cuda.gridsize(1)")
            w("while i < n:")
        w.indent()
    elif target == "cpu":
        # Outer dimensions: nested loops (prange outermost) carrying each array's position. The
        # innermost loop reads rows sliced out of the 1-D arrays, so LLVM sees unit-stride
        # accesses and vectorizes them without gathers; inner-broadcast ("R") leaves are loaded
        # once per row.
        idx = {}
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
                idx[a] = ("row", a)  # type: ignore[assignment]
            elif lay == "R":
                idx[a] = pos
            else:
                idx[a] = f"{pos} + i{last} * {a}_s{last}"
        hoisted = [i for i, lf in enumerate(spec.leaves) if lf.kind == "buffer" and lf.layout == "R"]
        for i in hoisted:
            lf = spec.leaves[i]
            pos0 = idx["in" + str(i)]
            elem0 = f"in{i}[{pos0}]"
            w(f"x{i} = {cast(elem0, storage(lf.dtype), dtypes.register(lf.dtype))}")
        w(f"for i{last} in {'prange' if last == 0 else 'range'}(n{last}):")
        w.indent()
        preloaded = set(hoisted)
        for a in list(idx):
            if isinstance(idx[a], tuple):
                idx[a] = f"i{last}"
                idx[a + "@row"] = f"{a}_r"  # type: ignore[index]
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
        idx = {}
        for a, lay in arrays:
            if lay == "C":
                idx[a] = "i"
                continue
            terms = [f"i{d}" if lay == "I" and d == nd - 1 else f"i{d} * {a}_s{d}" for d in range(nd)]
            idx[a] = " + ".join(([f"{a}_o"] if offsets else []) + terms)

    def elem(a: str, sfx: str = "") -> str:
        return f"{idx.get(a + '@row', a)}[{idx[a]}{sfx}]"

    def body(copies: tuple[str, ...]) -> None:
        _body(spec, w, load=lambda i, sfx: elem(leaf_name[i], sfx), store=lambda k, sfx: elem(f"out{k}", sfx),
              storage=storage, scalar_storage=scalar_storage, preloaded=preloaded, copies=copies)  # fmt: skip

    unroll = config.current.cuda_unroll if target in ("cuda", "cuda-sim") and spec.flat else 1
    if unroll > 1:
        # flat grid-stride loop, ``unroll`` elements (one grid stride apart) per thread and step
        w.lines.pop()
        w.dedent()
        w(f"while i + {unroll - 1} * step < n:")
        w.indent()
        for u in range(1, unroll):
            w(f"i_{u} = i + {u} * step")
        body(("",) + tuple(f"_{u}" for u in range(1, unroll)))
        w(f"i += {unroll} * step")
        w.dedent()
        w("while i < n:")
        w.indent()
    body(("",))
    if target != "cpu":
        w("i += step")
    return w.text(), params
