"""The IR: immutable nodes with a structural key computed once, at construction.

A :class:`Node` is an elementwise op over children of exactly its own shape (broadcasts and views are
pushed down to the leaves when a node is built, see :mod:`fusetree.lazy`), or a leaf:

* ``buffer``: an array view (NumPy or CuPy) read through its strides;
* ``scalar``: a Python or NumPy scalar, passed to the kernel as an argument;
* ``matmul``: a GEMM result, a fusion boundary computed before the kernel that reads it.

``node.key`` is a small int interned from ``(op, dtype, attrs, child keys, leaf sharing)``. It never
contains sizes, strides or scalar values, so two trees with the same key compute the same function of
their leaf lists and share one compiled kernel. ``node.leaves`` lists the distinct leaves in a fixed
order: the kernel's inputs.
"""

from __future__ import annotations

import itertools
import operator
import threading
from typing import Any

import numpy as np

from . import dtypes

LEAF_OPS = frozenset(("buffer", "scalar", "matmul"))

_KEYS: dict[tuple, int] = {}
KEY_DESCRIPTIONS: list[tuple] = []  # int key -> the tuple it was interned from
_key_lock = threading.Lock()
_uids = itertools.count()


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


def layout_class(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    """'C' contiguous; 'I' inner dimension contiguous; 'R' inner dimension broadcast (stride 0);
    'S' any other strides."""
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
    return "S"


_FIELDS = (
    "op",
    "dtype",
    "shape",
    "args",
    "attrs",
    "key",
    "leaves",
    "uid",
    "device",
    "data",
    "weak",
    "layout",
    "_box",
)


class Node(tuple):
    """An immutable IR node (a tuple: fields cannot be reassigned). Build with ``make_*``.

    Equality and hashing are by identity: structural equality is ``key``'s job, and a deep
    ``__eq__`` must never run on the hot path.
    """

    __slots__ = ()

    op: str
    dtype: np.dtype
    shape: tuple[int, ...]
    args: tuple[Node, ...]
    attrs: tuple
    key: int
    uid: int
    device: str
    data: Any
    weak: type | None
    layout: str

    __eq__ = object.__eq__  # type: ignore[assignment]
    __ne__ = object.__ne__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    @property
    def leaves(self) -> tuple[Node, ...]:  # type: ignore[override]
        """Distinct leaves in kernel-argument order; ``(self,)`` for a leaf."""
        lv = self[6]
        return (self,) if lv is None else lv

    @property
    def is_leaf(self) -> bool:
        return self[0] in LEAF_OPS

    @property
    def desc(self) -> dtypes.Desc:
        """The operand descriptor used by dtype rules: the dtype, or the Python type if weak."""
        return self[10] if self[10] is not None else self[1]

    @property
    def memo(self) -> Any:
        """A cache, not state: a GEMM node's result, or a buffer leaf's kernel arguments (or None)."""
        return self[12][0]

    def set_memo(self, value: object) -> None:
        self[12][0] = value

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.dtype}, {self.shape}, key={self.key})"


for _i, _f in enumerate(_FIELDS[:-1]):
    if _f != "leaves":
        setattr(Node, _f, property(operator.itemgetter(_i)))
_tnew = tuple.__new__


def make_buffer(data: Any, device: str) -> Node:
    """A leaf reading ``data`` (an array view) through its strides."""
    dt = data.dtype
    shape = data.shape
    lay = layout_class(shape, data.strides, dt.itemsize)
    key = intern_key(("buffer", dtypes.SHORT[dt], len(shape), lay))
    return _leaf("buffer", dt, shape, (), key, device, data, None, lay)


def make_scalar(value: Any) -> Node:
    """A leaf for a scalar. Python scalars are weak (NEP 50); NumPy scalars keep their dtype."""
    weak: type | None
    t = type(value)
    if t is bool:
        weak, dt = bool, _WEAK_DT[bool]
    elif t is int:
        weak, dt = int, _WEAK_DT[int]
        if not (-(2**63) <= value < 2**63):
            raise OverflowError(
                f"Python integer {value} does not fit in int64 (fusetree passes Python ints as int64)"
            )
    elif t is float:
        weak, dt = float, _WEAK_DT[float]
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
        key = _SCALAR_KEYS[(weak, dt)] = intern_key(("scalar", weak.__name__ if weak else dtypes.SHORT[dt]))
    return _leaf("scalar", dt, (), (), key, "", value, weak, "")


_WEAK_DT = {t: dtypes.weak_default(t) for t in (bool, int, float)}
_SCALAR_KEYS: dict = {}


