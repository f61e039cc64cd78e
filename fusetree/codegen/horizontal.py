"""Render a horizontal kernel: one launch over many tensors of the same structure (multi-tensor
apply, as PyTorch's ``MultiTensorApply.cuh``), with their memory given by a table of chunks.

Every array parameter is a *base* pointer (the lowest address among the tensors in that slot); row
``r`` of the int64 table ``tab`` (``ncols`` wide) is one chunk of one tensor: its length, then per
array leaf and output the chunk's element offset from the slot's base. A "C" leaf is read at
``offset + i``; a "B" leaf (one element broadcast over the tensor: a 0-d coefficient) once per
chunk. On the CPU rows run in a ``prange`` loop; on CUDA one thread block per row.

    for r in prange(nrows):          # CUDA: r = blockIdx.x, i strides by blockDim.x
        b = r * ncols
        n = tab[b]
        o1 = tab[b + 1]
        ...
        for i in range(n):
            x1 = in1[o1 + i]
            ...
            out0[p0 + i] = t7
"""

from __future__ import annotations

from ..schedule.spec import KernelSpec
from . import abi
from .common import Target, begin
from .elementwise import body


def render(spec: KernelSpec, target: Target) -> tuple[str, list[str]]:
    params = [p.name for p in abi.params(spec, target.name)]
    w = begin(spec, target.name, params)
    if target.name == "cpu":
        w("for r in prange(nrows):")
        w.indent()
    else:
        w("r = cuda.blockIdx.x")
    w("b = r * ncols")
    w("n = tab[b]")
    col = 1
    offset: dict[str, str] = {}
    for i, lf in enumerate(spec.leaves):
        if lf.kind == "buffer":
            w(f"o{i} = tab[b + {col}]")
            offset[f"in{i}"] = f"o{i}"
            col += 1
    for k in range(len(spec.outs)):
        w(f"p{k} = tab[b + {col}]")
        offset[f"out{k}"] = f"p{k}"
        col += 1
    preloaded = set()
    for i, lf in enumerate(spec.leaves):
        if lf.kind == "buffer" and lf.layout == "B":
            w(f"x{i} = {target.load(f'in{i}[o{i}]', lf.dtype)}")
            preloaded.add(i)
    if target.name == "cpu":
        w("for i in range(n):")
    else:
        w("i = cuda.threadIdx.x")
        w("step = cuda.blockDim.x")
        w("while i < n:")
    w.indent()
    body(spec, w, target, load=lambda i, sfx: f"in{i}[o{i} + i]", store=lambda k, sfx: f"out{k}[p{k} + i]",
         preloaded=preloaded)  # fmt: skip
    if target.name != "cpu":
        w("i += step")
    return w.text(), params


def columns(spec: KernelSpec) -> int:
    """Columns of the chunk table: the length, then one per array leaf and output."""
    return 1 + sum(lf.kind == "buffer" for lf in spec.leaves) + len(spec.outs)
