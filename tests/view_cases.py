"""Views described by arithmetic (``ViewLeaf``: an offset and strides of a source array, bound without
a backend view object) checked against NumPy on one device; shared by the CPU and GPU tests."""

from __future__ import annotations

import numpy as np

import fusetree as ft
from fusetree.ir.node import ViewLeaf

INDEXES = [
    np.s_[:, 8:16],
    np.s_[1:, ::2],
    np.s_[::-1, 3:],
    np.s_[2],
    np.s_[None, 1:3, ::-3],
    np.s_[-1, 5],
    np.s_[::2, 1::3],
]


def check_arithmetic_views(device: str, rng: np.random.Generator) -> int:
    """Returns the number of checks made; raises on a mismatch. Every computed output is compared
    with NumPy in float64 on fresh random inputs."""
    checks = 0
    conv = (lambda a: ft.asarray(a, device=device)) if device != "cpu" else ft.asarray
    for dtype, rtol in (("float32", 2e-5), ("float64", 1e-12)):
        x = rng.standard_normal((6, 5)).astype(dtype)
        W = rng.standard_normal((5, 32)).astype(dtype)
        h = rng.standard_normal((6, 7)).astype(dtype)
        U = rng.standard_normal((7, 32)).astype(dtype)
        b = rng.standard_normal(32).astype(dtype)
        X, Wf, Hf, Uf, bf = (conv(v) for v in (x, W, h, U, b))
        want_g = x.astype(np.float64) @ W + h.astype(np.float64) @ U + b
        for index in INDEXES:
            g = X @ Wf + Hf @ Uf + bf  # a pending GEMM sum + bias: slices are views of the GEMM output
            s = g[index]
            got = ft.tanh(s) * 2.0
            np.testing.assert_allclose(got.numpy(), np.tanh(want_g[index]) * 2.0, rtol=rtol, atol=rtol)
            checks += 1
        # the four gate slices of one step, in one expression (one GEMM output, four views)
        g = X @ Wf + Hf @ Uf + bf
        q = [g[:, 8 * k : 8 * (k + 1)] for k in range(4)]
        got = ft.sigmoid(q[0]) * q[1] + ft.tanh(q[2]) - q[3]
        w = [want_g[:, 8 * k : 8 * (k + 1)] for k in range(4)]
        np.testing.assert_allclose(got.numpy(), 1 / (1 + np.exp(-w[0])) * w[1] + np.tanh(w[2]) - w[3], rtol=rtol,
                                   atol=rtol)  # fmt: skip
        checks += 1
        # views of memory, views of views, transposes; writes to the memory seen through them
        a = rng.standard_normal((9, 12)).astype(dtype)
        A = conv(a)
        for index in INDEXES:
            v = A[index]
            np.testing.assert_allclose((v * 3.0).numpy(), a[index] * 3.0, rtol=rtol)
            vv = v[..., ::-1] if v.ndim else v
            np.testing.assert_allclose((vv + 1.0).numpy(), (a[index][..., ::-1] if v.ndim else a[index]) + 1.0,
                                       rtol=rtol)  # fmt: skip
            if v.ndim == 2:
                np.testing.assert_allclose((v.T - 1.0).numpy(), a[index].T - 1.0, rtol=rtol)
                np.testing.assert_allclose(v.T[1:].numpy(), a[index].T[1:], rtol=rtol)
            checks += 1
        v = A[1:, ::2]
        assert type(v._node) is ViewLeaf or device not in ("cpu", "cuda"), type(v._node)
        A[...] = 5.0
        a[...] = 5.0
        np.testing.assert_allclose((v * 1.0).numpy(), a[1:, ::2])
        np.testing.assert_allclose(np.asarray(v.numpy()), a[1:, ::2])
        # a view written through: the memory (and the other views) see it
        w = A[2:4, 1:5]
        w[...] = w * 0.0 + 7.0
        a[2:4, 1:5] = 7.0
        np.testing.assert_allclose(A.numpy(), a)
        np.testing.assert_allclose((A[::-1, ::3] + 0.0).numpy(), a[::-1, ::3])
        checks += 3
    # float16: slices of memory bound as views (the kernel reads 2-byte elements at the offsets)
    a16 = rng.standard_normal((8, 10)).astype(np.float16)
    A16 = conv(a16)
    for index in INDEXES[:3]:
        np.testing.assert_allclose((A16[index] * 2.0).numpy().astype(np.float64),
                                   (a16[index].astype(np.float32) * 2.0).astype(np.float16).astype(np.float64))  # fmt: skip
        checks += 1
    return checks
