"""Reverse-mode autodiff: ``ft.grad``, ``ft.value_and_grad`` and ``ft.vjp`` (JAX's conventions).

How it works. While the function runs, every operator, view, reduction and GEMM appends one entry
``(op, operand nodes, attrs, result node)`` to a trace (``frontend.array.TAPE``); a pending value
that gets memory meanwhile (a GEMM operand, ``ft.evaluate``) adds an ``alias`` entry from its node
to the buffer. The backward pass walks the trace in reverse and builds each operand's cotangent
as an ordinary *lazy* fusetree expression from the op table's rule (``OpDef.vjp``), so

* the backward trees fuse like forward trees: the elementwise backward of an LSTM step between its
  GEMMs is one kernel, which also writes the four gate gradients into their slices of one array
  (``x[i]`` cotangents are written by one kernel per shape, ``engine.write_group``; a cotangent
  flowing unchanged into a slice of another gradient is written straight there, no copy);
* forward values a rule needs are read from memory when the forward stored them (GEMM results, a
  value the live-value rule stored) and otherwise *recomputed inside the backward kernel* from
  the nearest stored values (no extra forward outputs, no extra reads);
* a cotangent that sums several contributions (a value used twice, as an RNN's state is) is kept
  live, so the next kernel that computes it anyway stores it as an extra output; and every rule
  is applied only when its receiver's cotangent is summed (thunks reading the Arrays' nodes
  then), so trees built after that kernel read the stored value instead of recomputing a chain
  through time (a safety valve realizes a cotangent whose tree grows past ``_VALVE`` leaves).

Broadcasts reduce back (sums over the broadcast axes), ``a @ b`` becomes GEMMs on transposed
views, reductions, ``concat``/``stack`` and views have their rules here. Stores inside the
function are functional rebinds (``x[...] = v``, ``x += v``); ``y[t] = h`` into fresh memory (an
RNN's outputs) gives ``h`` the slice of ``y``'s cotangent. So nothing the backward pass reads is
overwritten. Everything composes with ``ft.jit``: a traced training step (forward, backward,
optimizer) is one plan and, with ``graph=True``, one CUDA graph.

>>> import numpy as np, fusetree as ft
>>> x = ft.asarray(np.array([0.5, -1.0, 2.0]))
>>> g = ft.grad(lambda x: ft.sum(ft.tanh(x) * x))(x)
>>> np.allclose(g.numpy(), np.tanh([0.5, -1.0, 2.0]) + [0.5, -1.0, 2.0] / np.cosh([0.5, -1.0, 2.0]) ** 2)
True
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import backends, engine
from ..engine import pytree
from ..engine.state import HOOK
from ..errors import ShapeError, UnsupportedError
from ..ir.node import Node, make_buffer
from ..ir.ops import OPS
from . import array as _arr
from .array import Array, broadcast, matmul, wrap
from .creation import asarray, empty, full, zeros


class _Namespace:
    """The array namespace the op table's rules are written against (fusetree's functions)."""

    def __getattr__(self, name: str) -> Any:
        import fusetree

        return getattr(fusetree, name)


F = _Namespace()
_DIFFERENTIABLE = "fc"  # dtype kinds that carry gradients
_VALVE = 64  # a cotangent still pending with more leaves than this is realized when read (a safety
# valve: the scatter kernels store the kept sums, so an RNN's chains stay short without it)


def _is_float(n: Node) -> bool:
    return n.op != "scalar" and n.dtype.kind in _DIFFERENTIABLE


class _Acc:
    """The cotangent of one node: a dense sum, scatters into index views, and how many
    contributions it has (a sum of two or more is kept live: see the module docstring)."""

    __slots__ = ("dense", "n", "node", "pre", "scatters", "thunks", "written")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.dense: Array | None = None
        self.scatters: list[tuple[Any, Array]] = []
        self.thunks: list[Callable[[], Array | None]] = []
        self.n = 0
        self.pre: Array | None = None  # memory pieces were written into ahead (see slot)
        self.written: set[int] = set()  # ids of scatter values already in ``pre``

    def add(self, g: Array | Callable[[], Array | None]) -> None:
        if not isinstance(g, Array):
            self.thunks.append(g)
        else:
            self.dense = g if self.dense is None else self.dense + g
        self.n += 1

    def _collect(self) -> None:
        for th in self.thunks:
            g = th()
            if g is not None:
                self.dense = g if self.dense is None else self.dense + g
        self.thunks = []

    def value(self, keep: list[Array], into: Array | None = None) -> Array:
        """The cotangent (lazy, or memory when scatters were written). ``into``: zeroed memory of
        this shape (a slice of the gradient the cotangent flows into unchanged) to write the
        scatters into, instead of a fresh array."""
        n = self.node
        self._collect()
        if not self.scatters:
            return self.dense if self.dense is not None else zeros(n.shape, n.dtype, n.device)
        scatters = [(k, g) for k, g in self.scatters if id(g) not in self.written]
        keys = [k for k, _ in self.scatters]
        disjoint, covered = _tiling(n.shape, keys)
        self.n += len(self.scatters)
        if self.pre is not None:
            buf, zeroed = self.pre, True
        elif into is not None and self.dense is None:
            buf, zeroed = into, True
        else:
            buf, zeroed = empty(n.shape, n.dtype, n.device), False
        if disjoint:  # one kernel per shape writes every piece into its slice (and the live sums)
            if not covered and not zeroed:
                buf[...] = 0.0
            data = buf._node.data  # type: ignore[attr-defined]
            live = [k for k in keep if k._node.op != "buffer" and k.device == n.device]
            engine.write_group(
                [g for _, g in scatters] + live, [data[k] for k, _ in scatters] + [None] * len(live), n.device
            )
        else:  # overlapping index views accumulate one by one
            if not zeroed:
                buf[...] = 0.0  # a kernel (ft.jit replays it), not a host fill frozen into the trace
            for key, g in scatters:
                buf[key] = buf[key] + g
        return buf if self.dense is None else buf + self.dense

    def slot(self, key: Any) -> Array:
        """Zeroed memory for index view ``key`` of this cotangent (allocated once, filled once):
        a piece written there now is not copied when the scatters are written."""
        if self.pre is None:
            n = self.node
            self.pre = empty(n.shape, n.dtype, n.device)
            self.pre[...] = 0.0
        return self.pre[key]

    def region(self, key: Any, keep: list[Array]) -> Array:
        """The cotangent of index view ``key`` (the dense part sliced, scatters into that same
        view taken as they are; anything overlapping it partly: the whole value, sliced)."""
        self._collect()
        same = [g for k, g in self.scatters if k == key]
        others = [k for k, _ in self.scatters if k != key]
        if others and _tiling(self.node.shape, [key, *others])[0] is False:
            return self.value(keep)[key]
        parts = ([self.dense[key]] if self.dense is not None else []) + same
        if not parts:
            return self.value(keep)[key]
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out


_TILINGS: dict[tuple, tuple[bool, bool]] = {}


def _hashable(key: Any) -> Any:
    """An index key as a hashable value (slices are not hashable before Python 3.12)."""
    if type(key) is slice:
        return (slice, key.start, key.stop, key.step)
    if type(key) is tuple:
        return tuple(_hashable(k) for k in key)
    return key


def _tiling(shape: tuple[int, ...], keys: list) -> tuple[bool, bool]:
    """(the index views are pairwise disjoint, together they cover the whole array)."""
    try:
        k = (shape, tuple(_hashable(key) for key in keys))
        hash(k)
    except TypeError:
        k = None
    r = _TILINGS.get(k) if k is not None else None
    if r is None:
        count = np.zeros(shape, np.int32)
        for key in keys:
            count[key] += 1
        r = (bool(count.max(initial=0) <= 1), bool(count.min(initial=1) >= 1))
        if k is not None:
            if len(_TILINGS) > 1024:
                _TILINGS.clear()
            _TILINGS[k] = r
    return r


def _unbroadcast(g: Array, n: Node) -> Array:
    """``g`` (a cotangent of ``n`` broadcast) summed back to ``n``'s shape and cast to its dtype
    (leading axes summed away, size-1 axes kept: no reshape of a pending reduction)."""
    shape = n.shape
    if g.shape != shape:
        lead = g.ndim - len(shape)
        if lead:
            g = F.sum(g, axis=tuple(range(lead)))
        ones = tuple(k for k, s in enumerate(shape) if s == 1 and g.shape[k] != 1)
        if ones:
            g = F.sum(g, axis=ones, keepdims=True)
    if g.dtype != n.dtype:
        g = g.astype(n.dtype)
    return g


def _expand_back(g: Array, n: Node, axes: tuple[int, ...], keepdims: bool) -> Array:
    """A reduction's cotangent ``g`` broadcast back to the reduced operand ``n``'s shape."""
    if not keepdims:
        g = g.reshape(tuple(1 if d in axes else s for d, s in enumerate(n.shape)))
    return wrap(broadcast(g._node, n.shape))


def _reduce_vjp(
    g: Array, y: Array, x: Array, kind: str, axes: tuple[int, ...], keepdims: bool
) -> Array | None:
    if kind == "sum":
        return _expand_back(g, x._node, axes, keepdims)
    if kind in ("max", "min"):
        yb = _expand_back(y, x._node, axes, keepdims)
        hit = (x == yb).astype(x.dtype)
        count = F.sum(hit, axis=axes, keepdims=True)
        return _expand_back(g, x._node, axes, keepdims) * hit / count
    if kind == "prod":
        return _expand_back(g * y, x._node, axes, keepdims) / x
    return None  # argmax/argmin/any/all: no gradient


def _matmul_vjp(g: Array, a: Array, b: Array, need: tuple[bool, bool]) -> tuple[Array | None, Array | None]:
    a2 = a.reshape((1, a.shape[0])) if a.ndim == 1 else a
    b2 = b.reshape((b.shape[0], 1)) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1 or b.ndim == 1:  # the product of the 2-D forms, before its 1-D axes were dropped
        g2 = g.reshape(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]))
    ga = matmul(g2, b2.mT) if need[0] else None
    gb = matmul(a2.mT, g2) if need[1] else None
    if ga is not None:
        ga = _unbroadcast(ga, a2._node) if ga.shape != a2.shape else ga
        ga = ga.reshape(a.shape) if ga.shape != a.shape else ga
    if gb is not None:
        gb = _unbroadcast(gb, b2._node) if gb.shape != b2.shape else gb
        gb = gb.reshape(b.shape) if gb.shape != b.shape else gb
    return ga, gb


def _deferred(
    op: str, ins: tuple, attrs: tuple, out: Node, g: Array, only: list[bool], val: Callable, i: int
) -> Array | None:
    """Operand ``i``'s contribution from a summed cotangent ``g``, built when it is summed (``g``
    has memory by then if a kernel stored it meanwhile; a deep pending one is realized here)."""
    if g._node.op != "buffer" and len(g._node.leaves) > _VALVE:
        engine.realize((g,))
    gx = _cotangents(op, ins, attrs, out, g, only, val)[i]
    return None if gx is None else _unbroadcast(gx, ins[i])


def _cotangents(
    op: str, ins: tuple, attrs: tuple, out: Node, g: Array, need: Sequence[bool], val: Callable
) -> Sequence[Array | None]:
    """Each operand's cotangent of trace entry ``(op, ins, attrs, out)`` given ``g`` (None: none)."""
    if op == "alias" or op == "store":
        return (g,)
    if op == "transpose":
        ax = attrs[0]
        return (g.transpose(tuple(np.argsort(ax))) if ax is not None else g.transpose(),)
    if op == "reshape":
        return (g.reshape(ins[0].shape),)
    if op == "reduce":
        return (_reduce_vjp(g, val(out), val(ins[0]), *attrs),)
    if op == "matmul":
        return _matmul_vjp(g, val(ins[0]), val(ins[1]), (need[0], need[1]))
    if op == "concat":
        ax, off, parts = attrs[0], 0, []
        for x in ins:
            n = x.shape[ax]
            parts.append(g[(slice(None),) * ax + (slice(off, off + n),)])
            off += n
        return parts
    if op == "boundary":
        raise UnsupportedError(
            f"ft.grad: {attrs[0]} has no gradient rule (it runs in the backend); the gradient "
            "of a differentiated input passes through it"
        )
    if op == "gather":
        raise UnsupportedError(
            "ft.grad: the gradient of integer-array or boolean indexing is not implemented "
            "(use a one-hot matrix product or basic slicing)"
        )
    rule = OPS[op].vjp
    if rule is None:
        return (None,) * len(ins)  # comparisons, rounding, bitwise: no gradient
    return [
        None if gx is None else gx if isinstance(gx, Array) else asarray(gx, device=x.device)
        for gx, x in zip(rule(F, g, val(out), *[val(x) for x in ins]), ins)
    ]


