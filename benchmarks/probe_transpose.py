"""Which kernel structure reads a transposed input at copy bandwidth: ``out = a.T + b`` over (S, S),
hand-written CUDA C variants (CuPy RawKernel) timed beside fusetree's generated kernel and a copy.

    python benchmarks/probe_transpose.py [--size 8192]

Variants (float32 and a 2-byte type; the 2-byte cases add as integers: the same memory traffic):

* ``t32``: 32x32 tile, block 32x8, one tile per block (the textbook transpose);
* ``t32_persist``: the same tile loop with a grid of 8 blocks per SM (fusetree's current shape);
* ``t64``: 64x64 tile, block 32x8 (2 columns x 8 rows per thread), one tile per block;
* ``t64_pairs`` (2-byte): 64x64 tile, block 32x8, the transposed input read as 4-byte pairs along
  its contiguous axis, the other input and the output as 4-byte pairs along theirs;
* ``t64_v4`` (float32): 64x64 tile, block 16x16, 16-byte loads of the transposed input, 16-byte
  loads and stores of the others.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SRC = r"""
template <typename T> __device__ __forceinline__ T add(T x, T y) { return x + y; }

// out[i, j] = a[j, i] + b[i, j]; a, b, out: (n, n) C-contiguous
template <typename T, int TILE, int ROWS>
__device__ __forceinline__ void tile_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                          long long n, long long I0, long long J0, T (*sh)[TILE + 1]) {
  int tx = threadIdx.x, ty = threadIdx.y;
  #pragma unroll
  for (int c = 0; c < TILE / 32; c++)
    #pragma unroll
    for (int k = 0; k < TILE / ROWS; k++) {
      long long jj = J0 + ty + k * ROWS, ii = I0 + tx + 32 * c;
      if (ii < n && jj < n) sh[ty + k * ROWS][tx + 32 * c] = a[jj * n + ii];
    }
  __syncthreads();
  #pragma unroll
  for (int c = 0; c < TILE / 32; c++)
    #pragma unroll
    for (int k = 0; k < TILE / ROWS; k++) {
      long long i = I0 + ty + k * ROWS, j = J0 + tx + 32 * c;
      if (i < n && j < n) out[i * n + j] = add(sh[tx + 32 * c][ty + k * ROWS], b[i * n + j]);
    }
}

template <typename T, int TILE>
__device__ void one_per_block(const T* a, const T* b, T* out, long long n) {
  __shared__ T sh[TILE][TILE + 1];
  tile_body<T, TILE, 8>(a, b, out, n, (long long)blockIdx.y * TILE, (long long)blockIdx.x * TILE, sh);
}

template <typename T>
__device__ void persist(const T* a, const T* b, T* out, long long n) {
  __shared__ T sh[32][33];
  long long t = (n + 31) / 32, ntiles = t * t;
  for (long long tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    tile_body<T, 32, 8>(a, b, out, n, (tile / t) * 32, (tile % t) * 32, sh);
    __syncthreads();
  }
}

extern "C" __global__ void t32_f4(const float* a, const float* b, float* o, long long n) { one_per_block<float, 32>(a, b, o, n); }
extern "C" __global__ void t32_h(const unsigned short* a, const unsigned short* b, unsigned short* o, long long n) { one_per_block<unsigned short, 32>(a, b, o, n); }
extern "C" __global__ void t64_f4(const float* a, const float* b, float* o, long long n) { one_per_block<float, 64>(a, b, o, n); }
extern "C" __global__ void t64_h(const unsigned short* a, const unsigned short* b, unsigned short* o, long long n) { one_per_block<unsigned short, 64>(a, b, o, n); }
extern "C" __global__ void persist_f4(const float* a, const float* b, float* o, long long n) { persist<float>(a, b, o, n); }
extern "C" __global__ void persist_h(const unsigned short* a, const unsigned short* b, unsigned short* o, long long n) { persist<unsigned short>(a, b, o, n); }

// 2-byte: 64x64 tile, block 32x8; a read as pairs along i, b/out as pairs along j (n even)
extern "C" __global__ void t64_pairs_h(const unsigned short* __restrict__ a, const unsigned short* __restrict__ b,
                                       unsigned short* __restrict__ out, long long n) {
  __shared__ unsigned short sh[64][66];
  int tx = threadIdx.x, ty = threadIdx.y;
  long long I0 = (long long)blockIdx.y * 64, J0 = (long long)blockIdx.x * 64;
  #pragma unroll
  for (int k = 0; k < 8; k++) {
    long long jj = J0 + ty + 8 * k, ii = I0 + 2 * tx;
    if (jj < n && ii < n) {
      unsigned int p = *reinterpret_cast<const unsigned int*>(a + jj * n + ii);
      sh[ty + 8 * k][2 * tx] = (unsigned short)(p & 0xffff);
      sh[ty + 8 * k][2 * tx + 1] = (unsigned short)(p >> 16);
    }
  }
  __syncthreads();
  #pragma unroll
  for (int k = 0; k < 8; k++) {
    long long i = I0 + ty + 8 * k, j = J0 + 2 * tx;
    if (i < n && j < n) {
      unsigned int q = *reinterpret_cast<const unsigned int*>(b + i * n + j);
      unsigned short lo = sh[2 * tx][ty + 8 * k] + (unsigned short)(q & 0xffff);
      unsigned short hi = sh[2 * tx + 1][ty + 8 * k] + (unsigned short)(q >> 16);
      *reinterpret_cast<unsigned int*>(out + i * n + j) = (unsigned int)lo | ((unsigned int)hi << 16);
    }
  }
}

