"""CUDA target without a GPU: every op and layout class compiles to sm_90 PTX with the pointer ABI."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusetree as ft
from fusetree.ir.ops import OPS

cuda = pytest.importorskip("numba.cuda")

DTYPE_FOR = {
    "invert": "int32",
    "left_shift": "int64",
    "right_shift": "uint16",
    "bitwise_and": "int32",
    "bitwise_or": "uint8",
    "bitwise_xor": "int8",
}


def _ptx_params(ptx: str) -> int:
    m = re.search(r"\.entry\s+[^\s(]+\s*\((.*?)\)", ptx, re.S)
    assert m, "no .entry"
    return m.group(1).count(".param")


@pytest.mark.parametrize("name", sorted(n for n in OPS if n != "astype"))
def test_every_op_compiles_to_ptx(name):
    d = OPS[name]
    dt = DTYPE_FOR.get(name, "float32")
    args = [
        ft.asarray(np.ones((4, 8), dt))[:, ::2] if k == 0 else ft.asarray(np.ones(4, dt))
        for k in range(d.arity)
    ]
    if name == "where":
        args[0] = ft.asarray(np.ones((4, 4), bool))
    e = ft.explain(ft.FUNCTIONS_BY_NAME[name](*args), target="cuda")
    (k,) = e.kernels
    assert ".version" in k.ptx and ".target sm_90" in k.ptx
    sig = re.search(r"# signature: \w+\((.*)\)", k.source).group(1).split(", ")
    assert _ptx_params(k.ptx) == len(sig)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint64", "float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["C", "I", "R", "S"])
def test_layouts_and_dtypes_compile(dtype, layout):
    base = np.ones((6, 8), dtype)
    view = {"C": base, "I": base[::2], "R": np.broadcast_to(base[:, :1], (6, 8)), "S": base[:, ::-2]}[layout]
    x = ft.asarray(view)
    y = ft.where(x > 0, x, 0) if dtype != "bool" else x & True
    e = ft.explain(y.astype(np.float32) * 2.5 + 1, target="cuda")
    (k,) = e.kernels
    assert f"[{layout}]" in k.source
    assert _ptx_params(k.ptx) == len(re.search(r"# signature: \w+\((.*)\)", k.source).group(1).split(", "))
    if layout == "C":
        assert "flat=True" in k.source and "i0" not in k.source.split("def ")[1]


def test_lstm_cell_ptx_is_one_kernel():
    B, H = 4, 8
    g = ft.asarray(np.ones((B, 4 * H), np.float32))
    c = ft.asarray(np.ones((B, H), np.float32))

    def step():
        i, f, o, gg = (ft.sigmoid(g[:, k * H : (k + 1) * H]) for k in range(4))
        c2 = f * c + i * ft.tanh(gg)
        return o * ft.tanh(c2), c2, i

    h2, c2, i = step()
    e = ft.explain(h2, c2, target="cuda")  # i is still held: stored by the same kernel
    assert len(e.kernels) == 1 and e.kernels[0].outputs == 3
    del i
    e = ft.explain(h2, c2, target="cuda")
    assert len(e.kernels) == 1 and e.kernels[0].outputs == 2
    assert "__nv_expf" in e.kernels[0].ptx or "ex2.approx" in e.kernels[0].ptx


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_horizontal_kernel_compiles_to_ptx(dtype):
    """The multi-tensor AdamW kernel (deferred stores of m, v, p; a 0-d coefficient read once per
    chunk) for CUDA: base pointers, the chunk table, a block per row."""
    from fusetree import backends, codegen
    from fusetree.engine import horizontal

    p, g, m, v = (ft.asarray(np.ones(8, dtype)) for _ in range(4))
    c = ft.asarray(np.ones((), dtype))
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * (g * g)
    p2 = p - c * m2 / (ft.sqrt(v2) + 1e-8)
    nodes = [x._node for x in (m2, v2, p2)]
    hm = horizontal.key_of([(n, x.data, None) for n, x in zip(nodes, (m, v, p))], (8,), "cpu")
    assert hm is not None
    key = hm[0]
    assert "B" in key[3] and key[3].count("C") == 1 and {"O0", "O1", "O2"} <= set(key[3]), key[3]
    spec = horizontal._spec(nodes, key[3], "cuda", "cuda/test")
    tgt, ptx_fn = backends.codegen_target("cuda")
    src, params = codegen.render(spec, tgt)
    assert "cuda.blockIdx.x" in src and params[-3:] == ["tab", "nrows", "ncols"]
    ptx = ptx_fn(spec, src)[0]
    assert _ptx_params(ptx) == len(params)


def _wide(ptx: str, op: str) -> list[str]:
    """The 8- and 16-byte global accesses (``ld``/``st``) in ``ptx``."""
    return re.findall(rf"{op}\.global(?:\.nc)?\.v[24]\.(?:u32|b32|f32|u16|b16|f16|f64|u64)", ptx)


def test_wide_global_accesses_in_ptx():
    """Contiguous float16 kernels, row-broadcast kernels and a row softmax load and store with
    16-byte (or 8-byte) global accesses."""
    h = [ft.asarray(np.ones(64, np.float16)) for _ in range(3)]
    (k,) = ft.explain(h[0] * h[1] + ft.exp(h[2]), target="cuda").kernels
    assert "vld8" in k.source
    assert any(".v4.u32" in x for x in _wide(k.ptx, "ld")) and _wide(k.ptx, "st"), k.ptx
    x = ft.asarray(np.ones((8, 256), np.float32))
    bias = ft.asarray(np.ones(256, np.float32))
    (k,) = ft.explain(ft.maximum(x + bias, 0) * 2, target="cuda").kernels
    assert "flat=False" in k.source and _wide(k.ptx, "ld") and _wide(k.ptx, "st")
    (k,) = ft.explain(ft.softmax(x, -1), target="cuda").kernels
    assert "ld.global.v4.f32" in k.ptx and "st.global.v4.f32" in k.ptx


def test_horizontal_kernel_wide_accesses_in_ptx():
    """A horizontal (multi-tensor) AdamW-like kernel compiles for CUDA with 16-byte loads and stores
    of its chunks (float32 and float16); the leaves updated in place are recognized as such."""
    from fusetree import backends, codegen
    from fusetree.engine import horizontal

    tgt, ptx_fn = backends.codegen_target("cuda")
    for dt, width in ((np.float32, 4), (np.float16, 8)):
        P = [ft.asarray(np.ones(n, dt)) for n in (5, 9)]
        M = [ft.asarray(np.zeros(n, dt)) for n in (5, 9)]
        G = [ft.asarray(np.ones(n, dt)) for n in (5, 9)]
        horizontal._SPECS.clear()
        with ft.options(defer_stores=True):
            for p, m, g in zip(P, M, G):
                m[...] = 0.9 * m + g
                p -= 0.5 * m
        ft.synchronize()
        (spec,) = horizontal._SPECS.values()
        assert sorted(lf.layout for lf in spec.leaves if lf.kind == "buffer") == ["C", "O0", "O1"], (
            spec.leaves
        )
        src, _ = codegen.render(spec, tgt)
        assert f"vld{width}(" in src and f"vst{width}(" in src, src
        ptx = ptx_fn(spec, src)[0]
        assert _wide(ptx, "ld") and _wide(ptx, "st"), ptx


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tiled_kernels_compile_at_both_tile_sizes(dtype):
    """Kernels reading a transposed input compile for CUDA: a wide path (64 x 64 tiles, the
    transposed input and the other arrays read with 16-byte float32 / 8-byte float16 accesses)
    and a scalar path with 32 or 64 tiles (64: two columns and eight rows per thread); without
    wide accesses only the scalar path; another size is refused with the option's name."""
    x, b = (ft.asarray(np.ones((8, 8), dtype)) for _ in range(2))
    for tile, cols in ((32, 1), (64, 2)):
        with ft.options(cuda_tile=tile):
            (k,) = ft.explain(x.T + b, target="cuda").kernels
        assert "cuda.shared.array((64, 65)" in k.source  # the larger of the two paths' tiles
        assert ("J_1 = " in k.source) == (cols == 2)
        assert "vld4(in0, " in k.source and "vld4(in1, " in k.source and "vst4(out0, " in k.source
        assert "bar.sync" in k.ptx
        wide = r"ld\.global\.v4\.f32" if dtype == np.float32 else r"ld\.global\.(?:v4\.u16|v2\.u32)"
        assert len(re.findall(wide, k.ptx)) >= 2, k.ptx  # both inputs, 16 / 8 bytes a load
        assert "ld.global.b32" not in k.ptx  # (float16 quads once split into two 4-byte loads)
    with ft.options(cuda_vector=False):
        (k,) = ft.explain(x.T + b, target="cuda").kernels
    assert "cuda.shared.array((32, 33)" in k.source and "vld" not in k.source
    with ft.options(cuda_tile=48), pytest.raises(ValueError, match="cuda_tile"):
        ft.explain(x.T + b, target="cuda")


