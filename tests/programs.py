"""Random *programs* run in every execution mode and compared with NumPy (the mode fuzzer).

A program is a few statements over arrays the caller passes in (some of them overlapping views of
one buffer, some strided): temporaries, stores through views (``x[...] =``, ``x[1:] =``, strided,
reversed), augmented assignments (``x += e``, ``x[::2] *= e``), element reads (``float(x[i, j])``,
``.item()``) whose values feed later expressions, reductions, GEMMs, ``ft.evaluate`` and rebinding.
:func:`check_program` runs it

* in NumPy (the reference, same dtype),
* eagerly, with ``fuse=False``, under ``ft.jit`` (four calls: trace, then three replays on new
  values: fresh arrays or the same arrays refilled, fresh, then those same arrays refilled, which
  takes a replay's short path on the very same arrays) and under ``ft.jit(graph=True)``,

and compares every array the program touched: the caller's buffers after each call and every
value the program made. Programs that read values cannot be traced: under ``ft.jit`` they must
raise UnsupportedError (checked) and nothing is compared.

>>> prog = random_program(7)
>>> print(describe(prog))  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fusetree as ft

MODES = ("eager", "unfused", "deferred", "jit", "graph")
UNARY = ("tanh", "sin", "sigmoid", "absolute", "negative", "exp_small")
BINARY = ("add", "subtract", "multiply", "maximum", "minimum")
AUG = {"add": operator.iadd, "subtract": operator.isub, "multiply": operator.imul}
REDUCE = ("sum", "max", "mean", "min")
INDEX_2D = [
    Ellipsis, np.s_[1:], np.s_[:-1], np.s_[::2], np.s_[::-1], np.s_[:, 1:], np.s_[:, :-1],
    np.s_[:, ::-1], np.s_[1:, ::2], np.s_[0], np.s_[:, 0], np.s_[-1],
]  # fmt: skip
INDEX_1D = [Ellipsis, np.s_[1:], np.s_[:-1], np.s_[::2], np.s_[::-1], np.s_[1::2], np.s_[2:]]


@dataclass
class Program:
    seed: int
    dtype: str
    bases: list[tuple[int, ...]]  # shapes of the buffers the caller owns
    inputs: list[tuple[int, Any]]  # each argument: (base, index) -> bases[base][index]
    stmts: list[tuple] = field(default_factory=list)
    reads: bool = False  # does the program read values (then it cannot be traced)


class NumpyNS:
    """The few functions programs call, for NumPy arrays."""

    tanh, sin, absolute, negative = np.tanh, np.sin, np.absolute, np.negative
    add, subtract, multiply, maximum, minimum = np.add, np.subtract, np.multiply, np.maximum, np.minimum

    # NumPy reductions over everything return scalars; fusetree returns 0-d arrays (writable)
    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return np.asarray(np.max(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def min(x, axis=None, keepdims=False):
        return np.asarray(np.min(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return np.asarray(np.mean(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    @staticmethod
    def exp(x):
        return np.exp(x)

    @staticmethod
    def softmax(x, axis=-1):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    @staticmethod
    def evaluate(*xs):
        return xs


# ---------------------------------------------------------------------------------------------
# generation


def _shape_after(shape: tuple[int, ...], index: Any) -> tuple[int, ...]:
    return np.empty(shape, np.int8)[index].shape


def _indices(shape: tuple[int, ...]) -> list[Any]:
    table = INDEX_2D if len(shape) == 2 else INDEX_1D if len(shape) == 1 else [Ellipsis]
    out = []
    for ix in table:
        try:
            if 0 not in _shape_after(shape, ix):
                out.append(ix)
        except IndexError:
            pass
    return out


def _broadcasts(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(src, dst) == dst
    except ValueError:
        return False


class _Gen:
    def __init__(self, seed: int, narrow: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.unary = ("tanh", "negative") if narrow else UNARY
        self.binary = ("add", "multiply") if narrow else BINARY
        self.depth = 1 if narrow else 3
        self.shapes: list[tuple[int, ...]] = []  # env slot -> shape (None for Python scalars)
        self.scalars: list[int] = []  # env slots holding Python scalars
        self.arrays: list[int] = []  # env slots holding arrays

    def choice(self, seq: Any) -> Any:
        return seq[int(self.rng.integers(0, len(seq)))]

    def leaf(self, target: tuple[int, ...]) -> tuple:
        r = self.rng.random()
        if r < 0.12:
            return ("scalar", float(np.round(self.rng.uniform(-1.5, 1.5), 2)))
        if r < 0.2 and self.scalars:
            return ("sread", self.choice(self.scalars))
        cands = []
        for k in self.arrays:
            for ix in _indices(self.shapes[k]):
                if _broadcasts(_shape_after(self.shapes[k], ix), target):
                    cands.append((k, ix))
        if not cands:
            return ("scalar", 0.5)
        k, ix = self.choice(cands)
        return ("var", k, ix)

    def expr(self, target: tuple[int, ...], depth: int = 0) -> tuple:
        r = self.rng.random()
        if depth >= self.depth or r < 0.3:
            return self.leaf(target)
        if r < 0.55:
            return (self.choice(self.unary), self.expr(target, depth + 1))
        return (self.choice(self.binary), self.expr(target, depth + 1), self.expr(target, depth + 1))

    def bounded(self, target: tuple[int, ...]) -> tuple:
        e = self.expr(target)
        return ("tanh", e) if self.rng.random() < 0.4 else e

    def shape_of(self, e: tuple) -> tuple[int, ...]:
        """The shape an expression evaluates to (its leaves broadcast together)."""
        if e[0] in ("scalar", "sread"):
            return ()
        if e[0] == "var":
            return _shape_after(self.shapes[e[1]], e[2])
        return tuple(np.broadcast_shapes(*[self.shape_of(a) for a in e[1:]]))

    def new(self, shape: tuple[int, ...]) -> None:
        self.arrays.append(len(self.shapes))
        self.shapes.append(shape)


def random_program(seed: int, n_stmts: int | None = None, narrow: bool = False) -> Program:
    """A random program (deterministic in ``seed``). ``narrow`` draws expressions from a few ops
    and shallow trees, so long runs mostly hit the kernel cache (the point is the modes, not the
    kernels: the tree fuzzer covers those)."""
    g = _Gen(seed, narrow)
    rng = g.rng
    dtype = "float64" if rng.random() < 0.6 else "float32"
    nd = int(rng.integers(1, 3))
    frame = tuple(int(s) for s in rng.integers(2, 6, size=nd))
    bases: list[tuple[int, ...]] = []
    inputs: list[tuple[int, Any]] = []
    for _ in range(int(rng.integers(1, 4))):
        r = rng.random()
        if r < 0.2 and len(inputs) < 3:  # two overlapping views of one buffer
            bases.append((frame[0] + 1, *frame[1:]))
            inputs += [(len(bases) - 1, np.s_[1:]), (len(bases) - 1, np.s_[:-1])]
        elif r < 0.35:  # a strided view
            bases.append((frame[0] * 2, *frame[1:]))
            inputs.append((len(bases) - 1, np.s_[::2]))
        elif r < 0.45 and nd == 2:  # a row vector (broadcast operand)
            bases.append(frame[1:])
            inputs.append((len(bases) - 1, Ellipsis))
        else:
            bases.append(frame)
            inputs.append((len(bases) - 1, Ellipsis))
    for b, ix in inputs:
        g.new(_shape_after(bases[b], ix))
    prog = Program(seed, dtype, bases, inputs)
    for _ in range(int(rng.integers(2, 8)) if n_stmts is None else n_stmts):
        r = rng.random()
        k = g.choice(g.arrays)
        shape = g.shapes[k]
        if r < 0.22:
            e = g.bounded(frame)
            while "'var'" not in repr(e):  # a value made from arrays (not a Python scalar)
                e = g.bounded(frame)
            prog.stmts.append(("let", e))
            g.new(g.shape_of(e))
        elif r < 0.45:
            ix = g.choice(_indices(shape))
            prog.stmts.append(("store", k, ix, g.bounded(_shape_after(shape, ix))))
        elif r < 0.6:
            ix = None if rng.random() < 0.5 else g.choice(_indices(shape))
            tshape = shape if ix is None else _shape_after(shape, ix)
            prog.stmts.append(("aug", k, ix, g.choice(list(AUG)), ("tanh", g.expr(tshape))))
        elif r < 0.68:
            if not shape:
                continue
            at = tuple(int(rng.integers(-s, s)) for s in shape)
            prog.stmts.append(("read", k, at, "item" if rng.random() < 0.5 else "float"))
            prog.reads = True
            g.scalars.append(len(g.shapes))
            g.shapes.append(())
        elif r < 0.78:
            if not shape:
                continue
            kind = g.choice(REDUCE)
            axis = int(rng.integers(-1, len(shape)))
            ax = None if axis < 0 else axis
            keep = bool(rng.random() < 0.5) and ax is not None
            prog.stmts.append(("reduce", k, kind, ax, keep))
            g.new(np.sum(np.empty(shape), axis=ax, keepdims=keep).shape)
        elif r < 0.83 and len(shape) == 2:
            prog.stmts.append(("softmax", k))
            g.new(shape)
        elif r < 0.9 and len(shape) == 2:
            j = g.choice([a for a in g.arrays if len(g.shapes[a]) == 2 and g.shapes[a][1] == shape[1]])
            prog.stmts.append(("gemm", k, j))  # x @ y.T
            g.new((shape[0], g.shapes[j][0]))
        elif r < 0.95:
            e = g.bounded(shape)
            while "'var'" not in repr(e):  # a value made from arrays (not a Python scalar)
                e = g.bounded(shape)
            prog.stmts.append(("rebind", k, e))
            g.shapes[k] = g.shape_of(e)
        else:
            prog.stmts.append(("evaluate", [a for a in g.arrays if a >= len(inputs)][-3:]))
    # a sweep: the same update stored into every argument (the stores of an optimizer loop: deferred
    # and horizontally fused where they can be). Drawn from its own generator, so the statements
    # above are those of earlier versions of this function for the same seed.
    extra = np.random.default_rng(seed + 7_777_777)
    if extra.random() < 0.35:
        at = int(extra.integers(0, len(prog.stmts) + 1))
        c, s = (float(np.round(extra.uniform(-1.5, 1.5), 2)) for _ in range(2))
        prog.stmts.insert(at, ("sweep", tuple(range(len(inputs))), c, s))
    # a sum of GEMMs over row blocks of two arguments (sum_t x[t].T @ y[t]: a weight gradient
    # through time, one GEMM when the blocks join along K), checked where it stands in the program
    # (stores before and after it); its value is appended to the results, not to the numbered values
    extra = np.random.default_rng(seed + 8_888_888)
    if extra.random() < 0.3:
        at = int(extra.integers(0, len(prog.stmts) + 1))
        k, j = (int(extra.integers(0, len(inputs))) for _ in range(2))
        prog.stmts.insert(at, ("gsum", k, j, int(extra.integers(1, 4)), bool(extra.random() < 0.5)))
    # a loop updating an argument many times without reading it: a chain deeper than one kernel
    # takes (config.MAX_TREE_DEPTH), or a value used twice per step (a DAG whose tree doubles every
    # level); the result is rebound or stored into the argument
    extra = np.random.default_rng(seed + 9_999_999)
    if extra.random() < 0.2:
        at = int(extra.integers(0, len(prog.stmts) + 1))
        shared = bool(extra.random() < 0.5)
        n = 30 if shared else int(extra.choice([70, 140]))
        k = int(extra.integers(0, len(inputs)))
        prog.stmts.insert(at, ("loop", k, n, shared, bool(extra.random() < 0.5)))
    return prog


def _row_blocks(n: int, parts: int) -> list[tuple[int, int]]:
    cuts = [n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


# ---------------------------------------------------------------------------------------------
# running


def _eval(e: tuple, env: list[Any], xp: Any) -> Any:
    kind = e[0]
    if kind == "scalar":
        return e[1]
    if kind == "sread":
        return env[e[1]]
    if kind == "var":
        return env[e[1]][e[2]]
    args = [_eval(a, env, xp) for a in e[1:]]
    out = xp.exp(xp.tanh(args[0])) if kind == "exp_small" else getattr(xp, kind)(*args)
    if isinstance(out, np.generic):  # NumPy gives scalars for 0-d results; fusetree 0-d arrays
        out = np.asarray(out)
    return out


def run_program(prog: Program, xp: Any, args: list[Any]) -> tuple:
    """Run ``prog`` with namespace ``xp`` (fusetree or :class:`NumpyNS`) on argument arrays
    ``args``; returns every value it made (arrays and scalars), in order."""
    env: list[Any] = list(args)
    made: list[int] = []
    sums: list[Any] = []
    for st in prog.stmts:
        kind = st[0]
        if kind == "let":
            env.append(_eval(st[1], env, xp))
            made.append(len(env) - 1)
        elif kind == "store":
            env[st[1]][st[2]] = _eval(st[3], env, xp)
        elif kind == "aug":
            _, k, ix, op, e = st
            v = _eval(e, env, xp)
            if ix is None:
                env[k] = AUG[op](env[k], v)
            else:
                t = env[k]
                t[ix] = AUG[op](t[ix], v)
        elif kind == "read":
            _, k, at, how = st
            v = env[k][at]
            env.append(v.item() if how == "item" else float(v))
            made.append(len(env) - 1)
        elif kind == "reduce":
            _, k, red, ax, keep = st
            env.append(getattr(xp, red)(env[k], axis=ax, keepdims=keep))
            made.append(len(env) - 1)
        elif kind == "softmax":
            env.append(xp.softmax(env[st[1]], axis=-1))
            made.append(len(env) - 1)
        elif kind == "gemm":
            env.append(env[st[1]] @ env[st[2]].T)
            made.append(len(env) - 1)
        elif kind == "rebind":
            env[st[1]] = _eval(st[2], env, xp)
        elif kind == "evaluate":
            xp.evaluate(*[env[k] for k in st[1]])
        elif kind == "sweep":
            _, ks, c, s = st
            for k in ks:
                t = env[k]
                t[...] = xp.tanh(t * c) + s
        elif kind == "gsum":
            _, k, j, parts, reverse = st
            x, y = env[k], env[j]
            if len(x.shape) == 2 and len(y.shape) == 2 and x.shape[0] == y.shape[0]:
                blocks = _row_blocks(x.shape[0], parts)
                acc = None
                for lo, hi in blocks[::-1] if reverse else blocks:
                    term = x[lo:hi].T @ y[lo:hi]
                    acc = term if acc is None else acc + term
                sums.append(acc)
        elif kind == "loop":
            _, k, n, shared, inplace = st
            y = env[k]
            for _ in range(n):
                y = y * 1.75 - y * 0.8 if shared else y * 0.97 + 0.03
            if inplace:
                env[k][...] = y
            else:
                env[k] = y
    return tuple(env[k] for k in made) + tuple(sums)


def describe(prog: Program) -> str:
    """The program as Python source (``a0, a1...`` are the arguments, ``v<k>`` the values)."""

    def ix(i: Any) -> str:
        if i is Ellipsis:
            return "..."
        items = i if isinstance(i, tuple) else (i,)
        parts = []
        for x in items:
            if isinstance(x, slice):
                parts.append(
                    f"{'' if x.start is None else x.start}:{'' if x.stop is None else x.stop}"
                    + ("" if x.step is None else f":{x.step}")
                )
            else:
                parts.append(str(x))
        return ", ".join(parts)

    names = [f"a{k}" for k in range(len(prog.inputs))]

    def ex(e: tuple) -> str:
        if e[0] == "scalar":
            return repr(e[1])
        if e[0] == "sread":
            return names[e[1]]
        if e[0] == "var":
            return names[e[1]] + ("" if e[2] is Ellipsis else f"[{ix(e[2])}]")
        return f"{e[0]}({', '.join(ex(a) for a in e[1:])})"

    lines = [
        f"# seed {prog.seed}, {prog.dtype}; buffers {prog.bases}; "
        + ", ".join(f"a{k} = buf{b}[{ix(i)}]" for k, (b, i) in enumerate(prog.inputs))
    ]
    sym = {"add": "+=", "subtract": "-=", "multiply": "*="}
    for st in prog.stmts:
        kind = st[0]
        if kind in ("let", "read", "reduce", "softmax", "gemm"):
            name = f"v{len(names)}"
            if kind == "let":
                rhs = ex(st[1])
            elif kind == "read":
                rhs = (
                    f"{names[st[1]]}[{ix(st[2])}].item()"
                    if st[3] == "item"
                    else f"float({names[st[1]]}[{ix(st[2])}])"
                )
            elif kind == "reduce":
                rhs = f"{st[2]}({names[st[1]]}, axis={st[3]}, keepdims={st[4]})"
            elif kind == "softmax":
                rhs = f"softmax({names[st[1]]}, axis=-1)"
            else:
                rhs = f"{names[st[1]]} @ {names[st[2]]}.T"
            names.append(name)
            lines.append(f"{name} = {rhs}")
        elif kind == "store":
            lines.append(f"{names[st[1]]}[{ix(st[2])}] = {ex(st[3])}")
        elif kind == "aug":
            tgt = names[st[1]] + ("" if st[2] is None else f"[{ix(st[2])}]")
            lines.append(f"{tgt} {sym[st[3]]} {ex(st[4])}")
        elif kind == "rebind":
            new = f"{names[st[1]]}'"
            lines.append(f"{new} = {ex(st[2])}")
            names[st[1]] = new
        elif kind == "sweep":
            lines.append(f"for t in ({', '.join(names[k] for k in st[1])},):")
            lines.append(f"    t[...] = tanh(t * {st[2]!r}) + {st[3]!r}")
        elif kind == "gsum":
            _, k, j, parts, reverse = st
            x, y = names[k], names[j]
            order = "reversed" if reverse else "in order"
            lines.append(
                f"extra = sum({x}[r].T @ {y}[r] for r in {parts} row blocks, {order})  # if 2-D, same rows"
            )
        elif kind == "loop":
            _, k, n, shared, inplace = st
            step = "y * 1.75 - y * 0.8" if shared else "y * 0.97 + 0.03"
            lines.append(f"y = {names[k]}")
            lines.append(f"for _ in range({n}): y = {step}")
            if inplace:
                lines.append(f"{names[k]}[...] = y")
            else:
                new = f"{names[k]}'"
                lines.append(f"{new} = y")
                names[k] = new
        else:
            lines.append(f"ft.evaluate({', '.join(names[k] for k in st[1])})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# checking


def _fill(rng: np.random.Generator, prog: Program) -> list[np.ndarray]:
    return [(rng.standard_normal(s) * 2).astype(prog.dtype) for s in prog.bases]


def _args(bases: list[Any], prog: Program) -> list[Any]:
    return [bases[b][ix] for b, ix in prog.inputs]


def _tol(dtype: str) -> float:
    return 2e-4 if dtype == "float32" else 1e-9


def _close(got: Any, want: Any, dtype: str, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tol = _tol(dtype)
    scale = float(np.max(np.abs(want), initial=1.0))
    if not np.allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True):
        bad = np.argwhere(~np.isclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True))
        first = tuple(bad[0]) if bad.size else ()
        raise AssertionError(
            f"{what}: {len(bad)} of {want.size} elements differ; first at {first}: "
            f"got {got[first] if got.ndim else got} want {want[first] if want.ndim else want}"
        )


def _host(x: Any) -> Any:
    if isinstance(x, ft.Array):
        return x.numpy().copy()
    if hasattr(x, "get"):  # CuPy
        return x.get()
    return np.array(x, copy=True) if isinstance(x, np.ndarray) else x


def _to_device(a: np.ndarray, device: str) -> Any:
    if device == "cuda":
        import cupy as cp

        return cp.asarray(a)
    return a.copy()


def _reference(prog: Program, bases: list[np.ndarray]) -> tuple[list[np.ndarray], tuple]:
    ref = [b.copy() for b in bases]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        made = run_program(prog, NumpyNS, _args(ref, prog))
    return ref, tuple(_host(m) for m in made)


def check_program(prog: Program, modes: tuple[str, ...] = MODES, device: str = "cpu") -> dict[str, int]:
    """Run ``prog`` in ``modes`` on ``device`` and compare with NumPy; raises AssertionError naming
    the mode, the call and the array on a mismatch. Returns {mode: comparisons made}."""
    rng = np.random.default_rng(prog.seed + 1_000_003)
    counts: dict[str, int] = {}
    for mode in modes:
        calls = 4 if mode in ("jit", "graph") else 1
        if mode in ("jit", "graph"):
            fn = ft.jit(graph=mode == "graph")(lambda *a: run_program(prog, ft, list(a)))
        bases_dev: list[Any] | None = None
        n = 0
        for call in range(calls):
            host = _fill(rng, prog)
            ref_bases, ref_made = _reference(prog, host)
            if bases_dev is None or call == 2 or (call != 3 and rng.random() < 0.5):
                bases_dev = [_to_device(b, device) for b in host]  # fresh arrays
            else:  # the same arrays, refilled
                for d, h in zip(bases_dev, host):
                    d[...] = _to_device(h, device)
            args = [ft.asarray(a, device=device) for a in _args(bases_dev, prog)]
            what = f"seed {prog.seed} mode {mode} call {call}"
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                if mode in ("jit", "graph") and prog.reads:
                    try:
                        fn(*args)
                    except ft.UnsupportedError as e:
                        assert "inside an ft.jit" in str(e), what
                        break
                    raise AssertionError(f"{what}: a value read inside ft.jit did not raise")
                if mode in ("jit", "graph"):
                    made = fn(*args)
                else:
                    with ft.options(fuse=mode != "unfused", defer_stores=mode == "deferred"):
                        made = run_program(prog, ft, args)
                made = tuple(_host(m) for m in made)  # before the next call overwrites graph buffers
                ft.synchronize()  # deferred stores reach the buffers read below
            for k, (g, w) in enumerate(zip(bases_dev, ref_bases)):
                _close(_host(g), w, prog.dtype, f"{what}: argument buffer {k}")
                n += 1
            assert len(made) == len(ref_made), what
            for k, (g, w) in enumerate(zip(made, ref_made)):
                _close(g, w, prog.dtype, f"{what}: value {k}")
                n += 1
        counts[mode] = n
    return counts


def minimize(prog: Program, modes: tuple[str, ...], device: str = "cpu", budget: int = 200) -> Program:
    """Drop statements while the mismatch persists (a program that still fails, maybe shorter)."""

    def fails(p: Program) -> bool:
        try:
            check_program(p, modes, device)
            return False
        except AssertionError:
            return True
        except Exception:
            return False  # a statement whose operand was dropped: not the same failure

    def without(p: Program, i: int) -> Program:
        rest = p.stmts[:i] + p.stmts[i + 1 :]
        return Program(p.seed, p.dtype, p.bases, p.inputs, rest, any(s[0] == "read" for s in rest))

    # statements that make values are only dropped from the end (later ones refer to them by slot)
    changed = True
    while changed and budget > 0:
        changed = False
        last = len(prog.stmts) - 1
        for i in range(last, -1, -1):
            if i != last and prog.stmts[i][0] in ("let", "read", "reduce", "softmax", "gemm"):
                continue
            budget -= 1
            cand = without(prog, i)
            if fails(cand):
                prog, changed = cand, True
                break
    return prog
