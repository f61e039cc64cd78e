"""The op table: one row per elementwise op drives names, dtype rules, codegen and reference tests.

Each :class:`OpDef` has

* ``ref``: a NumPy reference. It *defines* the result dtype (called on one-element samples) and is
  what the reference tests compare kernels against.
* ``template``: the kernel expression. ``{0}``, ``{1}``, ``{2}`` are operand names (already cast as
  ``operands`` says), ``{T}`` the constructor of the compute dtype (``float32``...), ``{t}`` its short
  name (``f4``) for typed helpers such as ``exp_f4``. A dict maps dtype kinds (``b i u f``) to
  templates, ``"*"`` being the default.
* ``operands``: how operands are cast before the template: ``"out"`` to the result's compute dtype,
  ``"common"`` to the promoted operand dtype (comparisons), ``"bool"``, or ``"keep"``.
* ``vjp``: the derivative rule (reverse mode, see :mod:`fusetree.frontend.autodiff`):
  ``vjp(F, g, y, *xs)`` gives each operand's cotangent (None: no gradient) from the result's
  cotangent ``g``, the result ``y`` and the operands ``xs``, written with the array namespace ``F``
  (fusetree for training, NumPy in the tests, which check every rule against finite differences).
  Ops without a rule (comparisons, bitwise, rounding) pass no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..errors import DTypeError
from . import dtypes

Template = str | dict[str, str]


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int
    ref: Callable[..., object]
    template: Template
    operands: str = "out"
    # accuracy of the kernel against a float64 reference, in units of the result dtype's eps
    ulps: float = 4.0
    # domain used by the reference tests to draw inputs: "any", "positive", "unit" (|x|<=1), "small"
    domain: str = "any"
    notes: str = field(default="", compare=False)
    vjp: Callable[..., tuple] | None = field(default=None, compare=False)

    def template_for(self, kind: str) -> str:
        t = self.template
        if isinstance(t, str):
            return t
        return t.get(kind, t.get("*", ""))


def _f64like(fn: Callable[[np.ndarray], np.ndarray], like: Callable[..., object]):
    """A reference computed in float64 with the dtype NumPy's ``like`` ufunc would give."""

    def ref(x):
        x = np.asarray(x)
        with np.errstate(all="ignore"):
            out_dt = np.asarray(like(np.ones(1, x.dtype))).dtype
            return np.asarray(fn(x.astype(np.float64))).astype(out_dt)

    return ref


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _round(x):
    return np.round(np.asarray(x))


_U = "{0}"
OPS: dict[str, OpDef] = {}


def _op(name: str, arity: int, ref, template: Template, **kw) -> None:
    OPS[name] = OpDef(name, arity, ref, template, **kw)


