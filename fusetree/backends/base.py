"""What every backend provides (pure Python: no numba or cupy here).

The engine talks to a backend through this interface: compile a rendered kernel into a launcher,
bind arrays and scalars into kernel arguments (the ABI of :mod:`fusetree.codegen.abi`), allocate,
launch, GEMM, copy. ``ft.jit`` additionally addresses memory as (root array, byte offset, shape,
strides) to rebind recorded launches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codegen import abi
from ..codegen.common import Target


def store_product(r: Any, out: Any, accumulate: bool) -> Any:
    """Put a computed product ``r`` into ``out`` (adding when ``accumulate``); ``r`` if no ``out``."""
    if out is None:
        return r
    if accumulate:
        out += r
    else:
        out[...] = r
    return out


class _Raw:
    """Exposes raw host memory (kept alive through ``owner``) as an array interface."""

    def __init__(self, owner: Any, ptr: int, shape: tuple, strides: tuple, dtype: Any) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "data": (ptr, False), "shape": tuple(shape), "strides": tuple(strides),
            "typestr": np.dtype(dtype).str, "version": 3,
        }  # fmt: skip


def mapped(strides: Any, smap: tuple) -> list[int]:
    """Frame strides from an array's element strides (see Backend.bind_frame)."""
    return [strides[i] if i >= 0 else 0 for i in smap]


def launch_dims(v: Any) -> tuple[int, int]:
    """(x, y) of a launch's grid or block, given as an int (1-D) or an (x, y) pair."""
    return v if type(v) is tuple else (v, 1)


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def pow2_at_most(n: int) -> int:
    """The largest power of two <= ``n`` (1 for n < 2)."""
    return 1 << (max(n, 1).bit_length() - 1)


