"""The lazy array: NumPy-named operators and methods that build IR nodes instead of computing.

Nothing here imports numba or cupy. Broadcasting and basic-indexing views are pushed down to the
leaves when a node is built, so every node of an elementwise tree has the shape of its consumer and
every leaf is a zero-copy strided view; a kernel reads its inputs through strides. Realization
(values, stores, GEMM operands) goes through :mod:`fusetree.engine`.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import backends, config, engine
from ..errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from ..ir import dtypes
from ..ir import node as _nm
from ..ir.node import (
    EXPAND,
    REDUCE,
    Buffer,
    Node,
    make_buffer,
    make_gemm_sum,
    make_matmul,
    make_op,
    make_scalar,
)
from ..ir.ops import (
    BINARY_OPERATORS,
    COMPARISONS,
    INPLACE_OPERATORS,
    OPS,
    RULES1,
    RULES2,
    UNARY_OPERATORS,
    rule,
)
from . import unfused
from . import views as _views
from .views import cached_view, compose, index_shape, resolve_shape, view_index, view_key, view_of

_ref = weakref.ref
_next_uid = _nm.next_uid
_PENDING = engine.PENDING
_drop = engine.drop
_new = object.__new__
_EXACT_INT = 2**53  # the Python ints the operators' fast path takes
_EXPANDS = REDUCE | EXPAND  # a value broadcast to a larger shape through an ``expand`` node
_WEAK = (builtins.float, builtins.int, builtins.bool, builtins.complex)
_WEAK_OR_NUMPY_SCALAR = (*_WEAK, np.generic)


class Tape(list):
    """A gradient trace (frontend.autodiff): entries (op, operand nodes, attrs, result node)
    appended by the operators, views, reductions and GEMMs, and what partial stores must check:
    the nodes some entry produced, read whole, or read through index views (with the keys)."""

    def __init__(self, wrt: set[int]) -> None:
        super().__init__()
        self.produced: set[int] = set(wrt)  # differentiated inputs count as produced
        self.whole: set[int] = set()
        self.parts: dict[int, list] = {}  # node uid -> [(index key, its axis ranges or None)]


TAPE: Tape | None = None


@contextlib.contextmanager
def untraced() -> Iterator[Tape | None]:
    """Suspend the gradient trace (yields it): the operations inside are one step of the caller's,
    which records a single entry for them afterwards (a partial store, ``concat``)."""
    global TAPE
    tape, TAPE = TAPE, None
    try:
        yield tape
    finally:
        TAPE = tape


def record(op: str, inputs: tuple, attrs: tuple, out: Node) -> None:
    """Append one step to the gradient trace (callers check ``TAPE is not None`` first)."""
    t = TAPE
    t.append((op, inputs, attrs, out))  # type: ignore[union-attr]
    t.produced.add(out.uid)  # type: ignore[union-attr]
    if op == "getitem" and inputs[0].op == "buffer":
        x = inputs[0]
        t.parts.setdefault(x.uid, []).append((attrs[0], _axis_ranges(x.shape, attrs[0])))  # type: ignore[union-attr]
    else:
        for x in inputs:
            t.whole.add(x.uid)  # type: ignore[union-attr]


class Array:
    """A fusetree array: a lazy expression, or a realized buffer (NumPy or CuPy memory).

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.arange(4, dtype=np.float32))
    >>> y = ft.exp(x) * 2 + 1          # builds a tree; nothing runs yet
    >>> np.allclose(np.asarray(y), np.exp(np.arange(4)) * 2 + 1)
    True
    """

    __slots__ = ("__weakref__", "_base", "_node", "_pmark", "_pref", "_views")
    __array_priority__ = 100.0
    __hash__ = None  # type: ignore[assignment]  # == is elementwise, as in NumPy

    # A view of a *pending* array is itself a lazy expression, but NumPy's semantics make it an
    # alias: ``_base`` is (weakref to the viewed array, the view as a function of its memory), and
    # the viewed array lists its live views in ``_views``. When the viewed array gets memory, its
    # views become real views of it (see engine.realize).
    _base: tuple[Any, Callable[[Any], Any]] | None
    _views: list[Any] | None
    _node: Node
    _pref: Any  # the weak reference registered in engine.PENDING while pending
    _pmark: int  # when it was registered (ir.node.next_uid): marks grow in PENDING's order

    def __init__(self, node: Node) -> None:
        self._node = node
        self._base = None
        self._views = None
        self._pref = None
        if node.leaves or node.op == "matmul":
            r = self._pref = _ref(self, _drop)
            self._pmark = _next_uid()
            _PENDING[id(r)] = r

    # -- attributes ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> np.dtype:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._node.shape:
            n *= s
        return n

    @property
    def device(self) -> str:
        return self._node.device or "cpu"  # a value made of scalars only is computed on the host

    @property
    def T(self) -> Array:
        return self.transpose()

    @property
    def is_realized(self) -> bool:
        """True when the array is backed by memory (no pending computation)."""
        return self._node.op == "buffer"

    @property
    def data(self) -> Any:
        """The backing NumPy/CuPy array (realizes the value first)."""
        engine.realize((self,))
        return self._node.data  # type: ignore[attr-defined]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d fusetree array")
        return self.shape[0]

    def __iter__(self) -> Iterator[Array]:
        for i in range(len(self)):
            yield self[i]

    # -- realization -----------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Realize and return the value as a NumPy array (copied from the device if needed)."""
        engine.check_readable()
        engine.realize((self,))
        return backends.get(self.device).to_numpy(self._node.data)  # type: ignore[attr-defined]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        return np.array(a, copy=True) if copy else a

    def item(self) -> Any:
        return self.numpy().item()

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __bool__(self) -> bool:
        return bool(self.numpy())

    def __complex__(self) -> complex:
        return complex(self.numpy())

    def __index__(self) -> int:
        return self.numpy().__index__()

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="ft.Array(")
        return f"ft.Array({body}, dtype={self.dtype}, device='{self.device}')"

    __str__ = __repr__

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.device != "cuda":
            raise AttributeError("__cuda_array_interface__ is only defined for device='cuda'")
        return self.data.__cuda_array_interface__

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:  # fmt: skip
        kw = {k: v for k, v in (("stream", stream), ("max_version", max_version), ("dl_device", dl_device),
                                ("copy", copy)) if v is not None}  # fmt: skip
        return self.data.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.data.__dlpack_device__()

    # -- NumPy interop ---------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = {"divide": "true_divide", "abs": "absolute"}.get(ufunc.__name__, ufunc.__name__)
        if method == "__call__" and not kwargs and name in OPS and OPS[name].arity == len(inputs):
            return elementwise(name, *inputs)
        if method == "__call__" and not kwargs and name == "matmul" and len(inputs) == 2:
            return matmul(*inputs)  # ``numpy_array @ fusetree_array``: a fusetree GEMM
        if TAPE is not None:
            raise UnsupportedError(
                f"NumPy's {name}.{method} on a fusetree array inside a function being differentiated: "
                "it would compute in NumPy, outside the gradient trace; use fusetree's functions"
            )
        arrays = [np.asarray(x) if isinstance(x, Array) else x for x in inputs]
        return getattr(ufunc, method)(*arrays, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """NumPy functions on fusetree arrays run fusetree's function of the same name (lazy where
        it can be: ``np.sum(a)``, ``np.where(c, a, b)``, ``np.concatenate([a, b])``); others raise
        UnsupportedError naming the function instead of converting silently."""
        import fusetree

        name = func.__name__
        fn = getattr(fusetree, name, None) if not name.startswith("_") else None
        if fn is None or not callable(fn):
            raise UnsupportedError(
                f"numpy.{name} is not supported on fusetree arrays (fusetree has no {name}); "
                "convert explicitly with np.asarray(x) or x.numpy()"
            )
        return fn(*args, **kwargs)

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        """The Array API namespace of fusetree arrays: the ``fusetree`` module."""
        import fusetree

        if api_version not in (None, "2023.12", "2022.12", "2021.12"):
            raise ValueError(f"fusetree implements the Array API 2023.12, not {api_version!r}")
        return fusetree

    def to_device(self, device: str, /, *, stream: Any = None) -> Array:
        """This array on ``device`` (a copy when it differs)."""
        if device == self.device:
            return self
        return wrap(make_buffer(backends.get(device).asarray(self.numpy()), device))

    @property
    def mT(self) -> Array:
        """The transpose of the last two axes."""
        if self.ndim < 2:
            raise ShapeError(f"mT needs at least 2 dimensions, got shape {self.shape}")
        axes = list(range(self.ndim))
        axes[-2], axes[-1] = axes[-1], axes[-2]
        return self.transpose(axes)

    # -- views -----------------------------------------------------------------------------
    def _boundary(self) -> None:
        """A view cannot be pushed below a GEMM or a reduction at this value's root: give this
        array memory first, so that the view is of it (NumPy's aliasing)."""
        op = self._node.op
        if op == "matmul" or op == "reduce" or op == "expand":
            engine.realize((self,))

    def __getitem__(self, key: Any) -> Array:
        n = self._node
        vk = view_key(key)  # (NumPy integer slice bounds hash as the ints _int_slices makes them)
        if vk is not None and n.op == "add" and TAPE is None and engine.fold_sliced_sum(self):
            n = self._node  # x@W + h@U + b in memory first (Backend.fold_sliced_sums)
        if vk is not None:  # ints, slices and None only: a basic index, its pieces memoized
            if n.op == "buffer" and TAPE is None:
                v = cached_view(n, vk)  # type: ignore[arg-type]
                if v is not None:  # a basic index of memory taken before (a bias's gate slice every step)
                    return Array(v)
            basic = _BASIC_INDEX.get(vk)
            if basic is None:
                k = _int_slices(key)
                if len(_BASIC_INDEX) > 4096:
                    _BASIC_INDEX.clear()
                basic = _BASIC_INDEX[vk] = (k, _Indexer(view_index(k)))
            key, fn = basic
        else:
            key = _int_slices(key)
            if _advanced(key):  # integer-array or boolean-mask indexing: a fusion boundary (a copy)
                engine.realize((self,))
                be = backends.get(self.device)
                bkey = _backend_key(key, be)
                out = wrap(make_buffer(be.xp.asarray(self._node.data[bkey]), self.device))  # type: ignore[attr-defined]
                if TAPE is not None:
                    record("gather", (self._node,), (bkey,), out._node)
                return out
            fn = _Indexer(view_index(key))
        op = n.op
        if op == "matmul" or op == "reduce" or op == "expand":
            self._boundary()
        src_shape = self._node.shape
        shape = _INDEX_SHAPES.get((vk, src_shape)) if vk is not None else None
        if shape is None:
            shape = index_shape(key, src_shape)  # (raises for a bad index)
            if vk is not None:
                if len(_INDEX_SHAPES) > 4096:
                    _INDEX_SHAPES.clear()
                _INDEX_SHAPES[(vk, src_shape)] = shape
        out = self._derive(view_of(self._node, fn, shape, vk), fn)
        if TAPE is not None:
            record("getitem", (self._node,), (fn.index,), out._node)
        return out

    def transpose(self, *axes: Any) -> Array:
        self._boundary()
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], Sequence)):
            axes = tuple(axes[0]) if axes[0] is not None else ()
        ax: tuple[int, ...] | None = tuple(int(a) for a in axes) if axes else None
        try:
            shape = np.empty(self.shape, np.int8).transpose(ax).shape if self.shape else ()
        except (ValueError, np.exceptions.AxisError) as e:
            raise ShapeError(f"transpose: axes {axes} do not fit shape {self.shape}: {e}") from None

        def fn(d: Any) -> Any:
            return d.transpose(ax)

        out = self._derive(view_of(self._node, fn, shape, ("T", ax)), fn)
        if TAPE is not None:
            record("transpose", (self._node,), (ax,), out._node)
        return out

    def reshape(self, *shape: Any) -> Array:
        if len(shape) == 1 and isinstance(shape[0], Sequence | np.ndarray):
            shape = tuple(shape[0])
        new = resolve_shape(tuple(int(s) for s in shape), self.shape)
        self._boundary()
        be = backends.get(self.device)

        def fn(d: Any) -> Any:
            v = be.reshape_view(d, new)
            return v if v is not None else be.xp.reshape(be.xp.ascontiguousarray(d), new)

        out = self._derive(view_of(self._node, fn, new, None), fn)
        if TAPE is not None:
            record("reshape", (self._node,), (), out._node)
        return out

    def _derive(self, node: Node, fn: Callable[[Any], Any]) -> Array:
        """The Array of a view ``node`` of this array (``fn`` maps this array's memory to it)."""
        if self._node.op != "buffer" and node.op == "buffer":
            # the view could not be pushed below this value (a GEMM or a reduction at its root):
            # this array gets memory and the view is of it, as in NumPy
            engine.realize((self,))
            node = make_buffer(fn(self._node.data), self._node.device)  # type: ignore[attr-defined]
        v = wrap(node)
        if self._node.op != "buffer" and node.op != "buffer":
            src: Array = self
            base = self._base
            if base is not None and base[0]() is not None:  # a view of a view: of the same array
                src, fn = base[0](), compose(fn, base[1])
            v._base = (_ref(src), fn)
            views = src._views
            if views is None:
                views = src._views = []
            elif len(views) > 32:
                views[:] = [r for r in views if r() is not None]
            views.append(_ref(v))
        return v

    def astype(self, dtype: Any) -> Array:
        dt = dtypes.check(dtype, "astype")
        if dt == self.dtype:
            return self
        return elementwise("astype", self, attrs=(dt,))

    # -- in-place writes -------------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        refs = sys.getrefcount(value)  # first, as _RefProbe measures it: no local holds it yet
        if key is Ellipsis and type(value) is Array and TAPE is None and engine.deferring():
            # x[...] = expr of x's shape, stores deferred (an optimizer's statements): queued with
            # none of the general checks below (no index, no broadcast, no complex dtype)
            n, vn = self._node, value._node
            if vn.shape == n.shape and n.dtype.kind != "c" and vn.dtype.kind != "c" and \
                    engine.defer(self, value, _prepare):  # fmt: skip
                return
        key = _int_slices(key)
        if TAPE is not None:
            self._traced_store(key, value)
            return
        if (key is not Ellipsis and _advanced(key)) or self._node.dtype.kind == "c" or _complex_value(value):
            # integer-array or boolean-mask stores, and complex ones (frontend.unfused): the backend's
            engine.realize((self,))
            be = backends.get(self.device)
            data = self._node.data  # type: ignore[attr-defined]
            v = value.data if isinstance(value, Array) else value
            engine.write_barrier(be, data)
            data[_backend_key(key, be)] = v
            return
        index_shape(key, self.shape)
        if type(value) is Array and (key is Ellipsis or key == _ALL) and engine.deferring():
            # a whole-array store of a pending value: queued, written at the next flush
            vs = value._node.shape
            if (vs == self.shape or broadcast_shape("assignment", [vs, self.shape], False) == self.shape) and \
                    engine.defer(self, value, _prepare):  # fmt: skip
                return
        engine.realize((self,))
        target = self._node.data[view_index(key)]  # type: ignore[attr-defined]
        owner = value if isinstance(value, Array) and value._node.op != "buffer" else None
        # a temporary value (``x[...] = a * b``) need not survive the store; one the caller holds
        # (``y = a * b; x[...] = y``) does (CPython's reference count tells them apart)
        held = owner is not None and refs > _TEMPORARY_REFS
        vnode = as_node(value)
        tshape = tuple(target.shape)
        if vnode.op != "scalar" and vnode.shape != tshape:
            if broadcast_shape("assignment", [vnode.shape, tshape], False) != tshape:
                raise ShapeError(
                    f"could not broadcast input array from shape {vnode.shape} into shape {tshape}"
                )
        engine.assign(target, self.device, vnode, owner, _prepare, held)

    def _traced_store(self, key: Any, value: Any) -> None:
        """``self[...] = value`` while a gradient is traced: the array is rebound to the value (a
        functional update, so the values the backward pass reads are never overwritten). A
        partial store ``y[k] = v`` writes memory that nothing in the trace computed or has read
        (``y = ft.empty(...)`` filled slice by slice, an RNN's outputs): ``v``'s cotangent is
        ``y``'s, sliced."""
        if not (key is Ellipsis or key == _ALL):
            self._traced_partial_store(key, value)
            return
        vnode = as_node(value, self.device)
        if vnode.op != "scalar" and vnode.shape != self.shape and \
                broadcast_shape("assignment", [vnode.shape, self.shape], False) != self.shape:  # fmt: skip
            raise ShapeError(
                f"could not broadcast input array from shape {vnode.shape} into shape {self.shape}"
            )
        if vnode.op == "scalar":
            vnode = make_op("astype", (vnode,), self.dtype, (), self.device, (self.dtype,))
        new = _prepare(vnode, self.shape, self.dtype)
        if new is vnode:  # a new node, so the trace can tell the store from its value
            new = make_op("astype", (vnode,), self.dtype, self.shape, self.device, (self.dtype,))
        record("store", (vnode,), (), new)
        self._node = new
        self._base = None
        if self._pref is not None:  # registered again, last: a pending array's node is newer than its mark
            _PENDING.pop(id(self._pref), None)
        r = self._pref = _ref(self, _drop)
        self._pmark = _next_uid()
        _PENDING[id(r)] = r

    def _traced_partial_store(self, key: Any, value: Any) -> None:
        tape = TAPE
        assert tape is not None
        n = self._node
        vkey = view_index(key)
        why = ""
        if _advanced(key):
            why = "integer-array or boolean indexes"
        elif n.op != "buffer" or n.uid in tape.produced:
            why = "the array is computed in the function (or differentiated)"
        elif n.uid in tape.whole or _overlaps_any(n.shape, vkey, tape.parts.get(n.uid, ())):
            why = "the function read the elements it overwrites"
        if why:
            raise UnsupportedError(
                f"a partial store (x[{key!r}] = ...) inside a function being differentiated: {why}; "
                "store into a fresh array (ft.empty) that is read only after it is written, or build "
                "the value with ft.where / ft.concat"
            )
        vnode = as_node(value, self.device)
        with untraced():  # the store itself is not differentiated: one entry for it below
            self[key] = value
        tape.append(("setitem", (vnode,), (vkey,), n))
        tape.whole.add(vnode.uid)

    def _inplace(self, name: str, other: Any) -> Array:
        """``self <op>= other``: NumPy's ``ufunc(self, other, out=self, casting="same_kind")``.

        Writes into this array's memory (aliases and the wrapped NumPy/CuPy buffer see the
        result); a result dtype that cannot be cast to ``self.dtype`` with the same-kind rule
        raises DTypeError before anything is written.
        """
        if TAPE is None and not (
            engine.deferring() and (self._node.op == "buffer" or engine.queued_store(self) is not None)
        ):
            engine.realize((self,))  # first, so the value reads this array's memory as a buffer
        value = matmul(self, other) if name == "matmul" else elementwise(name, self, other)
        if not np.can_cast(value.dtype, self.dtype, casting="same_kind"):
            raise DTypeError(
                f"Cannot cast ufunc '{name}' output from dtype('{value.dtype}') to "
                f"dtype('{self.dtype}') with casting rule 'same_kind' (in-place {name} on a "
                f"{self.dtype} array)"
            )
        if (
            value.shape != self.shape
            and broadcast_shape(name, [value.shape, self.shape], False) != self.shape
        ):
            raise ShapeError(
                f"non-broadcastable output operand with shape {self.shape} doesn't match the "
                f"broadcast shape {value.shape} (in-place {name})"
            )
        self[...] = value
        return self

    # -- matmul ----------------------------------------------------------------------------
    def __matmul__(self, other: Any) -> Array:  # (the C accelerator's fast path in front: below)
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Array:
        return matmul(other, self)

    if TYPE_CHECKING:  # the operators are attached below, from the op table

        def __add__(self, other: Any) -> Array: ...
        def __radd__(self, other: Any) -> Array: ...
        def __sub__(self, other: Any) -> Array: ...
        def __rsub__(self, other: Any) -> Array: ...
        def __mul__(self, other: Any) -> Array: ...
        def __rmul__(self, other: Any) -> Array: ...
        def __truediv__(self, other: Any) -> Array: ...
        def __rtruediv__(self, other: Any) -> Array: ...
        def __floordiv__(self, other: Any) -> Array: ...
        def __rfloordiv__(self, other: Any) -> Array: ...
        def __mod__(self, other: Any) -> Array: ...
        def __rmod__(self, other: Any) -> Array: ...
        def __pow__(self, other: Any) -> Array: ...
        def __rpow__(self, other: Any) -> Array: ...
        def __and__(self, other: Any) -> Array: ...
        def __rand__(self, other: Any) -> Array: ...
        def __or__(self, other: Any) -> Array: ...
        def __ror__(self, other: Any) -> Array: ...
        def __xor__(self, other: Any) -> Array: ...
        def __rxor__(self, other: Any) -> Array: ...
        def __lshift__(self, other: Any) -> Array: ...
        def __rlshift__(self, other: Any) -> Array: ...
        def __rshift__(self, other: Any) -> Array: ...
        def __rrshift__(self, other: Any) -> Array: ...
        def __eq__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __lt__(self, other: Any) -> Array: ...
        def __le__(self, other: Any) -> Array: ...
        def __gt__(self, other: Any) -> Array: ...
        def __ge__(self, other: Any) -> Array: ...
        def __neg__(self) -> Array: ...
        def __abs__(self) -> Array: ...
        def __invert__(self) -> Array: ...
        def __iadd__(self, other: Any) -> Array: ...
        def __isub__(self, other: Any) -> Array: ...
        def __imul__(self, other: Any) -> Array: ...
        def __itruediv__(self, other: Any) -> Array: ...

    # reductions (sum, mean, max, ...) are attached by fusetree.frontend.reductions


