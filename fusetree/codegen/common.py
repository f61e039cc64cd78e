"""What every renderer shares: the target description, a source writer, casts, one op's expression."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ir import dtypes
from ..ir.ops import OPS, rule
from ..schedule.spec import KernelSpec, OpSpec


def _same(dt: np.dtype) -> np.dtype:
    return dt


@dataclass(frozen=True)
class Target:
    """How a codegen target stores values. ``storage(dtype)`` is the element dtype a buffer of
    ``dtype`` is read as (CUDA: bool as uint8 bytes; CPU: float16 as its uint16 bits, converted
    in the kernel); ``scalar_storage`` likewise for scalar parameters (CUDA: every scalar is an
    8-byte int64 or float64)."""

    name: str  # "cpu", "cuda" or "cuda-sim"
    storage: Callable[[np.dtype], np.dtype] = _same
    scalar_storage: Callable[[np.dtype], np.dtype] = _same

    @property
    def cuda(self) -> bool:
        return self.name in ("cuda", "cuda-sim")

    @property
    def offsets(self) -> bool:
        return self.name in ("cpu", "cuda-sim")

    def load(self, expr: str, dt: np.dtype) -> str:
        """An element of a buffer of logical dtype ``dt`` as its register value."""
        st = self.storage(dt)
        if dt == np.float16 and (st == np.uint16 or self.cuda):
            return f"h2f({expr})"
        return cast(expr, st, dtypes.register(dt))

    def store(self, expr: str, reg: np.dtype, dt: np.dtype) -> str:
        """A register value of dtype ``reg`` as an element of a buffer of logical dtype ``dt``."""
        st = self.storage(dt)
        if dt == np.float16 and (st == np.uint16 or self.cuda):  # (CUDA: f2h folds a rounding before it)
            return f"f2h({cast(expr, reg, np.dtype(np.float32))})"
        return cast(expr, reg, st)


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


def op_value(o: OpSpec, args: list[str], regs: list[np.dtype], descs: list) -> tuple[str, np.dtype]:
    """The expression computing elementwise op ``o`` from operand names ``args`` (held in register
    dtypes ``regs``, described by ``descs`` for the dtype rules), and its register dtype."""
    d = OPS[o.op]
    r = rule(o.op, tuple(descs), o.attrs if o.op == "astype" else ())
    if o.op == "astype" and o.dtype == np.float16 and regs[0] == np.float64:
        return f"f16_round_d({args[0]})", dtypes.register(o.dtype)  # one rounding, not two via float32
    operands = [cast(a, rg, r.operands[k]) for k, (a, rg) in enumerate(zip(args, regs))]
    if float in descs or int in descs:
        strong = [x for x in descs if isinstance(x, np.dtype)]
        if strong and np.result_type(*strong) == np.float16:
            # NumPy converts a Python scalar to float16 before a float16 loop (computed in float32):
            # 0.1 enters as 0.0999755859375, not as float32(0.1)
            for k, x in enumerate(descs):
                if x is float or x is int:
                    operands[k] = f"f16_round_d({cast(args[k], regs[k], np.dtype(np.float64))})"
    out_reg = dtypes.register(o.dtype)
    kind = r.operands[0].kind if d.operands in ("keep", "common") else out_reg.kind
    expr = d.template_for(kind).format(
        *operands, T=dtypes.CTOR[out_reg], t=dtypes.SHORT[out_reg], bits=8 * out_reg.itemsize
    )
    value = convert(expr, out_reg)
    if o.dtype == np.float16:  # computed in float32, rounded to float16 like NumPy's result
        value = f"f16_round({value})"
    return value, out_reg


def vector_width(itemsizes: list[int]) -> int:
    """Elements per wide (``vld``/``vst``) access over arrays of these item sizes: 16 bytes of the
    widest, at most 8 elements (float32: 4, float16: 8, float64: 2); 1 without arrays."""
    return max(1, min(8, 16 // max(itemsizes))) if itemsizes else 1


def aligned_check(pointers: list[tuple[str, int]], width: int) -> str:
    """A condition that every ``(pointer expression, item size)`` is aligned to ``width`` elements."""
    masks: dict[int, list[str]] = {}
    for ptr, item in pointers:
        masks.setdefault(width * item - 1, []).append(ptr)
    bits = " | ".join(f"({' | '.join(ps)}) & {m}" for m, ps in sorted(masks.items()))
    return f"({bits}) == 0"


def wide_load(
    w: Writer, target: Target, leaf: int, dt: np.dtype, sfxs: list[str], width: int, index: str
) -> None:
    """``x<leaf><sfx>`` for each of ``sfxs`` from one ``vld<width>`` of ``in<leaf>`` at ``index``
    (unpacked into the registers directly when the element needs no conversion)."""
    direct = target.load("v", dt) == "v"
    raw = [f"{'x' if direct else 'v'}{leaf}{s}" for s in sfxs]
    w(f"{', '.join(raw)} = vld{width}(in{leaf}, {index})")
    if not direct:
        for s, v in zip(sfxs, raw):
            w(f"x{leaf}{s} = {target.load(v, dt)}")


def begin(spec: KernelSpec, target: str, params: list[str], *notes: str) -> Writer:
    """A writer holding the kernel's header comments (plus ``notes``) and its ``def`` line, indented
    into the body."""
    w = Writer()
    for line in header(spec, target, params) + list(notes):
        w(line)
    w(f"def {spec.name}({', '.join(params)}):")
    return w.indent()


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