def backward(entries: list, outs: Sequence[Node], cts: Sequence[Array], wrt: Sequence[Node]) -> list[Array]:
    """Cotangents of the nodes ``wrt`` given cotangents ``cts`` of ``outs``, from a trace."""
    primal: dict[int, Node] = {}  # a pending node's uid -> the buffer it was realized into
    needed = {n.uid for n in wrt}  # nodes that depend on an input being differentiated
    view_of: dict[int, tuple[Node, Any]] = {}  # an index view's node -> (its source, the key)
    for op, ins, _attrs, out in entries:
        if op == "alias":
            primal[ins[0].uid] = out
        elif op == "getitem":
            view_of[out.uid] = (ins[0], _attrs[0])
        if any(x.uid in needed for x in ins):
            needed.add(out.uid)

    def val(n: Node) -> Array:
        seen = n
        while seen.uid in primal:
            seen = primal[seen.uid]
        return wrap(seen)

    acc: dict[int, _Acc] = {}
    for n, c in zip(outs, cts):
        if n.uid in needed and _is_float(n):
            acc.setdefault(n.uid, _Acc(n)).add(_unbroadcast(c, n))
    keep: list[Array] = []  # sums of several contributions, live while the backward runs
    wanted = {n.uid for n in wrt}
    for op, ins, attrs, out in reversed(entries):
        cur = acc.get(out.uid)
        if cur is None or out.uid in wanted:
            continue
        if op == "setitem":  # y[k] = v into fresh memory: v's cotangent is y's, sliced (y stays)
            x = ins[0]
            if x.uid in needed and _is_float(x):
                acc.setdefault(x.uid, _Acc(x)).add(_unbroadcast(cur.region(attrs[0], keep), x))
            continue
        del acc[out.uid]
        into = None
        if op == "add" and cur.scatters and not cur.thunks and cur.dense is None:
            # written into the slice of the gradient it flows into unchanged (an RNN's gate
            # gradients into the all-steps input projection's): no copy later
            for x in ins:
                v = view_of.get(x.uid)
                if v is not None and x.shape == out.shape and x.dtype == out.dtype and x.uid in needed:
                    into = acc.setdefault(v[0].uid, _Acc(v[0])).slot(v[1])
                    break
        g = cur.value(keep, into)
        need = [x.uid in needed and _is_float(x) for x in ins]
        if cur.n > 1:
            # a sum of several contributions (a value used twice: an RNN's state) is kept live:
            # the next kernel that computes it anyway (an index-view scatter, a GEMM operand)
            # stores it. Every contribution is built when its receiver is summed (thunks reading
            # the Arrays' nodes then), so trees built after that kernel read its memory instead
            # of recomputing a chain through time.
            keep.append(g)
        if not builtins.any(need):
            continue
        if op == "getitem":
            x = ins[0]
            src = acc.setdefault(x.uid, _Acc(x))
            src.scatters.append((attrs[0], g))
            if src.pre is not None and g._node.op == "buffer" and cur.n == 1:
                piece = src.pre[attrs[0]]._node  # the slot this value may have been written into
                if backends.get(g.device).same_view(g._node.data, piece.data):  # type: ignore[attr-defined]
                    src.written.add(id(g))
            continue
        for i, x in enumerate(ins):
            if need[i]:
                only = [k == i for k in range(len(ins))]
                acc.setdefault(x.uid, _Acc(x)).add(
                    functools.partial(_deferred, op, ins, attrs, out, g, only, val, i)
                )
    res = []
    for n in wrt:
        a = acc.get(n.uid)
        if a is None:
            res.append(zeros(n.shape, n.dtype, n.device))
        else:
            res.append(a.value(keep))
    return res