// float32: 64x64 tile, block 16x16; 16-byte accesses (n % 4 == 0, aligned)
extern "C" __global__ void t64_v4_f4(const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ out, long long n) {
  __shared__ float sh[64][65];
  int tx = threadIdx.x, ty = threadIdx.y;
  long long I0 = (long long)blockIdx.y * 64, J0 = (long long)blockIdx.x * 64;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    long long jj = J0 + ty + 16 * k, ii = I0 + 4 * tx;
    if (jj < n && ii < n) {
      float4 p = *reinterpret_cast<const float4*>(a + jj * n + ii);
      sh[ty + 16 * k][4 * tx] = p.x; sh[ty + 16 * k][4 * tx + 1] = p.y;
      sh[ty + 16 * k][4 * tx + 2] = p.z; sh[ty + 16 * k][4 * tx + 3] = p.w;
    }
  }
  __syncthreads();
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    long long i = I0 + ty + 16 * k, j = J0 + 4 * tx;
    if (i < n && j < n) {
      float4 q = *reinterpret_cast<const float4*>(b + i * n + j);
      int r = ty + 16 * k;
      q.x += sh[4 * tx][r]; q.y += sh[4 * tx + 1][r]; q.z += sh[4 * tx + 2][r]; q.w += sh[4 * tx + 3][r];
      *reinterpret_cast<float4*>(out + i * n + j) = q;
    }
  }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    args = ap.parse_args()
    import cupy as cp
    from bandwidth import gpu_time

    import fusetree as ft

    S = args.size
    n = S * S
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    t32 = (S + 31) // 32
    t64 = (S + 63) // 64
    variants = {
        "float32": [
            ("t32", "t32_f4", (t32, t32), (32, 8)),
            ("t32_persist", "persist_f4", (8 * sms,), (32, 8)),
            ("t64", "t64_f4", (t64, t64), (32, 8)),
            ("t64_v4", "t64_v4_f4", (t64, t64), (16, 16)),
        ],
        "float16": [
            ("t32", "t32_h", (t32, t32), (32, 8)),
            ("t32_persist", "persist_h", (8 * sms,), (32, 8)),
            ("t64", "t64_h", (t64, t64), (32, 8)),
            ("t64_pairs", "t64_pairs_h", (t64, t64), (32, 8)),
        ],
    }
    print(
        f"| variant ({S}x{S} out = a.T + b) | dtype | µs | GB/s | % of copy | check |\n|---|---|---:|---:|---:|---|"
    )
    for dt_name, vs in variants.items():
        dt = cp.dtype(dt_name)
        item = dt.itemsize
        rng = cp.random.default_rng(0)
        a = rng.standard_normal((S, S), dtype=cp.float32).astype(dt)
        b = rng.standard_normal((S, S), dtype=cp.float32).astype(dt)
        out = cp.empty((S, S), dt)
        tc = gpu_time(lambda: cp.copyto(out, a))
        copy_bw = 2 * n * item / tc / 1e9
        nbytes = 3 * n * item
        print(f"| copy | {dt_name} | {tc * 1e6:.1f} | {copy_bw:.0f} | 100.0% | |")
        fa, fb, fo = ft.asarray(a), ft.asarray(b), ft.asarray(out)

        def run_ft():
            fo[...] = fa.T + fb

        t = gpu_time(run_ft)
        print(
            f"| fusetree | {dt_name} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | {100 * nbytes / t / 1e9 / copy_bw:.1f}% | |"
        )
        if item == 2:  # integer adds of the bit patterns: the same traffic
            ua, ub, uo = a.view(cp.uint16), b.view(cp.uint16), out.view(cp.uint16)
            want = (ua.T.astype(cp.uint32) + ub).astype(cp.uint16)
        else:
            ua, ub, uo = a, b, out
            want = a.T + b
        for label, fn_name, grid, block in vs:
            k = mod.get_function(fn_name)

            def go(k=k, grid=grid, block=block):
                k(grid, block, (ua, ub, uo, cp.int64(S)))

            uo.fill(0)
            go()
            ok = bool(cp.array_equal(uo, want))
            t = gpu_time(go)
            print(f"| {label} | {dt_name} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | "
                  f"{100 * nbytes / t / 1e9 / copy_bw:.1f}% | {'ok' if ok else 'WRONG'} |")  # fmt: skip


if __name__ == "__main__":
    main()
