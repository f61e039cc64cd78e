"""Intrinsics of the generated CUDA kernels: wide memory accesses (``vld<n>``/``vst<n>``, ``addr``),
float16 conversions LLVM can see through, and one-instruction float32 ``maximum``/``minimum``.

numba's kernel dialect has no vector loads: a kernel reading ``in0[i]``, ``in0[i + 1]``... issues one
4-byte (or 2-byte) ``ld.global`` per element, because the pointer's alignment is unknown to LLVM.
These intrinsics emit one aligned LLVM vector access instead, which NVPTX lowers to
``ld.global.v4.f32``/``v2.f64``... (16 or 8 bytes; halves and bytes go through one inline
``ld.global.v4.u32`` or ``v2.u32``, which NVPTX would split):

* ``vld<n>(ptr, i)``: elements ``i .. i+n-1`` of ``ptr`` as a tuple (the caller guarantees that
  ``ptr + i`` is aligned to ``n * itemsize`` bytes);
* ``vst<n>(ptr, i, values)``: the converse (``values``: a tuple of ``n`` numbers, cast to the
  pointer's element type);
* ``addr(ptr)``: the pointer as an int64, for the kernels' alignment check;
* ``f2h``/``h2f``/``f16_round``/``f16_round_d``: float16 conversions as LLVM ``fptrunc``/``fpext``
  (numba's are opaque inline PTX), so LLVM folds a rounding into the store that follows it;
* ``maximum``/``minimum``: NumPy's (NaN propagates), float32 in one ``max.NaN.f32``/``min.NaN.f32``.

The access goes through an integer vector of the same size (``<4 x i32>`` for 16 bytes) and a
bitcast, so float16 and bool bytes get the same wide instruction as float32. :func:`sim_namespace`
holds the same functions in plain Python for numba's CUDA simulator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

WIDTHS = (2, 4, 8)

# NVPTX splits a 16-byte load of 8 halves into two 8-byte ones: those go through inline PTX
_LD16 = "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.v4.u32 {$0, $1, $2, $3}, [g]; }"
_ST16 = "{ .reg .u64 g; cvta.to.global.u64 g, $0; st.global.v4.u32 [g], {$1, $2, $3, $4}; }"
# 8 bytes of halves likewise: LLVM turns <2 x i32> + bitcasts to half into <4 x half>, which NVPTX
# loads as two 4-byte words (the float16 transposed case's quads: 8 ld.global.b32, not 4 v4.u16)
_LD8 = "{ .reg .u64 g; cvta.to.global.u64 g, $2; ld.global.v2.u32 {$0, $1}, [g]; }"
_ST8 = "{ .reg .u64 g; cvta.to.global.u64 g, $0; st.global.v2.u32 [g], {$1, $2}; }"


def _int_vector(ir: Any, nbytes: int) -> Any:
    if nbytes >= 4:
        return ir.VectorType(ir.IntType(32), nbytes // 4) if nbytes > 4 else ir.IntType(32)
    return ir.IntType(8 * nbytes)


def cuda_namespace() -> dict[str, Any]:
    """The intrinsics, compiled by numba for the CUDA target."""
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    def words(builder, ptr, n: int = 4):  # type: ignore[no-untyped-def]
        """The ``4 n`` bytes at ``ptr`` as ``n`` (4 or 2) i32 values, through one inline
        ``ld.global.v<n>.u32``."""
        i32 = ir.IntType(32)
        fn = ir.FunctionType(ir.LiteralStructType([i32] * n), [ptr.type])
        asm, cons = (_LD16, "=r,=r,=r,=r,l") if n == 4 else (_LD8, "=r,=r,l")
        words = builder.call(ir.InlineAsm(fn, asm, cons, side_effect=False), [ptr])
        return [builder.extract_value(words, w) for w in range(n)]

    # float16 conversions as LLVM fptrunc/fpext (numba's float16() and float32() of a half are
    # opaque inline PTX): LLVM folds a rounding followed by a store, f2h(f16_round(x)) ->
    # f2h(x), one cvt instead of three per stored element
    half = ir.HalfType()

    def to_half(builder, v, ty):  # type: ignore[no-untyped-def]
        if ty == types.float64:  # through float32, as every float16 result is computed
            v = builder.fptrunc(v, ir.FloatType())
        return builder.fptrunc(v, half)

    def widen(builder, h):  # type: ignore[no-untyped-def]
        return builder.fpext(builder.bitcast(h, half), ir.FloatType())

    def vld(n: int) -> Any:
        @intrinsic
        def load(typingctx, ptr, idx):  # type: ignore[no-untyped-def]
            el = ptr.dtype
            sig = types.UniTuple(el, n)(ptr, idx)

            def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
                p, i = args
                lt = context.get_value_type(el)
                nbytes = n * context.get_abi_sizeof(lt)
                ptr = builder.gep(p, [i])
                if (nbytes == 16 and n > 4) or (nbytes == 8 and n == 4):  # halves / bytes: v4 or v2.u32
                    per = n // (nbytes // 4)
                    elems = []
                    for word in words(builder, ptr, nbytes // 4):
                        part = builder.bitcast(word, ir.VectorType(lt, per))
                        elems += [
                            builder.extract_element(part, ir.Constant(ir.IntType(32), k)) for k in range(per)
                        ]
                    return context.make_tuple(builder, sig.return_type, elems)
                iv = _int_vector(ir, nbytes)
                raw = builder.load(builder.bitcast(ptr, iv.as_pointer()), align=nbytes)
                v = builder.bitcast(raw, ir.VectorType(lt, n))
                elems = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(n)]
                return context.make_tuple(builder, sig.return_type, elems)

            return sig, codegen

        return load

    def vst(n: int) -> Any:
        @intrinsic
        def store(typingctx, ptr, idx, values):  # type: ignore[no-untyped-def]
            if not isinstance(values, types.BaseTuple) or len(values) != n:
                return None
            el = ptr.dtype
            sig = types.void(ptr, idx, values)

            def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
                p, i, tup = args
                lt = context.get_value_type(el)
                nbytes = n * context.get_abi_sizeof(lt)
                v = ir.Constant(ir.VectorType(lt, n), ir.Undefined)
                for k in range(n):
                    x = context.cast(builder, builder.extract_value(tup, k), signature.args[2][k], el)
                    v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), k))
                ptr = builder.gep(p, [i])
                if (nbytes == 16 and n > 4) or (nbytes == 8 and n == 4):  # one st.global.v4/v2.u32 (see vld)
                    i32 = ir.IntType(32)
                    nw = nbytes // 4
                    words = builder.bitcast(v, ir.VectorType(i32, nw))
                    args = [ptr] + [builder.extract_element(words, ir.Constant(i32, w)) for w in range(nw)]
                    fn = ir.FunctionType(ir.VoidType(), [a.type for a in args])
                    asm, cons = (_ST16, "l,r,r,r,r,~{memory}") if nw == 4 else (_ST8, "l,r,r,~{memory}")
                    builder.call(ir.InlineAsm(fn, asm, cons, side_effect=True), args)
                    return context.get_dummy_value()
                iv = _int_vector(ir, nbytes)
                builder.store(builder.bitcast(v, iv), builder.bitcast(ptr, iv.as_pointer()), align=nbytes)
                return context.get_dummy_value()

            return sig, codegen

        return store

    @intrinsic
    def addr(typingctx, ptr):  # type: ignore[no-untyped-def]
        sig = types.int64(ptr)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            return builder.ptrtoint(args[0], ir.IntType(64))

        return sig, codegen

    @intrinsic
    def opaque(typingctx, x):  # type: ignore[no-untyped-def]
        """``x`` through a side-effecting ``mov``: a value LLVM cannot prove equal to ``x``, so
        expressions of it are recomputed, not merged with the same expressions of ``x``."""
        sig = x(x)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            lt = context.get_value_type(signature.args[0])
            is_int = isinstance(lt, ir.IntType)  # (bool is i1, int8 i8)
            bits = lt.width if is_int else context.get_abi_sizeof(lt) * 8
            if bits > 64:
                return args[0]
            v = args[0] if is_int else builder.bitcast(args[0], ir.IntType(bits))
            wide = max(bits, 16)  # PTX moves 16, 32 or 64 bits
            if wide != bits:
                v = builder.zext(v, ir.IntType(wide))
            kind = {16: "h", 32: "r", 64: "l"}[wide]
            fn = ir.FunctionType(ir.IntType(wide), [ir.IntType(wide)])
            v = builder.call(
                ir.InlineAsm(fn, f"mov.b{wide} $0, $1;", f"={kind},{kind}", side_effect=True), [v]
            )
            if wide != bits:
                v = builder.trunc(v, ir.IntType(bits))
            return v if is_int else builder.bitcast(v, lt)

        return sig, codegen

    @intrinsic
    def vld8w(typingctx, ptr, idx):  # type: ignore[no-untyped-def]
        """8 halves at ``ptr + idx`` as 4 uint32 words (two halves each, the first in the low bits)."""
        sig = types.UniTuple(types.uint32, 4)(ptr, idx)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            p, i = args
            return context.make_tuple(builder, signature.return_type, words(builder, builder.gep(p, [i])))

        return sig, codegen

    @intrinsic
    def half_of(typingctx, word, k):  # type: ignore[no-untyped-def]
        """Half ``k`` (a literal 0 or 1) of a uint32 word, as float32."""
        if not isinstance(k, types.IntegerLiteral):
            return None
        sig = types.float32(word, k)
        hi = k.literal_value

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            v = args[0]
            if hi:
                v = builder.lshr(v, ir.Constant(ir.IntType(32), 16))
            return widen(builder, builder.trunc(v, ir.IntType(16)))

        return sig, codegen

    def conversion(accepts: tuple, ret: Any, emit: Any) -> Any:
        """A one-argument intrinsic: ``emit(builder, value, its numba type)`` for ``accepts``."""

        @intrinsic
        def convert(typingctx, x):  # type: ignore[no-untyped-def]
            if x not in accepts:
                return None

            def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
                return emit(builder, args[0], signature.args[0])

            return ret(x), codegen

        return convert

    floats = (types.float32, types.float64)
    i16 = ir.IntType(16)
    # f2h: float32 -> float16 (round to nearest even); h2f: float16 -> float32 (exact);
    # f16_round: rounded to float16, as float32; f16_round_d: float64 in one rounding
    f2h = conversion(floats, types.float16, lambda b, v, ty: b.bitcast(to_half(b, v, ty), i16))
    h2f = conversion((types.float16,), types.float32, lambda b, v, ty: widen(b, v))
    f16_round = conversion(floats, types.float32, lambda b, v, ty: b.fpext(to_half(b, v, ty), ir.FloatType()))
    f16_round_d = conversion(
        floats, types.float32, lambda b, v, ty: b.fpext(b.fptrunc(v, half), ir.FloatType())
    )

    def minmax(is_max: bool) -> Any:
        @intrinsic
        def pick(typingctx, a, b):  # type: ignore[no-untyped-def]
            """NumPy's maximum/minimum (NaN propagates; otherwise ties take ``b``): float32 in one
            ``max.NaN.f32`` (sm_80+; the compare, NaN test and select were 3 instructions)."""
            ty = typingctx.unify_types(types.unliteral(a), types.unliteral(b))
            if not isinstance(ty, (types.Integer, types.Float, types.Boolean)):
                return None
            sig = ty(a, b)

            def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
                x, y = (context.cast(builder, v, t, ty) for v, t in zip(args, signature.args))
                if ty == types.float32:
                    fn = ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 2)
                    op = "max" if is_max else "min"
                    return builder.call(ir.InlineAsm(fn, f"{op}.NaN.f32 $0, $1, $2;", "=f,f,f"), [x, y])
                if isinstance(ty, types.Float):
                    wins = builder.or_(builder.fcmp_ordered(">" if is_max else "<", x, y),
                                       builder.fcmp_unordered("uno", x, x))  # fmt: skip
                elif isinstance(ty, types.Integer) and ty.signed:  # type: ignore[attr-defined]
                    wins = builder.icmp_signed(">" if is_max else "<", x, y)
                else:
                    wins = builder.icmp_unsigned(">" if is_max else "<", x, y)
                return builder.select(wins, x, y)

            return sig, codegen

        return pick

    ns: dict[str, Any] = {"addr": addr, "opaque": opaque, "vld8w": vld8w, "half_of": half_of, "f2h": f2h,
                          "h2f": h2f, "f16_round": f16_round, "f16_round_d": f16_round_d,
                          "maximum": minmax(True), "minimum": minmax(False)}  # fmt: skip
    for n in WIDTHS:
        ns[f"vld{n}"] = vld(n)
        ns[f"vst{n}"] = vst(n)
    return ns


def sim_namespace() -> dict[str, Any]:
    """The same functions for numba's CUDA simulator (arrays are NumPy arrays there)."""

    def addr(a):  # type: ignore[no-untyped-def]
        return a.__array_interface__["data"][0]

    def vld8w(a, i):  # type: ignore[no-untyped-def]
        return tuple((a[i + 2 * k], a[i + 2 * k + 1]) for k in range(4))  # "words": pairs of halves

    def half_of(word, k):  # type: ignore[no-untyped-def]
        return np.float32(word[k])

    def f2h(x):  # type: ignore[no-untyped-def]
        return np.float16(np.float32(x))

    ns: dict[str, Any] = {"addr": addr, "opaque": lambda x: x, "vld8w": vld8w, "half_of": half_of,
                          "f2h": f2h, "h2f": np.float32}  # fmt: skip
    for n in WIDTHS:

        def load(a, i, n=n):  # type: ignore[no-untyped-def]
            return tuple(a[i + k] for k in range(n))

        def store(a, i, values, n=n):  # type: ignore[no-untyped-def]
            for k in range(n):
                a[i + k] = values[k]

        ns[f"vld{n}"] = load
        ns[f"vst{n}"] = store
    return ns