# ---------------------------------------------------------------------------------------------
# the public transformations


def _trace(fun: Callable[..., Any], args: tuple, argnums: tuple[int, ...], kwargs: dict) -> tuple:
    """Run ``fun`` with fresh leaves for the differentiated arguments, recording the trace."""
    call = list(args)
    wrt: list[Node] = []
    trees = []
    for i in argnums:
        if i >= len(call):
            raise TypeError(f"argnums {i} is out of range for a call with {len(call)} positional argument(s)")
        leaves, tree = pytree.flatten(call[i])
        fresh = []
        for leaf in leaves:
            a = asarray(leaf)
            if a.dtype.kind not in _DIFFERENTIABLE:
                raise TypeError(
                    f"ft.grad: differentiated inputs must be floating point, got {a.dtype} (argument {i}); "
                    "pass integer arrays through a non-differentiated argument"
                )
            engine.realize((a,))
            n = make_buffer(a._node.data, a.device)  # type: ignore[attr-defined]
            wrt.append(n)
            fresh.append(wrap(n))
        trees.append((tree, len(leaves)))
        call[i] = pytree.unflatten(tree, fresh)
    entries = _arr.Tape({n.uid for n in wrt})
    prev_tape, prev_hook = _arr.TAPE, HOOK.tape
    _arr.TAPE = entries

    def alias(old: Node, new: Node) -> None:
        if old is not new:
            entries.append(("alias", (old,), (), new))

    HOOK.tape = alias
    try:
        result = fun(*call, **kwargs)
    finally:
        _arr.TAPE, HOOK.tape = prev_tape, prev_hook
    return result, entries, wrt, trees