@pytest.mark.parametrize("route", ["python", "c"])
def test_launch_plumbing_without_a_gpu(monkeypatch, route):
    """The CUDA backend's host side of a launch, with the driver call stubbed: a flat elementwise
    launch packs outputs and sizes in the ABI's order and takes elementwise_config's grid; a
    refused launch becomes DeviceError naming the kernel and the driver's code; no current context
    (201) is made current and retried once. ``route``: struct + CuPy's launchKernel, or the C
    accelerator's pack_launch calling a stand-in for cuLaunchKernel."""
    import ctypes
    import struct

    from cupy_backends.cuda.api.driver import CUDADriverError

    from fusetree.backends import cuda as cb
    from fusetree.errors import DeviceError
    from fusetree.ir import node as nm

    if route == "c" and nm.NATIVE is None:
        pytest.skip("fusetree._native is not built")
    calls: list[tuple] = []
    fail: list[int] = []

    def fake_launch(*args):
        calls.append(args)
        if fail:
            e = CUDADriverError.__new__(CUDADriverError)
            e.status = fail.pop(0)
            raise e

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p)  # fmt: skip

    def fake_driver(*args):  # (cuLaunchKernel's C signature; extra is NULL)
        calls.append((*args[:-1], 0 if args[-1] is None else args[-1]))
        return fail.pop(0) if fail else 0

    class _Stream:
        ptr = 1234

    class _Lib:
        def cuCtxSetCurrent(self, ctx):
            calls.append(("set", ctx))
            return 0

    class _Driver:
        lib = _Lib()

        def check(self, res, what):
            if res:
                raise DeviceError(f"CUDA driver error {res} in {what}: stub")

    class _Out:  # a C-contiguous output: only its pointer is read
        class data:
            ptr = 4096

    monkeypatch.setattr(cb, "launch_kernel", fake_launch)
    monkeypatch.setattr(cb, "_current_stream", lambda: _Stream())
    be = object.__new__(cb.CUDABackend)
    be.driver, be.ctx, be.sms, be._pack = _Driver(), 77, 132, None
    prev = None
    if route == "c":
        callback = proto(fake_driver)
        prev = nm.NATIVE.set_launcher(ctypes.cast(callback, ctypes.c_void_p).value)
        be._pack = nm.NATIVE.pack_launch
    k = object.__new__(cb.CUDAKernel)
    k.func, k.block, k.max_blocks, k.per_thread, k.flat, k.tile, k.name = 5, 256, 264, 4, True, 0, "ft_test"
    k.calls = {}
    k.packer = struct.Struct("=QQqq")
    k.fmt = b"QQqq"
    k.buf = ctypes.create_string_buffer(k.packer.size)
    k.bufaddr = ctypes.addressof(k.buf)
    k.params = (ctypes.c_void_p * 4)(*[ctypes.addressof(k.buf) + 8 * j for j in range(4)])
    k.args = ctypes.addressof(k.params)
    try:
        for shape in [(10,), (3, 1000), (1 << 20,), (), (0, 5)]:
            calls.clear()
            be.launch(k, [111], [_Out()], ("C",), shape)
            n = int(np.prod(shape))
            grid, block = be.elementwise_config(k, shape, n)  # ints for a flat kernel
            assert calls == [(5, grid, 1, 1, block, 1, 1, 0, 1234, k.args, 0)], shape
            assert k.packer.unpack_from(k.buf) == (111, 4096, n, n)  # input, output, size, size

        calls.clear()
        fail[:] = [201]  # no current context: made current, retried (through CuPy's launchKernel)
        be.launch(k, [111], [_Out()], ("C",), (10,))
        assert [c[0] for c in calls] == [5, "set", 5] and calls[1] == ("set", 77)
        fail[:] = [1]
        with pytest.raises(DeviceError, match=re.escape("cuLaunchKernel(ft_test)")):
            be.launch(k, [111], [_Out()], ("C",), (10,))
        params = be.param_buffer(k, [1, 2, 3, 4], grid=7, block=64)
        calls.clear()
        be.launch_params(params)
        assert calls == [(5, 7, 1, 1, 64, 1, 1, 0, 1234, params.ptr, 0)]
        if route == "c":  # realize_hit's launch (cuda_launch): the same call, packing and errors
            be.pack_direct = True
            for shape in [(10,), (3, 1000), (1 << 20,)]:  # launch shapes memoized by be.launch above
                n = int(np.prod(shape))
                calls.clear()
                k.buf[:] = b"\xff" * len(k.buf)
                args = [111]
                assert nm.NATIVE.cuda_launch(be, k, args, [_Out()], ("C",), shape) is True
                grid, block = be.elementwise_config(k, shape, n)
                assert calls == [(5, grid, 1, 1, block, 1, 1, 0, 1234, k.args, 0)], shape
                assert k.packer.unpack_from(k.buf) == (111, 4096, n, n) and args == [111, 4096, n, n]
            fail[:] = [201]  # retried after making the context current
            calls.clear()
            assert nm.NATIVE.cuda_launch(be, k, [111], [_Out()], ("C",), (10,)) is True
            assert [c[0] for c in calls] == [5, "set", 5]
            fail[:] = [1]
            args = [111]
            with pytest.raises(DeviceError, match=re.escape("cuLaunchKernel(ft_test)")):
                nm.NATIVE.cuda_launch(be, k, args, [_Out()], ("C",), (10,))
            assert args == [111]
            calls.clear()
            for case in [((5, 7), ("C",), True), ((11,), ("C",), True), ((10,), ("F",), True),
                         ((10,), ("C",), False)]:  # fmt: skip
                shape, lay, direct = case
                be.pack_direct = direct
                args = [111]
                assert nm.NATIVE.cuda_launch(be, k, args, [_Out()], lay, shape) is False, case  # be.launch's
                assert args == [111] and calls == []
            # a row kernel (3-D shape: rows x inner axis): the shape's extents, keyed by shape
            be.pack_direct = True
            k.flat = False
            k.fmt = b"QQqqqq"
            k.packer = struct.Struct("=QQqqqq")
            k.buf = ctypes.create_string_buffer(k.packer.size)
            k.bufaddr = ctypes.addressof(k.buf)
            k.params = (ctypes.c_void_p * 6)(*[ctypes.addressof(k.buf) + 8 * j for j in range(6)])
            k.args = ctypes.addressof(k.params)
            assert nm.NATIVE.cuda_launch(be, k, [111], [_Out()], ("C",), (2, 3, 40)) is False  # not memoized
            be.launch(k, [111], [_Out()], ("C",), (2, 3, 40))
            calls.clear()
            k.buf[:] = b"\xff" * len(k.buf)
            args = [111]
            assert nm.NATIVE.cuda_launch(be, k, args, [_Out()], ("C",), (2, 3, 40)) is True
            (gx, gy), (bx, by) = be.elementwise_config(k, (2, 3, 40), 240)
            assert calls == [(5, gx, gy, 1, bx, by, 1, 0, 1234, k.args, 0)]
            assert k.packer.unpack_from(k.buf) == (111, 4096, 2, 3, 40, 240) and args == [
                111,
                4096,
                2,
                3,
                40,
                240,
            ]
    finally:
        if route == "c":
            nm.NATIVE.set_launcher(prev)


