"""Horizontal fusion: kernels of the same structure flushed together run as one launch.

A flush of deferred stores (engine.stores) makes one kernel per *component* (the stores of one
parameter: ``m``, ``v`` and ``p``). Components whose trees have the same structural key, whose
buffers are C-contiguous (or one element broadcast, like a 0-d coefficient), whose in-place
updates match (a leaf at its target's address: read through the output, so a CPU loop over
``m``, ``v``, ``p`` and ``g`` sees four arrays, not seven, and vectorizes) and whose scalars are
equal run as one horizontal kernel (:mod:`fusetree.codegen.horizontal`) over a table of chunks:
an optimizer step over 148 tensors of two ranks is two launches instead of 148.

The table (one row per ``CHUNK`` elements of a tensor) depends only on the tensors' addresses and
sizes: it is built once per address set and kept (``_TABLES``, a few entries), so a loop updating
the same arrays every step looks it up instead of rebuilding and uploading it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from ..ir.node import EXPAND, REDUCE, Node, address, merge_leaves
from ..schedule import planner
from ..schedule.spec import KernelSpec
from . import kernels
from .state import HOOK, STATS

# Elements per table row. CUDA runs a row per thread block (blocks of up to 1024 threads loop
# over it), the CPU a row per prange iteration: large enough that the row bookkeeping is noise,
# small enough that a 3M-parameter step still spreads over ~100 rows.
CHUNK = 1 << 15

_SPECS: dict[tuple, KernelSpec] = {}
_TABLES: dict[tuple, tuple] = {}  # (key, addresses and sizes) -> (launch arguments, keep-alive)
_MAX_TABLES = 16


class Member(NamedTuple):
    """One component of a horizontal launch: its entries ``(node, target, _)`` (engine.stores),
    their merged leaves and the targets' addresses."""

    comp: list[tuple]
    leaves: tuple[Node, ...]
    tptrs: list[int]


def scalar_id(v: Any) -> tuple:
    """A scalar's identity for keys: its type and value, the sign of a float zero included
    (``0.0 == -0.0``: one kernel's scalar for both would turn ``1 / (x * -0.0)`` into +inf)."""
    t = type(v)
    if t is float and v == 0.0:
        return t, v, math.copysign(1.0, v)
    return t, v


def key_of(comp: list[tuple], shape: tuple[int, ...], device: str,
           ptr_of: Callable[[Any], int] = address) -> tuple[tuple, Member] | None:  # fmt: skip
    """The horizontal-fusion key of a component (entries ``(value node, target, _)``) and its
    :class:`Member`, or None when it cannot run in a horizontal kernel. ``ptr_of(target)``: a
    target's address (the flush knows them)."""
    nodes = [e[0] for e in comp]
    targets = [e[1] for e in comp]
    for n in nodes:
        if n.flags & (REDUCE | EXPAND):
            return None
    if len(nodes) == 1:
        leaves, sharing = nodes[0].leaves, None
    else:
        leaves, sharing = merge_leaves(tuple(nodes))
    for t in targets:
        if t is None or not t.flags.c_contiguous:
            return None
    tptrs = [ptr_of(t) for t in targets]
    outs = {p: k for k, p in enumerate(tptrs)}
    kinds = []
    scalars = []
    for x in leaves:
        op = x.op
        if op == "scalar":
            kinds.append("")
            scalars.append(scalar_id(x.value))  # type: ignore[attr-defined]
        elif op == "buffer":
            d = x.data  # type: ignore[attr-defined]
            if not any(d.strides) and d.ndim:  # a broadcast element (first: a (1,) broadcast is one too)
                kinds.append("B")
            elif x.shape == shape and x.layout == "C":  # type: ignore[attr-defined]
                k = outs.get(x.ptr)  # type: ignore[attr-defined]
                # updated in place (m = b1 * m + ...): read through the output (kind "O<k>")
                kinds.append("C" if k is None or targets[k].dtype != x.dtype else f"O{k}")
            else:
                return None
        else:
            return None
    return (device, tuple([n.key for n in nodes]), sharing, tuple(kinds), tuple(scalars)), Member(
        comp, leaves, tptrs
    )


