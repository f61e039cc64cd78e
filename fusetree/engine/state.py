"""Engine state: the live pending arrays, counters, the trace recorder hook and the lock."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

# Live pending arrays: id(weak reference) -> weak reference; a reference removes itself when its
# array dies (``drop``), and realization removes it (the array keeps its reference in ``_pref``).
# Realizing a value also stores the live pending values inside its tree (see engine.realize).
PENDING: dict[int, weakref.ref] = {}


def drop(r: weakref.ref) -> None:
    PENDING.pop(id(r), None)


def recent_pending(lo: int, top: int = 1 << 62) -> list[Any]:
    """The live pending arrays that can hold a node made at or after uid ``lo`` (and before ``top``:
    their node's uid is checked), newest first.

    Arrays register in PENDING in the order of their marks (``Array._pmark``, drawn from the node
    uid counter when they register), and an array's node is older than its mark: the search walks
    PENDING from its newest end and stops at the first mark below ``lo``, so realizing a fresh value
    costs the few values made since, not one step per live pending array (10,000 pending values
    made every realize scan 10,000 entries). Each slice of the walk is taken by one C call
    (``list(islice(...))``), retried when PENDING changed in between: allocating the ``islice``
    object after its reversed iterator can run the garbage collector, whose weak-reference
    callbacks drop dead arrays from PENDING ("dictionary changed size during iteration", seen
    once on the H100). A longer slice skips what the last one looked at by mark, not position
    (entries dropped in between move the positions).
    """
    out: list[Any] = []
    seen = 1 << 62  # arrays with marks >= seen were looked at (positions can move: marks do not)
    k = 16
    while True:
        try:
            tail = list(itertools.islice(reversed(PENDING.values()), k))
        except RuntimeError:  # PENDING changed while the slice was taken (a collection): again
            continue
        for r in tail:
            w = r()
            if w is not None:
                m = w._pmark
                if m >= seen:
                    continue
                if m < lo:
                    return out
                seen = m
                if w._node.uid < top:
                    out.append(w)
        if len(tail) < k:
            return out
        k *= 8


# counters of :func:`stats` (plain ints: incremented on the hot path)
STATS: dict[str, int] = dict.fromkeys(
    ("compiles", "cache_hits", "plan_hits", "plans", "launches", "kernels", "gemms", "copies", "disk_hits",
     "traces", "replays", "graph_launches", "graph_captures", "graph_node_updates", "stores", "flushes",
     "flush_plan_hits", "horizontal"),
    0)  # fmt: skip
_ZERO = dict(STATS)

LOCK = threading.RLock()


class _Hook:
    """The trace being recorded by ``ft.jit`` (see engine.jit), else None."""

    recorder: Any = None
    flush: Any = None  # engine.stores.flush: writes the queued deferred stores
    # frontend.autodiff, while a gradient trace records: called (old node, buffer node) when a
    # pending array gets memory, so the backward pass reads the buffer and routes cotangents back
    tape: Any = None


# deferred stores waiting for a flush (engine.stores)
STORES: list = []


HOOK = _Hook()


def stats() -> dict[str, int]:
    """Counters since the last :func:`reset_stats`.

    ``compiles`` kernels generated and compiled; ``cache_hits`` kernels found in the kernel cache;
    ``plans``/``plan_hits`` plans made and found in the plan cache; ``launches`` every kernel
    fusetree launched, GEMMs and copies included (a CUDA graph counts once); ``kernels`` fused
    elementwise and reduction launches; ``gemms`` GEMM calls; ``copies`` copies (staging, stores
    of memory, graph inputs); ``traces``/``replays`` ft.jit traces and replays;
    ``graph_captures``/``graph_launches`` CUDA graphs captured and launched;
    ``graph_node_updates`` kernel nodes re-pointed at new argument addresses (instead of copies);
    ``stores``/``flushes`` deferred stores queued and the flushes that wrote them;
    ``horizontal`` horizontal launches (one kernel over many same-structure tensors).

    >>> import fusetree as ft
    >>> ft.reset_stats(); sorted(ft.stats())[:3]
    ['cache_hits', 'compiles', 'copies']
    """
    return dict(STATS)


def reset_stats() -> None:
    """Zero the counters of :func:`stats`."""
    STATS.update(_ZERO)


def check_readable() -> None:
    """Reading values is refused while ``ft.jit`` records a trace (the trace would freeze them)."""
    if HOOK.recorder is not None:
        from ..errors import UnsupportedError

        raise UnsupportedError(
            "reading an array's values inside an ft.jit function: the trace would freeze them; "
            "return the value instead, or call the function without ft.jit"
        )