def test_reductions_recomputing_held_rows_compile_to_ptx():
    """With ``reduce_remat`` a held row's later phases recompute from the held leaves (float16 kept
    as packed pairs of one 16-byte load); ``reduce_max_registers`` caps ptxas's registers."""
    x16 = ft.asarray(np.ones((8, 256), np.float16))
    with ft.options(reduce_remat=True, reduce_max_registers=48):
        (k,) = ft.explain(ft.softmax(x16, -1), target="cuda").kernels
    assert "vld8w(in0" in k.source and "opaque(u0_0_0)" in k.source and "opaque(cl)" in k.source
    assert "ld.global.v4.u32" in k.ptx and re.search(r"\)\s*\.maxnreg 48\s*\{", k.ptx), k.ptx[:3000]
    (k,) = ft.explain(ft.softmax(x16, -1), target="cuda").kernels
    assert "opaque(" not in k.source and ".maxnreg" not in k.ptx
    x = ft.asarray(np.ones((8, 256), np.float32))
    g = ft.asarray(np.ones(256, np.float32))
    with ft.options(reduce_remat=True):
        (k,) = ft.explain(ft.layer_norm(x, g, g), target="cuda").kernels
    assert "x0_0_0 = opaque(x0_0_0)" in k.source and "st.global.v4.f32" in k.ptx


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "float16", "float32", "float64"])
def test_recomputed_held_rows_compile_for_every_width(dtype):
    """``opaque`` (the recomputation's barrier to value numbering) takes 1- to 8-byte values."""
    x = ft.asarray(np.ones((8, 256), dtype))
    e = ft.logical_and(x, x.any(-1, keepdims=True)) if dtype == "bool" else x - x.max(-1, keepdims=True)
    with ft.options(reduce_remat=True):
        (k,) = ft.explain(e, target="cuda").kernels
    assert "opaque(" in k.source and "mov.b" in k.ptx