class _RefProbe:
    """Measures the reference count a temporary value has inside ``__setitem__`` (the same call
    shape), so that ``Array.__setitem__`` can tell a temporary from a value the caller holds."""

    count = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        _RefProbe.count = sys.getrefcount(value)


_ALL = slice(None)


_INT_OR_NONE = (int, type(None))


def _overlaps_any(shape: tuple[int, ...], key: Any, parts: Sequence[tuple[Any, list[range] | None]]) -> bool:
    """Whether index view ``key`` of an array of ``shape`` shares an element with any of ``parts``
    (index keys read before, each with its :func:`_axis_ranges`, computed when it was read)."""
    if not parts:
        return False
    a = _axis_ranges(shape, key)
    a0 = a[0] if a else None
    mark = None
    for k, r in parts:
        if a is not None and r is not None:  # disjoint when some axis's index sets are
            if a0 is not None and not _ranges_meet(a0, r[0]):
                continue  # the common case: x[t] written, x[s] read for other steps s
            if builtins.all(_ranges_meet(x, y) for x, y in zip(a, r)):
                return True
            continue
        if mark is None:
            mark = np.zeros(shape, np.bool_)
            mark[key] = True
        if mark[k].any():
            return True
    return False


def _ranges_meet(x: range, y: range) -> bool:
    """Whether two index ranges share an index (interval arithmetic for unit steps)."""
    if not x or not y:
        return False
    if len(x) == 1:
        return x[0] in y  # O(1) for ranges
    if len(y) == 1:
        return y[0] in x
    if abs(x.step) == 1 and abs(y.step) == 1:
        (xl, xh), (yl, yh) = sorted((x[0], x[-1])), sorted((y[0], y[-1]))
        return max(xl, yl) <= min(xh, yh)
    return not set(x).isdisjoint(y)


