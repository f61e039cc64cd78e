"""CUDA graphs built node by node through the driver API (ctypes), so kernel nodes can be re-pointed.

fusetree's kernels become kernel nodes whose parameters are patched in the executable graph
(``cuGraphExecKernelNodeSetParams``, ~1 µs) when an argument's address changes; work fusetree does
not generate (cuBLAS GEMMs, copies) is stream-captured into child graphs. Nodes run in order (each
depends on the one before).
"""

from __future__ import annotations

import ctypes
from typing import Any

from .base import launch_dims

_vp = ctypes.c_void_p


class KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2."""

    _fields_ = [
        ("func", _vp),
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", _vp),
        ("extra", _vp),
        ("kern", _vp),
        ("ctx", _vp),
    ]  # fmt: skip


def _node_params(func: int, grid: Any, block: Any, params_ptr: int) -> KernelNodeParams:
    """A kernel node's parameters; ``grid``/``block`` are ints (1-D) or (x, y) pairs."""
    (gx, gy), (bx, by) = launch_dims(grid), launch_dims(block)
    return KernelNodeParams(func, gx, gy, 1, bx, by, 1, 0, params_ptr, None, None, None)


def _setup(lib: Any) -> None:
    if getattr(lib, "_fusetree_graphs", False):
        return
    P = ctypes.POINTER
    lib.cuGraphCreate.argtypes = [P(_vp), ctypes.c_uint]
    lib.cuGraphAddKernelNode_v2.argtypes = [P(_vp), _vp, _vp, ctypes.c_size_t, P(KernelNodeParams)]
    lib.cuGraphAddChildGraphNode.argtypes = [P(_vp), _vp, _vp, ctypes.c_size_t, _vp]
    lib.cuGraphInstantiateWithFlags.argtypes = [P(_vp), _vp, ctypes.c_ulonglong]
    lib.cuGraphLaunch.argtypes = [_vp, _vp]
    lib.cuGraphExecKernelNodeSetParams_v2.argtypes = [_vp, _vp, P(KernelNodeParams)]
    lib.cuGraphDestroy.argtypes = [_vp]
    lib.cuGraphExecDestroy.argtypes = [_vp]
    lib._fusetree_graphs = True


class GraphBuilder:
    """Adds nodes in order, then instantiates."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.lib = driver.lib
        _setup(self.lib)
        g = _vp()
        driver.check(self.lib.cuGraphCreate(ctypes.byref(g), 0), "cuGraphCreate")
        self.graph = g.value or 0
        self.last: int | None = None
        self.keep: list[Any] = []  # child graphs (their owners) kept alive with the graph

    def _deps(self) -> tuple[Any, int]:
        if self.last is None:
            return None, 0
        return (_vp * 1)(self.last), 1

    def kernel(self, func: int, grid: Any, block: Any, params_ptr: int) -> int:
        p = _node_params(func, grid, block, params_ptr)
        node = _vp()
        deps, n = self._deps()
        self.driver.check(self.lib.cuGraphAddKernelNode_v2(ctypes.byref(node), self.graph, deps, n, ctypes.byref(p)),
                          "cuGraphAddKernelNode")  # fmt: skip
        self.last = node.value
        return node.value or 0

    def child(self, graph_handle: int, owner: Any) -> int:
        node = _vp()
        deps, n = self._deps()
        self.driver.check(self.lib.cuGraphAddChildGraphNode(ctypes.byref(node), self.graph, deps, n, graph_handle),
                          "cuGraphAddChildGraphNode")  # fmt: skip
        self.keep.append(owner)
        self.last = node.value
        return node.value or 0

    def instantiate(self) -> Exec:
        ex = _vp()
        self.driver.check(self.lib.cuGraphInstantiateWithFlags(ctypes.byref(ex), self.graph, 0),
                          "cuGraphInstantiate")  # fmt: skip
        return Exec(self.driver, self.graph, ex.value or 0, self.keep)


class Exec:
    """An instantiated graph: launch it, re-point its kernel nodes."""

    def __init__(self, driver: Any, graph: int, exec_: int, keep: list[Any]) -> None:
        self.driver = driver
        self.lib = driver.lib
        self.graph = graph
        self.exec = exec_
        self.keep = keep

    def launch(self, stream: int) -> None:
        self.driver.check(self.lib.cuGraphLaunch(self.exec, stream), "cuGraphLaunch")

    def set_kernel(self, node: int, func: int, grid: Any, block: Any, params_ptr: int) -> None:
        p = _node_params(func, grid, block, params_ptr)
        self.driver.check(self.lib.cuGraphExecKernelNodeSetParams_v2(self.exec, node, ctypes.byref(p)),
                          "cuGraphExecKernelNodeSetParams")  # fmt: skip

    def __del__(self) -> None:
        try:
            self.lib.cuGraphExecDestroy(self.exec)
            self.lib.cuGraphDestroy(self.graph)
        except Exception:
            pass
