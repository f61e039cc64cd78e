"""Reverse-mode autodiff (ft.grad / value_and_grad / vjp): every op-table rule and every traced
construct against central finite differences in float64, and a T=4 LSTM with cross-entropy.
Seeds are fixed per test (the ``rng`` fixture prints its seed on failure)."""

import numpy as np
import pytest
from lstm_ref import lstm_cell

import fusetree as ft
from fusetree.ir.ops import OPS

RULED = sorted(n for n, d in OPS.items() if d.vjp is not None and n not in ("astype", "where"))


def draw(rng, shape, domain):
    x = rng.standard_normal(shape)
    if domain == "positive":
        return np.abs(x) + 0.5
    if domain == "unit":
        return np.clip(x, -0.9, 0.9) * 0.9
    if domain == "small":
        return np.clip(x, -2, 2)
    if domain == "nonzero":
        return np.sign(x) * (np.abs(x) + 0.5)
    return x


def numeric_grad(f, xs, i, eps=1e-6):
    """Central differences of scalar f(*xs) (NumPy, float64) in argument i."""
    x = xs[i]
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        hi = f(*xs)
        x[idx] = old - eps
        lo = f(*xs)
        x[idx] = old
        g[idx] = (hi - lo) / (2 * eps)
    return g


def check_grad(f_ft, f_np, xs, argnums=None, rtol=1e-5, atol=1e-7):
    argnums = tuple(range(len(xs))) if argnums is None else argnums
    got = ft.grad(f_ft, argnums=argnums)(*[ft.asarray(x.copy()) for x in xs])
    for k, i in enumerate(argnums):
        want = numeric_grad(f_np, [x.copy() for x in xs], i)
        np.testing.assert_allclose(got[k].numpy(), want, rtol=rtol, atol=atol, err_msg=f"argument {i}")


def _second_operand(rng, name, shape):
    if name in ("power",):
        return rng.uniform(0.5, 2.0, shape)
    if name in ("true_divide", "remainder"):
        return np.sign(rng.standard_normal(shape)) * rng.uniform(0.5, 2.0, shape)
    return rng.standard_normal(shape)


@pytest.mark.parametrize("name", RULED)
def test_every_op_rule_matches_finite_differences(name, rng):
    d = OPS[name]
    fn = getattr(ft, name)
    ref = d.ref
    if d.arity == 1:
        x = draw(rng, (3, 4), "unit" if name == "tan" else d.domain)  # tan: away from its poles
        if name in ("absolute", "relu"):
            x = np.sign(x) * (np.abs(x) + 0.1)  # away from the kink
        check_grad(lambda a: ft.sum(fn(a) * fn(a)), lambda a: float(np.sum(ref(a) * ref(a))), [x])
    else:
        x = draw(rng, (3, 4), "positive" if name == "power" else d.domain)
        y = _second_operand(rng, name, (3, 4))
        if name == "remainder":
            x = np.round(x * 4) / 4 + 0.13  # away from the jumps of x mod y
        check_grad(
            lambda a, b: ft.sum(fn(a, b) * fn(a, b)), lambda a, b: float(np.sum(ref(a, b) ** 2)), [x, y]
        )


@pytest.mark.parametrize("name", RULED)
def test_every_rule_also_runs_with_numpy(name, rng):
    """The op table's rules are namespace-generic: with NumPy as the namespace they give the same
    cotangents as through fusetree (the table drives the reference tests too)."""
    d = OPS[name]
    xs = [draw(rng, (5,), "positive" if name in ("power", "log", "sqrt", "rsqrt", "log2", "log10",
                                                    "log1p") else "unit" if d.domain == "unit" else "nonzero")
          for _ in range(d.arity)]  # fmt: skip

    class NP:
        def __getattr__(self, n):
            return getattr(np, n)

    g = np.linspace(0.5, 1.5, 5)
    y = d.ref(*xs)
    want = d.vjp(NP(), g, y, *xs)
    fx = [ft.asarray(x) for x in xs]
    got = d.vjp(ft, ft.asarray(g), ft.asarray(np.asarray(y)), *fx)
    for w, gt in zip(want, got):
        if w is None:
            assert gt is None
        else:
            np.testing.assert_allclose(np.asarray(gt.numpy()), w, rtol=1e-12, atol=1e-12)