def _axis_ranges(shape: tuple[int, ...], key: Any) -> list[range] | None:
    """The indices a basic key (ints, slices, one Ellipsis) selects on each axis, or None for other
    keys (new axes, arrays)."""
    items = key if isinstance(key, tuple) else (key,)
    n_ell = sum(1 for k in items if k is Ellipsis)
    if n_ell > 1:
        return None
    if n_ell:
        at = next(i for i, k in enumerate(items) if k is Ellipsis)
        fill = len(shape) - (len(items) - 1)
        if fill < 0:
            return None
        items = items[:at] + (_ALL,) * fill + items[at + 1 :]
    if len(items) > len(shape):
        return None
    out = []
    for n, k in zip(shape, items):
        if isinstance(k, slice):
            out.append(range(*k.indices(n)))
        elif isinstance(k, int | np.integer) and not isinstance(k, builtins.bool):
            i = int(k) % n if n else 0
            out.append(range(i, i + 1))
        else:
            return None
    out.extend(range(n) for n in shape[len(items) :])
    return out


_INDEX_SHAPES: dict[tuple, tuple[int, ...]] = {}  # (view_key, source shape) -> the indexed shape
_BASIC_INDEX: dict[tuple, tuple] = {}  # view_key -> (the key with int bounds, its _Indexer)


