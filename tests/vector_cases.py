"""Wide (vld/vst) paths of the CUDA kernels and their scalar fallbacks, checked against NumPy on one
device (the simulator in CI, a GPU in test_gpu): aligned and misaligned views, lengths with tails,
float16/float64/bool, negative strides, row- and column-broadcast operands, transposed inputs,
strided output views, rows held in registers; outputs poisoned before every run."""

import itertools

import numpy as np

import fusetree as ft


def _run(device, expr, arrays, out_shape, dt, out_view=None):
    """``expr`` over ``arrays`` written into a poisoned output (or a view of it), for each codegen
    option (unroll, wide accesses on/off); compared with NumPy computing ``expr`` on the arrays."""
    xs = [ft.asarray(a, device=device) for a in arrays]
    checked = 0
    poison = np.nan if np.dtype(dt).kind == "f" else 7
    want = np.full(out_shape, poison, dt)
    (want if out_view is None else out_view(want))[...] = expr(*arrays)
    for unroll, vector in ((1, True), (2, True), (1, False)):
        with ft.options(cuda_unroll=unroll, cuda_vector=vector):
            o = ft.asarray(np.full(out_shape, poison, dt), device=device)
            (o if out_view is None else out_view(o))[...] = expr(*xs)
            # the GPU contracts a * b + c into one FMA (one rounding fewer than NumPy): atol as well
            tol = 2e-3 if np.dtype(dt) == np.float16 else 1e-6
            np.testing.assert_allclose(o.numpy().astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                       err_msg=f"unroll={unroll} vector={vector} dt={dt} shape={out_shape}")  # fmt: skip
            checked += 1
    return checked


def check_elementwise(device, rng, scale=1):
    checked = 0
    for dt, n in itertools.product(("float32", "float16", "float64"), (1, 7, 16, 37 * scale)):
        a = rng.standard_normal(n + 3).astype(dt)
        b = rng.standard_normal(n + 3).astype(dt)
        for sa, sb in ((0, 0), (1, 0), (0, 3), (2, 2)):  # element offsets: misaligned views
            checked += _run(
                device, lambda x, y, sa=sa, sb=sb, n=n: x[sa : sa + n] * y[sb : sb + n] + 1, [a, b], (n,), dt
            )
        checked += _run(device, lambda x, n=n: x[::-1][:n] * 2, [a], (n,), dt)  # negative stride
    for dt in ("float32", "float16"):
        for rows, cols in ((3, 8), (5, 13), (2, 16), (4, 1), (3 * scale, 40 * scale)):
            x = rng.standard_normal((rows, cols + 4)).astype(dt)
            bias = rng.standard_normal(cols).astype(dt)
            col = rng.standard_normal((rows, 1)).astype(dt)
            xt = rng.standard_normal((cols, rows)).astype(dt)
            c = cols
            cases = [
                (lambda x, b, k: x[:, :c] * b + k, [x, bias, col], None),  # row and column broadcast
                (lambda x, b, k: x[:, 1 : c + 1] + b - k, [x, bias, col], None),  # misaligned rows
                (lambda x, b, k: x[::-1, :c] * b, [x, bias, col], None),  # negative row stride
                (lambda t, b: t.T * 2 + b[0], [xt, bias], None),  # transposed input
                (lambda x, b: x[:, :c] + b, [x, bias], lambda o: o[:, 2 : c + 2]),  # strided output view
            ]
            for expr, arrays, view in cases:
                shape = (rows, cols + 4) if view is not None else (rows, cols)
                checked += _run(device, expr, arrays, shape, dt, view)
    checked += check_transposed(device, rng)
    # mixed widths: float16 in, float32 and bool out; a 3-D shape; a float16 view with a tail
    h = rng.standard_normal((2, 3, 12)).astype(np.float16)
    f = rng.standard_normal((2, 3, 12)).astype(np.float32)
    checked += _run(device, lambda h, f: h.astype(np.float32) * f, [h, f], (2, 3, 12), "float32")
    checked += _run(device, lambda h, f: h.astype(np.float32) > f, [h, f], (2, 3, 12), "bool")
    checked += _run(device, lambda h, f: h[:, :, 1:] * 2, [h, f], (2, 3, 11), "float16")
    return checked


def check_transposed(device, rng, big=False):
    """Transposed inputs (shared-memory tiles): several tiles with ragged edges, a batch axis, a
    transposed view of a strided array, two transposed inputs and a transposed output view;
    ``big``: a shape spanning several 64-wide tiles too."""
    checked = 0
    for dt in ("float32", "float16"):
        t2 = rng.standard_normal((45, 37)).astype(dt)
        y = rng.standard_normal((37, 45)).astype(dt)
        t3 = rng.standard_normal((2, 9, 35)).astype(dt)
        y3 = rng.standard_normal((2, 35, 9)).astype(dt)
        checked += _run(device, lambda t, y: t.T * y - 1, [t2, y], (37, 45), dt)
        checked += _run(device, lambda t, y: t.transpose(0, 2, 1) + y, [t3, y3], (2, 35, 9), dt)
        checked += _run(device, lambda t, y: t[::2].T + y[:, :23], [t2, y], (37, 23), dt)
        checked += _run(device, lambda t, y: t.T + y.T.T * t.T, [t2, y], (37, 45), dt)
        checked += _run(device, lambda t, y: t.T + y, [t2, y], (45, 37), dt, out_view=lambda o: o.T)
        if big:
            tb = rng.standard_normal((130, 70)).astype(dt)
            yb = rng.standard_normal((70, 130)).astype(dt)
            checked += _run(device, lambda t, y: t.T * y + 1, [tb, yb], (70, 130), dt)
    checked += check_transposed_wide(device, rng, big)
    return checked