def _f16_round_trips(ptx: str) -> int:
    """Stores of a float16 value converted three times: ``cvt.rn.f16.f32`` of a ``cvt.f32.f16`` of
    a ``cvt.rn.f16.f32`` (a value rounded to float16, widened, then converted again to be stored)."""
    defs: dict[str, tuple[str, str]] = {}
    for op, dst, src in re.findall(r"(cvt\.rn\.f16\.f32|cvt\.f32\.f16)\s+(%\w+),\s*(%\w+);", ptx):
        defs[dst] = (op, src)
    n = 0
    for op, src in defs.values():
        if op.startswith("cvt.rn") and defs.get(src, ("",))[0] == "cvt.f32.f16":
            n += defs.get(defs[src][1], ("",))[0] == "cvt.rn.f16.f32"
    return n


@pytest.mark.parametrize("case", ["exp", "softmax", "bias"])
def test_float16_results_are_rounded_once_before_their_store(case):
    """A float16 result is computed in float32 and rounded to float16 once: the store takes that
    rounding (LLVM sees fptrunc/fpext, not opaque inline PTX), not a widened copy rounded again."""
    x = ft.asarray(np.zeros((64, 256), np.float16))
    b = ft.asarray(np.zeros(256, np.float16))
    expr = {"exp": ft.exp(x), "softmax": ft.softmax(x, axis=-1), "bias": ft.maximum(x + b, 0) * 0.5}[case]
    (k,) = ft.explain(expr, target="cuda").kernels
    assert "cvt" in k.ptx or ".f16" in k.ptx
    assert _f16_round_trips(k.ptx) == 0