class _Indexer:
    """``d[index]`` as a function of an array ``d`` (a view's leaf function)."""

    __slots__ = ("index",)

    def __init__(self, index: Any) -> None:
        self.index = index

    def __call__(self, d: Any) -> Any:
        return d[self.index]


def _int_slices(key: Any) -> Any:
    """``key`` with slice bounds given as integer arrays or NumPy integers made Python ints."""
    t = type(key)
    if t is slice:
        if (
            type(key.start) in _INT_OR_NONE
            and type(key.stop) in _INT_OR_NONE
            and type(key.step) in _INT_OR_NONE
        ):
            return key
        return slice(*[None if b is None else operator.index(b) for b in (key.start, key.stop, key.step)])
    if t is tuple:
        for k in key:
            if type(k) is slice and not (
                type(k.start) in _INT_OR_NONE
                and type(k.stop) in _INT_OR_NONE
                and type(k.step) in _INT_OR_NONE
            ):
                return tuple(_int_slices(k) if type(k) is slice else k for k in key)
    return key


def _advanced(key: Any) -> bool:
    """Whether ``key`` holds an array or a list (NumPy's advanced indexing)."""
    for k in key if type(key) is tuple else (key,):
        t = type(k)
        if (
            t is Array
            or t is list
            or (hasattr(k, "shape") and hasattr(k, "dtype") and not isinstance(k, np.generic))
        ):
            return True
    return False


