"""What every backend provides (pure Python: no numba or cupy here)."""

from __future__ import annotations

from typing import Any

import numpy as np


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


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class Backend:
    """Interface of a backend; see cpu.py and cuda.py."""

    name = "base"
    device = "cpu"
    target = "cpu"  # codegen target
    cache_bindings = True  # a buffer's kernel arguments depend only on the buffer (see runtime.run)
    gemm_accumulate = False  # can ``matmul(..., out=buf, accumulate=True)`` add into buf (beta=1)
    xp: Any = np

    def scalar_storage(self, dt: np.dtype) -> np.dtype:
        """The dtype a scalar parameter of ``dt`` is passed as."""
        return dt

    def cache_tag(self) -> str:
        """Target plus whatever compile options change the generated machine code."""
        return self.target

    def storage_dtype(self, dt: np.dtype) -> np.dtype:
        """The dtype the kernel sees for a buffer of ``dt`` (the CPU backend widens float16)."""
        return dt

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

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b))

    def same_view(self, a: Any, b: Any) -> bool:
        return bool(
            a.shape == b.shape
            and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        )

    # -- raw memory (trace/replay) ----------------------------------------------------------
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

    def view(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        """An array of ``shape``/``strides`` whose element [0...] is ``offset`` bytes from root's."""
        return np.asarray(_Raw(root, self.ptr(root) + offset, shape, strides, dtype))

    def bind_view(
        self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any, layout: str, flat: bool
    ) -> tuple:
        return self.bind(self.view(root, offset, shape, strides, dtype), layout, flat)

    # -- kernels ----------------------------------------------------------------------------
    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        """Compile ``source`` (rendered from ``spec``); returns (kernel, extra info)."""
        raise NotImplementedError

    def bind(self, data: Any, layout: str, flat: bool) -> tuple:
        """Kernel arguments for one input array of ``layout``."""
        raise NotImplementedError

    def scalar_arg(self, leaf: Any) -> Any:
        return leaf.dtype.type(leaf.data)

    def launch(self, plan: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        """Append the outputs' and sizes' arguments to ``args`` and launch ``plan``."""
        raise NotImplementedError

    # -- reduction kernels (see fusetree.codegen_frame) -----------------------------------------
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

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        """Arguments of one array of a reduction kernel: its memory and one stride per frame axis
        (``smap[d]`` is the array axis read for frame axis ``d``, -1 for stride 0)."""
        raise NotImplementedError

    def bind_frame_view(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any,
                        smap: tuple) -> tuple:  # fmt: skip
        return self.bind_frame(self.view(root, offset, shape, strides, dtype), smap)

    def launch_frame(self, plan: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        """Append the outputs and the geometry (sizes, rows, row length, chunks, chunk length)."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any) -> None:
        raise NotImplementedError

    def matmul(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        raise NotImplementedError