def test_where_clip_maximum_and_broadcasting(rng):
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((3,))

    def f(a, b, xp):
        s = xp.where(a > 0.1, a * b, xp.exp(a)) + xp.clip(a, -0.5, 0.5) * 2 + xp.maximum(a, b + 0.05)
        return xp.sum(s * s)

    check_grad(lambda a, b: f(a, b, ft), lambda a, b: float(f(a, b, np)), [x, y])


@pytest.mark.parametrize(
    "what",
    ["sum_axis", "mean_keep", "max", "min_axis0", "prod", "softmax", "log_softmax", "logsumexp", "var",
     "layer_norm", "std"],
)  # fmt: skip
def test_reductions_and_composites(what, rng):
    x = rng.standard_normal((4, 5))
    w = rng.standard_normal((4, 5))

    def f(a, xp):
        if what == "sum_axis":
            r = xp.sum(a * a, axis=1)
        elif what == "mean_keep":
            r = xp.mean(xp.tanh(a), axis=0, keepdims=True) * 3
        elif what == "max":
            r = xp.max(a, axis=1)
        elif what == "min_axis0":
            r = xp.min(a, axis=0)
        elif what == "prod":
            r = xp.prod(a * 0.5 + 2, axis=1)
        elif what == "softmax":
            r = ft.softmax(a, axis=-1) if xp is ft else np.exp(a) / np.exp(a).sum(-1, keepdims=True)
        elif what == "log_softmax":
            r = ft.log_softmax(a) if xp is ft else a - np.log(np.exp(a).sum(-1, keepdims=True))
        elif what == "logsumexp":
            r = ft.logsumexp(a, axis=0) if xp is ft else np.log(np.exp(a).sum(0))
        elif what == "var":
            r = xp.var(a, axis=1)
        elif what == "std":
            r = xp.std(a, axis=0)
        else:
            if xp is ft:
                r = ft.layer_norm(a)
            else:
                m = a.mean(-1, keepdims=True)
                r = (a - m) / np.sqrt(((a - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        return r

    def loss(a, xp):
        r = f(a, xp)
        wt = w[: r.shape[0], : r.shape[1]] if r.ndim == 2 else w[0, : r.shape[0]]
        return xp.sum(r * (wt if xp is np else ft.asarray(wt)))

    check_grad(lambda a: loss(a, ft), lambda a: float(loss(a, np)), [x], rtol=1e-4, atol=1e-6)


def test_views_transposes_reshapes_and_matmul(rng):
    A, B, v = rng.standard_normal((4, 6)), rng.standard_normal((6, 3)), rng.standard_normal(6)

    def f(a, b, u, xp):
        s = a[:, ::2] * 2 + a[1:2, 1::2]  # strided and broadcast slices of one array
        t = (a @ b).T.reshape(2, 6)  # a GEMM, a transpose, a reshape
        m = a @ u  # matrix @ vector
        return xp.sum(s * s) + xp.sum(xp.tanh(t)) + xp.sum(m * m) + xp.sum(u @ b)

    check_grad(lambda a, b, u: f(a, b, u, ft), lambda a, b, u: float(f(a, b, u, np)), [A, B, v])


def test_batched_matmul_with_broadcast_batch(rng):
    A, B = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))

    def f(a, b, xp):
        return xp.sum(xp.sin(a @ b))

    check_grad(lambda a, b: f(a, b, ft), lambda a, b: float(f(a, b, np)), [A, B])


def test_values_used_twice_stores_and_inplace_updates(rng):
    x = rng.standard_normal((3, 4))

    def f_ft(a):
        acc = ft.zeros((3, 4), dtype=np.float64)
        for k in range(3):
            acc += a * (k + 1)  # an in-place update: a rebind under ft.grad
        y = ft.exp(a)
        z = ft.empty((3, 4), dtype=np.float64)
        z[...] = y * y + acc
        return ft.sum(z * y)

    def f_np(a):
        acc = a * 6
        y = np.exp(a)
        return float(np.sum((y * y + acc) * y))

    check_grad(f_ft, f_np, [x])


def test_evaluate_inside_the_function_keeps_the_chain(rng):
    x = rng.standard_normal((3, 3))

    def f_ft(a):
        y = ft.tanh(a) * 2
        ft.evaluate(y)  # y gets memory: the backward reads it and routes its cotangent back
        return ft.sum(y @ y)

    check_grad(f_ft, lambda a: float(np.sum((np.tanh(a) * 2) @ (np.tanh(a) * 2))), [x])


def lstm_loss(params, X, targets, h, c, xp, softmax_xent):
    Wx, Wh, b, Wy = params
    T, B, _ = X.shape
    total = 0.0
    for t in range(T):
        h, c = lstm_cell(X[t] @ Wx + h @ Wh + b, c, xp)
        total = total + softmax_xent(h @ Wy, targets[t])
    return total / (T * B)


def _xent_ft(logits, onehot):
    return -ft.sum(ft.log_softmax(logits, axis=-1) * onehot)


def _xent_np(logits, onehot):
    m = logits.max(-1, keepdims=True)
    ls = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return -np.sum(ls * onehot)


class NumpyXP:
    tanh = staticmethod(np.tanh)

    @staticmethod
    def sigmoid(z):
        return 1 / (1 + np.exp(-z))


def test_a_t4_lstm_with_cross_entropy_matches_finite_differences(rng):
    T, B, n_in, H, V = 4, 3, 5, 4, 6
    X = rng.standard_normal((T, B, n_in))
    tgt = np.eye(V)[rng.integers(0, V, (T, B))]
    h0, c0 = rng.standard_normal((B, H)) * 0.5, rng.standard_normal((B, H)) * 0.5
    params = [rng.standard_normal(s) * 0.5 for s in ((n_in, 4 * H), (H, 4 * H), (4 * H,), (H, V))]

    def f_np(*p):
        return float(lstm_loss(p, X, tgt, h0, c0, NumpyXP, _xent_np))

    fX, ft_t = ft.asarray(X), ft.asarray(tgt)
    grads = ft.grad(lambda p: lstm_loss(p, fX, ft_t, ft.asarray(h0), ft.asarray(c0), ft, _xent_ft))(
        [ft.asarray(p) for p in params]
    )
    ft.evaluate(*grads)
    for i, g in enumerate(grads):
        want = numeric_grad(f_np, [p.copy() for p in params], i)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-8, err_msg=f"parameter {i}")