def _complex_value(v: Any) -> bool:
    t = type(v)
    if t is Array:
        return v._node.dtype.kind == "c"
    if t is float or t is int:
        return False
    return t is complex or (isinstance(v, _HAS_DTYPE) and v.dtype.kind == "c")


def _backend_key(key: Any, be: Any) -> Any:
    def conv(k: Any) -> Any:
        if isinstance(k, Array):
            return k.data
        if isinstance(k, list):
            return be.xp.asarray(np.asarray(k))
        return k

    return tuple(conv(k) for k in key) if type(key) is tuple else conv(key)


_RefProbe()[0] = object()
_TEMPORARY_REFS = _RefProbe.count
_HAS_DTYPE = (Array, np.ndarray, np.generic)


_TOO_DEEP = config.MAX_TREE_DEPTH << _nm.DEPTH_SHIFT


def wrap(node: Node) -> Array:
    """A new Array over ``node`` (registered as pending unless it is memory or a scalar)."""
    a = _new(Array)
    a._node = node
    a._base = None
    a._views = None
    if node.leaves or node.op == "matmul":
        r = a._pref = _ref(a, _drop)
        a._pmark = _next_uid()
        _PENDING[id(r)] = r
        if node.flags >= _TOO_DEEP:  # a long chain of pending ops (a loop that never reads): run it
            engine.realize((a,))
    else:
        a._pref = None
    return a


# ---------------------------------------------------------------------------------------------
# operators


def _binary(name: str, reflected: bool) -> Callable[[Array, Any], Array]:
    if reflected:

        def method(self: Array, other: Any) -> Array:
            if _nm.WATCH is not None:
                _watch(self, other)
            t = type(other)
            if t is float or (t is int and -_EXACT_INT <= other <= _EXACT_INT):
                # 1.0 - x, 2 * x: the memoized rule, no generic checks (ints with float arrays only:
                # see ops._int_fast)
                a = self._node
                r = RULES2.get((name, t, a.dtype))
                if r is not None and config.current.fuse and TAPE is None and a.op != "matmul":
                    return wrap(make_op(name, (make_scalar(other), a), r.out, a.shape, a.device))
            if t is float or t is int:
                return _build(name, (make_scalar(other), self._node))
            if not _is_operand(other):
                return NotImplemented  # type: ignore[return-value]
            return elementwise(name, other, self)

    else:

        def method(self: Array, other: Any) -> Array:
            if _nm.WATCH is not None:
                _watch(self, other)
            t = type(other)
            a = self._node
            if t is Array:
                b = other._node
                if a.op == "matmul" and b.op == "matmul" and name == "add" and TAPE is None:
                    # x@W + h@U: one pending GEMM sum (the generic path's fold, without its checks)
                    if a.dtype.kind == "f" and a.device == b.device and _foldable((a, b), a.dtype, a.shape):
                        return wrap(_gemm_sum(a, b, a.shape, a.dtype))
                    return _build(name, (a, b))
                # the fast path: same shape and device, a known dtype rule (no broadcast, no GEMM fold)
                if a.device == b.device:  # (a GEMM and a bias: x@W + b)
                    r = RULES2.get((name, a.dtype, b.dtype))
                    if r is not None and config.current.fuse and TAPE is None:
                        if a.shape == b.shape:
                            return wrap(make_op(name, (a, b), r.out, a.shape, a.device))
                        # a buffer broadcast to the other's shape before (c[0] * x, x + bias): its view
                        v = _seen_broadcast(b, a.shape)
                        if v is not None:
                            return wrap(make_op(name, (a, v), r.out, a.shape, a.device))
                        v = _seen_broadcast(a, b.shape)
                        if v is not None:
                            return wrap(make_op(name, (v, b), r.out, b.shape, a.device))
                        # a reduced value broadcast back (x - x.max(-1, keepdims=True)): its expand node
                        if b.flags & _EXPANDS and b.leaves and _BCAST.get((a.shape, b.shape)) == a.shape:
                            return wrap(make_op(name, (a, broadcast(b, a.shape)), r.out, a.shape, a.device))
                        if a.flags & _EXPANDS and a.leaves and _BCAST.get((a.shape, b.shape)) == b.shape:
                            return wrap(make_op(name, (broadcast(a, b.shape), b), r.out, b.shape, a.device))
                return _build(name, (a, b))
            if t is float or (t is int and -_EXACT_INT <= other <= _EXACT_INT):
                # x * 0.5, x / 64: the memoized rule (ints with float arrays only: see ops._int_fast)
                r = RULES2.get((name, a.dtype, t))
                if r is not None and config.current.fuse and TAPE is None:
                    return wrap(make_op(name, (a, make_scalar(other)), r.out, a.shape, a.device))
            if t is float or t is int:
                return _build(name, (a, make_scalar(other)))
            if not _is_operand(other):
                return NotImplemented  # type: ignore[return-value]
            return elementwise(name, self, other)

    method.__name__ = name
    return method


