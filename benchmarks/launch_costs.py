"""Host cost of the CUDA calls on fusetree's launch path, one by one (µs per call, median of 7
repeats): the floor under ``benchmarks/host_overhead.py``'s rows.

    python benchmarks/launch_costs.py            # needs a CUDA GPU and CuPy
"""

from __future__ import annotations

import ctypes
import statistics
import struct
import sys
import timeit


def us(fn, n: int = 20000) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6


def main() -> None:
    import cupy as cp
    from cupy_backends.cuda.api.driver import launchKernel

    N = 4096
    a = cp.ones(N, cp.float32)
    out = cp.empty_like(a)
    rk = cp.RawKernel(
        r'extern "C" __global__ void k(const float* a, float* o, long long n)'
        r"{ long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) o[i] = a[i] * 2.0f; }",
        "k",
    )
    rk((N // 256,), (256,), (a, out, cp.int64(N)))
    fn = rk.kernel.ptr
    packer = struct.Struct("=QQq")
    buf = ctypes.create_string_buffer(packer.size)
    packer.pack_into(buf, 0, a.data.ptr, out.data.ptr, N)
    base = ctypes.addressof(buf)
    params = (ctypes.c_void_p * 3)(base, base + 8, base + 16)
    pp = ctypes.addressof(params)
    lib = ctypes.CDLL("libcuda.so.1")
    ct = lib.cuLaunchKernel
    vp, u = ctypes.c_void_p, ctypes.c_uint
    ct.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    s = cp.cuda.get_current_stream().ptr
    rows = {
        "cuLaunchKernel via ctypes (argtypes), prepacked": us(
            lambda: ct(fn, 16, 1, 1, 256, 1, 1, 0, s, pp, None)
        ),
        "cuLaunchKernel via CuPy's Cython binding, prepacked": us(
            lambda: launchKernel(fn, 16, 1, 1, 256, 1, 1, 0, s, pp, 0)
        ),
        "cupy.cuda.get_current_stream().ptr": us(lambda: cp.cuda.get_current_stream().ptr),
        "array.data.ptr": us(lambda: a.data.ptr),
        "struct.pack_into, 3 arguments": us(lambda: packer.pack_into(buf, 0, 1, 2, 3)),
        "cupy.ndarray((4096,), float32) (pool hit, freed)": us(lambda: cp.ndarray((N,), cp.float32)),
        "cupy.empty(4096, float32)": us(lambda: cp.empty(N, cp.float32)),
    }
    cp.cuda.Device().synchronize()
    for k, v in rows.items():
        print(f"| {k} | {v:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