def _leaf(op, dt, shape, args, key, device, data, weak, layout):  # type: ignore[no-untyped-def]
    # a leaf's ``leaves`` is (itself,): stored as None, see Node.leaves
    # box: [cached kernel arguments or GEMM result, cached views of this buffer]
    return _tnew(
        Node, (op, dt, shape, args, (), key, None, next(_uids), device, data, weak, layout, [None, None])
    )


def make_matmul(a: Node, b: Node, shape: tuple[int, ...], dtype: np.dtype, acc: bool = False) -> Node:
    """A pending GEMM; to elementwise consumers it is a C-contiguous leaf computed first.

    With ``acc``, ``a`` and ``b`` are two pending GEMMs whose sum this node is: the second one
    accumulates into the first one's output (beta = 1).
    """
    key = intern_key(("matmul", dtypes.SHORT[dtype], len(shape)))
    args = (a.args + b.args) if acc else (a, b)
    return _leaf("matmul", dtype, shape, args, key, a.device, None, None, "C")


def merge_leaves(args: tuple[Node, ...]) -> tuple[tuple[Node, ...], tuple | None]:
    """Distinct leaves of ``args`` in order, and the sharing map (None when no leaf is shared)."""
    if len(args) == 1:
        return args[0].leaves, None
    if len(args) == 2:
        la, lb = args[0].leaves, args[1].leaves
        if len(la) + len(lb) <= 16:
            ids = [id(x) for x in la]
            if not any(id(y) in ids for y in lb):
                return la + lb, None
        elif not {id(x) for x in la}.intersection(map(id, lb)):
            return la + lb, None
    total = sum(len(a.leaves) for a in args)
    index: dict[int, int] = {}
    leaves: list[Node] = []
    maps = []
    for a in args:
        m = []
        for leaf in a.leaves:
            j = index.get(id(leaf))
            if j is None:
                j = index[id(leaf)] = len(leaves)
                leaves.append(leaf)
            m.append(j)
        maps.append(tuple(m))
    if len(leaves) == total:
        return tuple(leaves), None
    return tuple(leaves), tuple(maps)


def make_op(op: str, args: tuple[Node, ...], dtype: np.dtype, shape: tuple[int, ...],
            device: str, attrs: tuple = ()) -> Node:  # fmt: skip
    """An elementwise node. Non-scalar children must already have exactly ``shape``."""
    leaves, sharing = merge_leaves(args)
    key = intern_key((op, dtypes.SHORT[dtype], attrs, tuple([a[5] for a in args]), sharing))
    return _tnew(
        Node, (op, dtype, shape, args, attrs, key, leaves, next(_uids), device, None, None, "", [None])
    )


_HAS_REDUCE: dict[int, bool] = {}


def has_reduce(node: Node) -> bool:
    """Whether a reduction is inside ``node``'s tree (memoized per structural key)."""
    k = node[5]
    v = _HAS_REDUCE.get(k)
    if v is not None:
        return v
    stack = [k]
    while stack:
        q = stack[-1]
        if q in _HAS_REDUCE:
            stack.pop()
            continue
        t = KEY_DESCRIPTIONS[q]
        if t[0] in LEAF_OPS:
            _HAS_REDUCE[q] = False
            stack.pop()
            continue
        if t[0] == "reduce":
            _HAS_REDUCE[q] = True
            stack.pop()
            continue
        todo = [c for c in t[3] if c not in _HAS_REDUCE]
        if todo:
            stack.extend(todo)
            continue
        _HAS_REDUCE[q] = any(_HAS_REDUCE[c] for c in t[3])
        stack.pop()
    return _HAS_REDUCE[k]


def verify(node: Node) -> None:
    """IR verifier (used by tests): shapes, devices and leaf lists are consistent."""
    from .ops import OPS

    stack = [node]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ("buffer", "scalar"):
            assert n.leaves == (n,)
            continue
        if n.op == "matmul":
            continue
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
                assert tuple(np.broadcast_shapes(a.shape, n.shape)) == n.shape and has_reduce(a)
            assert n.leaves == a.leaves
            stack.append(a)
            continue
        assert n.op in OPS, n.op
        assert len(n.args) == OPS[n.op].arity, (n.op, len(n.args))
        for a in n.args:
            assert a.op == "scalar" or a.shape == n.shape, (n.op, a.shape, n.shape)
            assert a.op == "scalar" or a.device == n.device, (a.device, n.device)
        assert set(map(id, n.leaves)) == {id(x) for a in n.args for x in a.leaves}
        stack.extend(n.args)