def _seen_broadcast(n: Node, shape: tuple[int, ...]) -> Node | None:
    """Buffer ``n``'s cached view broadcast to ``shape`` (made by :func:`broadcast` before), or None.

    Its existence proves ``n`` broadcasts to ``shape``, so ``shape`` is the op's result shape: the
    operator skips the generic broadcast path (0-d coefficients, biases reused every step)."""
    return cached_view(n, ("b", shape)) if n.op == "buffer" else None  # type: ignore[arg-type]


def _inplace_method(name: str) -> Callable[[Array, Any], Array]:
    def method(self: Array, other: Any) -> Array:
        if not _is_operand(other):
            return NotImplemented  # type: ignore[return-value]
        return self._inplace(name, other)

    method.__name__ = f"__i{name}__"
    return method


def _unary(name: str) -> Callable[[Array], Array]:
    def method(self: Array) -> Array:
        if _nm.WATCH is not None:
            _watch(self)
        return unary(name, self._node)

    method.__name__ = name
    return method


def unary_function(name: str) -> Callable[..., Array]:
    """``ft.<name>(x)`` for a one-operand op (``ft.tanh``): :func:`unary`'s fast path inline, one
    Python call per use instead of three; anything else goes through :func:`elementwise`."""

    def f(*args: Any) -> Array:
        if len(args) == 1:
            x = args[0]
            if type(x) is Array and _nm.WATCH is None:
                a = x._node
                r = RULES1.get((name, a.dtype))
                if r is not None and TAPE is None and a.op != "scalar" and config.current.fuse:
                    return wrap(make_op(name, (a,), r.out, a.shape, a.device))
            return elementwise(name, x)
        raise TypeError(f"{name}() takes 1 argument(s), got {len(args)}")

    f.__name__ = f.__qualname__ = name
    return _operator(name, 2, f, name)


def unary(name: str, a: Node) -> Array:
    """Op ``name`` of one array node: the memoized rule and the node (the generic path on a miss,
    while tracing gradients, or unfused)."""
    r = RULES1.get((name, a.dtype))
    if r is not None and TAPE is None and a.op != "scalar" and config.current.fuse:
        return wrap(make_op(name, (a,), r.out, a.shape, a.device))
    return _build(name, (a,))


# With the C accelerator (ir.node.NATIVE), each operator is a C callable running the fast path
# above (same shape and device, a memoized rule; a float or exact int scalar; with queued stores it
# calls the store watch on buffer operands first, as _watch does) and calling the Python operator
# for everything else; ``wrap`` is the C twin of the one above.
_NATIVE = _nm.NATIVE
if _NATIVE is not None:
    NATIVE_SETUP = {
        "Array": Array, "PENDING": _PENDING, "realize": lambda arrays: engine.realize(arrays),
        "globals": globals(), "config_globals": vars(config), "RULES1": RULES1, "RULES2": RULES2,
        "make_scalar": make_scalar, "TOO_DEEP": _TOO_DEEP, "EXACT_INT": _EXACT_INT,
        "BASIC_INDEX": _BASIC_INDEX, "INDEX_SHAPES": _INDEX_SHAPES, "ELEMENT_STRIDES": _views._ELEMENT_STRIDES,
        "GEOMETRY": _views._GEOMETRY, "views_globals": vars(_views), "compute_gemm": engine.compute_gemm,
    }  # fmt: skip
    try:
        _NATIVE.setup_arrays(NATIVE_SETUP)
    except (TypeError, KeyError, AttributeError) as e:  # a stale build: the Python operators run
        import warnings

        warnings.warn(f"fusetree._native does not fit this fusetree's Array ({e}); using the Python operators",
                      stacklevel=1)  # fmt: skip
        _NATIVE = None
    else:
        wrap = _NATIVE.wrap
        _drop = _NATIVE.drop  # engine.drop in C: the weak-reference callback of every pending array


def _operator(name: str, kind: int, method: Callable[..., Any], qualname: str) -> Callable[..., Any]:
    """``method`` behind the C fast path when the accelerator is built (kind 0 binary, 1 reflected,
    2 one operand, 3 matmul, 4 basic index, 5 ``x[...] = value`` queued as a deferred store), else
    ``method`` itself."""
    return method if _NATIVE is None else _NATIVE.operator(name, kind, method, qualname)


for _m, _name in BINARY_OPERATORS.items():
    setattr(Array, _m, _operator(_name, 0, _binary(_name, False), _m))
    if _m not in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
        _r = "__r" + _m[2:]
        setattr(Array, _r, _operator(_name, 1, _binary(_name, True), _r))
for _m, _name in INPLACE_OPERATORS.items():
    setattr(Array, _m, _inplace_method(_name))
for _m, _name in UNARY_OPERATORS.items():
    setattr(Array, _m, _operator(_name, 2, _unary(_name), _m))
Array.__matmul__ = _operator("matmul", 3, Array.__matmul__, "__matmul__")  # type: ignore[method-assign]
Array.__getitem__ = _operator("getitem", 4, Array.__getitem__, "__getitem__")  # type: ignore[method-assign]
Array.__setitem__ = _operator("setitem", 5, Array.__setitem__, "__setitem__")  # type: ignore[method-assign]
Array.__pos__ = lambda self: self  # type: ignore[attr-defined,operator]
_power = Array.__pow__


def _pow(self: Array, other: Any) -> Array:
    """``x ** 2`` is ``x * x`` for numbers, as NumPy's operator computes it (``np.square``): exact,
    and a multiply in the kernel instead of a ``pow`` call (``(x - m) ** 2`` in a variance)."""
    kind = self._node.dtype.kind
    square = type(other) in (int, float) and other == 2
    if square and (kind == "f" or (kind in "iu" and type(other) is int)):
        return self * self
    if square and kind == "b" and type(other) is int:  # np.square of booleans: int8
        return (self * self).astype(np.int8)
    return _power(self, other)


Array.__pow__ = _pow  # type: ignore[method-assign]


def _is_operand(x: Any) -> bool:
    return isinstance(x, Array | np.ndarray | np.generic | builtins.bool | int | float | complex) or (
        backends.device_of(x) is not None
    )


# ---------------------------------------------------------------------------------------------
# building nodes