def test_value_and_grad_has_aux_pytrees_and_vjp(rng):
    p = {"w": ft.asarray(rng.standard_normal((3, 2))), "b": ft.asarray(rng.standard_normal(2))}
    x = ft.asarray(rng.standard_normal((4, 3)))

    def f(p, x):
        y = x @ p["w"] + p["b"]
        return ft.sum(y * y), y

    (val, y), g = ft.value_and_grad(f, has_aux=True)(p, x)
    yn = x.numpy() @ p["w"].numpy() + p["b"].numpy()
    np.testing.assert_allclose(float(val), np.sum(yn**2))
    np.testing.assert_allclose(y.numpy(), yn)
    assert set(g) == {"w", "b"}
    np.testing.assert_allclose(g["w"].numpy(), x.numpy().T @ (2 * yn))
    np.testing.assert_allclose(g["b"].numpy(), (2 * yn).sum(0))
    out, f_vjp = ft.vjp(lambda a, b: a * b, x, x)
    ga, gb = f_vjp(ft.ones_like(out))
    np.testing.assert_allclose(ga.numpy(), x.numpy())


def test_unused_inputs_get_zeros_and_bad_inputs_raise(rng):
    x = ft.asarray(rng.standard_normal(3))
    g = ft.grad(lambda a, b: ft.sum(a * 2), argnums=1)(x, x)
    np.testing.assert_array_equal(g.numpy(), np.zeros(3))
    with pytest.raises(ft.ShapeError, match="scalar"):
        ft.grad(lambda a: a * 2)(x)
    with pytest.raises(TypeError, match="floating point"):
        ft.grad(lambda a: ft.sum(a))(ft.asarray(np.arange(3)))
    with pytest.raises(ft.UnsupportedError, match="partial store"):

        def partial(a):
            b = a * 1
            b[0] = 5.0
            return ft.sum(b)

        ft.grad(partial)(x)


