"""Reductions (``sum``, ``max``, ``argmax``, ``mean``, ``var``...) and their fusion.

A reduction is an IR node ``reduce`` (attrs: kind, reduced axes, keepdims) over one child of the
full shape. Broadcasting a value that contains a reduction back to a larger shape makes an
``expand`` node (the view cannot be pushed to the leaves through a reduction). At realization,
:func:`prepare` chooses the tree's *frame* (the full shape and the reduced axes), realizes
separately whatever does not fit it (a reduction over other axes, an incompatible broadcast) and
splits rows that are too long for one block or thread into a two-stage reduction. Everything
left is one kernel (:mod:`fusetree.codegen_frame`): ``softmax``, ``log_softmax``, layernorm and
``x - x.max(-1, keepdims=True)`` each launch once.

>>> import numpy as np, fusetree as ft
>>> x = ft.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
>>> ft.reset_stats(); y = ft.softmax(x, axis=-1).numpy(); ft.stats()["launches"]
1
>>> np.allclose(y.sum(-1), 1)
True
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from . import backends, config, fuser, ir, lazy, runtime
from .errors import ShapeError, UnsupportedError
from .ir import Node
from .lazy import Array
from .ops import REDUCTIONS, reduce_dtypes

# ---------------------------------------------------------------------------------------------
# building


def normalize_axes(axis: Any, ndim: int, what: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints, negative allowed) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple | list) else (axis,)
    out = []
    for a in items:
        if isinstance(a, builtins.bool) or not isinstance(a, int | np.integer):
            raise UnsupportedError(f"{what}: axis must be an int or a tuple of ints, got {a!r}")
        a = int(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"{what}: axis {a} is out of bounds for array of dimension {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: duplicate value in 'axis': {axis!r}")
    return tuple(sorted(out))


def row_shapes(full: tuple[int, ...], axes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of a reduction of ``full`` over ``axes`` with and without keepdims."""
    keep = tuple(1 if d in axes else s for d, s in enumerate(full))
    return keep, tuple(s for d, s in enumerate(full) if d not in axes)