# ---- binary arithmetic ----
_op("add", 2, np.add, "{0} + {1}")
_op("subtract", 2, np.subtract, "{0} - {1}")
_op("multiply", 2, np.multiply, "{0} * {1}")
_op("true_divide", 2, np.true_divide, "{0} / {1}")
_op("floor_divide", 2, np.floor_divide, {"f": "floordiv_{t}({0}, {1})", "*": "ifloordiv({0}, {1})"})
_op("remainder", 2, np.remainder, {"f": "fmod_py_{t}({0}, {1})", "*": "imod({0}, {1})"})
_op("power", 2, np.power, {"f": "pow_{t}({0}, {1})", "*": "ipow({0}, {1})"}, ulps=8, domain="small")
_op("maximum", 2, np.maximum, "maximum({0}, {1})")
_op("minimum", 2, np.minimum, "minimum({0}, {1})")
_op("fmax", 2, np.fmax, "fmax({0}, {1})")
_op("fmin", 2, np.fmin, "fmin({0}, {1})")
_op("arctan2", 2, np.arctan2, "atan2_{t}({0}, {1})")
# ---- comparisons (operands promoted to their common dtype) ----
_op("equal", 2, np.equal, "{0} == {1}", operands="common")
_op("not_equal", 2, np.not_equal, "{0} != {1}", operands="common")
_op("less", 2, np.less, "{0} < {1}", operands="common")
_op("less_equal", 2, np.less_equal, "{0} <= {1}", operands="common")
_op("greater", 2, np.greater, "{0} > {1}", operands="common")
_op("greater_equal", 2, np.greater_equal, "{0} >= {1}", operands="common")
# ---- logical and bitwise ----
_op("logical_and", 2, np.logical_and, "{0} and {1}", operands="bool")
_op("logical_or", 2, np.logical_or, "{0} or {1}", operands="bool")
_op("logical_not", 1, np.logical_not, "not {0}", operands="bool")
_op("bitwise_and", 2, np.bitwise_and, "{0} & {1}")
_op("bitwise_or", 2, np.bitwise_or, "{0} | {1}")
_op("bitwise_xor", 2, np.bitwise_xor, "{0} ^ {1}")
_op("left_shift", 2, np.left_shift, "ilshift({0}, {1}, {bits})")
_op("right_shift", 2, np.right_shift, "irshift({0}, {1}, {bits})")
_op("invert", 1, np.invert, {"b": "not {0}", "*": "~{0}"})
# ---- unary arithmetic ----
_op("negative", 1, np.negative, "-{0}")
_op("absolute", 1, np.absolute, {"b": _U, "u": _U, "*": "abs({0})"})
_op("square", 1, np.square, "{0} * {0}")
_op("reciprocal", 1, np.reciprocal, {"f": "{T}(1) / {0}", "*": "ireciprocal({0})"}, domain="nonzero")
_op("sign", 1, np.sign, "sign({0})")
_op("sqrt", 1, np.sqrt, "sqrt_{t}({0})", domain="positive")
_op("rsqrt", 1, _f64like(lambda x: 1.0 / np.sqrt(x), np.sqrt), "rsqrt_{t}({0})", domain="positive")
_op("relu", 1, lambda x: np.maximum(x, 0), "maximum({0}, {T}(0))")
# ---- transcendental ----
_op("exp", 1, np.exp, "exp_{t}({0})")
_op("exp2", 1, np.exp2, "exp2_{t}({0})")
_op("expm1", 1, np.expm1, "expm1_{t}({0})")
_op("log", 1, np.log, "log_{t}({0})", domain="positive")
_op("log2", 1, np.log2, "log2_{t}({0})", domain="positive")
_op("log10", 1, np.log10, "log10_{t}({0})", domain="positive")
_op("log1p", 1, np.log1p, "log1p_{t}({0})", domain="positive")
_op("sin", 1, np.sin, "sin_{t}({0})")
_op("cos", 1, np.cos, "cos_{t}({0})")
_op("tan", 1, np.tan, "tan_{t}({0})", ulps=16)
_op("tanh", 1, np.tanh, "tanh_{t}({0})")
_op("sinh", 1, np.sinh, "sinh_{t}({0})", domain="small")
_op("cosh", 1, np.cosh, "cosh_{t}({0})", domain="small")
_op("arcsin", 1, np.arcsin, "asin_{t}({0})", domain="unit")
_op("arccos", 1, np.arccos, "acos_{t}({0})", domain="unit")
_op("arctan", 1, np.arctan, "atan_{t}({0})")
_op("sigmoid", 1, _f64like(_sigmoid, np.exp), "sigmoid_{t}({0})")
_op("erf", 1, _f64like(_erf, np.exp), "erf_{t}({0})")
# ---- rounding ----
_op("floor", 1, np.floor, {"f": "floor_{t}({0})", "*": _U})
_op("ceil", 1, np.ceil, {"f": "ceil_{t}({0})", "*": _U})
_op("trunc", 1, np.trunc, {"f": "trunc_{t}({0})", "*": _U})
_op("round", 1, _round, {"f": "rint_{t}({0})", "*": _U})
# ---- classification ----
_op("isnan", 1, np.isnan, {"f": "{0} != {0}", "*": "False"}, operands="keep")
_op("isinf", 1, np.isinf, {"f": "isinf({0})", "*": "False"}, operands="keep")
_op("isfinite", 1, np.isfinite, {"f": "isfinite({0})", "*": "True"}, operands="keep")
# ---- selection and casts (attrs-driven ops) ----
_op("where", 3, np.where, "{1} if {0} else {2}", operands="where")
_op("astype", 1, lambda x, dtype: np.asarray(x).astype(dtype), _U)