def check_transposed_wide(device, rng, big=False):
    """The tiled kernels' wide path (sizes multiples of the vector width: 4 elements, 2 for
    float64) and its scalar fallback in the same kernel (a misaligned pointer, a row stride not a
    multiple of the width): a partial tile, a batch axis, two transposed inputs, a transposed output
    view; ``big``: several 64-wide float32 tiles with a partial one."""
    checked = 0
    for dt in ("float32", "float16", "float64"):
        t = rng.standard_normal((44, 36)).astype(dt)
        y = rng.standard_normal((36, 44)).astype(dt)
        u = rng.standard_normal((44, 36)).astype(dt)
        t3 = rng.standard_normal((2, 8, 12)).astype(dt)
        y3 = rng.standard_normal((2, 12, 8)).astype(dt)
        wide = rng.standard_normal((44, 41)).astype(dt)
        checked += _run(device, lambda t, y: t.T * y - 1, [t, y], (36, 44), dt)
        checked += _run(device, lambda t, y: t.transpose(0, 2, 1) + y, [t3, y3], (2, 12, 8), dt)
        checked += _run(device, lambda t, u, y: t.T + u.T * y, [t, u, y], (36, 44), dt)
        checked += _run(device, lambda t, y: t.T + y.T.T, [t, y], (44, 36), dt, out_view=lambda o: o.T)
        checked += _run(device, lambda w, y: w[:, 1:37].T + y, [wide, y], (36, 44), dt)  # misaligned pointer
        checked += _run(device, lambda w, y: w[:, :36].T * y, [wide, y], (36, 44), dt)  # row stride 41
        if big and dt == "float32":  # (float64's 32-wide tiles: several in the shapes above)
            tb = rng.standard_normal((132, 68)).astype(dt)
            yb = rng.standard_normal((68, 132)).astype(dt)
            checked += _run(device, lambda t, y: t.T * y + 1, [tb, yb], (68, 132), dt)
    return checked


def check_horizontal(device, rng, scale=1):
    """Horizontal kernels (deferred stores of several same-structure tensors in one launch): 16-byte
    groups per chunk when every array of the chunk is aligned, element loops for tails and for
    misaligned tensors (views at odd element offsets); float32/float16/float64; poisoned targets'
    neighbours stay untouched."""
    from fusetree.engine import horizontal

    checked = 0
    sizes = (1, 7, 16, 37 * scale, horizontal.CHUNK + 5) if scale > 1 else (1, 7, 16, 37)
    for dt, lo in itertools.product(("float32", "float16", "float64"), (0, 1)):
        tol = 2e-3 if dt == "float16" else 1e-6
        # every tensor is a view at element offset ``lo`` of a poisoned buffer (lo=1: misaligned)
        bufs = {k: [np.full(n + 2, np.nan, dt) for n in sizes] for k in "pm"}
        g = [rng.standard_normal(n).astype(dt) for n in sizes]
        p0 = [rng.standard_normal(n).astype(dt) for n in sizes]
        for b, x in zip(bufs["p"], p0):
            b[lo : lo + len(x)] = x
        for b in bufs["m"]:
            b[lo : lo + len(b) - 2] = 0
        dev = {k: [ft.asarray(b, device=device) for b in v] for k, v in bufs.items()}
        P = [b[lo : lo + n] for b, n in zip(dev["p"], sizes)]
        M = [b[lo : lo + n] for b, n in zip(dev["m"], sizes)]
        G = [ft.asarray(x, device=device) for x in g]
        ft.reset_stats()
        with ft.options(defer_stores=True):
            for p, m, gg in zip(P, M, G):
                m[...] = 0.9 * m + gg
                p -= 0.5 * m + p * 0.25
            ft.synchronize()
        assert ft.stats()["horizontal"] == 1 and ft.stats()["launches"] == 1, (dt, lo, ft.stats())
        for k, n in enumerate(sizes):
            m = g[k].astype(np.float64)
            p = p0[k].astype(np.float64) - (0.5 * m + p0[k].astype(np.float64) * 0.25)
            got_p, got_m = dev["p"][k].numpy(), dev["m"][k].numpy()
            msg = f"horizontal {dt} size {n} offset {lo}"
            np.testing.assert_allclose(
                got_m[lo : lo + n].astype(np.float64), m, rtol=tol, atol=tol, err_msg=msg
            )
            np.testing.assert_allclose(
                got_p[lo : lo + n].astype(np.float64), p, rtol=tol, atol=tol, err_msg=msg
            )
            outside = np.r_[got_p[:lo], got_p[lo + n :], got_m[:lo], got_m[lo + n :]]
            assert np.isnan(outside).all(), msg
            checked += 1
    return checked
