"""The pending op-tree as a networkx DAG: common-subexpression elimination, topological order, DOT.

Graph nodes are integers; attributes carry the IR node (``ir``), its op and dtype. Two IR nodes are
merged (CSE) when they have the same structural key *and* read the same leaves in the same
positions: then they compute the same value, whichever tree with the same key is being run.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from ..ir.node import Node


def build(roots: Sequence[Node], leaf_index: dict[int, int] | None = None) -> nx.DiGraph:
    """The DAG under ``roots`` (stopping at leaves), CSE applied. Edges point producer -> consumer;
    edge attribute ``pos`` is the operand position."""
    if leaf_index is None:
        leaf_index = {}
        for r in roots:
            for leaf in r.all_leaves:
                leaf_index.setdefault(id(leaf), len(leaf_index))
    g = nx.DiGraph()
    canon: dict[tuple, int] = {}  # (key, leaf positions) -> graph node
    ids: dict[int, int] = {}  # id(ir node) -> graph node
    for r in roots:
        stack: list[tuple[Node, bool]] = [(r, False)]
        while stack:
            n, ready = stack.pop()
            if id(n) in ids:
                continue
            if n.is_leaf:
                gid = ("leaf", leaf_index[id(n)])
                ids[id(n)] = canon.setdefault(gid, len(canon))  # type: ignore[arg-type]
                g.add_node(ids[id(n)], ir=n, op=n.op, dtype=n.dtype.name, leaf=leaf_index[id(n)])
                continue
            if not ready:
                stack.append((n, True))
                stack.extend((a, False) for a in reversed(n.args) if id(a) not in ids)
                continue
            sig = (n.key, tuple(leaf_index[id(x)] for x in n.leaves))
            gid_ = canon.get(sig)
            if gid_ is None:
                gid_ = canon[sig] = len(canon)
                g.add_node(gid_, ir=n, op=n.op, dtype=n.dtype.name)
                for pos, a in enumerate(n.args):
                    src = ids[id(a)]
                    if g.has_edge(src, gid_):
                        g.edges[src, gid_]["pos"] = g.edges[src, gid_]["pos"] + (pos,)
                    else:
                        g.add_edge(src, gid_, pos=(pos,))
            ids[id(n)] = gid_
    g.graph["ids"] = ids
    return g


def topological_order(g: nx.DiGraph) -> list[int]:
    """A deterministic topological order (graph node numbers follow first visit)."""
    return list(nx.lexicographical_topological_sort(g))


def to_dot(g: nx.DiGraph) -> str:
    """Graphviz DOT text of the DAG (no pydot needed)."""
    lines = ["digraph fusetree {", "  rankdir=BT;"]
    for n, d in g.nodes(data=True):
        label = f"{d['op']}\\n{d['dtype']}"
        if "leaf" in d:
            label = f"in{d['leaf']}: {label}"
        shape = "box" if "leaf" in d else "ellipse"
        lines.append(f'  n{n} [label="{label}", shape={shape}];')
    for a, b, d in g.edges(data=True):
        lines.append(f'  n{a} -> n{b} [label="{",".join(map(str, d["pos"]))}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