# ---- derivative rules: vjp(F, g, y, *xs) -> one cotangent per operand (None: none) ----
_LN2, _LN10, _2_SQRT_PI = math.log(2.0), math.log(10.0), 2.0 / math.sqrt(math.pi)


def _half_ties(F, g, a, b):  # maximum/minimum: the winner gets g, a tie splits it (JAX's rule)
    return F.where(a == b, g * 0.5, F.where(a > b, g, g * 0.0))


VJP: dict[str, Callable[..., tuple]] = {
    "add": lambda F, g, y, a, b: (g, g),
    "subtract": lambda F, g, y, a, b: (g, -g),
    "multiply": lambda F, g, y, a, b: (g * b, g * a),
    "true_divide": lambda F, g, y, a, b: (g / b, -g * y / b),
    "power": lambda F, g, y, a, b: (
        g * b * F.power(a, b - 1),
        g * F.where(a > 0, y * F.log(F.where(a > 0, a, a * 0 + 1)), y * 0.0),
    ),
    "maximum": lambda F, g, y, a, b: (_half_ties(F, g, a, b), _half_ties(F, g, b, a)),
    "minimum": lambda F, g, y, a, b: (_half_ties(F, g, b, a), _half_ties(F, g, a, b)),
    "fmax": lambda F, g, y, a, b: (_half_ties(F, g, a, b), _half_ties(F, g, b, a)),
    "fmin": lambda F, g, y, a, b: (_half_ties(F, g, b, a), _half_ties(F, g, a, b)),
    "arctan2": lambda F, g, y, a, b: (g * b / (a * a + b * b), -g * a / (a * a + b * b)),
    "remainder": lambda F, g, y, a, b: (g, -g * F.floor_divide(a, b)),
    "negative": lambda F, g, y, x: (-g,),
    "absolute": lambda F, g, y, x: (g * F.sign(x),),
    "square": lambda F, g, y, x: (g * 2 * x,),
    "reciprocal": lambda F, g, y, x: (-g * y * y,),
    "sqrt": lambda F, g, y, x: (g * 0.5 / y,),
    "rsqrt": lambda F, g, y, x: (g * -0.5 * y / x,),
    "relu": lambda F, g, y, x: (F.where(x > 0, g, g * 0.0),),
    "exp": lambda F, g, y, x: (g * y,),
    "exp2": lambda F, g, y, x: (g * y * _LN2,),
    "expm1": lambda F, g, y, x: (g * (y + 1),),
    "log": lambda F, g, y, x: (g / x,),
    "log2": lambda F, g, y, x: (g / (x * _LN2),),
    "log10": lambda F, g, y, x: (g / (x * _LN10),),
    "log1p": lambda F, g, y, x: (g / (x + 1),),
    "sin": lambda F, g, y, x: (g * F.cos(x),),
    "cos": lambda F, g, y, x: (-g * F.sin(x),),
    "tan": lambda F, g, y, x: (g * (y * y + 1),),
    "tanh": lambda F, g, y, x: (g * (1 - y * y),),
    "sinh": lambda F, g, y, x: (g * F.cosh(x),),
    "cosh": lambda F, g, y, x: (g * F.sinh(x),),
    "arcsin": lambda F, g, y, x: (g / F.sqrt(1 - x * x),),
    "arccos": lambda F, g, y, x: (-g / F.sqrt(1 - x * x),),
    "arctan": lambda F, g, y, x: (g / (x * x + 1),),
    "sigmoid": lambda F, g, y, x: (g * y * (1 - y),),
    "erf": lambda F, g, y, x: (g * _2_SQRT_PI * F.exp(-(x * x)),),
    "where": lambda F, g, y, c, a, b: (None, F.where(c, g, g * 0.0), F.where(c, g * 0.0, g)),
    "astype": lambda F, g, y, x: (g,),  # cast back to the operand's dtype by the caller
}
for _name, _rule in VJP.items():
    OPS[_name] = OpDef(**{**OPS[_name].__dict__, "vjp": _rule})

