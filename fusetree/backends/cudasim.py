"""CUDA simulator backend (device "cuda-sim"): the generated CUDA kernels run in numba's simulator
on NumPy memory, so CI checks the CUDA target's semantics without a GPU.

numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported, so this backend must
be used in a process that has not imported numba.cuda for the real GPU (tests run it in their own
subprocess). The simulator runs ~10k elements/s: use tiny arrays.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ..codegen.common import Target
from ..codegen.elementwise import TILE_BLOCK, tiled
from ..errors import DeviceError
from . import helpers, vector
from .base import Backend, mapped, pow2_at_least, pow2_at_most, store_product
from .cpu import _flat_view, _frame_outputs, host_view

if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise DeviceError(
        "device 'cuda-sim' needs NUMBA_ENABLE_CUDASIM=1 before numba.cuda is imported; "
        "run it in its own process"
    )
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
from .shim import numpy_shim

numpy_shim()
from numba import cuda  # noqa: E402


class SimLauncher:
    __slots__ = ("flat", "fn", "name", "source", "tiled")

    def __init__(self, fn: Any, name: str, flat: bool, tiled: bool = False) -> None:
        self.fn, self.name, self.flat, self.source, self.tiled = fn, name, flat, "", tiled


class SimBackend(Backend):
    name = "cuda-sim"
    device = "cuda-sim"
    target = Target("cuda-sim")  # the simulator reads NumPy arrays directly: no storage changes
    xp = np

    def __init__(self) -> None:
        self.ns = helpers.namespace(lambda f: f, None)  # the simulator runs plain Python
        self.ns.update(vector.sim_namespace())
        self.ns["cuda"] = cuda

    def cache_tag(self) -> str:
        from .. import config

        o = config.current
        return f"cuda-sim/u{o.cuda_unroll}v{int(o.cuda_vector)}h{o.reduce_held}t{o.cuda_tile}r{int(o.reduce_remat)}"

    def compile(self, spec: Any, source: str, params: list[str]) -> tuple[Any, dict]:
        ns = dict(self.ns)
        exec(compile(source, f"<fusetree {spec.name}>", "exec"), ns)
        return SimLauncher(cuda.jit(ns[spec.name]), spec.name, spec.flat, tiled(spec)), {}

    def view_at(self, root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any) -> Any:
        return host_view(root, offset, shape, strides, dtype)

    def restride(self, data: Any, shape: tuple[int, ...], estrides: tuple[int, ...]) -> Any:
        item = data.dtype.itemsize
        return host_view(data, 0, shape, tuple(s * item for s in estrides), data.dtype)

    def bind(self, data: Any, strided: bool) -> tuple:
        if not strided:
            return (data.reshape(-1),)
        base, off, strides, _ = _flat_view(data)
        return (base, off, *strides)

    def launch(self, launcher: Any, args: list, outs: list, layouts: tuple, shape: tuple) -> None:
        for o, lay in zip(outs, layouts):
            if lay == "C":
                args.append(o.reshape(-1))
            else:
                base, off, strides, copied = _flat_view(o)
                if copied:
                    raise DeviceError("cuda-sim: cannot write through this output view")
                args.extend((base, off, *strides))
        n = int(np.prod(shape, dtype=np.int64))
        args.extend([n] if launcher.flat else (list(shape) if shape else [1]))
        args.append(n)
        if launcher.tiled:  # the tile shape is fixed by the kernel
            launcher.fn[2, TILE_BLOCK](*args)
        elif launcher.flat:
            block, grid = 32, max(1, min((n + 31) // 32, 4))
            launcher.fn[grid, block](*args)
        else:  # row kernels: a 2-D grid (x along the row, y over rows), small to keep it quick
            launcher.fn[(2, 2), (4, 4)](*args)

    def bind_frame(self, data: Any, smap: tuple) -> tuple:
        base, off, strides, _ = _flat_view(data)
        return (base, off, *mapped(strides, smap))

    def launch_frame(self, launcher: Any, args: list, outs: list, smaps: list, geometry: tuple) -> None:
        from .. import config

        staged = _frame_outputs(args, outs, smaps)
        nkeep, clen = geometry[-4] * geometry[-2], geometry[-1]
        tpr = pow2_at_most(config.current.reduce_threads or min(pow2_at_least(-(-clen // 4)), 64))
        block = min(tpr * config.current.reduce_rows_per_block, 1024) if tpr >= 32 else 32
        grid = max(1, min(-(-nkeep // (block // tpr)), 4))  # few blocks: the kernel loops over rows
        launcher.fn[grid, block](*args, *geometry, tpr)
        for o, buf in staged:
            np.copyto(o, buf, casting="unsafe")

    def gemm(self, a: Any, b: Any, out: Any = None, accumulate: bool = False) -> Any:
        return store_product(np.matmul(a, b), out, accumulate)

    def copy(self, dst: Any, src: Any) -> None:
        np.copyto(dst, src, casting="unsafe")

    # -- horizontal kernels (engine.horizontal; host bases and tables: Backend's): one block of
    # 32 threads per table row
    def launch_table(self, launcher: Any, args: list, nrows: int, total: int) -> None:
        # the bases span several tensors' memory: passed as device arrays, not as host arrays
        # (which the simulator copies in and back out, over whatever lies between the tensors)
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        if nrows:
            launcher.fn[nrows, 32](*[FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args])


def make_backend() -> SimBackend:
    return SimBackend()
