"""IR nodes: immutable, slotted, with a structural key interned once at construction.

Every node of an elementwise tree has its consumer's shape: broadcasts and views are pushed down to
the leaves when a node is built (see :mod:`fusetree.frontend`). Leaves are

* :class:`Buffer`: a strided view of device memory, read by the kernel through its strides;
* :class:`Scalar`: a Python or NumPy scalar, passed to the kernel as an argument;
* a ``matmul`` :class:`Node`: a pending GEMM, a fusion boundary computed before its consumer.

``key`` is a small int interned from ``(op, dtype, attrs, child keys, leaf sharing)``: it never
contains sizes, strides or scalar values, so two trees with one key compute the same function of
their leaf tuples and share one compiled kernel. ``leaves`` lists the distinct leaves in a fixed
order (the kernel's inputs), with sharing merged. Both are computed from the children at
construction: nothing on the hot path walks a tree.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import numpy as np

from . import dtypes

# flags
REDUCE = 1  # a reduction is in the tree
GEMM = 2  # a pending GEMM is a leaf of the tree
EXPAND = 4  # a reduced value is broadcast back (an ``expand`` node) in the tree
# Above the flag bits, ``flags`` counts the tree's depth (op levels above its deepest leaf): the max of
# two flags words is the one with the deeper tree, so a node's depth costs one compare and one add.
DEPTH_SHIFT = 8
FLAG_BITS = (1 << DEPTH_SHIFT) - 1
ONE_LEVEL = 1 << DEPTH_SHIFT

# the IR verifier runs on every op node built (tests turn it on: FUSETREE_VERIFY=1)
VERIFY = os.environ.get("FUSETREE_VERIFY", "") not in ("", "0")


def _load_native() -> Any:
    """The optional C accelerator (``fusetree/_native.c``, built at install), or None when it is not
    built or FUSETREE_NATIVE=0: then the Python definitions below run (they are the reference)."""
    if os.environ.get("FUSETREE_NATIVE", "") in ("0", "false", "no", "off"):
        return None
    try:
        from .. import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native


NATIVE: Any = _load_native()

_KEYS: dict[tuple, int] = {}
KEY_DESCRIPTIONS: list[tuple] = []  # int key -> the tuple it was interned from
_key_lock = threading.Lock()
_uids = itertools.count(1)
# one shared order for nodes and pending-array registrations: an array registered as pending after
# node ``n`` was made has a larger mark than ``n.uid`` (engine.realization's live-value search)
next_uid = _uids.__next__


def intern_key(t: tuple) -> int:
    """Map a structural tuple to a small int (one dict lookup when the structure was seen before)."""
    k = _KEYS.get(t)
    if k is None:
        with _key_lock:
            k = _KEYS.get(t)
            if k is None:
                k = len(KEY_DESCRIPTIONS)
                KEY_DESCRIPTIONS.append(t)
                _KEYS[t] = k
    return k


_LAYOUTS: dict[tuple, str] = {}


def layout_class(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    """'C' contiguous; 'I' inner dimension contiguous; 'R' inner dimension broadcast (stride 0);
    'T' transposed: the second-to-last dimension contiguous (CUDA kernels read it through a
    shared-memory tile); 'S' any other strides (strides in bytes). Memoized: a view taken every
    step (a gate slice of a GEMM's output) asks the same question each time (0.8 -> 0.15 us)."""
    k = (shape, strides, itemsize)
    lay = _LAYOUTS.get(k)
    if lay is None:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        lay = _LAYOUTS[k] = _layout_class(shape, strides, itemsize)
    return lay


def _layout_class(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    expect = itemsize
    contiguous = True
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            contiguous = False
            break
        expect *= n
    if contiguous:
        return "C"
    if shape and (shape[-1] == 1 or strides[-1] == itemsize):
        return "I"
    if shape and strides[-1] == 0:
        return "R"
    if len(shape) >= 2 and strides[-2] == itemsize and shape[-2] > 1:
        return "T"
    return "S"


class Node:
    """An IR node. Build with :func:`make_op` and the leaf constructors; never mutate.

    Equality and hashing are by identity: structural equality is ``key``'s job, and a deep
    ``__eq__`` must never run on the hot path.
    """

    __slots__ = ("args", "attrs", "device", "dtype", "flags", "key", "leaves", "lo", "mask",
                 "memo", "op", "shape", "uid")  # fmt: skip

    op: str  # an op-table name, "reduce", "expand", or a leaf kind ("buffer", "scalar", "matmul")
    dtype: np.dtype
    shape: tuple[int, ...]
    args: tuple[Node, ...]  # children (a GEMM's operands for "matmul")
    attrs: tuple  # op attributes (astype: (dtype,); reduce: (kind, axes, keepdims))
    key: int  # the interned structural key
    leaves: tuple[Node, ...]  # distinct leaves in kernel-argument order; () for a leaf itself
    uid: int  # creation order
    device: str  # "" for scalars
    flags: int  # REDUCE | GEMM | EXPAND, and the depth above DEPTH_SHIFT (see ``depth``)
    lo: int  # smallest uid of an op node in this tree (the live-value search's range filter)
    mask: int  # a 64-bit Bloom mask of the leaves: no common bit means no shared leaf
    memo: Any  # a pending GEMM's result once computed

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.dtype}, {self.shape}, key={self.key})"

    @property
    def is_leaf(self) -> bool:
        return not self.leaves

    @property
    def all_leaves(self) -> tuple[Node, ...]:
        """``leaves``, or ``(self,)`` for a leaf."""
        return self.leaves or (self,)

    @property
    def desc(self) -> dtypes.Desc:
        """The operand descriptor for dtype rules: the dtype, or the Python type of a weak scalar."""
        return self.dtype