def run(be: Any, tag: str, target_name: str, key: tuple, members: list[Member]) -> tuple[Any, tuple, int]:
    """One horizontal launch computing every component of ``members``; returns what :func:`launch`
    takes to launch it again over the same memory (engine.stores caches it per flush structure)."""
    first = [e[0] for e in members[0].comp]
    spec = _SPECS.get((tag, key))
    if spec is None:
        spec = _SPECS[(tag, key)] = _spec(first, key[3], target_name, tag)
    launcher = kernels.launcher_for(be, tag, spec)
    nslots = columns(spec) - 1
    sizes: list[int] = []
    addrs: list[list[int]] = [[] for _ in range(nslots)]
    arrays: list[Any] = []
    scalars: list[Any] = []
    for g, (comp, leaves, tptrs) in enumerate(members):
        sizes.append(comp[0][1].size)
        j = 0
        for x in leaves:
            if x.op == "buffer":
                addrs[j].append(x.ptr)  # type: ignore[attr-defined,union-attr]
                arrays.append(x.data)  # type: ignore[attr-defined,union-attr]
                j += 1
            elif g == 0:
                scalars.append(be.scalar_arg(x))
        for e, p in zip(comp, tptrs):
            addrs[j].append(p)
            arrays.append(e[1])
            j += 1
    tkey = (tag, key, tuple(sizes), tuple(map(tuple, addrs)))
    hit = _TABLES.get(tkey)
    if hit is None:
        hit = table(be, spec, sizes, addrs, scalars, arrays)
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[tkey] = hit
    total = sum(sizes)
    launch(be, launcher, hit, total)
    rec = HOOK.recorder
    if rec is not None:
        k = 0
        slot_arrays: list[list[Any]] = [[] for _ in range(nslots)]
        for _ in members:
            for j in range(nslots):
                slot_arrays[j].append(arrays[k])
                k += 1
        rec.hkernel(launcher, spec, tuple(sizes), slot_arrays, tuple(scalars))
    return launcher, hit, total


def launch(be: Any, launcher: Any, hit: tuple, total: int) -> None:
    args, nrows = hit[0], hit[1]
    be.launch_table(launcher, list(args), nrows, total)
    STATS["launches"] += 1
    STATS["kernels"] += 1
    STATS["horizontal"] += 1


def columns(spec: KernelSpec) -> int:
    """Columns of the chunk table: the length, then one per array leaf and output."""
    return 1 + sum(lf.kind == "buffer" for lf in spec.leaves) + len(spec.outs)


def _spec(nodes: list[Node], kinds: tuple[str, ...], target: str, tag: str) -> KernelSpec:
    leaves = nodes[0].leaves if len(nodes) == 1 else merge_leaves(tuple(nodes))[0]
    paths = [(i, ()) for i in range(len(nodes))]
    s = planner.spec_for(nodes, paths, leaves, ["C"] * len(nodes), target, tag)
    text = s.key_text + f";horizontal;kinds={list(kinds)}"
    name = "ft_h" + hashlib.sha1(text.encode()).hexdigest()[:12]
    new_leaves = tuple(lf if lf.kind == "scalar" else replace(lf, layout=k) for lf, k in zip(s.leaves, kinds))
    return replace(s, name=name, key_text=text, ndim=1, leaves=new_leaves, horizontal=True)


def table(be: Any, spec: KernelSpec, sizes: list[int], addrs: list[list[int]], scalars: list[Any],
          keep: Any) -> tuple:  # fmt: skip
    """(launch arguments, rows, what they keep alive): per array slot the lowest address as the
    base, the chunk table with every chunk's offsets from the bases. ``addrs[slot][tensor]``.
    Raises ValueError when an address is not a whole number of elements from its base."""
    dts = [lf.dtype for lf in spec.leaves if lf.kind == "buffer"] + [o.dtype for o in spec.outs]
    broadcast = [lf.layout == "B" for lf in spec.leaves if lf.kind == "buffer"] + [False] * len(spec.outs)
    bases = []
    offsets = []
    for dt, a, b in zip(dts, addrs, broadcast):
        item = dt.itemsize
        lo = min(a)
        hi = max(p + (1 if b else n) * item for p, n in zip(a, sizes))
        if any((p - lo) % item for p in a):
            raise ValueError("misaligned tensor for a horizontal kernel")
        offsets.append([(p - lo) // item for p in a])
        bases.append(be.raw_base(lo, max(1, (hi - lo) // item), dt, keep))
    ncols = 1 + len(dts)
    blocks = []
    for g, n in enumerate(sizes):
        starts = np.arange(0, n, CHUNK, dtype=np.int64)
        block = np.empty((len(starts), ncols), np.int64)
        block[:, 0] = np.minimum(CHUNK, n - starts)
        for j in range(len(dts)):
            block[:, 1 + j] = offsets[j][g] + (0 if broadcast[j] else starts)
        blocks.append(block)
    tab = np.concatenate(blocks) if blocks else np.zeros((0, ncols), np.int64)
    tab_arg, tab_keep = be.table_arg(tab)
    args: list[Any] = []
    si = bi = 0
    for lf in spec.leaves:
        if lf.kind == "scalar":
            args.append(scalars[si])
            si += 1
        else:
            args.append(bases[bi])
            bi += 1
    args.extend(bases[bi:])
    args.extend((tab_arg, len(tab), ncols))
    return tuple(args), len(tab), (tab_keep, bases)