# Python operators -> op names (reflected forms swap operands).
BINARY_OPERATORS = {
    "__add__": "add", "__sub__": "subtract", "__mul__": "multiply", "__truediv__": "true_divide",
    "__floordiv__": "floor_divide", "__mod__": "remainder", "__pow__": "power",
    "__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor",
    "__lshift__": "left_shift", "__rshift__": "right_shift",
    "__eq__": "equal", "__ne__": "not_equal", "__lt__": "less", "__le__": "less_equal",
    "__gt__": "greater", "__ge__": "greater_equal",
}  # fmt: skip
UNARY_OPERATORS = {"__neg__": "negative", "__abs__": "absolute", "__invert__": "invert"}
# augmented assignments write in place (``a += b`` is ``add(a, b, out=a, casting="same_kind")``)
INPLACE_OPERATORS = {
    "__i" + m[2:]: op for m, op in BINARY_OPERATORS.items()
    if m not in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
} | {"__imatmul__": "matmul"}  # fmt: skip


class Rule(NamedTuple):
    """The dtypes of one application of an op: the result's and each operand's compute dtype."""

    out: np.dtype
    operands: tuple[np.dtype, ...]


_RULES: dict[tuple, Rule] = {}
# binary ops on two dtypes (or a dtype and a weak Python float): (op, desc0, desc1) -> Rule, the
# operators' fast path (one tuple, one lookup)
RULES2: dict[tuple, Rule] = {}  # (op, dtype, dtype | float) -> rule: the binary operators' fast path
RULES1: dict[tuple, Rule] = {}  # (op, dtype) -> rule: the unary functions' fast path


def rule(op: str, descs: tuple[dtypes.Desc, ...], attrs: tuple = ()) -> Rule:
    """The dtype rule of ``op`` on operands described by ``descs`` (dtypes, or Python types if
    weak), memoized: one dict lookup on the hot path. Raises DTypeError naming the op and the
    operand dtypes when NumPy refuses the combination."""
    k = (op, descs, attrs)
    r = _RULES.get(k)
    if r is None:
        out = result_dtype(op, descs, attrs)
        r = _RULES[k] = Rule(out, tuple(operand_dtype(op, descs, out, i) for i in range(len(descs))))
        if len(descs) == 2 and not attrs:
            # (identity tests: an int64 dtype compares equal to ``int``)
            if (descs[0] is not int and descs[1] is not int) or _int_fast(op, descs):
                RULES2[(op, descs[0], descs[1])] = r
        elif len(descs) == 1 and not attrs and isinstance(descs[0], np.dtype):
            RULES1[(op, descs[0])] = r
    return r


# the ops NumPy 2 computes on a Python int's true value (not converted to the array's dtype)
COMPARISONS = frozenset(("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"))


def _int_fast(op: str, descs: tuple) -> bool:
    """Whether ``RULES2`` may hold the rule of ``op`` on a float dtype and a weak Python int: the
    int needs no range check there (a float dtype takes any int NumPy 2 accepts; the operators'
    fast path takes ints of at most 2**53 in magnitude, exact in float64) and is not a comparison
    (which NumPy makes on the int's true value)."""
    other = descs[1] if descs[0] is int else descs[0]
    return isinstance(other, np.dtype) and other.kind == "f" and op not in COMPARISONS


def result_dtype(op: str, descs: tuple[dtypes.Desc, ...], attrs: tuple = ()) -> np.dtype:
    """Result dtype of ``op`` on operands described by ``descs``: NumPy's reference run on
    one-element samples (so the rule is NumPy's by construction)."""
    d = OPS[op]
    samples = [dtypes.sample(x) for x in descs]
    try:
        with np.errstate(all="ignore"):
            if op == "astype":
                return dtypes.check(attrs[0], "astype")
            out = d.ref(*samples)
    except (TypeError, ValueError) as e:
        given = ", ".join(dtypes.describe(x) for x in descs)
        raise DTypeError(f"{op} is not supported for operand dtype(s) ({given}): {e}") from None
    dt = np.asarray(out).dtype
    return dtypes.check(dt, f"result of {op}")


