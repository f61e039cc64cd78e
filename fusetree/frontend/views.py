"""Views (index, transpose, reshape, broadcast) of lazy values, pushed down to the leaves.

Elementwise ops commute with views and every non-scalar child of an elementwise node has its
parent's shape, so a view of a tree is the same tree over viewed leaves: still one kernel, every
leaf a zero-copy strided view. Fusion boundaries inside the tree (a pending GEMM, a reduction) are
computed first and viewed as memory.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import engine
from ..errors import ShapeError, UnsupportedError
from ..ir.node import Buffer, Node, ViewLeaf, make_buffer, make_op, make_view_leaf, view_layout


def view_of(node: Node, leaf_fn: Callable[[Any], Any], shape: tuple[int, ...], vkey: tuple | None) -> Node:
    """``node`` viewed by ``leaf_fn`` (a function of an array): the tree rebuilt over viewed
    leaves. ``vkey`` names the view for the per-buffer view cache (None: not cached)."""
    if node.op == "buffer":
        return _buffer_view(node, leaf_fn, vkey)  # type: ignore[arg-type]
    args = node.args
    over_leaves = bool(node.leaves)
    for a in args:
        if a.op not in _LEAF_OPS:
            over_leaves = False
            break
    if over_leaves:  # one op over leaves (x@W + b): no walk
        if len(args) == 2 and args[0] is not args[1]:  # (the commonest: two distinct leaves)
            a0, a1 = args
            v0 = _leaf_view(a0, leaf_fn, vkey)
            return make_op(
                node.op, (v0, _leaf_view(a1, leaf_fn, vkey)), node.dtype, shape, node.device, node.attrs
            )
        views: list[Node] = []
        for i, a in enumerate(args):
            for j in range(i):
                if args[j] is a:  # a shared leaf stays shared (the tree's key depends on it)
                    views.append(views[j])
                    break
            else:
                views.append(_leaf_view(a, leaf_fn, vkey))
        return make_op(node.op, tuple(views), node.dtype, shape, node.device, node.attrs)
    memo: dict[int, Node] = {}
    ops: list[Node] = []
    stack = [node]
    while stack:
        n = stack.pop()
        i = id(n)
        if i in memo:
            continue
        op = n.op
        if op == "scalar":
            memo[i] = n
        elif op == "buffer":
            memo[i] = _buffer_view(n, leaf_fn, vkey)  # type: ignore[arg-type]
        elif op == "matmul":
            memo[i] = make_buffer(leaf_fn(engine.compute_gemm(n)), n.device)
        elif op == "reduce" or op == "expand":  # a fusion boundary for views: computed first
            memo[i] = make_buffer(leaf_fn(engine.realize_node(n)), n.device)
        else:
            memo[i] = n  # placeholder: rebuilt below
            ops.append(n)
            stack.extend(n.args)
    ops.sort(key=_uid)  # children were built before their parents
    for n in ops:
        memo[id(n)] = make_op(n.op, tuple([memo[id(a)] for a in n.args]), n.dtype, shape, n.device, n.attrs)
    return memo[id(node)]


_LEAF_OPS = frozenset(("buffer", "scalar", "matmul"))


def _leaf_view(n: Node, leaf_fn: Callable[[Any], Any], vkey: tuple | None) -> Node:
    op = n.op
    if op == "scalar":
        return n
    if op == "buffer":
        return _buffer_view(n, leaf_fn, vkey)  # type: ignore[arg-type]
    data = n.memo  # a pending GEMM: computed first (once: the other gate slices reuse it)
    if data is None:
        data = engine.compute_gemm(n)
    if vkey is not None and vkey[0] in _ARITHMETIC:
        return _arithmetic_view(data, leaf_fn, vkey, n.dtype, n.device)
    return make_buffer(leaf_fn(data), n.device)


# Views that are pointer arithmetic on their source (basic indexing "i", transposes "T"): a leaf
# made of an offset and strides, bound without a backend view object (see ViewLeaf). The gate
# slices of an LSTM step's GEMM output are four such views per step.
_ARITHMETIC = frozenset(("i", "T"))
_GEOMETRY: dict[tuple, ViewGeometry] = {}
_ELEMENT_STRIDES: dict[tuple, tuple[int, ...]] = {}  # (byte strides, dtype) -> element strides
_BYTE = np.zeros(1, np.int8)
_BYTE_ADDR = _BYTE.__array_interface__["data"][0]


class ViewGeometry(NamedTuple):
    """A view of an array described by arithmetic (see :func:`_geometry`)."""

    shape: tuple[int, ...]
    estrides: tuple[int, ...]  # element strides
    offset: int  # element offset of the view's element 0 from the array's
    layout: tuple[str, int]  # (layout class, buffer key): ir.node.view_layout


def _geometry(shape: tuple[int, ...], estrides: tuple[int, ...], vkey: tuple, leaf_fn: Callable[[Any], Any],
              dtype: np.dtype) -> ViewGeometry:  # fmt: skip
    """``leaf_fn`` applied to an array of ``shape``, element strides ``estrides`` and ``dtype``:
    computed once on a byte-sized stand-in (NumPy's own index rules), memoized by the view's key."""
    k = (shape, estrides, vkey, dtype)
    g = _GEOMETRY.get(k)
    if g is None:
        v = leaf_fn(np.lib.stride_tricks.as_strided(_BYTE, shape, estrides))
        offset = v.__array_interface__["data"][0] - _BYTE_ADDR
        g = ViewGeometry(v.shape, v.strides, offset, view_layout(v.shape, v.strides, dtype))
        if len(_GEOMETRY) > 4096:
            _GEOMETRY.clear()
        _GEOMETRY[k] = g
    return g


def _arithmetic_view(data: Any, leaf_fn: Callable[[Any], Any], vkey: tuple, dtype: np.dtype,
                     device: str) -> Buffer:  # fmt: skip
    """``leaf_fn(data)`` as a :class:`ViewLeaf` (a buffer over the view itself when ``data``'s
    strides are not whole elements). Nothing here asks the backend: building trees loads no
    compiler."""
    strides = data.strides
    src_strides = _ELEMENT_STRIDES.get((strides, dtype))
    if src_strides is None:
        item = dtype.itemsize
        if any([s % item for s in strides]):
            return make_buffer(leaf_fn(data), device)
        if len(_ELEMENT_STRIDES) > 4096:
            _ELEMENT_STRIDES.clear()
        src_strides = _ELEMENT_STRIDES[(strides, dtype)] = tuple([s // item for s in strides])
    g = _geometry(data.shape, src_strides, vkey, leaf_fn, dtype)
    return make_view_leaf(data, leaf_fn, src_strides, g.offset, g.shape, g.estrides, dtype, device, g.layout)


def _uid(n: Node) -> int:
    return n.uid


def cached_view(n: Buffer, vkey: tuple | None) -> Buffer | None:
    """The view ``vkey`` (see :func:`view_key`) of buffer ``n`` made before, if it was cached."""
    bound = n.bound
    if bound is None or vkey is None:
        return None
    views = bound.get("views")
    return views.get(vkey) if views is not None else None


def _buffer_view(n: Buffer, leaf_fn: Callable[[Any], Any], vkey: tuple | None) -> Buffer:
    # the same view of the same buffer (a bias broadcast and sliced every step) is reused
    v = cached_view(n, vkey)
    if v is not None:
        return v
    if vkey is not None and vkey[0] in _ARITHMETIC:
        v = _buffer_arithmetic_view(n, leaf_fn, vkey)
    else:
        v = make_buffer(leaf_fn(n.data), n.device)
    if vkey is not None:
        bound = n.bound
        if bound is None:
            bound = n.bound = {}
        views = bound.get("views")
        if views is None or len(views) > 64:
            views = bound["views"] = {}
        views[vkey] = v
    return v


def _buffer_arithmetic_view(n: Buffer, leaf_fn: Callable[[Any], Any], vkey: tuple) -> Buffer:
    """A view of buffer ``n`` as a :class:`ViewLeaf` (a view of a view is described against the
    first one's source)."""
    if type(n) is ViewLeaf:
        g = _geometry(n.shape, n.estrides, vkey, leaf_fn, n.dtype)
        return make_view_leaf(n.source, compose(leaf_fn, n.fn), n.src_strides, n.offset + g.offset, g.shape,
                              g.estrides, n.dtype, n.device, g.layout)  # fmt: skip
    return _arithmetic_view(n.data, leaf_fn, vkey, n.dtype, n.device)


def compose(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``f`` after ``g`` (a view of a view)."""
    return lambda d: f(g(d))


def view_index(key: Any) -> Any:
    """``key`` such that indexing returns a *view*: NumPy turns an all-integer index into a scalar
    copy, which would go stale after a write; ``a[0, 0, ...]`` is a 0-d view of the same memory."""
    items = key if type(key) is tuple else (key,)
    for k in items:
        if k is Ellipsis:
            return key
    return (*items, Ellipsis)


def view_key(key: Any) -> tuple | None:
    """A hashable description of a basic index (slices are unhashable before Python 3.12)."""
    items = key if type(key) is tuple else (key,)
    out: list[Any] = ["i"]
    for k in items:
        if type(k) is slice:
            out.append((k.start, k.stop, k.step))
        elif type(k) is int or k is None:
            out.append(k)
        else:
            return None
    return tuple(out)


def _dummy(shape: tuple[int, ...]) -> np.ndarray:
    """A zero-memory array of ``shape`` for computing index results."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape, (0,) * len(shape))


def index_shape(key: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of ``x[key]`` for basic indexing, computed without touching any array; raises the
    errors NumPy raises (IndexError) or UnsupportedError for fancy indexing."""
    if key is Ellipsis:  # x[...] = value: the whole array
        return shape
    items = key if type(key) is tuple else (key,)
    ellipsis = -1
    for d, k in enumerate(items):
        t = type(k)
        if t is not slice and t is not int:
            if k is Ellipsis and ellipsis < 0:
                ellipsis = d
                continue
            _check_index(key, shape)
            return _dummy(shape)[key].shape
    if ellipsis >= 0:  # one Ellipsis among ints and slices: full slices in its place (none when
        # there are too many indices: the check below reports them)
        fill = max(0, len(shape) - len(items) + 1)
        items = items[:ellipsis] + (slice(None),) * fill + items[ellipsis + 1 :]
    if len(items) > len(shape):
        raise IndexError(
            f"too many indices for array: array is {len(shape)}-dimensional, but {len(items)} were indexed"
        )
    out: list[int] = []
    for d, k in enumerate(items):
        n = shape[d]
        if type(k) is int:
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {d} with size {n}")
        else:
            out.append(len(range(*k.indices(n))))
    out.extend(shape[len(items) :])
    return tuple(out)


def _check_index(key: Any, shape: tuple[int, ...]) -> Any:
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if isinstance(k, builtins.bool | np.bool_) or not (
            k is None or k is Ellipsis or isinstance(k, slice | int | np.integer)
        ):
            if hasattr(k, "_node") or hasattr(k, "__len__") or isinstance(k, builtins.bool | np.bool_):
                raise UnsupportedError(
                    f"only basic indexing (ints, slices, None, ...) is supported, got {type(k).__name__}; "
                    "for fancy indexing use ft.asarray(np.asarray(x)[index])"
                )
            raise UnsupportedError(f"invalid index {k!r} for an array of shape {shape}")
    try:
        _dummy(shape)[key]
    except IndexError as e:
        raise IndexError(f"index {key!r} is out of bounds for shape {shape}: {e}") from None
    return key


def resolve_shape(new: tuple[int, ...], old: tuple[int, ...]) -> tuple[int, ...]:
    """``new`` with a ``-1`` resolved; ShapeError when it does not hold ``old``'s elements."""
    size = 1
    for s in old:
        size *= s
    if new.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension, got {new}")
    if -1 in new:
        rest = 1
        for s in new:
            if s != -1:
                rest *= s
        if rest == 0 or size % rest:
            raise ShapeError(f"reshape: cannot reshape array of shape {old} into shape {new}")
        new = tuple(size // rest if s == -1 else s for s in new)
    total = 1
    for s in new:
        total *= s
    if total != size or any(s < 0 for s in new):
        raise ShapeError(f"reshape: cannot reshape array of shape {old} (size {size}) into shape {new}")
    return new