class Backend:
    """Interface of a backend; see cpu.py, cuda.py and cudasim.py."""

    name = "base"
    device = "cpu"
    target = Target("cpu")
    gemm_accumulate = False  # can ``gemm(..., out=buf, accumulate=True)`` add into buf (beta=1)
    # Slicing a pending ``GEMM + array`` (an RNN's gates ``x@W + h@U + b``, sliced per gate)
    # computes the sum into memory first (one add of the backend's arrays) when this is True: on the CPU one NumPy
    # add costs less host time than pushing each slice into both operands (a view of the GEMM's
    # output and of the bias per slice, an op node, the view bookkeeping), and the fused kernel then
    # reads one operand per gate instead of two. On CUDA the add would be a launch of its own.
    fold_sliced_sums = False
    # A host backend's 2-D product as one callable (NumPy's matmul ufunc on the CPU): the C
    # accelerator runs a pending GEMM sum with it directly (the second product added in place),
    # without :meth:`gemm`'s Python frame; None: through :meth:`gemm`.
    host_matmul: Any = None
    xp: Any = np

    def cache_tag(self) -> str:
        """Target plus whatever compile options change the generated machine code."""
        return self.target.name

    def count_params(self, spec: Any) -> int:
        """Number of parameters of ``spec``'s kernel on this backend (see codegen.abi)."""
        return abi.count(spec, self.target.name)

    def frame_chunks(self, nrows: int, rowlen: int) -> int:
        """Into how many chunks each of ``nrows`` rows of ``rowlen`` elements is split (two-stage
        reduction); 1 keeps one row per thread group."""
        from .. import config

        split = config.current.reduce_split
        if split > 0:
            return -(-rowlen // split) if rowlen > split else 1
        return self._auto_chunks(nrows, rowlen)

    def _auto_chunks(self, nrows: int, rowlen: int) -> int:
        return 1

    # -- arrays --------------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def asarray(self, obj: Any) -> Any:
        return self.xp.asarray(obj)

    def to_numpy(self, data: Any) -> np.ndarray:
        return np.asarray(data)

    def reshape_view(self, data: Any, shape: tuple[int, ...]) -> Any | None:
        """A no-copy reshape of ``data``, or None when that needs a copy."""
        try:
            return np.reshape(data, shape, copy=False)
        except ValueError:
            return None

    def same_view(self, a: Any, b: Any) -> bool:
        return bool(a.shape == b.shape and a.strides == b.strides and self.ptr(a) == self.ptr(b))

    def same_allocation(self, a: Any, b: Any) -> bool:
        """Whether views ``a`` and ``b`` lie in one allocation (False when unknown)."""
        return False

    @staticmethod
    def adjacent_columns(a1: Any, a2: Any, p1: int, p2: int) -> bool:
        """Whether 2-D views ``a1`` and ``a2`` (element-0 addresses ``p1``, ``p2``) are adjacent
        column blocks, in either order: :meth:`join_k`'s first test, cheap enough to run before it."""
        return (
            a1.ndim == 2
            and a2.ndim == 2
            and (p2 == p1 + a1.shape[1] * a1.strides[1] or p1 == p2 + a2.shape[1] * a2.strides[1])
        )

    def join_k(
        self, a1: Any, b1: Any, a2: Any, b2: Any, ptrs: tuple[int, int, int, int]
    ) -> tuple[Any, Any] | None:
        """``(a, b)`` with ``a @ b == a1 @ b1 + a2 @ b2`` when the pairs are adjacent blocks of the
        same memory along the contraction axis (``a`` = [a1 a2] or [a2 a1] as one strided view,
        ``b`` the matching rows): one GEMM with a longer K instead of two. None otherwise.
        ``ptrs``: the four arrays' element-0 addresses (known to their buffer nodes).

        A backward pass through time sums ``h[t-1].T @ dgates[t]`` over the steps; when ``h`` and
        ``dgates`` are row blocks of two buffers, the sum is one GEMM over all steps, as in cuDNN."""
        pa1, pb1, pa2, pb2 = ptrs
        if not self.adjacent_columns(a1, a2, pa1, pa2) or b1.ndim != 2 or b2.ndim != 2:
            return None
        sa, sb = a1.strides, b1.strides
        if a2.strides != sa or b2.strides != sb or sa[1] == 0 or sb[0] == 0:
            return None
        if (
            a1.shape[0] != a2.shape[0]
            or b1.shape[1] != b2.shape[1]
            or a1.dtype != a2.dtype
            or b1.dtype != b2.dtype
        ):
            return None
        k1, k2 = a1.shape[1], a2.shape[1]
        if pa2 == pa1 + k1 * sa[1] and pb2 == pb1 + k1 * sb[0]:
            fa, fb = a1, b1
        elif pa1 == pa2 + k2 * sa[1] and pb1 == pb2 + k2 * sb[0]:
            fa, fb = a2, b2
        else:
            return None
        if not (self.same_allocation(a1, a2) and self.same_allocation(b1, b2)):
            return None
        ia, ib = a1.itemsize, b1.itemsize
        if sa[0] % ia or sa[1] % ia or sb[0] % ib or sb[1] % ib:
            return None
        k = k1 + k2
        a = self.restride(fa, (a1.shape[0], k), (sa[0] // ia, sa[1] // ia))
        b = self.restride(fb, (k, b1.shape[1]), (sb[0] // ib, sb[1] // ib))
        return a, b

    def stream_ptr(self) -> Any:
        """The current stream's handle, for launches of prepared parameters (None: no streams)."""
        return None

    def ptr(self, a: Any) -> int:
        """Address of element [0, ..., 0] of array ``a``."""
        return int(a.__array_interface__["data"][0])

    def nbytes_span(self, a: Any) -> tuple[int, int]:
        """[low, high) byte addresses ``a`` can touch."""
        p = self.ptr(a)
        lo = hi = p
        for n, s in zip(a.shape, a.strides):
            if n > 1:
                if s < 0:
                    lo += (n - 1) * s
                else:
                    hi += (n - 1) * s
        return lo, hi + a.itemsize

    def view_at(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        """An array of ``shape``/``strides`` (bytes) whose element 0 is ``offset`` bytes from
        ``root``'s element 0."""
        return np.asarray(_Raw(root, self.ptr(root) + offset, shape, strides, dtype))

    def restride(self, data: Any, shape: tuple[int, ...], estrides: tuple[int, ...]) -> Any:
        """``data``'s element 0 seen with another shape and element strides (a plan's view)."""
        item = data.dtype.itemsize
        return self.view_at(data, 0, shape, tuple(s * item for s in estrides), data.dtype)

    # -- kernels ----------------------------------------------------------------------------
    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        """Compile ``source`` (rendered from ``spec``); returns (launcher, extra info)."""
        raise NotImplementedError

    def save_source(self, spec: Any, source: str) -> str:
        return "(not saved)"

    def bind(self, data: Any, strided: bool) -> tuple:
        """Kernel arguments of one input array: flat, or with its strides (see codegen.abi)."""
        raise NotImplementedError

    def view_source(self, data: Any) -> tuple[tuple, tuple[int, ...]] | None:
        """``data``'s strided kernel arguments and element strides, when views of it can be bound
        by arithmetic (:meth:`bind_offset`); None: views of it are bound through view objects."""
        return None

    def bind_offset(self, src_bound: tuple, offset: int, estrides: tuple[int, ...], item: int,
                    strided: bool) -> tuple | None:  # fmt: skip
        """Kernel arguments of the view ``offset`` elements from the element 0 of an array bound as
        ``src_bound`` (:meth:`view_source`), with element strides ``estrides``; None: bind a view
        object instead."""
        return None

    # The C accelerator's realize (fusetree._native.realize_hit) launches a flat kernel itself when
    # ``flat_launch`` is True: the bound arguments, each output as a fresh 1-D array allocated by
    # ``fast_empty`` (a callable (shape, dtype) with no Python frame), the element count, passed
    # to ``launcher.direct(n)`` (or ``launcher(n, args)`` when that is None), as :meth:`launch`
    # does for a flat launcher; outputs of a dtype in ``flat_view_dtypes`` (stored as another
    # type) take :meth:`launch`. Tests check the two agree.
    flat_launch = False
    fast_empty: Any = None
    flat_view_dtypes: frozenset = frozenset()
    # ... and runs a CUDA launch's common case itself when ``pack_direct`` is True (the CUDA
    # backend with the C module's pack_launch: see CUDABackend.launch)
    pack_direct = False

    # Which of two forms :meth:`bind_offset` has, for the C accelerator's copy of it (fusetree._native;
    # tests check the two agree): 0 neither (it calls bind_offset); 1 ``(array, element offset,
    # *strides)`` with ``offset`` added to the element offset, strided only (None otherwise: the CPU);
    # 2 ``(pointer, *strides)`` / ``(pointer,)`` with ``offset * item`` added to the pointer (CUDA).
    offset_form = 0

    def scalar_arg(self, leaf: Any) -> Any:
        st = self.target.scalar_storage(leaf.dtype)
        return st.type(leaf.value)

    def launch(self, launcher: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        """Append the outputs' and sizes' arguments to ``args`` and launch."""
        raise NotImplementedError

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        """Arguments of one array of a reduction kernel: its memory and one stride per frame axis
        (``smap[d]`` is the array axis read for frame axis ``d``, -1 for stride 0)."""
        raise NotImplementedError

    def launch_frame(self, launcher: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        """Append the outputs and the geometry (sizes, rows, row length, chunks, chunk length)."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any) -> None:
        raise NotImplementedError

    # -- horizontal kernels (engine.horizontal); these defaults are for host memory -----------
    def raw_base(self, ptr: int, n: int, dtype: np.dtype, owner: Any) -> Any:
        """A 1-D array of ``n`` elements (in the target's storage dtype) at ``ptr`` spanning several
        tensors (kept alive by ``owner``); the kernel only touches the tensors' own elements."""
        st = self.target.storage(dtype)
        return np.asarray(_Raw(owner, ptr, (n,), (st.itemsize,), st))

    def table_arg(self, table: np.ndarray) -> tuple[Any, Any]:
        """(the kernel argument of a chunk table, what keeps it alive)."""
        t = np.ascontiguousarray(table).reshape(-1)
        return t, t

    def gemm(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        raise NotImplementedError