def as_node(x: Any, device: str | None = None) -> Node:
    """The IR node for an operand: fusetree arrays, NumPy/CuPy arrays, Python and NumPy scalars."""
    if isinstance(x, Array):
        return x._node
    if isinstance(x, _WEAK) or isinstance(x, np.generic):
        if isinstance(x, np.generic):
            dtypes.check(x.dtype, "scalar operand")
        return make_scalar(x)
    return from_foreign(x)


def from_foreign(a: Any) -> Buffer:
    """A buffer leaf over a NumPy/CuPy/DLPack array (or anything ``np.asarray`` takes), no copy
    when the memory can be wrapped."""
    src = backends.device_of(a)
    if src is None:
        if isinstance(a, str | bytes) or a is None or isinstance(a, dict | set):
            raise UnsupportedError(f"asarray: cannot make a fusetree array from {type(a).__name__} {a!r:.60}")
        try:
            data = np.asarray(a)
        except Exception as e:
            raise UnsupportedError(f"asarray: cannot convert {type(a).__name__} to an array: {e}") from None
        src = "cpu"
    elif src == "cpu":
        data = np.asarray(a)
    else:
        data = backends.get(src).asarray(a)
    dtypes.check(data.dtype, "asarray")
    return make_buffer(data, src)


def elementwise(name: str, *operands: Any, attrs: tuple = ()) -> Array:
    """Build the node for op ``name`` (see fusetree.ir.ops.OPS) over ``operands``."""
    if _nm.WATCH is not None:
        _watch(*operands)
    if len(operands) == 1 and not attrs and type(operands[0]) is Array:
        return unary(name, operands[0]._node)
    return _build(name, tuple([x._node if type(x) is Array else as_node(x) for x in operands]), attrs)


def _watch(*operands: Any) -> None:
    """Deferred stores are queued (engine.stores): an operand reading a queued store's target
    memory flushes them first. Called *before* the operands' nodes are read: a flush turns the
    pending operands that read a target into memory (their old nodes would read the new data)."""
    for x in operands:
        t = type(x)
        if t is Array:
            n = x._node
            if n.op != "buffer":  # a pending value: the flush orders its reads (stores._readers)
                continue
        elif t is float or t is int or isinstance(x, _WEAK_OR_NUMPY_SCALAR) or backends.device_of(x) is None:
            continue
        else:
            n = from_foreign(x)
        watch = _nm.WATCH
        if watch is None:  # flushed by an earlier operand
            return
        watch(n)


_BCAST: dict[tuple, tuple] = {}


def broadcast_shape(name: str, shapes: list[tuple[int, ...]], raise_: bool = True) -> tuple[int, ...] | None:
    key = tuple(shapes)
    out = _BCAST.get(key)
    if out is None:
        try:
            out = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            if not raise_:
                return None
            pretty = " and ".join(str(s) for s in shapes)
            raise ShapeError(
                f"{name}: operands could not be broadcast together with shapes {pretty}"
            ) from None
        if len(_BCAST) > 4096:
            _BCAST.clear()
        _BCAST[key] = out
    return out


def _build(name: str, nodes: tuple[Node, ...], attrs: tuple = ()) -> Array:
    """The hot path of every operator: device and shape checks, the memoized dtype rule, the node."""
    if unfused.involves_complex(nodes, attrs):
        return _unfused(name, nodes, attrs)
    if TAPE is not None:
        out = _build_array(name, nodes, attrs)
        record(name, nodes, attrs, out._node)
        return out
    return _build_array(name, nodes, attrs)


def _unfused(name: str, nodes: tuple[Node, ...], attrs: tuple = ()) -> Array:
    """Op ``name`` run by the backend on realized operands (complex values: frontend.unfused)."""
    if engine.HOOK.recorder is not None:
        raise UnsupportedError(
            f"{name} of a complex value inside an ft.jit function: complex ops run in the backend, "
            "outside the recorded kernels; call it outside ft.jit"
        )
    device = ""
    for n in nodes:
        if n.op != "scalar" and n.device:
            if device and n.device != device:
                raise DeviceError(f"{name}: operands are on different devices ({device!r} and {n.device!r})")
            device = n.device
    device = device or "cpu"
    values: list[Any] = []
    for n in nodes:
        if n.op == "scalar":
            values.append(n.value if n.weak is not None else n.dtype.type(n.value))  # type: ignore[attr-defined]
        elif n.op == "buffer":
            values.append(n.data)  # type: ignore[attr-defined]
        else:
            a = wrap(n)
            engine.realize((a,))
            values.append(a._node.data)  # type: ignore[attr-defined]
    out = wrap(make_buffer(unfused.compute(backends.get(device), name, values, attrs), device))
    if TAPE is not None:  # no gradient rule: an error if a gradient must pass through it
        record("boundary", tuple(n for n in nodes if n.op != "scalar"), (name,), out._node)
    return out


def _build_array(name: str, nodes: tuple[Node, ...], attrs: tuple = ()) -> Array:
    device = ""  # a value made of scalars only has no device: it goes with any operand
    shape: tuple[int, ...] | None = None
    bcast = weak_int = False
    for n in nodes:
        if n.op == "scalar":
            if n.weak is int:  # type: ignore[attr-defined]
                weak_int = True
            continue
        d = n.device
        if d:
            if not device:
                device = d
            elif d != device:
                raise DeviceError(
                    f"{name}: operands are on different devices ({device!r} and {d!r}); "
                    "move them with ft.asarray(x, device=...) first"
                )
        if shape is None:
            shape = n.shape
        elif n.shape != shape:
            bcast = True
    out_shape: tuple[int, ...] = () if shape is None else shape
    if weak_int:
        nodes = _weak_ints(name, nodes)
    descs = tuple([n.weak or n.dtype if n.op == "scalar" else n.dtype for n in nodes])  # type: ignore[attr-defined]
    r = rule(name, descs, attrs)
    out_dt = r.out
    if bcast:
        out_shape = broadcast_shape(name, [m.shape for m in nodes if m.op != "scalar"])  # type: ignore[assignment]
        if name == "add" and nodes[0].op == "matmul" and _foldable(nodes, out_dt, out_shape):
            # x@W + h@U: the second GEMM accumulates into the first (beta = 1): one leaf
            return wrap(_gemm_sum(nodes[0], nodes[1], out_shape, out_dt))
        nodes = tuple(
            [n if n.op == "scalar" or n.shape == out_shape else broadcast(n, out_shape) for n in nodes]
        )
    elif name == "add" and nodes[0].op == "matmul" and _foldable(nodes, out_dt, out_shape):
        return wrap(_gemm_sum(nodes[0], nodes[1], out_shape, out_dt))
    out = wrap(make_op(name, nodes, out_dt, out_shape, device, attrs))
    if not config.current.fuse and device:
        engine.realize((out,))  # the unfused baseline: one kernel per op, launched eagerly
    return out