def reduce(kind: str, x: Any, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Array:
    """Reduction ``kind`` (a row of :data:`fusetree.ops.REDUCTIONS`) of ``x`` over ``axis``."""
    a = lazy.asarray(x)
    if dtype is not None:
        a = a.astype(dtype)
    index = REDUCTIONS[kind].index
    if index and isinstance(axis, tuple | list):
        raise UnsupportedError(f"{kind}: axis must be None or an int, got {axis!r}")
    axes = normalize_axes(axis, a.ndim, kind)
    full = a.shape
    keep, squeezed = row_shapes(full, axes)
    shape = keep if keepdims else squeezed
    if index and axis is None and keepdims:
        shape = (1,) * a.ndim
    n = math.prod(full[d] for d in axes)
    out_dt = reduce_dtypes(kind, a.dtype)[0]
    if n == 0:
        if kind in ("max", "min", "argmax", "argmin"):
            name = {"max": "maximum", "min": "minimum"}.get(kind, kind)
            raise ShapeError(
                f"zero-size array to reduction operation {name} which has no identity (shape {full}, axis {axis!r})"
            )
        fill = {"sum": 0, "prod": 1, "any": False, "all": True}[kind]
        return lazy.full(shape, fill, dtype=out_dt, device=a.device)
    if n == 1:  # nothing to combine: an elementwise op
        if index:
            return lazy.zeros(shape, dtype=out_dt, device=a.device)
        v = (a != 0) if kind in ("any", "all") else a.astype(out_dt)
        return v.reshape(shape)
    if index and axis is None and a.ndim > 1:
        flat = a.reshape(-1)  # argmax over everything: the index into the flattened array
        r = reduce(kind, flat, 0)
        return r.reshape(shape) if keepdims else r
    node = ir.make_op("reduce", (a._node,), out_dt, shape, a.device, (kind, axes, builtins.bool(keepdims)))
    out = Array(node)
    if not config.current.fuse:
        runtime.realize([out])
    return out


def expand(node: Node, shape: tuple[int, ...]) -> Node:
    """Broadcast a value containing a reduction to ``shape`` (a fusion-kernel ``expand`` node)."""
    return ir.make_op("expand", (node,), node.dtype, shape, node.device)


# ---------------------------------------------------------------------------------------------
# NumPy-named functions


def sum(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Sum over ``axis`` (like ``np.sum``: integers accumulate in the platform integer).

    >>> import numpy as np, fusetree as ft
    >>> ft.sum(ft.asarray(np.ones((2, 3), np.int8)), axis=1).numpy().tolist()
    [3, 3]
    """
    return reduce("sum", x, axis, keepdims, dtype)


def prod(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
    """Product over ``axis`` (like ``np.prod``)."""
    return reduce("prod", x, axis, keepdims, dtype)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Maximum over ``axis``; NaN propagates (like ``np.max``)."""
    return reduce("max", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Minimum over ``axis``; NaN propagates (like ``np.min``)."""
    return reduce("min", x, axis, keepdims)


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """Index of the first maximum (of the first NaN) along ``axis`` (flattened when None)."""
    return reduce("argmax", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """Index of the first minimum (of the first NaN) along ``axis`` (flattened when None)."""
    return reduce("argmin", x, axis, keepdims)


def any(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Whether any element along ``axis`` is non-zero (NaN counts as true)."""
    return reduce("any", x, axis, keepdims)


def all(x: Any, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    """Whether every element along ``axis`` is non-zero."""
    return reduce("all", x, axis, keepdims)


def _count(a: Array, axis: Any, what: str) -> int:
    return math.prod(a.shape[d] for d in normalize_axes(axis, a.ndim, what))


def mean(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
    """Arithmetic mean over ``axis`` with NumPy's dtypes (integers give float64; float16 is
    summed in float32 and returned as float16).

    >>> import numpy as np, fusetree as ft
    >>> ft.mean(ft.asarray(np.arange(6).reshape(2, 3)), axis=-1).numpy().tolist()
    [1.0, 4.0]
    """
    a = lazy.asarray(x)
    n = _count(a, axis, "mean")
    sum_dt = dtype
    if dtype is None and a.dtype.kind in "biu":
        sum_dt = np.float64
    elif dtype is None and a.dtype == np.float16:
        sum_dt = np.float32
    s = sum(a, axis, sum_dt, keepdims)
    m = s / n if n else s * np.nan
    out_dt = (
        np.dtype(dtype) if dtype is not None else (a.dtype if a.dtype.kind == "f" else np.dtype(np.float64))
    )
    return m.astype(out_dt)


def var(x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Array:
    """Variance ``mean(abs(x - x.mean())**2)`` over ``axis``, divided by ``n - ddof`` (NumPy's
    formula and dtypes). The mean and the sum of squares fuse into one two-pass kernel."""
    a = lazy.asarray(x)
    n = _count(a, axis, "var")
    dt = dtype
    if dt is None and a.dtype.kind in "biu":
        dt = np.float64
    m = sum(a, axis, dt, keepdims=True) / n if n else sum(a, axis, dt, keepdims=True) * np.nan
    d = a - m
    ss = sum(d * d, axis, dt, keepdims)
    return ss / builtins.max(n - ddof, 0)


def std(x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Array:
    """Standard deviation: ``sqrt(var(x, axis, dtype, ddof, keepdims))``."""
    return lazy.FUNCTIONS["sqrt"](var(x, axis, dtype, ddof, keepdims))


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """``log(sum(exp(x)))`` over ``axis``, computed stably (as ``scipy.special.logsumexp``)."""
    a = lazy.asarray(x)
    fns = lazy.FUNCTIONS
    m = max(a, axis, keepdims=True)
    m0 = lazy.where(fns["isfinite"](m), m, 0)
    s = sum(fns["exp"](a - m0), axis, keepdims=keepdims)
    mk = m0 if keepdims else lazy.where(fns["isfinite"](max(a, axis)), max(a, axis), 0)
    return fns["log"](s) + mk


def softmax(x: Any, axis: Any = -1) -> Array:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: one kernel.

    >>> import numpy as np, fusetree as ft
    >>> ft.softmax(ft.asarray(np.zeros((1, 4), np.float32))).numpy().tolist()
    [[0.25, 0.25, 0.25, 0.25]]
    """
    a = lazy.asarray(x)
    e = lazy.FUNCTIONS["exp"](a - max(a, axis, keepdims=True))
    return e / sum(e, axis, keepdims=True)


def log_softmax(x: Any, axis: Any = -1) -> Array:
    """``x - logsumexp(x, axis, keepdims=True)``: one kernel."""
    a = lazy.asarray(x)
    d = a - max(a, axis, keepdims=True)
    return d - lazy.FUNCTIONS["log"](sum(lazy.FUNCTIONS["exp"](d), axis, keepdims=True))


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, axis: Any = -1) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over ``axis`` (layernorm): one kernel."""
    a = lazy.asarray(x)
    m = mean(a, axis, keepdims=True)
    d = a - m
    v = mean(d * d, axis, keepdims=True)
    y = (
        d * lazy.FUNCTIONS["rsqrt"](v + eps)
        if "rsqrt" in lazy.FUNCTIONS
        else d / lazy.FUNCTIONS["sqrt"](v + eps)
    )
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


FUNCTIONS = {
    f.__name__: f
    for f in (
        sum,
        prod,
        max,
        min,
        argmax,
        argmin,
        any,
        all,
        mean,
        var,
        std,
        logsumexp,
        softmax,
        log_softmax,
        layer_norm,
    )
}
FUNCTIONS["amax"], FUNCTIONS["amin"] = max, min


# ---------------------------------------------------------------------------------------------
# planning

Frame = tuple[tuple[int, ...], tuple[int, ...]]  # (full shape, reduced axes)


def frame_of(r: Node) -> Frame:
    return r.args[0].shape, r.attrs[1]


def _reductions(root: Node, top: bool = False) -> list[Node]:
    """Reductions in ``root``'s tree; with ``top``, only those reachable without passing through
    another reduction."""
    out: list[Node] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen or n.is_leaf or not ir.has_reduce(n):
            continue
        seen.add(id(n))
        if n.op == "reduce":
            out.append(n)
            if top:
                continue
        stack.extend(reversed(n.args))
    return out


def frame_sizes(frame: Frame) -> tuple[int, int]:
    """(rows, row length) of a frame."""
    full, axes = frame
    return math.prod(s for d, s in enumerate(full) if d not in axes), math.prod(full[d] for d in axes)


def _choose(root: Node) -> Frame | None:
    if root.op == "reduce":
        return frame_of(root)
    for r in _reductions(root, top=True):
        full, axes = frame_of(r)
        if root.shape == full or root.shape in row_shapes(full, axes):
            return full, axes
    return None


def materialize(n: Node) -> Node:
    """A buffer leaf holding ``n``'s value (an ``expand`` becomes a broadcast view of its row)."""
    if n.op == "expand":
        return lazy._broadcast(materialize(n.args[0]), n.shape)
    return ir.make_buffer(runtime.realize_node(n), n.device)


def _incompatible(root: Node, frame: Frame, dry: bool = False) -> dict[int, Node]:
    """Replacements for the nodes of ``root``'s tree that do not fit ``frame`` (``dry``: the
    nodes themselves, nothing is computed)."""
    materialize_ = (lambda n: n) if dry else materialize
    full, axes = frame
    keep, squeezed = row_shapes(full, axes)
    subs: dict[int, Node] = {}
    seen: set[tuple[int, str]] = set()
    stack = [(root, "full" if root.shape == full else "row")]
    while stack:
        n, level = stack.pop()
        if n.op == "scalar" or (id(n), level) in seen or id(n) in subs:
            continue
        seen.add((id(n), level))
        if n.is_leaf:
            continue
        if level == "full":
            if n.op == "reduce" or n.shape != full:
                subs[id(n)] = materialize_(n)
            elif n.op == "expand":
                a = n.args[0]
                if (1,) * (len(full) - len(a.shape)) + a.shape == keep:
                    stack.append((a, "row"))
                else:
                    subs[id(n)] = materialize_(n)
            else:
                stack.extend((a, "full") for a in n.args)
        else:
            if n.shape not in (keep, squeezed) or n.op == "expand":
                subs[id(n)] = materialize_(n)
            elif n.op == "reduce":
                if frame_of(n) == frame:
                    stack.append((n.args[0], "full"))
                else:
                    subs[id(n)] = materialize_(n)
            else:
                stack.extend((a, "row") for a in n.args)
    return subs


def substitute(root: Node, subs: dict[int, Node]) -> Node:
    """``root``'s tree with nodes replaced (by id); nodes above a replacement are rebuilt."""
    memo: dict[int, Node] = dict(subs)
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if id(n) in memo:
            continue
        if n.is_leaf:
            memo[id(n)] = n
        elif not ready:
            stack.append((n, True))
            stack.extend((a, False) for a in n.args if id(a) not in memo)
        else:
            args = tuple(memo[id(a)] for a in n.args)
            if builtins.all(a is b for a, b in zip(args, n.args)):
                memo[id(n)] = n
            elif n.op == "expand":
                memo[id(n)] = lazy._broadcast(args[0], n.shape)
            else:
                memo[id(n)] = ir.make_op(n.op, args, n.dtype, n.shape, n.device, n.attrs)
    return memo[id(root)]


def _stage2(r: Node, chunks: int) -> Node:
    """Two-stage form of reduction ``r``: per-chunk partial accumulators, then their reduction."""
    part = run_partial(r, chunks)
    kind2 = REDUCTIONS[r.attrs[0]].stage2
    leaf = ir.make_buffer(part, r.device)
    dt = reduce_dtypes(kind2, part.dtype)[0]
    node = ir.make_op("reduce", (leaf,), dt, r.shape, r.device, (kind2, (len(r.shape),), False))
    if dt != r.dtype:
        node = ir.make_op("astype", (node,), r.dtype, r.shape, r.device, (r.dtype,))
    return node


def _two_stage(root: Node, frame: Frame, be: Any) -> dict[int, Node]:
    full = frame[0]
    chunks = be.frame_chunks(*frame_sizes(frame))
    if chunks <= 1:
        return {}
    reds = [r for r in _reductions(root) if frame_of(r) == frame]
    first = [r for r in reds if not ir.has_reduce(r.args[0]) and REDUCTIONS[r.attrs[0]].two_stage]
    if root.shape != full and len(first) == len(reds):
        return {id(r): _stage2(r, chunks) for r in first}  # row-level result: stage 2 fuses the rest
    return {id(r): materialize(r) for r in first}


def prepare(root: Node) -> tuple[Node, Frame | None]:
    """``root`` rewritten so its tree is one reduction kernel in the returned frame (or a plain
    elementwise tree, frame None): what does not fit is realized first."""
    be = backends.get(root.device)
    for _ in range(64):
        if not ir.has_reduce(root):
            return root, None
        frame = _choose(root)
        if frame is None:
            subs = {id(r): materialize(r) for r in _reductions(root, top=True)}
        else:
            subs = _incompatible(root, frame)
            if not subs:
                subs = _two_stage(root, frame, be)
                if not subs:
                    return root, frame
        root = substitute(root, subs)
    raise RuntimeError("fusetree: reduction planning did not converge")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# running


def stride_map(shape: tuple[int, ...], frame: Frame) -> tuple[int, ...]:
    """For each frame axis, which axis of an array of ``shape`` it reads (-1: stride 0)."""
    full, axes = frame
    if shape == full:
        return tuple(range(len(full)))
    keep, squeezed = row_shapes(full, axes)
    if shape == keep:
        return tuple(-1 if d in axes else d for d in range(len(full)))
    assert shape == squeezed, (shape, frame)
    out, k = [], 0
    for d in range(len(full)):
        if d in axes:
            out.append(-1)
        else:
            out.append(k)
            k += 1
    return tuple(out)


def frame_spec(root: Node, target: str) -> Any:
    """The KernelSpec of ``root`` when it is one reduction kernel as it stands (None when parts of
    it would be computed first); for :func:`fusetree.explain`. Nothing runs."""
    frame = _choose(root)
    if frame is None or _incompatible(root, frame, dry=True):
        return None
    full, axes = frame
    leaves = root.leaves
    lays = ["" if x.op == "scalar" else ("full" if x.shape == full else "row") for x in leaves]
    olays = ("full" if root.shape == full else "row",)
    return fuser.spec_for([root], [(0, ())], leaves, olays, target, None, (axes, False), lays, len(full))


def run(roots: Sequence[Node], paths: Sequence[tuple[int, tuple]], device: str, shape: tuple,
        targets: Sequence[Any]) -> list[Any]:  # fmt: skip
    """runtime.run for trees that contain reductions (same contract)."""
    if len(roots) > 1:
        outs: list[Any] = [None] * len(paths)
        for ri, r in enumerate(roots):
            idx = [k for k, (i, _) in enumerate(paths) if i == ri]
            res = run([r], [(0, paths[k][1]) for k in idx], device, shape, [targets[k] for k in idx])
            for k, v in zip(idx, res):
                outs[k] = v
        return outs
    root = roots[0]
    if not ir.has_reduce(root):  # one of several roots realized together needs no reduction
        return runtime.run([root], paths, device, shape, targets)
    new, frame = prepare(root)
    if new is not root:
        # the tree changed: its live subexpressions are computed on their own
        if frame is None:
            first = runtime.run([new], [(0, ())], device, shape, [targets[0]])
        else:
            first = _run_frame(new, frame, [(0, ())], [targets[0]])
        rest = [runtime.run([fuser.node_at(root, p)], [(0, ())], device, shape, [t])[0]
                for (_, p), t in zip(paths[1:], targets[1:])]  # fmt: skip
        return first + rest
    assert frame is not None
    return _run_frame(root, frame, paths, targets)


def _run_frame(root: Node, frame: Frame, paths: Sequence[tuple[int, tuple]], targets: Sequence[Any],
               partial: int = 0) -> list[Any]:  # fmt: skip
    be = backends.get(root.device)
    full, axes = frame
    leaves = root.leaves
    lays = ["" if x.op == "scalar" else ("full" if x.shape == full else "row") for x in leaves]
    nodes = [fuser.node_at(root, p) for _, p in paths]
    olays: tuple[str, ...]
    if partial:
        olays = ("acc",)
    else:
        olays = tuple("full" if n.shape == full else "row" for n in nodes)
    key = ("frame", be.cache_tag(), root.key, tuple(paths), olays, tuple(lays), len(full))
    plan = runtime.lookup(key)
    if plan is None:
        spec = fuser.spec_for(
            [root], paths, leaves, olays, be.target, None, (axes, bool(partial)), lays, len(full)
        )
        if partial:
            acc = reduce_dtypes(root.attrs[0], root.args[0].dtype, be.target)[1]
            spec = replace(spec, outs=(replace(spec.outs[0], dtype=acc),))
        if spec.param_count(be.target) > config.current.max_kernel_params:
            raise ShapeError(
                f"a reduction kernel over {len(leaves)} inputs needs {spec.param_count(be.target)} parameters "
                f"(at most {config.current.max_kernel_params}); evaluate part of the expression first"
            )
        plan = runtime._compile(be, spec)
        runtime._store(key, plan)
    nrows, rowlen = frame_sizes(frame)
    if partial:
        outs = [
            be.empty(root.shape + (partial,), plan.spec.outs[0].dtype) if targets[0] is None else targets[0]
        ]
        omaps: list[tuple] = [(-1,) * len(full)]
        chunks, clen = partial, -(-rowlen // partial)
    else:
        outs = [be.empty(n.shape, n.dtype) if t is None else t for n, t in zip(nodes, targets)]
        omaps = [stride_map(n.shape, frame) for n in nodes]
        chunks, clen = 1, rowlen
    if nrows == 0 or rowlen == 0:
        return outs
    args: list[Any] = []
    maps: list[Any] = []
    datas: list[Any] = []
    for leaf in leaves:
        if leaf.op == "scalar":
            args.append(be.scalar_arg(leaf))
            maps.append(None)
            datas.append(None)
            continue
        data = leaf.data if leaf.op == "buffer" else runtime.compute_matmul(leaf)
        m = stride_map(leaf.shape, frame)
        args.extend(be.bind_frame(data, m))
        maps.append(m)
        datas.append(data)
    geometry = (*full, nrows, rowlen, chunks, clen)
    if runtime.RECORDER is not None:
        runtime.RECORDER.frame_kernel(be, plan, leaves, datas, maps, targets, outs, omaps, geometry)
    be.launch_frame(plan, args, outs, omaps, geometry)
    runtime._stats["launches"] += 1
    runtime._stats["kernels"] += 1
    return outs


def run_partial(r: Node, chunks: int) -> Any:
    """First stage of a two-stage reduction: each row of ``r`` in ``chunks`` chunks."""
    return _run_frame(r, frame_of(r), [(0, ())], [None], partial=chunks)[0]
