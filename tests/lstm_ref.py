"""The natural LSTM step, written once for fusetree, NumPy and (in benchmarks) CuPy/torch."""

from __future__ import annotations

import numpy as np


def lstm_step(x, h, c, Wx, Wh, b, xp):
    return lstm_cell(x @ Wx + h @ Wh + b, c, xp)


class NumpyXP:
    @staticmethod
    def sigmoid(z):
        return 1.0 / (1.0 + np.exp(-z))

    tanh = staticmethod(np.tanh)
    exp = staticmethod(np.exp)


def make_inputs(rng, B, H, dtype=np.float32):
    x, h, c = (rng.standard_normal((B, H)).astype(dtype) for _ in range(3))
    Wx, Wh = ((rng.standard_normal((H, 4 * H)) / np.sqrt(H)).astype(dtype) for _ in range(2))
    b = (rng.standard_normal(4 * H) * 0.1).astype(dtype)
    return x, h, c, Wx, Wh, b


def reference(x, h, c, Wx, Wh, b):
    args = [np.asarray(a, np.float64) for a in (x, h, c, Wx, Wh, b)]
    return lstm_step(*args, xp=NumpyXP)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def lstm_cell(gates, c, xp):
    """The elementwise part: gates (B, 4H) -> h2, c2."""
    H = c.shape[1]
    i = xp.sigmoid(gates[:, :H])
    f = xp.sigmoid(gates[:, H : 2 * H])
    o = xp.sigmoid(gates[:, 2 * H : 3 * H])
    g = xp.tanh(gates[:, 3 * H :])
    c2 = f * c + i * g
    return o * xp.tanh(c2), c2


def lstm_layer(X, h, c, Wx, Wh, b, Y, xp):
    """An LSTM layer over a sequence X (T, B, I): the input projection of all T steps is one GEMM
    up front, then one recurrent GEMM and one cell per step; h_t is written into Y[t]."""
    T, B, n_in = X.shape
    xw = X.reshape(T * B, n_in) @ Wx
    for t in range(T):
        gates = xw[t * B : (t + 1) * B] + h @ Wh + b
        h2, c2 = lstm_cell(gates, c, xp)
        Y[t] = h2
        h, c = Y[t], c2
    return Y, c


def gru_step(x, h, Wx, Wh, bx, bh, xp):
    """A GRU step (PyTorch's GRUCell formula, gate order r, z, n): 2 GEMMs + one elementwise cell."""
    H = h.shape[1]
    gx = x @ Wx + bx
    gh = h @ Wh + bh
    r = xp.sigmoid(gx[:, :H] + gh[:, :H])
    z = xp.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
    n = xp.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
    return (1 - z) * n + z * h


def make_gru_inputs(rng, B, H, dtype=np.float32):
    x, h = (rng.standard_normal((B, H)).astype(dtype) for _ in range(2))
    Wx, Wh = ((rng.standard_normal((H, 3 * H)) / np.sqrt(H)).astype(dtype) for _ in range(2))
    bx, bh = ((rng.standard_normal(3 * H) * 0.1).astype(dtype) for _ in range(2))
    return x, h, Wx, Wh, bx, bh
