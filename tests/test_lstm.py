"""The issue's must-show: the natural LSTM step on the CPU is 2 GEMMs + 1 fused kernel."""

import numpy as np
from lstm_ref import lstm_step, make_inputs, reference, rel_err

import fusetree as ft


def _run(inputs):
    h2, c2 = lstm_step(*(ft.asarray(a) for a in inputs), xp=ft)
    ft.evaluate(h2, c2)
    return h2, c2


def test_lstm_step_fused_launches_and_accuracy(rng):
    inputs = make_inputs(rng, 16, 32)
    ft.reset_stats()
    h2, c2 = _run(inputs)
    s = ft.stats()
    assert s["launches"] <= 3 and s["gemms"] == 2 and s["kernels"] == 1, s
    hr, cr = reference(*inputs)
    assert rel_err(h2, hr) < 1e-5 and rel_err(c2, cr) < 1e-5
    # new data and another batch size: nothing compiles
    ft.reset_stats()
    inputs2 = make_inputs(rng, 24, 32)
    h3, c3 = _run(inputs2)
    assert ft.stats()["compiles"] == 0, ft.stats()
    hr, cr = reference(*inputs2)
    assert rel_err(h3, hr) < 1e-5 and rel_err(c3, cr) < 1e-5


def test_lstm_step_unfused_launches_many(rng):
    inputs = make_inputs(rng, 8, 16)
    with ft.options(fuse=False):
        ft.reset_stats()
        h2, c2 = _run(inputs)
        assert ft.stats()["launches"] >= 10, ft.stats()
    hr, cr = reference(*inputs)
    assert rel_err(h2, hr) < 1e-5 and rel_err(c2, cr) < 1e-5


def test_lstm_loop_stores_c_with_h_parallel(rng):
    """A loop over steps in natural code: realizing h (for the next GEMM) stores c in the same kernel."""
    B, H = 8, 16
    _, h, c, Wx, Wh, b = make_inputs(rng, B, H)
    xs = [rng.standard_normal((B, H)).astype(np.float32) for _ in range(4)]
    with ft.options(cpu_parallel=True):
        fh, fc = ft.asarray(h), ft.asarray(c)
        nh, nc = h.astype(np.float64), c.astype(np.float64)
        fW = [ft.asarray(a) for a in (Wx, Wh, b)]
        ft.reset_stats()
        for xt in xs:
            fh, fc = lstm_step(ft.asarray(xt), fh, fc, *fW, xp=ft)
            nh, nc = reference(xt, nh, nc, Wx, Wh, b)
        ft.evaluate(fh, fc)
    s = ft.stats()
    assert s["kernels"] == len(xs) and s["gemms"] == 2 * len(xs), s
    assert rel_err(fh, nh) < 1e-5 and rel_err(fc, nc) < 1e-5