def operand_dtype(op: str, descs: tuple[dtypes.Desc, ...], out: np.dtype, index: int) -> np.dtype:
    """The compute dtype operand ``index`` is cast to before ``op``'s template is applied."""
    rule_ = OPS[op].operands
    if rule_ == "out":
        return dtypes.register(out)
    if rule_ == "bool" or (rule_ == "where" and index == 0):
        return np.dtype(np.bool_)
    if rule_ == "where":
        return dtypes.register(out)
    if rule_ == "common":
        return dtypes.register(dtypes.result_type(*descs))
    d = descs[index]
    return dtypes.register(d if isinstance(d, np.dtype) else dtypes.weak_default(d))


__all__ = ["OPS", "REDUCTIONS", "OpDef", "ReduceDef", "Rule", "operand_dtype", "result_dtype", "rule"]


# ---------------------------------------------------------------------------------------------
# reductions: the same idea, one row per reduction kind. ``ref`` is NumPy's function (dtype rule and
# test oracle); ``combine`` merges two partial accumulators (``{0}``, ``{1}``); ``identity`` starts
# an accumulator ("lowest"/"highest" are the dtype's extreme values, -inf/+inf for floats).
# Composite reductions (mean, var, std, logsumexp) are built from these in fusetree.reductions.


@dataclass(frozen=True)
class ReduceDef:
    name: str
    ref: Callable[..., object]
    combine: str
    identity: str
    # where the partial results of a two-stage reduction are combined by: (reduction, its dtype)
    stage2: str = ""
    index: bool = False  # argmax/argmin: the result is the position of the winner

    @property
    def two_stage(self) -> bool:
        return bool(self.stage2)


REDUCTIONS: dict[str, ReduceDef] = {
    "sum": ReduceDef("sum", np.sum, "{0} + {1}", "0", stage2="sum"),
    "prod": ReduceDef("prod", np.prod, "{0} * {1}", "1", stage2="prod"),
    "max": ReduceDef("max", np.max, "maximum({0}, {1})", "lowest", stage2="max"),
    "min": ReduceDef("min", np.min, "minimum({0}, {1})", "highest", stage2="min"),
    "any": ReduceDef("any", np.any, "max({0}, {1})", "0", stage2="max"),
    "all": ReduceDef("all", np.all, "min({0}, {1})", "1", stage2="min"),
    "argmax": ReduceDef("argmax", np.argmax, "", "lowest", index=True),
    "argmin": ReduceDef("argmin", np.argmin, "", "highest", index=True),
}


@lru_cache(maxsize=1024)
def reduce_dtypes(kind: str, dt: np.dtype, target: str = "") -> tuple[np.dtype, np.dtype]:
    """(result dtype, accumulator dtype) of reduction ``kind`` over ``dt``.

    The result dtype is NumPy's (the reference run on a sample: integer sums give the platform
    integer). Accumulators: float16 accumulates in float32; float32 sums accumulate in float64 on
    the CPU (a sequential loop; the GPU's tree reduction is accurate in float32); booleans and
    any/all count in int32; max/min keep the value's register dtype.
    """
    d = REDUCTIONS[kind]
    with np.errstate(all="ignore"):
        out = np.asarray(d.ref(np.ones(2, dt))).dtype
    small_int = dt.kind in "iu" and dt.itemsize < 4  # held in int32 (warp shuffles move 4 or 8 bytes)
    if d.index:
        return out, (
            np.dtype(np.int64) if dt.kind == "b" else np.dtype(np.int32) if small_int else dtypes.register(dt)
        )
    if kind in ("any", "all") or (dt.kind == "b" and kind in ("max", "min")):
        return out, np.dtype(np.int32)
    if small_int and kind in ("max", "min"):
        return out, np.dtype(np.int32)
    acc = dtypes.register(out)
    if kind in ("sum", "prod") and out.kind == "f" and target == "cpu":
        acc = np.dtype(np.float64)
    return out, acc


def identity_value(kind: str, acc: np.dtype) -> str:
    """Source text of the identity of ``kind`` in accumulator dtype ``acc``."""
    ident = REDUCTIONS[kind].identity
    if ident in ("lowest", "highest"):
        if acc.kind == "f":
            return f"{dtypes.CTOR[acc]}({'-' if ident == 'lowest' else ''}np.inf)"
        info = np.iinfo(acc)
        return f"{dtypes.CTOR[acc]}({info.min if ident == 'lowest' else info.max})"
    return f"{dtypes.CTOR[acc]}({ident})"