def test_grad_inside_jit_matches_eager(rng):
    W = rng.standard_normal((4, 4)) * 0.5
    X = rng.standard_normal((3, 4))

    def step(w, x):
        loss, gw = ft.value_and_grad(lambda w: ft.sum(ft.tanh(x @ w) ** 2))(w)
        return loss, w - 0.1 * gw

    ref_loss, ref_w = step(ft.asarray(W), ft.asarray(X))
    ref_loss, ref_w = float(ref_loss), ref_w.numpy()
    jstep = ft.jit(step)
    for _ in range(3):
        loss, w2 = jstep(ft.asarray(W.copy()), ft.asarray(X))
        np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-12)
        np.testing.assert_allclose(w2.numpy(), ref_w, rtol=1e-12)


def test_stack_and_concat_have_gradients_and_boundaries_say_they_have_none(rng):
    xs = [rng.standard_normal((2, 3)) for _ in range(3)]

    def f(a, b, c, xp):
        s = xp.stack([a, xp.tanh(b), c * 2], axis=1)  # (2, 3, 3)
        t = xp.concat([a, b * b], axis=-1) if xp is ft else np.concatenate([a, b * b], axis=-1)
        return xp.sum(s * s) + xp.sum(xp.sin(t))

    check_grad(lambda a, b, c: f(a, b, c, ft), lambda a, b, c: float(f(a, b, c, np)), xs)
    with pytest.raises(ft.UnsupportedError, match="no gradient rule"):
        ft.grad(lambda a: ft.sum(ft.flip(a * 2, axis=0)))(ft.asarray(xs[0]))


def test_concat_is_recorded_by_jit_and_backend_boundaries_refuse_it(rng):
    a, b = rng.standard_normal(3), rng.standard_normal(2)
    f = ft.jit(lambda x, y: ft.concat([x * 2, y + 1]))
    for _ in range(3):
        a, b = rng.standard_normal(3), rng.standard_normal(2)
        np.testing.assert_allclose(f(ft.asarray(a), ft.asarray(b)).numpy(), np.concatenate([a * 2, b + 1]))
    with pytest.raises(ft.UnsupportedError, match="inside an ft.jit"):
        ft.jit(lambda x: ft.flip(x))(ft.asarray(a))


def test_an_rnn_writing_its_outputs_into_a_fresh_array(rng):
    """lstm_ref.lstm_layer's pattern: Y = empty; Y[t] = h; h = Y[t] (partial stores into fresh
    memory, read back), then a GEMM over all of Y."""
    from lstm_ref import lstm_layer

    T, B, n_in, H = 3, 2, 4, 3
    X = rng.standard_normal((T, B, n_in))
    h0, c0 = rng.standard_normal((B, H)), rng.standard_normal((B, H))
    P = [rng.standard_normal(s) * 0.5 for s in ((n_in, 4 * H), (H, 4 * H), (4 * H,), (H, 2))]

    def f(Wx, Wh, b, Wo, xp):
        Y = xp.empty((T, B, H)) if xp is ft else np.empty((T, B, H))
        Y, c = lstm_layer(X if xp is np else ft.asarray(X), h0, c0, Wx, Wh, b, Y, xp if xp is ft else NumpyXP)
        return xp.sum(xp.tanh(Y.reshape(T * B, H) @ Wo)) + xp.sum(c * c)

    check_grad(lambda *p: f(*p, ft), lambda *p: float(f(*p, np)), P)
    with pytest.raises(ft.UnsupportedError, match="read the elements"):

        def bad(w):
            Y = ft.zeros((2, 3)) * 1.0
            ft.evaluate(Y)
            s = ft.sum(Y[0] * w)
            Y[0] = w  # overwrites what s read
            return s

        ft.grad(bad)(ft.asarray(rng.standard_normal(3)))


