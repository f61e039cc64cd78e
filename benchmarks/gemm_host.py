"""Host µs per GEMM call for the small LSTM shapes (and a tiny one, where the GPU time is below the
host time): fusetree's cuBLASLt path (descriptors and algorithm cached per problem) and its cuBLAS
path (ctypes, own handle) vs CuPy matmul and CuPy's cuBLAS wrapper."""

from __future__ import annotations

import statistics
import time

import numpy as np


def main() -> None:
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    sync = cp.cuda.Device().synchronize
    rows = []
    for m, k, n in [(128, 512, 2048), (64, 512, 2048), (16, 64, 256)]:
        a = cp.random.random((m, k), dtype=cp.float32)
        b = cp.random.random((k, n), dtype=cp.float32)
        c = cp.empty((m, n), cp.float32)
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        h = cp.cuda.device.get_cublas_handle()

        def direct_set():
            cublas.setStream(h, cp.cuda.get_current_stream().ptr)
            cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
            cublas.sgemm(
                h,
                0,
                0,
                n,
                m,
                k,
                one.ctypes.data,
                b.data.ptr,
                n,
                a.data.ptr,
                k,
                zero.ctypes.data,
                c.data.ptr,
                n,
            )

        op, zp = one.ctypes.data, zero.ctypes.data

        def direct():
            cublas.sgemm(h, 0, 0, n, m, k, op, b.data.ptr, n, a.data.ptr, k, zp, c.data.ptr, n)

        import fusetree as ft
        from fusetree import backends

        be = backends.get("cuda")
        fa, fb = ft.asarray(a), ft.asarray(b)
        lt = be._lt if be._lt is not None else be._make_lt()

        def via_cublas():
            be._lt = False
            try:
                be.gemm(a, b, out=c)
            finally:
                be._lt = lt

        be.gemm(a, b, out=c)  # the problem's plan, made once
        fast = be._gemm_fast.get((a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype))
        stream_ptr = cp.cuda.get_current_stream().ptr
        c_ptr, a_ptr, b_ptr = c.data.ptr, a.data.ptr, b.data.ptr

        def lt_only():  # (through fusetree._native.call_c when built, else ctypes)
            lt.matmul(fast.plan, fast.one, b_ptr, a_ptr, fast.zero, c_ptr, stream_ptr)

        def lt_ctypes():
            p = fast.plan
            la, lb, lc = p.layouts
            lt.matmul_fn(lt.handle, p.desc, fast.one, b_ptr, la, a_ptr, lb, fast.zero, c_ptr, lc, c_ptr, lc,
                         p.algo_ptr, lt.workspace, lt.cublas.WORKSPACE, stream_ptr)  # fmt: skip

        variants = {
            "fusetree backend gemm(out=) (cuBLASLt, plan cached)": lambda: be.gemm(a, b, out=c),
            "fusetree backend gemm(out=) (ctypes cuBLAS)": via_cublas,
            "fusetree backend gemm (allocates)": lambda: be.gemm(a, b),
            "fusetree eager (fa @ fb).data": lambda: (fa @ fb).data,
            "cp.matmul": lambda: cp.matmul(a, b),
            "cp.matmul(out=)": lambda: cp.matmul(a, b, out=c),
            "sgemm + setStream + pointer mode": direct_set,
            "sgemm only (addresses prebuilt)": direct,
        }
        if fast is not None:
            how = "C call_c" if lt._call_c is not None else "ctypes"
            variants[f"cuBLASLt call alone (plan and pointers prebuilt, {how})"] = lt_only
            variants["cuBLASLt call alone (plan and pointers prebuilt, ctypes)"] = lt_ctypes
        for name, fn in variants.items():
            for _ in range(50):
                fn()
            sync()
            ts = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(500):
                    fn()
                sync()
                ts.append((time.perf_counter() - t) / 500 * 1e6)
            rows.append((f"{m}x{k}x{n}", name, statistics.median(ts)))
        cp.testing.assert_allclose(c, a @ b, rtol=1e-4)
    print("\n| shape | path | µs per call (host, synced at end) |\n|---|---|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} |")


if __name__ == "__main__":
    main()
