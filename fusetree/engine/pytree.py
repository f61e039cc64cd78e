"""Pytrees (JAX's convention): nested lists, tuples, named tuples and dicts whose leaves are arrays
or hashable values. ``ft.jit`` takes and returns them; the tree structure is part of the call's
signature."""

from __future__ import annotations

from typing import Any

LEAF = "*"


CONTAINERS = (list, tuple, dict)  # what is not a leaf (named tuples are tuples)
_FLAT_CALLS: dict[int, Any] = {}


def flat_call_tree(n: int) -> Any:
    """``flatten(((x1, ..., xn), {}))[1]`` for leaves ``x``: ``ft.jit``'s common call, without the walk.

    >>> flat_call_tree(2) == flatten(((1, 2), {}))[1]
    True
    """
    tree = _FLAT_CALLS.get(n)
    if tree is None:
        tree = _FLAT_CALLS[n] = flatten((tuple(range(n)), {}))[1]
    return tree


def flatten(x: Any) -> tuple[list[Any], Any]:
    """(leaves in order, the tree structure: hashable). Dict entries are ordered by key.

    >>> flatten({"b": [1, 2], "a": (3,)})
    ([3, 1, 2], ('dict', ('a', 'b'), (('tuple', 1), ('list', 2))))
    """
    leaves: list[Any] = []

    def go(v: Any) -> Any:
        t = type(v)
        if t is list or t is tuple:
            if not any(isinstance(c, CONTAINERS) for c in v):  # a flat sequence: (kind, length)
                leaves.extend(v)
                return ("list" if t is list else "tuple", len(v))
            return ("list" if t is list else "tuple", tuple(go(c) for c in v))
        if t is dict:
            keys = tuple(sorted(v))
            return ("dict", keys, tuple(go(v[k]) for k in keys))
        if isinstance(v, tuple) and hasattr(v, "_fields"):  # a named tuple
            return ("named", t, tuple(go(c) for c in v))
        leaves.append(v)
        return LEAF

    return leaves, go(x)


def unflatten(tree: Any, leaves: list[Any]) -> Any:
    """The inverse of :func:`flatten`.

    >>> unflatten(("tuple", 2), [1, 2]), unflatten(("dict", ("a",), (LEAF,)), [3])
    ((1, 2), {'a': 3})
    """
    if type(tree) is tuple and type(tree[-1]) is int:  # a flat sequence (a step's results): no walk
        if tree[0] == "tuple":
            return tuple(leaves)
        if tree[0] == "list":
            return list(leaves)
    it = iter(leaves)

    def go(node: Any) -> Any:
        if node == LEAF:
            return next(it)
        kind = node[0]
        if kind == "list" or kind == "tuple":
            kids = node[1]
            items = [next(it) for _ in range(kids)] if type(kids) is int else [go(c) for c in kids]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {k: go(c) for k, c in zip(node[1], node[2])}
        return node[1](*[go(c) for c in node[2]])

    return go(tree)
