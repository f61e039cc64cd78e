"""The kernel cache: compiled kernels by (backend tag, kernel key), least recently used evicted first.

A plan that runs a kernel keeps its launcher; evicting a kernel drops the plans that use it, so the
bound (``options(max_cached_kernels=...)``) bounds what compiled code is held.
"""

from __future__ import annotations

import gc
import itertools
from typing import Any

from .. import codegen, config
from ..errors import CompileError
from ..schedule.spec import KernelSpec
from .state import STATS

_CACHE: dict[tuple, Any] = {}  # (tag, key text) -> launcher
_USED: dict[tuple, int] = {}  # kernel key -> tick of its last compile or kernel-cache hit
_USERS: dict[tuple, list] = {}  # kernel key -> [(plan cache, plan key, plan)] holding its launcher
TICK = itertools.count(1)  # plans record ``next(TICK)`` in ``used`` when they run


def launcher_for(be: Any, tag: str, spec: KernelSpec, user: tuple[dict, tuple] | None = None) -> Any:
    """The compiled kernel of ``spec`` on backend ``be`` (compiled on a miss). ``user`` (a plan
    cache and key) is dropped when the kernel is evicted."""
    key = (tag, spec.key_text)
    launcher = _CACHE.get(key)
    if launcher is None:
        launcher = _compile(be, spec)
        _freeze_long_lived(be.target.name)
        bound = config.current.max_cached_kernels
        while _CACHE and len(_CACHE) >= bound:  # bounded: evict the least recently used
            _evict(min(_CACHE, key=_recency))
        _CACHE[key] = launcher
    else:
        STATS["cache_hits"] += 1
    _USED[key] = next(TICK)
    if user is not None:
        _USERS.setdefault(key, []).append(user)
    return launcher


_FROZEN: set[str] = set()  # targets whose first kernel froze the objects alive then


def _freeze_long_lived(target: str) -> None:
    """Once per target, after its first kernel: collect, then freeze what is alive (the compiler
    and its registries, just loaded) out of later collections (see ``config.GC_FREEZE``)."""
    if target in _FROZEN:
        return
    _FROZEN.add(target)
    if config.GC_FREEZE:
        gc.collect()
        gc.freeze()


def _recency(key: tuple) -> int:
    """When a kernel last ran: its last compile or cache hit, or the last run of a plan using it."""
    return max([_USED.get(key, 0)] + [plan.used for _, _, plan in _USERS.get(key, ())])


def _evict(key: tuple) -> None:
    del _CACHE[key]
    _USED.pop(key, None)
    for cache, pkey, _ in _USERS.pop(key, ()):
        cache.pop(pkey, None)


def _compile(be: Any, spec: KernelSpec) -> Any:
    source, params = codegen.render(spec, be.target, config.current)
    if config.current.debug:
        print(source)
    try:
        launcher, info = be.compile(spec, source, params)
    except CompileError:
        raise
    except Exception as e:
        path = be.save_source(spec, source)
        raise CompileError(
            f"kernel {spec.name} ({', '.join(o.op for o in spec.ops)}) failed to compile for "
            f"{be.target.name}: {type(e).__name__}: {e}\n  generated source: {path}"
        ) from e
    launcher.source = source
    STATS["compiles"] += 1
    if info.get("disk_hit"):
        STATS["disk_hits"] += 1
    return launcher


def cache_info() -> dict[str, int]:
    """Entries in the in-memory kernel cache and its bound (``options(max_cached_kernels=...)``)."""
    return {"entries": len(_CACHE), "max_entries": config.current.max_cached_kernels}


def clear() -> None:
    for users in _USERS.values():
        for cache, pkey, _ in users:
            cache.pop(pkey, None)
    _USERS.clear()
    _USED.clear()
    _CACHE.clear()
