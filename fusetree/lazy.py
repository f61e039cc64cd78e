"""Lazy arrays: NumPy-named operators and functions that build IR nodes instead of computing.

Nothing here imports numba or cupy. Broadcasting and basic-indexing views are pushed down to the
leaves when a node is built, so every node of an elementwise tree has the shape of its consumer and
every leaf is a zero-copy strided view; a kernel reads its inputs through strides.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import backends, config, dtypes, ir, runtime
from .errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from .ir import Node
from .ops import BINARY_OPERATORS, INPLACE_OPERATORS, OPS, UNARY_OPERATORS, operand_dtype, result_dtype

# Live, pending (unrealized) arrays: id -> weakref. Realizing a value also stores the live pending
# values that are part of its kernel (same shape and device); see runtime.realize.
PENDING = runtime.PENDING
_ref = weakref.ref


class Array:
    """A fusetree array: a lazy expression, or a realized buffer (NumPy or CuPy memory).

    >>> import numpy as np, fusetree as ft
    >>> x = ft.asarray(np.arange(4, dtype=np.float32))
    >>> y = ft.exp(x) * 2 + 1          # builds a tree; nothing runs yet
    >>> np.allclose(np.asarray(y), np.exp(np.arange(4)) * 2 + 1)
    True
    """

    __slots__ = ("__weakref__", "_base", "_node", "_views")
    __array_priority__ = 100.0
    __hash__ = None  # type: ignore[assignment]  # == is elementwise, as in NumPy

    def __init__(self, node: Node) -> None:
        self._node = node
        # A view of a *pending* array is itself a lazy expression, but NumPy's semantics make it an
        # alias: ``_base`` is (weakref to the viewed array, the view as a function of its memory),
        # and the viewed array lists its live views in ``_views``. When the viewed array gets
        # memory, its views become real views of it (runtime.realize / runtime.set_buffer).
        self._base: tuple[Any, Callable[[Any], Any]] | None = None
        self._views: list[Any] | None = None
        if node[0] != "buffer" and node[0] != "scalar":
            PENDING[id(self)] = _ref(self)

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
        return int(np.prod(self._node.shape, dtype=np.int64))

    @property
    def device(self) -> str:
        return self._node.device or "cpu"

    @property
    def T(self) -> Array:
        return self.transpose()

    @property
    def is_realized(self) -> bool:
        """True when the array is backed by a buffer (no pending computation)."""
        return self._node.op == "buffer"

    @property
    def data(self) -> Any:
        """The backing NumPy/CuPy array (realizes the value first)."""
        runtime.realize([self])
        return self._node.data

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
        if runtime.RECORDER is not None:
            raise UnsupportedError(
                "reading an array's values inside an ft.jit function: the trace would freeze them; "
                "return the value instead, or call the function without ft.jit"
            )
        runtime.realize([self])
        return backends.get(self.device).to_numpy(self._node.data)

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

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.data.__dlpack_device__()

    # -- NumPy interop ---------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = {"divide": "true_divide", "abs": "absolute"}.get(ufunc.__name__, ufunc.__name__)
        if method == "__call__" and not kwargs and name in OPS and OPS[name].arity == len(inputs):
            return elementwise(name, *inputs)
        arrays = [np.asarray(x) if isinstance(x, Array) else x for x in inputs]
        return getattr(ufunc, method)(*arrays, **kwargs)

    # -- views -----------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Array:
        shape = index_shape(key, self._node[2])
        vkey = view_index(key)
        fn = lambda d: d[vkey]
        return self._derive(_view(self._node, fn, shape, "index", _view_key(key)), fn)

    def transpose(self, *axes: Any) -> Array:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], Sequence)):
            axes = tuple(axes[0]) if axes[0] is not None else ()
        ax: tuple[int, ...] | None = tuple(int(a) for a in axes) if axes else None
        try:
            shape = _dummy(self.shape).transpose(ax).shape
        except (ValueError, np.exceptions.AxisError) as e:
            raise ShapeError(f"transpose: axes {axes} do not fit shape {self.shape}: {e}") from None
        fn = lambda d: d.transpose(ax)
        return self._derive(_view(self._node, fn, shape, "transpose"), fn)

    def reshape(self, *shape: Any) -> Array:
        if len(shape) == 1 and isinstance(shape[0], Sequence | np.ndarray):
            shape = tuple(shape[0])
        new = _resolve_shape(tuple(int(s) for s in shape), self.shape)
        be = backends.get(self.device)
        node = self._node

        def leaf_fn(d: Any) -> Any:
            v = be.reshape_view(d, new)
            return v if v is not None else be.xp.reshape(be.xp.ascontiguousarray(d), new)

        return self._derive(_view(node, leaf_fn, new, "reshape"), leaf_fn)

    def _derive(self, node: Node, fn: Callable[[Any], Any]) -> Array:
        """The Array of a view ``node`` of this array (``fn`` maps this array's memory to it)."""
        v = Array(node)
        if self._node[0] != "buffer" and node[0] != "buffer":
            src: Array = self
            base = self._base
            if base is not None and base[0]() is not None:  # a view of a view: of the same array
                src, fn0 = base[0](), base[1]
                fn = _compose(fn, fn0)
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

    # -- in-place writes (neon style: out[...] = expr) ----------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        index_shape(key, self.shape)
        runtime.realize([self])
        target = self._node.data[view_index(key)]
        runtime.assign(target, self.device, value)

    def _inplace(self, name: str, other: Any) -> Array:
        """``self <op>= other``: NumPy's ``ufunc(self, other, out=self, casting="same_kind")``.

        Writes into this array's memory (aliases and the wrapped NumPy/CuPy buffer see the
        result); a result dtype that cannot be cast to ``self.dtype`` with the same-kind rule
        raises DTypeError before anything is written.
        """
        runtime.realize([self])  # first, so the value reads this array's memory as a buffer
        value = matmul(self, other) if name == "matmul" else elementwise(name, self, other)
        if not np.can_cast(value.dtype, self.dtype, casting="same_kind"):
            raise DTypeError(
                f"Cannot cast ufunc '{name}' output from dtype('{value.dtype}') to "
                f"dtype('{self.dtype}') with casting rule 'same_kind' (in-place {name} on a "
                f"{self.dtype} array)"
            )
        if value.shape != self.shape:
            try:
                ok = tuple(np.broadcast_shapes(value.shape, self.shape)) == self.shape
            except ValueError:
                ok = False
            if not ok:
                raise ShapeError(
                    f"non-broadcastable output operand with shape {self.shape} doesn't match the "
                    f"broadcast shape {value.shape} (in-place {name})"
                )
        self[...] = value
        return self

    # -- matmul ----------------------------------------------------------------------------
    def __matmul__(self, other: Any) -> Array:
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
        def __eq__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __lt__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __le__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __gt__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __ge__(self, other: Any) -> Array: ...  # type: ignore[override]
        def __neg__(self) -> Array: ...
        def __abs__(self) -> Array: ...
        def __invert__(self) -> Array: ...

    # -- reductions (see fusetree.reductions) ------------------------------------------------
    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
        """Sum over ``axis`` (like ``ndarray.sum``)."""
        return _red().sum(self, axis, dtype, keepdims)

    def prod(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
        """Product over ``axis``."""
        return _red().prod(self, axis, dtype, keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Array:
        """Mean over ``axis``."""
        return _red().mean(self, axis, dtype, keepdims)

    def var(self, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Array:
        """Variance over ``axis``."""
        return _red().var(self, axis, dtype, ddof, keepdims)

    def std(self, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Array:
        """Standard deviation over ``axis``."""
        return _red().std(self, axis, dtype, ddof, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Maximum over ``axis``."""
        return _red().max(self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Minimum over ``axis``."""
        return _red().min(self, axis, keepdims)

    def argmax(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Index of the first maximum along ``axis``."""
        return _red().argmax(self, axis, keepdims)

    def argmin(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Index of the first minimum along ``axis``."""
        return _red().argmin(self, axis, keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether any element along ``axis`` is non-zero."""
        return _red().any(self, axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether all elements along ``axis`` are non-zero."""
        return _red().all(self, axis, keepdims)


def _compose(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda d: f(g(d))


def _red() -> Any:
    from . import reductions

    return reductions


def _binary(name: str, reflected: bool) -> Callable[[Array, Any], Array]:
    def method(self: Array, other: Any) -> Array:
        if not _is_operand(other):
            return NotImplemented  # type: ignore[return-value]
        return elementwise(name, other, self) if reflected else elementwise(name, self, other)

    return method


for _m, _name in BINARY_OPERATORS.items():
    setattr(Array, _m, _binary(_name, False))
    if _m not in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
        setattr(Array, "__r" + _m[2:], _binary(_name, True))


def _inplace_method(name: str) -> Callable[[Array, Any], Array]:
    def method(self: Array, other: Any) -> Array:
        if not _is_operand(other):
            return NotImplemented  # type: ignore[return-value]
        return self._inplace(name, other)

    method.__name__ = f"__i{name}__"
    return method


for _m, _name in INPLACE_OPERATORS.items():
    setattr(Array, _m, _inplace_method(_name))
for _m, _name in UNARY_OPERATORS.items():
    setattr(Array, _m, lambda self, _n=_name: elementwise(_n, self))
Array.__pos__ = lambda self: self  # type: ignore[attr-defined,operator]


def _is_operand(x: Any) -> bool:
    return isinstance(x, Array | np.ndarray | np.generic | builtins.bool | int | float) or (
        backends.device_of(x) is not None
    )


# ---------------------------------------------------------------------------------------------
# building nodes


_SCALAR_TYPES = (builtins.bool, int, float, np.generic)


def as_node(x: Any, device: str | None = None) -> Node:
    """The IR node for an operand: fusetree arrays, NumPy/CuPy arrays, Python and NumPy scalars."""
    if type(x) is Array:
        return x._node
    if isinstance(x, Array):
        return x._node
    if isinstance(x, _SCALAR_TYPES):
        if isinstance(x, np.generic):
            dtypes.check(x.dtype, "scalar operand")
        return ir.make_scalar(x)
    return asarray(x, device=device)._node


def elementwise(name: str, *operands: Any, attrs: tuple = ()) -> Array:
    """Build the node for op ``name`` (see fusetree.ops.OPS) over ``operands``."""
    nodes = [x._node if type(x) is Array else as_node(x) for x in operands]
    device: str | None = None
    shape: tuple[int, ...] = ()
    bcast = weak_int = False
    for n in nodes:
        if n[0] == "scalar":
            weak_int = weak_int or n[10] is int
        elif device is None:
            device, shape = n[8], n[2]
        elif n[8] != device:
            raise DeviceError(
                f"{name}: operands are on different devices ({device!r} and {n[8]!r}); "
                "move them with ft.asarray(x, device=...) first"
            )
        elif n[2] != shape:
            bcast = True
    if device is None:
        device = "cpu"
    if weak_int and name in _COMPARISONS:  # comparisons compare an out-of-range int's true value
        arrays = [m for m in nodes if m[0] != "scalar"]
        for k, n in enumerate(nodes):
            if n.weak is int and any(not dtypes.fits(n.data, m.dtype) for m in arrays):
                nodes[k] = ir.make_scalar(np.int64(n.data))
    descs = tuple([n[10] or n[1] for n in nodes])
    out_dt = result_dtype(name, descs, attrs)
    if weak_int and device is not None:  # NumPy 2 refuses a Python int that does not fit its loop dtype
        for k, n in enumerate(nodes):
            if n[10] is int:
                dtypes.check_weak_int(n[9], operand_dtype(name, descs, out_dt, k), name)
    if bcast:
        shape = _broadcast_shapes(name, [m.shape for m in nodes if m[0] != "scalar"])
    if name == "add" and nodes[0][0] == "matmul" and _foldable(nodes, out_dt, shape):
        # x@W + h@U: the second GEMM accumulates into the first (beta = 1), one leaf for the kernel
        a, b = nodes
        return Array(ir.make_matmul(a, b, shape, out_dt, acc=True))
    if bcast:
        args = tuple([n if n[0] == "scalar" or n[2] == shape else _broadcast(n, shape) for n in nodes])
    else:
        args = tuple(nodes)
    out = Array(ir.make_op(name, args, out_dt, shape, device, attrs))  # type: ignore[arg-type]
    if not config.current.fuse:
        runtime.realize([out])  # the unfused baseline: one kernel per op, launched eagerly
    return out


def _foldable(nodes: list[Node], dt: np.dtype, shape: tuple[int, ...]) -> bool:
    if len(nodes) != 2 or not all(n.op == "matmul" and n.memo is None for n in nodes):
        return False
    if any(n.shape != shape or n.dtype != dt or len(n.args) != 2 for n in nodes):
        return False
    return bool(backends.get(nodes[0].device).gemm_accumulate)


_COMPARISONS = frozenset(("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"))


def _broadcast_shapes(name: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        pretty = " and ".join(str(s) for s in shapes)
        raise ShapeError(f"{name}: operands could not be broadcast together with shapes {pretty}") from None


def _broadcast(node: Node, shape: tuple[int, ...]) -> Node:
    if not node.is_leaf and ir.has_reduce(node):  # a view cannot pass a reduction: expand the value
        return ir.make_op("expand", (node,), node.dtype, shape, node.device)
    xp = backends.xp_for(node.device)
    return _view(node, lambda d: xp.broadcast_to(d, shape), shape, "broadcast", ("b", shape))


def _view(node: Node, leaf_fn: Callable[[Any], Any], shape: tuple[int, ...], what: str,
          vkey: tuple | None = None) -> Node:  # fmt: skip
    """Apply a view (index, transpose, reshape, broadcast) by rebuilding the tree over viewed leaves.

    Elementwise ops commute with views, and every non-scalar child has its parent's shape, so the
    same view applies to every leaf. Pending GEMMs are computed first (a fusion boundary).
    """
    memo: dict[int, Node] = {}
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, ready = stack.pop()
        if id(n) in memo:
            continue
        if n.op == "scalar":
            memo[id(n)] = n
        elif n.op == "buffer":
            # the same view of the same buffer (a bias broadcast and sliced every step) is reused
            views = n[12][1] if vkey is not None else None
            v = views.get(vkey) if views is not None else None
            if v is None:
                v = ir.make_buffer(leaf_fn(n.data), n.device)
                if vkey is not None:
                    if views is None or len(views) > 64:
                        views = n[12][1] = dict[tuple, Node]()
                    views[vkey] = v
            memo[id(n)] = v
        elif n.op == "matmul":
            memo[id(n)] = ir.make_buffer(leaf_fn(runtime.compute_matmul(n)), n.device)
        elif n.op == "reduce":  # a fusion boundary for views: the reduction is computed first
            memo[id(n)] = ir.make_buffer(leaf_fn(runtime.realize_node(n)), n.device)
        elif n.op == "expand":
            row = backends.xp_for(n.device).broadcast_to(runtime.realize_node(n.args[0]), n.shape)
            memo[id(n)] = ir.make_buffer(leaf_fn(row), n.device)
        elif not ready:
            stack.append((n, True))
            stack.extend((a, False) for a in n.args if id(a) not in memo)
        else:
            args = tuple(memo[id(a)] for a in n.args)
            memo[id(n)] = ir.make_op(n.op, args, n.dtype, shape, n.device, n.attrs)
    return memo[id(node)]


def _dummy(shape: tuple[int, ...]) -> np.ndarray:
    """A zero-memory array of ``shape`` for computing index/transposition results."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape, (0,) * len(shape))


_INT_TYPES = (int, np.integer)


def view_index(key: Any) -> Any:
    """``key`` such that indexing returns a *view*: NumPy turns an all-integer index into a scalar
    copy, which would go stale after a write; ``a[0, 0, ...]`` is a 0-d view of the same memory."""
    items = key if type(key) is tuple else (key,)
    for k in items:
        if k is Ellipsis:
            return key
    return (*items, Ellipsis)


def _view_key(key: Any) -> tuple | None:
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


def index_shape(key: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of ``x[key]`` for basic indexing, computed without touching any array; raises the
    errors NumPy raises (IndexError) or UnsupportedError for fancy indexing."""
    items = key if type(key) is tuple else (key,)
    fast = True
    for k in items:
        t = type(k)
        if t is not slice and t is not int:
            fast = False
            break
    if not fast:
        _check_index(key, shape)
        return _dummy(shape)[key].shape
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
            if isinstance(k, Array) or hasattr(k, "__len__") or isinstance(k, builtins.bool | np.bool_):
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


def _resolve_shape(new: tuple[int, ...], old: tuple[int, ...]) -> tuple[int, ...]:
    size = int(np.prod(old, dtype=np.int64))
    if new.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension, got {new}")
    if -1 in new:
        rest = int(np.prod([s for s in new if s != -1], dtype=np.int64))
        if rest == 0 or size % rest:
            raise ShapeError(f"reshape: cannot reshape array of shape {old} into shape {new}")
        new = tuple(size // rest if s == -1 else s for s in new)
    if int(np.prod(new, dtype=np.int64)) != size or any(s < 0 for s in new):
        raise ShapeError(f"reshape: cannot reshape array of shape {old} (size {size}) into shape {new}")
    return new


# ---------------------------------------------------------------------------------------------
# creation


def asarray(a: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Wrap ``a`` without copying when possible.

    NumPy arrays live on "cpu"; CuPy arrays and other ``__cuda_array_interface__``/DLPack CUDA
    arrays on "cuda". ``device`` moves (copies) the data when it differs.

    >>> import numpy as np, fusetree as ft
    >>> ft.asarray(np.ones(3, np.float32)).device
    'cpu'
    """
    if isinstance(a, Array):
        arr = a
    else:
        src = backends.device_of(a)
        if src is None:
            if isinstance(a, str | bytes) or a is None or isinstance(a, dict | set):
                raise UnsupportedError(
                    f"asarray: cannot make a fusetree array from {type(a).__name__} {a!r:.60}"
                )
            try:
                data = np.asarray(a)
            except Exception as e:
                raise UnsupportedError(
                    f"asarray: cannot convert {type(a).__name__} to an array: {e}"
                ) from None
            src = "cpu"
        elif src == "cpu":
            data = np.asarray(a)
        else:
            data = backends.get(src).asarray(a)
        dtypes.check(data.dtype, "asarray")
        if src == "cpu" and device == "cuda-sim":
            src = "cuda-sim"
        arr = Array(ir.make_buffer(data, src))
    if device is not None and device != arr.device:
        arr = _to_device(arr, device)
    if dtype is not None:
        arr = arr.astype(dtype)
    return arr


def _to_device(a: Array, device: str) -> Array:
    be = backends.get(device)
    host = a.numpy()
    return Array(ir.make_buffer(be.asarray(host), device))


def _creation(shape: Any, dtype: Any, device: str | None, fill: Any) -> Array:
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"negative dimensions are not allowed: {shape}")
    dt = dtypes.check(np.float64 if dtype is None else dtype, "array creation")
    be = backends.get(device or "cpu")
    data = be.empty(shape, dt)
    if fill is not None:
        data[...] = fill
    return Array(ir.make_buffer(data, be.device))


def empty(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Uninitialized array (like ``np.empty``)."""
    return _creation(shape, dtype, device, None)


def zeros(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array of zeros (like ``np.zeros``)."""
    return _creation(shape, dtype, device, 0)


def ones(shape: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array of ones (like ``np.ones``)."""
    return _creation(shape, dtype, device, 1)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None) -> Array:
    """Array filled with ``fill_value``; the dtype defaults to NumPy's choice for the value."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return _creation(shape, dtype, device, fill_value)


def _like(a: Any, dtype: Any, fill: Any) -> Array:
    x = asarray(a)
    return _creation(x.shape, dtype or x.dtype, x.device, fill)


def empty_like(a: Any, dtype: Any = None) -> Array:
    """Uninitialized array with the shape (and dtype, device) of ``a``."""
    return _like(a, dtype, None)


def zeros_like(a: Any, dtype: Any = None) -> Array:
    """Zeros with the shape (and dtype, device) of ``a``."""
    return _like(a, dtype, 0)


def ones_like(a: Any, dtype: Any = None) -> Array:
    """Ones with the shape (and dtype, device) of ``a``."""
    return _like(a, dtype, 1)


def full_like(a: Any, fill_value: Any, dtype: Any = None) -> Array:
    """``fill_value`` with the shape (and dtype, device) of ``a``."""
    return _like(a, dtype, fill_value)


# ---------------------------------------------------------------------------------------------
# matmul (a fusion boundary)


def matmul(a: Any, b: Any) -> Array:
    """Matrix product with NumPy's ``@`` rules; a GEMM launched before the kernel that reads it.

    ``x @ W + h @ U`` costs two GEMMs (on CUDA the second accumulates into the first) plus the
    elementwise work, fused into the consumer kernel.
    """
    runtime.realize([x for x in (a, b) if isinstance(x, Array)])  # operands: a fusion boundary
    na, nb = as_node(a), as_node(b)
    if na.op == "scalar" or nb.op == "scalar":
        raise ShapeError("matmul: operands must be arrays, not scalars")
    if na.device != nb.device:
        raise DeviceError(f"matmul: operands are on different devices ({na.device!r} and {nb.device!r})")
    sa, sb = na.shape, nb.shape
    if sa and sb and sa[-1] == (sb[-2] if len(sb) > 1 else sb[0]):
        ba, bb = sa[:-2], sb[:-2]
        try:
            batch = tuple(np.broadcast_shapes(ba, bb))
        except ValueError:
            batch = None
        if batch is not None:
            shape = batch + (sa[-2:-1] if len(sa) > 1 else ()) + (sb[-1:] if len(sb) > 1 else ())
            dt = np.result_type(na.dtype, nb.dtype)
            if dt.kind == "b":
                raise ShapeError("matmul: boolean matmul is not supported")
            dtypes.check(dt, "matmul")
            return Array(ir.make_matmul(na, nb, shape, dt))
    raise ShapeError(f"matmul: shapes {sa} and {sb} are not aligned")


# ---------------------------------------------------------------------------------------------
# functions (one per op-table row), plus a few compositions


def _fn(name: str) -> Callable[..., Array]:
    arity = OPS[name].arity

    def f(*args: Any) -> Array:
        if len(args) != arity:
            raise TypeError(f"{name}() takes {arity} argument(s), got {len(args)}")
        return elementwise(name, *args)

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` with NumPy semantics (see fusetree.ops.OPS['{name}'])."
    return f


FUNCTIONS = {name: _fn(name) for name in OPS if name != "astype"}


def where(cond: Any, a: Any, b: Any) -> Array:
    """``a`` where ``cond`` else ``b`` (like ``np.where`` with three arguments)."""
    return elementwise("where", cond, a, b)


def clip(x: Any, lo: Any, hi: Any) -> Array:
    """``minimum(maximum(x, lo), hi)``, as NumPy defines ``np.clip``."""
    y = x if lo is None else elementwise("maximum", x, lo)
    return y if hi is None else elementwise("minimum", y, hi)


def astype(x: Any, dtype: Any) -> Array:
    """Cast to ``dtype`` (NumPy's ``astype`` with unsafe casting)."""
    return asarray(x).astype(dtype)


def power(a: Any, b: Any) -> Array:
    """``a ** b``."""
    return elementwise("power", a, b)