def test_row_kernels_shift_by_their_threads_per_row():
    """A reduction kernel finds its row and lane with shifts (threads per row: a power of two), not
    64-bit divisions, and its outermost kept index needs no modulo: a row softmax keeps at most the
    divisions of its multi-chunk and streaming paths."""
    x = ft.asarray(np.zeros((4096, 4096), np.float16))
    (k,) = ft.explain(ft.softmax(x, axis=-1), target="cuda").kernels
    assert "tsh = cuda.ffs(tpr) - 1" in k.source and "// tpr" not in k.source and "% tpr" not in k.source
    # the row's warp partials combined by a second butterfly, not a loop in every thread
    assert "k = w0 + (wl & (nw - 1))" in k.source and "range(w0" not in k.source
    assert len(re.findall(r"\b(?:div|rem)\.[su]64", k.ptx)) <= 4  # (6 before)


def test_float32_maximum_and_max_reductions_take_one_instruction():
    """NumPy's maximum/minimum (NaN propagates) of float32 are one ``max.NaN.f32``/``min.NaN.f32``
    on sm_80+ (a compare, a NaN test and a select before); other dtypes keep the compare."""
    x = ft.asarray(np.zeros((64, 256), np.float32))
    (k,) = ft.explain(ft.softmax(x, axis=-1) + ft.minimum(x, 1.0), target="cuda").kernels
    assert "max.NaN.f32" in k.ptx and "min.NaN.f32" in k.ptx
    (k,) = ft.explain(ft.maximum(x.astype(np.int32), 3), target="cuda").kernels
    assert "max.NaN" not in k.ptx