class Buffer(Node):
    """A leaf reading memory: a (possibly strided, broadcast or negative-stride) view.

    ``ptr`` is the address of element 0 and ``span`` the [low, high) byte range the view can
    touch (both computed on first use); ``bound`` caches the view's kernel arguments per argument
    form (see the backends' ``bind``) and views of it (the frontend's view cache).
    """

    __slots__ = ("_ptr", "_span", "bound", "data", "layout")

    data: Any  # the backend array (NumPy or CuPy view)
    layout: str
    bound: dict | None
    _ptr: int
    _span: tuple[int, int] | None

    @property
    def ptr(self) -> int:
        p = self._ptr
        if p < 0:
            p = self._ptr = address(self.data)
        return p

    @property
    def span(self) -> tuple[int, int]:
        s = self._span
        if s is None:
            d = self.data
            s = self._span = span_of(self.ptr, self.shape, d.strides, d.itemsize)
        return s


class ViewLeaf(Buffer):
    """A basic view (slice, transpose) of backend array ``source`` described by arithmetic: element
    ``offset`` from the source's element 0 and element ``estrides``. Kernels bind it from the
    source's binding and the offset (``Backend.bind_offset``), so no backend view object is made on
    the hot path (a CuPy view costs microseconds of host time); ``data`` makes one on first use
    (``fn(source)``) for everything else (a GEMM operand, ``.numpy()``, a jit recording)."""

    __slots__ = ("_view", "estrides", "fn", "offset", "source", "src_bound", "src_strides")

    source: Any  # the viewed backend array (kept alive by the leaf)
    fn: Any  # source -> the backend view
    offset: int  # element offset of the view's element 0 from the source's
    estrides: tuple[int, ...]
    src_strides: tuple[int, ...]  # the source's element strides the offset and strides assume
    src_bound: Any  # the source's strided kernel arguments once bound (False: bind view objects)
    _view: Any

    @property  # type: ignore[override]
    def data(self) -> Any:
        v = self._view
        if v is None:
            v = self._view = self.fn(self.source)
        return v

    @property
    def ptr(self) -> int:
        p = self._ptr
        if p < 0:
            p = self._ptr = address(self.source) + self.offset * self.dtype.itemsize
        return p

    @property
    def span(self) -> tuple[int, int]:
        s = self._span
        if s is None:
            item = self.dtype.itemsize
            s = self._span = span_of(self.ptr, self.shape, tuple([e * item for e in self.estrides]), item)
        return s


def address(data: Any) -> int:
    """Address of element 0 of a host or CUDA array (``__array_interface__`` /
    ``__cuda_array_interface__``)."""
    ai = getattr(data, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0])
    return int(data.__cuda_array_interface__["data"][0])


class Scalar(Node):
    """A leaf for a scalar. Python scalars are weak (NEP 50): ``weak`` is their type."""

    __slots__ = ("value", "weak")

    value: Any
    weak: type | None

    @property
    def desc(self) -> dtypes.Desc:
        return self.weak if self.weak is not None else self.dtype