def _argnums(argnums: int | Sequence[int]) -> tuple[tuple[int, ...], bool]:
    if isinstance(argnums, int):
        return (argnums,), True
    return tuple(argnums), False


def _split(result: Any, has_aux: bool) -> tuple[Any, Any]:
    if not has_aux:
        return result, None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError("has_aux=True: the function must return a pair (output, auxiliary data)")
    return result


def _grads_tree(grads: list[Array], trees: list[tuple[Any, int]], single: bool) -> Any:
    """The gradients in the differentiated arguments' structures ((tree, leaf count) each)."""
    out, k = [], 0
    for tree, n in trees:
        out.append(pytree.unflatten(tree, grads[k : k + n]))
        k += n
    return out[0] if single else tuple(out)


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``fun``'s value and its gradient with respect to argument(s) ``argnums`` (JAX's API).

    ``fun`` returns a scalar (a 0-d or one-element array), or ``(scalar, aux)`` with
    ``has_aux=True``; arguments may be pytrees (lists, tuples, dicts) of float arrays. The value
    and the gradients are lazy fusetree arrays: evaluate them together (``ft.evaluate``) and the
    forward and backward kernels are planned at once.

    >>> import numpy as np, fusetree as ft
    >>> w = ft.asarray(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> x = ft.asarray(np.array([1.0, -1.0]))
    >>> loss, (gw, gx) = ft.value_and_grad(lambda w, x: ft.sum((w @ x) ** 2), argnums=(0, 1))(w, x)
    >>> float(loss), gw.numpy().tolist(), gx.numpy().tolist()
    (2.0, [[-2.0, 2.0], [-2.0, 2.0]], [-8.0, -12.0])
    """
    nums, single = _argnums(argnums)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result, entries, wrt, trees = _trace(fun, args, nums, kwargs)
        out, aux = _split(result, has_aux)
        if not isinstance(out, Array):
            out = asarray(out)
        if out.size != 1:
            raise ShapeError(f"ft.grad: the function must return a scalar, got an array of shape {out.shape}")
        if out.dtype.kind not in _DIFFERENTIABLE:
            raise TypeError(f"ft.grad: the function's output must be floating point, got {out.dtype}")
        seed = full(out.shape, 1, out.dtype, out.device)  # ft.jit records the fill
        grads = backward(entries, [out._node], [seed], wrt)
        g = _grads_tree(grads, trees, single)
        return ((out, aux), g) if has_aux else (out, g)

    wrapped.__name__ = f"value_and_grad({getattr(fun, '__name__', 'fun')})"
    return wrapped


def grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """The gradient of scalar-valued ``fun`` with respect to argument(s) ``argnums`` (JAX's API;
    see :func:`value_and_grad`).

    >>> import numpy as np, fusetree as ft
    >>> ft.grad(lambda x: ft.sum(x * x))(ft.asarray(np.array([1.0, 2.0]))).numpy().tolist()
    [2.0, 4.0]
    """
    vg = value_and_grad(fun, argnums, has_aux)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if has_aux:
            (_, aux), g = vg(*args, **kwargs)
            return g, aux
        return vg(*args, **kwargs)[1]

    wrapped.__name__ = f"grad({getattr(fun, '__name__', 'fun')})"
    return wrapped


def vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple:
    """``(fun(*primals), vjp_fn)`` (and ``aux`` with ``has_aux=True``): ``vjp_fn(cotangent)`` gives
    the cotangent of every primal (a tuple) for a cotangent of the output (same pytree as the
    output). JAX's API.

    >>> import numpy as np, fusetree as ft
    >>> y, f_vjp = ft.vjp(lambda x: x * 3.0, ft.asarray(np.array([1.0, 2.0])))
    >>> f_vjp(ft.asarray(np.array([1.0, 10.0])))[0].numpy().tolist()
    [3.0, 30.0]
    """
    nums = tuple(range(len(primals)))
    result, entries, wrt, trees = _trace(fun, primals, nums, {})
    out, aux = _split(result, has_aux)
    out_leaves, out_tree = pytree.flatten(out)

    def vjp_fn(ct: Any) -> tuple:
        ct_leaves, ct_tree = pytree.flatten(ct)
        if ct_tree != out_tree or len(ct_leaves) != len(out_leaves):
            raise ShapeError("vjp: the cotangent's structure differs from the output's")
        outs, cts = [], []
        for o, c in zip(out_leaves, ct_leaves):
            if isinstance(o, Array):
                c = c if isinstance(c, Array) else asarray(c, device=o.device)
                if c.shape != o.shape:
                    raise ShapeError(f"vjp: cotangent shape {c.shape} differs from the output's {o.shape}")
                outs.append(o._node)
                cts.append(c)
        grads = backward(entries, outs, cts, wrt)
        return _grads_tree(grads, trees, False)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


__all__ = ["backward", "grad", "value_and_grad", "vjp"]