def test_numpy_array_at_fusetree_array_is_a_fusetree_gemm_with_a_gradient(rng):
    h0, W = rng.standard_normal((2, 3)), rng.standard_normal((3, 3))
    y = h0 @ ft.asarray(W)  # NumPy's matmul ufunc defers to fusetree
    assert isinstance(y, ft.Array)
    np.testing.assert_allclose(y.numpy(), h0 @ W)
    check_grad(lambda w: ft.sum(ft.tanh(h0 @ w)), lambda w: float(np.sum(np.tanh(h0 @ w))), [W])
    with pytest.raises(ft.UnsupportedError, match="outside the gradient trace"):
        ft.grad(lambda w: ft.sum(ft.asarray(np.cbrt(w))))(ft.asarray(W))


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("order", ["forward", "backward"])
def test_sum_of_products_of_adjacent_blocks_is_one_gemm(rng, mode, order):
    """``sum_t H[t].T @ G[t]`` over row blocks of two buffers (a weight gradient through time) is
    one GEMM with K = T*B, in either summation order; a term from another allocation or a gap in
    the blocks starts a new product (accumulated into the same output). Checked against float64
    NumPy, in eager mode and in a jit replay on fresh data (written into the same arrays)."""
    T, B, H, N = 6, 4, 5, 7
    steps = list(range(T)) if order == "forward" else list(range(T))[::-1]

    def blocks(h, g):
        acc = None
        for t in steps:
            term = h[t * B : (t + 1) * B].T @ g[t * B : (t + 1) * B]
            acc = term if acc is None else acc + term
        return acc

    def broken(h, g, other):  # 0-1 and 2-3 adjacent, "other" its own allocation, 4-5 skipped
        return (
            h[:B].T @ g[:B]
            + other.T @ g[B : 2 * B]
            + h[2 * B : 3 * B].T @ g[2 * B : 3 * B]
            + (h[3 * B : 4 * B].T @ g[3 * B : 4 * B])
        )

    run_b, run_k = (ft.jit(blocks), ft.jit(broken)) if mode == "jit" else (blocks, broken)
    fh, fg, fo = ft.zeros((T * B, H)), ft.zeros((T * B, N)), ft.zeros((B, H))
    for _ in range(2):  # a jit replay reads the new contents
        Hs, G, Ot = (
            rng.standard_normal((T * B, H)),
            rng.standard_normal((T * B, N)),
            rng.standard_normal((B, H)),
        )
        fh[...], fg[...], fo[...] = Hs, G, Ot
        ft.reset_stats()
        got = run_b(fh, fg).numpy()
        assert ft.stats()["gemms"] == 1
        np.testing.assert_allclose(got, Hs.T @ G, rtol=1e-12, atol=1e-12)
        ft.reset_stats()
        got = run_k(fh, fg, fo).numpy()
        assert ft.stats()["gemms"] == 3
        want = Hs[:B].T @ G[:B] + Ot.T @ G[B : 2 * B] + Hs[2 * B : 4 * B].T @ G[2 * B : 4 * B]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _random_key(rng, shape):
    """A basic index of ``shape``: ints, slices (any step), at most one Ellipsis."""
    items: list = []
    for n in shape:
        c = rng.random()
        if c < 0.3:
            items.append(int(rng.integers(-n, n)))
        elif c < 0.8:
            lo, hi = (None if rng.random() < 0.3 else int(rng.integers(-n - 2, n + 2)) for _ in range(2))
            items.append(slice(lo, hi, [None, 1, 2, 3, -1, -2][int(rng.integers(6))]))
        else:
            items.append(slice(None) if Ellipsis in items else Ellipsis)
    key = tuple(items[: int(rng.integers(1, len(items) + 1))])
    return key + (Ellipsis,) if Ellipsis not in key and rng.random() < 0.3 else key


def test_partial_store_overlap_rule_matches_numpy(rng):
    """The traced partial-store check (did the function read elements it overwrites?) computes
    overlap from index ranges (interval arithmetic, Ellipsis expanded) without a mask: it agrees
    with NumPy's marked elements on random basic indexes."""
    from fusetree.frontend.array import _axis_ranges, _overlaps_any

    checked = 0
    while checked < 3000:
        shape = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(1, 4))))
        key, keys = _random_key(rng, shape), [_random_key(rng, shape) for _ in range(int(rng.integers(1, 4)))]
        mark = np.zeros(shape, np.bool_)
        try:
            mark[key] = True
            want = any(bool(mark[k].any()) for k in keys)
        except IndexError:
            continue
        parts = [(k, _axis_ranges(shape, k)) for k in keys]
        assert _overlaps_any(shape, key, parts) == want, (shape, key, keys)
        checked += 1