_new_node = object.__new__
_BUFFER_KEYS: dict[tuple, int] = {}


def span_of(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if n > 1:
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
    return lo, hi + itemsize


def make_buffer(data: Any, device: str, ptr: int = -1) -> Buffer:
    """A leaf reading ``data`` (an array view; ``ptr``: its element 0's address if known)."""
    dt = data.dtype
    shape = data.shape
    lay = layout_class(shape, data.strides, dt.itemsize)
    bk = (dt, len(shape), lay)
    key = _BUFFER_KEYS.get(bk)
    if key is None:
        key = _BUFFER_KEYS[bk] = intern_key(("buffer", dtypes.SHORT[dt], len(shape), lay))
    n = _new_node(Buffer)
    uid = next(_uids)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = (
        "buffer",
        dt,
        shape,
        (),
        (),
        key,
        (),
        uid,
    )
    n.device, n.flags, n.lo, n.mask, n.memo = device, 0, 1 << 62, 1 << (uid % 64), None
    n.data, n.layout, n.bound, n._ptr, n._span = data, lay, None, ptr, None
    return n


def make_view_leaf(source: Any, fn: Any, src_strides: tuple[int, ...], offset: int, shape: tuple[int, ...],
                   estrides: tuple[int, ...], dtype: np.dtype, device: str,
                   layout: tuple[str, int] | None = None) -> ViewLeaf:  # fmt: skip
    """A :class:`ViewLeaf`: ``fn(source)`` described as ``offset`` and ``estrides`` (elements) of a
    source with element strides ``src_strides``. ``layout``: its (layout class, key) when known
    (see :func:`view_layout`)."""
    lay, key = layout if layout is not None else view_layout(shape, estrides, dtype)
    n = _new_leaf(ViewLeaf, "buffer", dtype, shape, key, device)
    n.layout, n.bound, n._ptr, n._span, n._view = lay, None, -1, None, None
    n.source, n.fn, n.src_strides, n.offset, n.estrides, n.src_bound = (
        source,
        fn,
        src_strides,
        offset,
        estrides,
        None,
    )
    return n


def _new_leaf(cls: type, op: str, dtype: np.dtype, shape: tuple[int, ...], key: int, device: str) -> Any:
    """A leaf node of class ``cls`` with the fields every leaf has (the class's own are the caller's;
    make_buffer and make_contiguous, the hottest, set them inline)."""
    n: Any = _new_node(cls)
    uid = next(_uids)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = op, dtype, shape, (), (), key, (), uid
    n.device, n.flags, n.lo, n.mask, n.memo = device, 0, 1 << 62, 1 << (uid % 64), None
    return n


def view_layout(shape: tuple[int, ...], estrides: tuple[int, ...], dtype: np.dtype) -> tuple[str, int]:
    """(layout class, buffer key) of a view of ``shape`` and element strides ``estrides``."""
    item = dtype.itemsize
    lay = layout_class(shape, tuple([e * item for e in estrides]), item)
    bk = (dtype, len(shape), lay)
    key = _BUFFER_KEYS.get(bk)
    if key is None:
        key = _BUFFER_KEYS[bk] = intern_key(("buffer", dtypes.SHORT[dtype], len(shape), lay))
    return lay, key


def make_contiguous(data: Any, device: str, shape: tuple[int, ...], dt: np.dtype, ptr: int = -1) -> Buffer:
    """A leaf for a fresh C-contiguous array (a kernel's output): no layout analysis needed."""
    bk = (dt, len(shape), "C")
    key = _BUFFER_KEYS.get(bk)
    if key is None:
        key = _BUFFER_KEYS[bk] = intern_key(("buffer", dtypes.SHORT[dt], len(shape), "C"))
    n = _new_node(Buffer)
    uid = next(_uids)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = (
        "buffer",
        dt,
        shape,
        (),
        (),
        key,
        (),
        uid,
    )
    n.device, n.flags, n.lo, n.mask, n.memo = device, 0, 1 << 62, 1 << (uid % 64), None
    n.data, n.layout, n.bound, n._ptr, n._span = data, "C", None, ptr, None
    return n


_WEAK_DT = {t: dtypes.weak_default(t) for t in (bool, int, float, complex)}
_SCALAR_KEYS: dict = {}
_FLOAT_DT = _WEAK_DT[float]
_FLOAT_KEY = _SCALAR_KEYS[(float, _FLOAT_DT)] = intern_key(("scalar", "float"))


def make_scalar(value: Any) -> Scalar:
    """A leaf for a scalar. Python scalars are weak (NEP 50); NumPy scalars keep their dtype."""
    weak: type | None
    key: int | None
    t = type(value)
    if t is float:  # the commonest (0.9 * m): its key is known
        weak, dt, key = float, _FLOAT_DT, _FLOAT_KEY
    else:
        if t is int:
            weak, dt = int, _WEAK_DT[int]
            if not (-(2**63) <= value < 2**63):
                raise OverflowError(
                    f"Python integer {value} does not fit in int64 (fusetree passes Python ints as int64)"
                )
        elif t is bool:
            weak, dt = bool, _WEAK_DT[bool]
        elif t is complex:  # (only complex arrays' unfused ops take one: frontend.unfused)
            weak, dt = complex, _WEAK_DT[complex]
        elif isinstance(value, np.generic):
            weak, dt = None, dtypes.check(value.dtype, "scalar")
            value = value.item() if dt.kind != "f" else float(value)
        elif isinstance(value, bool):
            weak, dt = bool, _WEAK_DT[bool]
        elif isinstance(value, int):
            weak, dt = int, _WEAK_DT[int]
            value = int(value)
        else:
            weak, dt = float, _WEAK_DT[float]
            value = float(value)
        key = _SCALAR_KEYS.get((weak, dt))
        if key is None:
            key = _SCALAR_KEYS[(weak, dt)] = intern_key(
                ("scalar", weak.__name__ if weak else dtypes.SHORT[dt])
            )
    n = _new_node(Scalar)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = "scalar", dt, (), (), (), key, (), 0
    n.device, n.flags, n.lo, n.mask, n.memo = "", 0, 1 << 62, 0, None
    n.value, n.weak = value, weak
    return n


def make_matmul(a: Node, b: Node, shape: tuple[int, ...], dtype: np.dtype) -> Node:
    """A pending GEMM ``a @ b`` (operands are buffers); to elementwise consumers a C-contiguous
    leaf computed first."""
    return make_gemm_sum((a, b), shape, dtype)


def make_gemm_sum(args: tuple[Node, ...], shape: tuple[int, ...], dtype: np.dtype) -> Node:
    """A pending sum of GEMMs ``args[0] @ args[1] + args[2] @ args[3] + ...`` (operand buffers in
    pairs): the first product writes the output, each later one accumulates into it (beta = 1)."""
    a = args[0]
    key = intern_key(("matmul", dtypes.SHORT[dtype], len(shape), tuple([x.key for x in args])))
    n = _new_node(Node)
    uid = next(_uids)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = (
        "matmul",
        dtype,
        shape,
        args,
        (),
        key,
        (),
        uid,
    )
    n.device, n.flags, n.lo, n.mask, n.memo = a.device, GEMM, 1 << 62, 1 << (uid % 64), None
    return n


_IOTA: dict[int, tuple[int, ...]] = {}


def _iota(n: int) -> tuple[int, ...]:
    t = _IOTA.get(n)
    if t is None:
        t = _IOTA[n] = tuple(range(n))
    return t


def merge_leaves(args: tuple[Node, ...]) -> tuple[tuple[Node, ...], tuple | None]:
    """Distinct leaves of ``args`` in order, and the sharing map (None when no leaf is shared)."""
    if len(args) == 1:
        return args[0].leaves or (args[0],), None
    mask = 0
    disjoint = True
    for a in args:
        if a.mask & mask:
            disjoint = False
        mask |= a.mask
    if disjoint:  # no common Bloom bit: no shared leaf
        out: tuple[Node, ...] = ()
        for a in args:
            out += a.leaves or (a,)
        return out, None
    if len(args) == 2:  # the common case, at C speed: `in` and `index` compare nodes by identity
        first = args[0].leaves or (args[0],)
        b = args[1]
        if not b.leaves:  # (x*y) + x: a tree and one of its own leaves
            return (first, (_iota(len(first)), (first.index(b),))) if b in first else (first + (b,), None)
        second = b.leaves
        k, n = len(second), len(first)
        if k <= n and first[n - k :] == second:  # b's tree ends a's (evaluate(h, c), h = o * tanh(c))
            return first, (_iota(n), _iota(n)[n - k :])
        if len(second) <= 8:
            merged = list(first)
            where = []
            for leaf in second:
                if leaf in merged:
                    where.append(merged.index(leaf))
                else:
                    where.append(len(merged))
                    merged.append(leaf)
            if len(merged) == len(first) + len(second):
                return tuple(merged), None  # a Bloom false positive
            return tuple(merged), (_iota(len(first)), tuple(where))
    # the first operand's leaves are distinct already: taken whole, indexed in one pass. A leaf is
    # shared when the same object comes twice, scalars included: a subtree used twice brings its
    # scalars twice (``y = y * 2.0 - y * 0.5`` in a loop would otherwise double them every level)
    first = args[0].leaves or (args[0],)
    leaves: list[Node] = list(first)
    index: dict[int, int] = {id(leaf): j for j, leaf in enumerate(first)}
    maps = [tuple(range(len(first)))]
    total = len(first)
    for a in args[1:]:
        m = []
        for leaf in a.leaves or (a,):
            total += 1
            j = index.get(id(leaf))
            if j is None:
                j = index[id(leaf)] = len(leaves)
                leaves.append(leaf)
            m.append(j)
        maps.append(tuple(m))
    if len(leaves) == total:
        return tuple(leaves), None
    return tuple(leaves), tuple(maps)


# Set by the engine while deferred stores are queued; the frontend calls it with each buffer operand
# of a new op (an operand reading a queued store's target memory flushes it first: engine.stores).
# Internal rebuilds of existing trees (views pushed to leaves, planning) do not call it.
WATCH: Any = None


def make_op(op: str, args: tuple[Node, ...], dtype: np.dtype, shape: tuple[int, ...],
            device: str, attrs: tuple = ()) -> Node:  # fmt: skip
    """An op node over ``args`` (non-scalar children already have ``shape``, except below a
    ``reduce`` or an ``expand``)."""
    if len(args) == 2:
        a0, a1 = args
        if a0.mask & a1.mask:
            leaves, sharing = merge_leaves(args)
        else:
            leaves, sharing = (a0.leaves or (a0,)) + (a1.leaves or (a1,)), None
        ckeys: tuple = (a0.key, a1.key)
        f0, f1 = a0.flags, a1.flags
        flags = ((f0 | f1) & FLAG_BITS) | ((f0 if f0 > f1 else f1) & ~FLAG_BITS) + ONE_LEVEL
        lo = a0.lo if a0.lo < a1.lo else a1.lo
        mask = a0.mask | a1.mask
    else:
        leaves, sharing = merge_leaves(args)
        ckeys = tuple([a.key for a in args])
        flags = deepest = 0
        lo = 1 << 62
        mask = 0
        for a in args:
            flags |= a.flags
            if a.flags > deepest:
                deepest = a.flags
            mask |= a.mask
            if a.lo < lo:
                lo = a.lo
        flags = (flags & FLAG_BITS) | (deepest & ~FLAG_BITS) + ONE_LEVEL
    if op == "reduce":
        flags |= REDUCE
    elif op == "expand":
        flags |= EXPAND
    key = intern_key((op, dtype, attrs, ckeys, sharing))
    n = _new_node(Node)
    uid = next(_uids)
    n.op, n.dtype, n.shape, n.args, n.attrs, n.key, n.leaves, n.uid = (
        op,
        dtype,
        shape,
        args,
        attrs,
        key,
        leaves,
        uid,
    )
    n.device, n.flags, n.lo, n.mask, n.memo = device, flags, lo if lo < uid else uid, mask, None
    if VERIFY:
        verify(n)
    return n


def depth(node: Node) -> int:
    """Op levels above the node's deepest leaf (0 for a leaf)."""
    return node.flags >> DEPTH_SHIFT


def has_reduce(node: Node) -> bool:
    """Whether a reduction is inside ``node``'s tree."""
    return bool(node.flags & REDUCE)


def verify(node: Node) -> None:
    """IR verifier (used by tests): shapes, devices, flags and leaf lists are consistent."""
    from .ops import OPS

    stack = [node]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ("buffer", "scalar", "temp", "derived"):
            assert n.leaves == () and n.args == ()
            continue
        if n.op == "matmul":
            assert all(a.op == "buffer" for a in n.args) and len(n.args) >= 2 and len(n.args) % 2 == 0
            continue
        assert n.leaves, n
        assert set(map(id, n.leaves)) == {id(x) for a in n.args for x in a.all_leaves}
        arrays = [x for x in n.leaves if x.op != "scalar"]
        assert len(set(map(id, arrays))) == len(arrays)
        assert bool(n.flags & REDUCE) == (n.op == "reduce" or any(a.flags & REDUCE for a in n.args))
        assert depth(n) == 1 + max(depth(a) for a in n.args), (depth(n), [depth(a) for a in n.args])
        if n.op in ("reduce", "expand"):
            (a,) = n.args
            assert a.device == n.device and n.attrs is not None
            if n.op == "reduce":
                kind, axes, keep = n.attrs
                assert all(0 <= d < len(a.shape) for d in axes), (axes, a.shape)
                want = (
                    tuple(1 if d in axes else s for d, s in enumerate(a.shape))
                    if keep
                    else tuple(s for d, s in enumerate(a.shape) if d not in axes)
                )
                assert n.shape == want, (n.shape, want)
            else:
                assert tuple(np.broadcast_shapes(a.shape, n.shape)) == n.shape and a.flags & REDUCE
            stack.append(a)
            continue
        assert n.op in OPS, n.op
        assert len(n.args) == OPS[n.op].arity, (n.op, len(n.args))
        for a in n.args:
            assert a.op == "scalar" or a.shape == n.shape, (n.op, a.shape, n.shape)
            assert a.op == "scalar" or not a.device or a.device == n.device, (a.device, n.device)
        stack.extend(n.args)


class PlanLeaf(Node):
    """A leaf only plans make (never the frontend): memory the plan binds at run time.

    ``op == "temp"``: plan temporary ``index``; ``op == "derived"``: the group's leaf ``index``.
    Either is seen with ``estrides`` (element strides) over ``shape`` - a C-contiguous temporary,
    or a broadcast made while planning a reduction. Keys are those of a buffer of the same dtype,
    rank and layout class: kernels are shared with real buffers."""

    __slots__ = ("estrides", "index", "layout")

    index: int
    estrides: tuple[int, ...]
    layout: str


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    out = []
    size = 1
    for s in reversed(shape):
        out.append(size)
        size *= s
    return tuple(reversed(out))


def make_plan_leaf(op: str, index: int, dtype: np.dtype, shape: tuple[int, ...], device: str,
                   estrides: tuple[int, ...] | None = None) -> PlanLeaf:  # fmt: skip
    """A ``temp`` or ``derived`` leaf (see :class:`PlanLeaf`); C-contiguous unless ``estrides``."""
    if estrides is None:
        estrides = c_strides(shape)
    lay, key = view_layout(shape, estrides, dtype)
    n = _new_leaf(PlanLeaf, op, dtype, shape, key, device)
    n.index, n.estrides, n.layout = index, estrides, lay
    return n


# The C accelerator's make_op: the same nodes (it writes these classes' slots), built in one call
# (~0.3 us instead of ~1.2). make_op_py stays the definition; tests compare the two.
make_op_py = make_op
make_gemm_sum_py = make_gemm_sum
NATIVE_SETUP = {
    "Node": Node,
    "Scalar": Scalar,
    "Buffer": Buffer,
    "ViewLeaf": ViewLeaf,
    "KEYS": _KEYS,
    "BUFFER_KEYS": _BUFFER_KEYS,
    "intern_key": intern_key,
    "merge_leaves": merge_leaves,
    "verify": verify,
    "make_op": make_op_py,
    "globals": globals(),
    "uids": _uids,
    "FLOAT_DT": _FLOAT_DT,
    "FLOAT_KEY": _FLOAT_KEY,
    "FLAG_BITS": FLAG_BITS,
    "ONE_LEVEL": ONE_LEVEL,
    "REDUCE": REDUCE,
    "EXPAND": EXPAND,
    "GEMM": GEMM,
    "SHORT": dtypes.SHORT,
}  # fmt: skip  (what the C module uses: the IR's classes, key table and Python definitions)
if NATIVE is not None:
    try:
        NATIVE.setup_nodes(NATIVE_SETUP)
    except (TypeError, KeyError, AttributeError) as e:  # a stale build (the classes' slots changed)
        import warnings

        warnings.warn(f"fusetree._native does not fit this fusetree ({e}); using the Python front end "
                      "(rebuild it: pip install -e . or python setup.py build_ext --inplace)", stacklevel=1)  # fmt: skip
        NATIVE = None
    else:
        make_op = NATIVE.make_op
        make_gemm_sum = NATIVE.make_gemm_sum
