"""Catalogue of bad inputs: each gives an error of a documented type naming the problem, and leaves
fusetree usable (nothing half-written)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fusetree as ft

A = lambda *s: ft.asarray(np.ones(s or (2, 3)))

CASES = [
    ("shape mismatch", lambda: A(2, 3) + A(4), ft.ShapeError, r"\(2, 3\) and \(4,\)"),
    ("shape mismatch 3-d", lambda: A(2, 3, 4) * A(3, 1, 5), ft.ShapeError, "multiply"),
    ("where shapes", lambda: ft.where(A(2) > 0, A(3), A(2)), ft.ShapeError, "where"),
    ("matmul inner", lambda: A(2, 3) @ A(2, 3), ft.ShapeError, "not aligned"),
    ("matmul scalar", lambda: ft.matmul(A(2, 2), 3), ft.ShapeError, "scalars"),
    ("reshape size", lambda: A(2, 3).reshape(4, 2), ft.ShapeError, "reshape"),
    ("reshape two -1", lambda: A(2, 3).reshape(-1, -1), ft.ShapeError, "unknown dimension"),
    ("negative shape", lambda: ft.zeros((-1, 2)), ft.ShapeError, "negative"),
    ("transpose axes", lambda: A(2, 3).transpose(0, 0), ft.ShapeError, "transpose"),
    ("assign broadcast", lambda: A(2, 3).__setitem__(Ellipsis, A(4)), ft.ShapeError, "could not broadcast"),
    ("index out of bounds", lambda: A(2, 3)[5], IndexError, "out of bounds"),
    ("too many indices", lambda: A(2, 3)[0, 0, 0], IndexError, "too many indices"),
    ("fancy index out of bounds", lambda: A(2, 3)[[0, 5]], IndexError, "out of bounds"),
    ("bool mask of another shape", lambda: A(2, 3)[np.ones((3, 3), bool)], IndexError, "boolean index"),
    ("float index", lambda: A(2, 3)[1.5], ft.UnsupportedError, "invalid index"),
    (
        "complex floor",
        lambda: ft.floor(ft.asarray(np.ones(2, np.complex64))),
        ft.DTypeError,
        "floor.*complex64",
    ),
    ("complex var", lambda: ft.var(ft.asarray(np.ones(2, np.complex64))), ft.DTypeError, "complex"),
    ("object dtype", lambda: ft.asarray(np.array([object()])), ft.DTypeError, "object"),
    ("string dtype", lambda: ft.asarray(np.array(["a", "b"])), ft.DTypeError, "<U1"),
    (
        "datetime dtype",
        lambda: ft.asarray(np.array(["2020-01-01"], "datetime64[D]")),
        ft.DTypeError,
        "datetime64",
    ),
    ("bad astype", lambda: A(2).astype(np.str_), ft.DTypeError, "<U"),
    ("not a dtype", lambda: A(2).astype("nonsense"), ft.DTypeError, "nonsense"),
    ("string object", lambda: ft.asarray("hello"), ft.UnsupportedError, "str"),
    ("None", lambda: ft.asarray(None), ft.UnsupportedError, "NoneType"),
    ("dict", lambda: ft.asarray({1: 2}), ft.UnsupportedError, "dict"),
    ("float invert", lambda: ~A(2), ft.DTypeError, "invert"),
    ("bool negative", lambda: -ft.asarray(np.ones(2, bool)), ft.DTypeError, "negative"),
    ("float bitwise", lambda: A(2) & A(2), ft.DTypeError, "bitwise_and"),
    ("int overflow scalar", lambda: ft.asarray(np.ones(2, np.int8)) + 300, OverflowError, "int8"),
    ("huge python int", lambda: A(2) * 2**70, OverflowError, "int64"),
    (
        "mixed devices",
        lambda: A(2) + ft.asarray(np.ones(2), device="cuda-sim"),
        ft.DeviceError,
        "different devices",
    ),
    ("unknown device", lambda: ft.zeros(2, device="tpu"), ft.DeviceError, "unknown device"),
    ("unknown option", lambda: ft.options(fusion=False).__enter__(), TypeError, "unknown fusetree option"),
    ("wrong arity", lambda: ft.exp(A(2), A(2)), TypeError, "exp"),
    ("len of 0-d", lambda: len(ft.asarray(np.array(1.0))), TypeError, "0-d"),
    ("reduce axis out of range", lambda: A(2, 3).sum(axis=2), ft.ShapeError, "axis 2 is out of bounds"),
    ("reduce duplicate axis", lambda: A(2, 3).max(axis=(1, -1)), ft.ShapeError, "duplicate value"),
    ("reduce float axis", lambda: A(2, 3).sum(axis=1.0), ft.UnsupportedError, "axis must be an int"),
    ("argmax tuple axis", lambda: A(2, 3).argmax(axis=(0, 1)), ft.UnsupportedError, "argmax"),
    ("max of empty", lambda: ft.zeros((3, 0)).max(axis=1), ft.ShapeError, "zero-size array"),
    ("argmin of empty", lambda: ft.zeros((0,)).argmin(), ft.ShapeError, "argmin"),
    ("reduce 0-d axis", lambda: ft.asarray(np.float32(1)).sum(axis=0), ft.ShapeError, "dimension 0"),
]


@pytest.mark.parametrize("name,fn,exc,match", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()
    # fusetree still works afterwards
    assert (A(2) * 2).numpy().tolist() == [2.0, 2.0]


def test_catalogue_size():
    assert len(CASES) >= 30


def test_failed_assignment_writes_nothing():
    buf = np.arange(6.0).reshape(2, 3)
    x = ft.asarray(buf)
    with pytest.raises(ft.ShapeError):
        x[...] = ft.asarray(np.ones(4))
    np.testing.assert_array_equal(buf, np.arange(6.0).reshape(2, 3))


def test_zero_size_and_0d_arrays():
    z = ft.asarray(np.ones((0, 5), np.float32))
    assert (ft.tanh(z) * 2).numpy().shape == (0, 5)
    s = ft.asarray(np.float32(3.0))
    assert float(s * s + 1) == 10.0


def test_kernel_cache_is_bounded(rng):
    with ft.options(max_cached_kernels=4):
        x = ft.asarray(rng.standard_normal(3))
        for k in range(10):
            y = x
            for _ in range(k + 1):
                y = ft.sin(y)  # a new structure each time
            y.numpy()
        assert ft.cache_info()["entries"] <= 4


def test_kernel_cache_evicts_the_least_recently_used(rng):
    x = ft.asarray(rng.standard_normal(3))
    with ft.options(max_cached_kernels=3):
        ft.clear_cache()
        ft.cos(x).numpy()  # A
        ft.sin(x).numpy()  # B
        ft.cos(x).numpy()  # A again: now the most recent
        ft.exp(x).numpy()  # C
        ft.tanh(x).numpy()  # D: evicts B, not A
        ft.reset_stats()
        ft.cos(x).numpy()
        assert ft.stats()["compiles"] == 0
        ft.sin(x).numpy()
        assert ft.stats()["compiles"] == 1


def test_concurrent_evaluation_from_8_threads(rng):
    data = [rng.standard_normal((16, 8)) for _ in range(8)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            x = ft.asarray(data[i])
            for _ in range(20):
                got = (ft.tanh(x * 2.0) + ft.exp(x[:, ::-1]) / 3).numpy()
                np.testing.assert_allclose(got, np.tanh(data[i] * 2) + np.exp(data[i][:, ::-1]) / 3)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
