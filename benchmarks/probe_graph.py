"""Probe (H200): explicit CUDA graphs through the driver API with fusetree's kernels - build, child
graphs from stream capture (cuBLAS), instantiate, launch, patch kernel-node parameters."""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np

sys.path.insert(0, ".")


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]  # fmt: skip


def main() -> None:
    import cupy as cp

    import fusetree as ft
    from fusetree import backends
    from fusetree.engine import kernels

    be = backends.get("cuda")
    lib = be.driver.lib
    vp = ctypes.c_void_p
    x = cp.arange(16, dtype=cp.float32)
    (ft.asarray(x) * 2.0).numpy()
    k = list(kernels._CACHE.values())[-1]
    print("kernel", k.name, k.packer.format, "block", k.block)
    out = cp.empty(16, cp.float32)
    out2 = cp.empty(16, cp.float32)
    x2 = cp.arange(16, dtype=cp.float32) * 10
    prm = be.param_buffer(k, [x.data.ptr, 2.0, out.data.ptr, 16, 16])

    def check(name: str, res: int) -> None:
        if res != 0:
            s = ctypes.c_char_p()
            lib.cuGetErrorString(res, ctypes.byref(s))
            raise RuntimeError(f"{name}: {res} {s.value}")

    g = vp()
    check("cuGraphCreate", lib.cuGraphCreate(ctypes.byref(g), 0))
    p = KernelNodeParams(k.func, 1, 1, 1, k.block, 1, 1, 0, prm[2], None, None, None)
    node = vp()
    lib.cuGraphAddKernelNode_v2.argtypes = [
        ctypes.POINTER(vp),
        vp,
        vp,
        ctypes.c_size_t,
        ctypes.POINTER(KernelNodeParams),
    ]
    check(
        "cuGraphAddKernelNode_v2",
        lib.cuGraphAddKernelNode_v2(ctypes.byref(node), g, None, 0, ctypes.byref(p)),
    )
    # a child graph from stream capture: a cuBLAS GEMM through fusetree's handle
    a = cp.random.random((64, 32), dtype=cp.float32)
    b = cp.random.random((32, 48), dtype=cp.float32)
    c = cp.empty((64, 48), cp.float32)
    be.gemm(a, b, out=c)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        be.gemm(a, b, out=c)
        cg = s.end_capture()
    print("cupy Graph attrs", [n for n in dir(cg) if not n.startswith("__")])
    child_handle = getattr(cg, "graph", None)
    print("child handle", child_handle)
    deps = (vp * 1)(node.value)
    child = vp()
    lib.cuGraphAddChildGraphNode.argtypes = [ctypes.POINTER(vp), vp, vp, ctypes.c_size_t, vp]
    check(
        "cuGraphAddChildGraphNode",
        lib.cuGraphAddChildGraphNode(ctypes.byref(child), g, deps, 1, child_handle),
    )
    ex = vp()
    lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_ulonglong]
    check("cuGraphInstantiateWithFlags", lib.cuGraphInstantiateWithFlags(ctypes.byref(ex), g, 0))
    stream = cp.cuda.get_current_stream().ptr
    lib.cuGraphLaunch.argtypes = [vp, vp]
    check("cuGraphLaunch", lib.cuGraphLaunch(ex, stream))
    cp.cuda.Device().synchronize()
    print(
        "kernel node ok:",
        bool(cp.allclose(out, x * 2)),
        "gemm child ok:",
        bool(cp.allclose(c, a @ b, rtol=1e-4)),
    )
    # patch the kernel node: new input and output pointers
    prm2 = be.param_buffer(k, [x2.data.ptr, 2.0, out2.data.ptr, 16, 16])
    p2 = KernelNodeParams(k.func, 1, 1, 1, k.block, 1, 1, 0, prm2[2], None, None, None)
    lib.cuGraphExecKernelNodeSetParams_v2.argtypes = [vp, vp, ctypes.POINTER(KernelNodeParams)]
    check(
        "cuGraphExecKernelNodeSetParams_v2", lib.cuGraphExecKernelNodeSetParams_v2(ex, node, ctypes.byref(p2))
    )
    check("cuGraphLaunch", lib.cuGraphLaunch(ex, stream))
    cp.cuda.Device().synchronize()
    print("patched ok:", bool(cp.allclose(out2, x2 * 2)))
    # costs
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        lib.cuGraphExecKernelNodeSetParams_v2(ex, node, ctypes.byref(p2))
    cp.cuda.Device().synchronize()
    print(f"setparams {((time.perf_counter() - t) / n * 1e6):.2f} us")
    t = time.perf_counter()
    for _ in range(n):
        lib.cuGraphLaunch(ex, stream)
    cp.cuda.Device().synchronize()
    print(f"graph launch (2 nodes) {((time.perf_counter() - t) / n * 1e6):.2f} us")
    t = time.perf_counter()
    for _ in range(n):
        be.launch_params(k, prm, 1, k.block)
    cp.cuda.Device().synchronize()
    print(f"prepared cuLaunchKernel {((time.perf_counter() - t) / n * 1e6):.2f} us")
    print("PROBE OK", np.float32(0))


if __name__ == "__main__":
    main()