def _weak_ints(name: str, nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """NumPy 2 rules for Python ints: comparisons see an out-of-range int's true value; any other
    op refuses an int that does not fit the dtype it is computed in."""
    arrays = [m for m in nodes if m.op != "scalar"]
    if name in COMPARISONS:
        out = list(nodes)
        for k, n in enumerate(nodes):
            if n.op == "scalar" and n.weak is int and any(not dtypes.fits(n.value, m.dtype) for m in arrays):  # type: ignore[attr-defined]
                out[k] = make_scalar(np.int64(n.value))  # type: ignore[attr-defined]
        return tuple(out)
    descs = tuple([n.weak or n.dtype if n.op == "scalar" else n.dtype for n in nodes])  # type: ignore[attr-defined]
    r = rule(name, descs, ())
    for k, n in enumerate(nodes):
        if n.op == "scalar" and n.weak is int:  # type: ignore[attr-defined]
            dtypes.check_weak_int(n.value, r.operands[k], name)  # type: ignore[attr-defined]
    return nodes


def _foldable(nodes: tuple[Node, ...], dt: np.dtype, shape: tuple[int, ...]) -> bool:
    if len(nodes) != 2:
        return False
    a, b = nodes
    if a.op != "matmul" or b.op != "matmul" or a.memo is not None or b.memo is not None:
        return False
    if a.shape != shape or b.shape != shape or a.dtype != dt or b.dtype != dt:
        return False
    return bool(backends.get(a.device).gemm_accumulate)


def _gemm_sum(a: Node, b: Node, shape: tuple[int, ...], dt: np.dtype) -> Node:
    """The pending sum of two pending GEMM (sums): one GEMM node whose products accumulate into
    one output. A product that continues the previous one along the contraction axis (adjacent
    blocks of the same memory: ``h[t-1].T @ g[t]`` summed over the steps of a backward pass) is
    merged into it: one GEMM with a longer K (Backend.join_k)."""
    be = backends.get(a.device)
    args = list(a.args)
    bargs = b.args
    for i in range(0, len(bargs), 2):
        x, y = bargs[i], bargs[i + 1]
        p, q = args[-2], args[-1]
        pd, xd = p.data, x.data  # type: ignore[attr-defined]
        pp, xp = p.ptr, x.ptr  # type: ignore[attr-defined]
        if not be.adjacent_columns(pd, xd, pp, xp):  # (x@W + h@U of two arrays never joins)
            args += (x, y)
            continue
        joined = be.join_k(pd, q.data, xd, y.data, (pp, q.ptr, xp, y.ptr))  # type: ignore[attr-defined]
        if joined is None:
            args += (x, y)
        else:
            args[-2:] = [make_buffer(joined[0], a.device), make_buffer(joined[1], a.device)]
    return make_gemm_sum(tuple(args), shape, dt)


def _prepare(node: Node, shape: tuple[int, ...], dtype: np.dtype) -> Node:
    """A stored value broadcast and cast to its target."""
    if node.shape != shape:
        node = broadcast(node, shape)
    if node.dtype != dtype:
        node = make_op("astype", (node,), dtype, shape, node.device, (dtype,))
    return node


def broadcast(node: Node, shape: tuple[int, ...]) -> Node:
    """``node`` broadcast to ``shape``: a view pushed to the leaves, or an ``expand`` node when the
    tree holds a reduction (a view cannot pass through it)."""
    if node.flags & _EXPANDS and node.leaves:
        return make_op("expand", (node,), node.dtype, shape, node.device)
    xp = backends.xp_for(node.device)
    return view_of(node, lambda d: xp.broadcast_to(d, shape), shape, ("b", shape))


# ---------------------------------------------------------------------------------------------
# matmul (a fusion boundary)


def matmul(a: Any, b: Any) -> Array:
    """Matrix product with NumPy's ``@`` rules; a GEMM launched before the kernel that reads it.

    ``x @ W + h @ U`` costs two GEMMs (on CUDA the second accumulates into the first) plus the
    elementwise work, fused into the consumer kernel.
    """
    if type(a) is Array and type(b) is Array and TAPE is None and not engine.STORES:
        na, nb = a._node, b._node  # the common case: two 2-D arrays in memory, one float dtype
        if na.op == "buffer" and nb.op == "buffer":
            sa, sb = na.shape, nb.shape
            dt = na.dtype
            if (len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0] and nb.dtype == dt and dt.kind == "f"
                    and na.device == nb.device):  # fmt: skip
                return wrap(make_matmul(na, nb, (sa[0], sb[1]), dt))
    engine.realize(tuple(x for x in (a, b) if isinstance(x, Array)))  # operands: a fusion boundary
    na, nb = as_node(a), as_node(b)
    if na.op == "scalar" or nb.op == "scalar":
        raise ShapeError("matmul: operands must be arrays, not scalars")
    if na.device != nb.device:
        raise DeviceError(f"matmul: operands are on different devices ({na.device!r} and {nb.device!r})")
    sa, sb = na.shape, nb.shape
    if sa and sb and sa[-1] == (sb[-2] if len(sb) > 1 else sb[0]):
        batch = broadcast_shape("matmul", [sa[:-2], sb[:-2]], False)
        if batch is not None:
            shape = batch + (sa[-2:-1] if len(sa) > 1 else ()) + (sb[-1:] if len(sb) > 1 else ())
            dt = np.result_type(na.dtype, nb.dtype)
            if dt.kind == "b":
                raise ShapeError("matmul: boolean matmul is not supported")
            dtypes.check(dt, "matmul")
            assert isinstance(na, Buffer) and isinstance(nb, Buffer)
            out = wrap(make_matmul(na, nb, shape, dt))
            if TAPE is not None:
                record("matmul", (na, nb), (), out._node)
            return out
    raise ShapeError(f"matmul: shapes {sa} and {sb} are not aligned")
