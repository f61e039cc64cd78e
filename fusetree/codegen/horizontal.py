"""Render a horizontal kernel: one launch over many tensors of the same structure (multi-tensor
apply, as PyTorch's ``MultiTensorApply.cuh``), with their memory given by a table of chunks.

Every array parameter is a *base* pointer (the lowest address among the tensors in that slot); row
``r`` of the int64 table ``tab`` (``ncols`` wide) is one chunk of one tensor: its length, then per
array leaf and output the chunk's element offset from the slot's base. A "C" leaf is read at
``offset + i``; a "B" leaf (one element broadcast over the tensor: a 0-d coefficient) once per
chunk; an "O<k>" leaf is a "C" leaf at output ``k``'s address (updated in place), which the CPU
loop reads through that output. On the CPU rows run in a ``prange`` loop; on CUDA one thread block
per row.

    for r in prange(nrows):          # CUDA: r = blockIdx.x, i strides by blockDim.x
        b = r * ncols
        n = tab[b]
        o1 = tab[b + 1]
        ...
        r1 = in1[o1:o1 + n]          # CUDA: in1[o1 + i] (and 16-byte groups, below)
        q0 = out0[p0:p0 + n]
        for i in range(n):
            x1 = r1[i]
            ...
            q0[i] = t7

On CUDA a chunk whose "C" arrays all start 16-byte aligned (checked per block, in the kernel) is
walked in groups of 16 bytes with one ``vld``/``vst`` per array and group, as the flat elementwise
kernels do (:func:`fusetree.codegen.elementwise._render_cuda`); the rest of the chunk, or all of a
misaligned one, element by element.
"""

from __future__ import annotations

from ..schedule.spec import KernelSpec
from . import abi
from .common import Target, aligned_check, begin, vector_width
from .elementwise import Vector, body


def render(spec: KernelSpec, target: Target, vector: bool = True) -> tuple[str, list[str]]:
    """Source of horizontal kernel ``spec`` and its parameter names (``vector``: CUDA 16-byte
    groups where a chunk is aligned)."""
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
        # each chunk's rows sliced out of the bases: unit-stride accesses from 0 that LLVM
        # vectorizes (``in1[o1 + i]`` keeps a negative-index check per element: 3.5x slower)
        # a leaf updated in place ("O<k>") is read through output k's slice: LLVM checks fewer
        # pairs of arrays for overlap (it gives up vectorizing past ~8 checks)
        rows = {
            i: f"q{lf.layout[1:]}" if lf.layout[:1] == "O" else f"r{i}" for i, lf in enumerate(spec.leaves)
        }
        for i, lf in enumerate(spec.leaves):
            if lf.kind == "buffer" and i not in preloaded and lf.layout == "C":
                w(f"r{i} = in{i}[o{i}:o{i} + n]")
        for k in range(len(spec.outs)):
            w(f"q{k} = out{k}[p{k}:p{k} + n]")
        w("for i in range(n):")
        w.indent()
        body(spec, w, target, load=lambda i, sfx: f"{rows[i]}[i]", store=lambda k, sfx: f"q{k}[i]",
             preloaded=preloaded)  # fmt: skip
        return w.text(), params
    w("i = cuda.threadIdx.x")
    w("step = cuda.blockDim.x")
    wide = {f"in{i}": (f"o{i}", lf.dtype.itemsize) for i, lf in enumerate(spec.leaves)
            if lf.kind == "buffer" and lf.layout != "B"}  # fmt: skip
    wide.update({f"out{k}": (f"p{k}", o.dtype.itemsize) for k, o in enumerate(spec.outs)})
    width = vector_width([item for _, item in wide.values()]) if vector else 1
    if width > 1:
        pointers = [(f"(addr({a}) + {o} * {item})", item) for a, (o, item) in wide.items()]
        w(f"if {aligned_check(pointers, width)}:")
        w.indent()
        w(f"nv = n // {width}")
        w("j = i")
        w("while j < nv:")
        w.indent()
        w(f"e = j * {width}")
        sfxs = [f"_{c}" for c in range(width)]
        vec = Vector(width, {}, {}, [("e", sfxs)])
        for i in range(len(spec.leaves)):
            if f"in{i}" in wide:
                vec.leaves[i] = f"o{i} + {{e}}"
        for k in range(len(spec.outs)):
            vec.outs[k] = f"p{k} + {{e}}"
        body(spec, w, target, load=lambda i, sfx: f"in{i}[o{i} + e + {sfx[1:]}]",
             store=lambda k, sfx: f"out{k}[p{k} + e + {sfx[1:]}]", preloaded=preloaded, copies=tuple(sfxs),
             vector=vec)  # fmt: skip
        w("j += step")
        w.dedent()
        w(f"i = nv * {width} + i")
        w.dedent()
    w("while i < n:")
    w.indent()
    body(spec, w, target, load=lambda i, sfx: f"in{i}[o{i} + i]", store=lambda k, sfx: f"out{k}[p{k} + i]",
         preloaded=preloaded)  # fmt: skip
    w("i += step")
    return w.text(), params


def columns(spec: KernelSpec) -> int:
    """Columns of the chunk table: the length, then one per array leaf and output."""
    return 1 + sum(lf.kind == "buffer" for lf in spec.leaves) + len(spec.outs)
