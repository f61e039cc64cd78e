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


class Node:
    """An immutable IR node. Build with the ``make_*`` functions, never directly."""

    __slots__ = (
        "__weakref__",
        "_memo",
        "args",
        "attrs",
        "data",
        "device",
        "dtype",
        "key",
        "layout",
        "leaves",
        "op",
        "shape",
        "uid",
        "weak",
    )  # fmt: skip

    op: str
    dtype: np.dtype
    shape: tuple[int, ...]
    args: tuple[Node, ...]
    attrs: tuple
    key: int
    leaves: tuple[Node, ...]
    uid: int
    device: str
    data: Any
    weak: type | None
    layout: str
    _memo: Any

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("fusetree IR nodes are immutable")

    def _init(self, **fields: object) -> None:
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    @property
    def is_leaf(self) -> bool:
        return self.op in LEAF_OPS

    @property
    def desc(self) -> dtypes.Desc:
        """The operand descriptor used by dtype rules: the dtype, or the Python type if weak."""
        return self.weak if self.weak is not None else self.dtype

    @property
    def memo(self) -> Any:
        """A boundary node's computed value (a GEMM result), or None. A cache, not state."""
        return self._memo

    def set_memo(self, value: object) -> None:
        object.__setattr__(self, "_memo", value)

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.dtype}, {self.shape}, key={self.key})"


def _new(**fields: object) -> Node:
    n = object.__new__(Node)
    base: dict[str, object] = {
        "uid": next(_uids),
        "_memo": None,
        "weak": None,
        "layout": "",
        "data": None,
        "attrs": (),
        "args": (),
    }
    base.update(fields)
    n._init(**base)
    return n


def make_buffer(data: Any, device: str) -> Node:
    """A leaf reading ``data`` (an array view) through its strides."""
    dt = np.dtype(data.dtype)
    shape = tuple(int(s) for s in data.shape)
    lay = layout_class(shape, tuple(int(s) for s in data.strides), dt.itemsize)
    key = intern_key(("buffer", dtypes.SHORT[dt], len(shape), lay))
    n = _new(op="buffer", dtype=dt, shape=shape, key=key, device=device, data=data, layout=lay)
    n._init(leaves=(n,))
    return n


def make_scalar(value: Any) -> Node:
    """A leaf for a scalar. Python scalars are weak (NEP 50); NumPy scalars keep their dtype."""
    weak: type | None
    if isinstance(value, bool | np.bool_) and not isinstance(value, np.generic):
        weak, dt = bool, dtypes.weak_default(bool)
    elif isinstance(value, np.generic):
        weak, dt = None, dtypes.check(value.dtype, "scalar")
        value = value.item() if dt.kind != "f" else float(value)
    elif isinstance(value, int):
        weak, dt = int, dtypes.weak_default(int)
        if not (-(2**63) <= value < 2**63):
            raise OverflowError(
                f"Python integer {value} does not fit in int64 (fusetree passes Python ints as int64)"
            )
    else:
        weak, dt = float, dtypes.weak_default(float)
        value = float(value)
    key = intern_key(("scalar", weak.__name__ if weak else dtypes.SHORT[dt]))
    n = _new(op="scalar", dtype=dt, shape=(), key=key, device="", data=value, weak=weak)
    n._init(leaves=(n,))
    return n


def make_matmul(a: Node, b: Node, shape: tuple[int, ...], dtype: np.dtype, acc: bool = False) -> Node:
    """A pending GEMM; to elementwise consumers it is a C-contiguous leaf computed first.

    With ``acc``, ``a`` and ``b`` are two pending GEMMs whose sum this node is: the second one
    accumulates into the first one's output (beta = 1).
    """
    key = intern_key(("matmul", dtypes.SHORT[dtype], len(shape)))
    args = (a.args + b.args) if acc else (a, b)
    n = _new(op="matmul", dtype=dtype, shape=shape, key=key, device=a.device, args=args, layout="C")
    n._init(leaves=(n,))
    return n


def merge_leaves(args: tuple[Node, ...]) -> tuple[tuple[Node, ...], tuple | None]:
    """Distinct leaves of ``args`` in order, and the sharing map (None when no leaf is shared)."""
    if len(args) == 1:
        return args[0].leaves, None
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
    key = intern_key((op, dtypes.SHORT[dtype], attrs, tuple(a.key for a in args), sharing))
    return _new(op=op, dtype=dtype, shape=shape, args=args, attrs=attrs, key=key,
                leaves=leaves, device=device)  # fmt: skip


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
        assert n.op in OPS, n.op
        assert len(n.args) == OPS[n.op].arity, (n.op, len(n.args))
        for a in n.args:
            assert a.op == "scalar" or a.shape == n.shape, (n.op, a.shape, n.shape)
            assert a.op == "scalar" or a.device == n.device, (a.device, n.device)
        assert set(map(id, n.leaves)) == {id(x) for a in n.args for x in a.leaves}
        stack.extend(n.args)
