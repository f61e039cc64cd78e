"""The engine: realization (plan cache, live-value rule, stores), the executor, the kernel cache and
``ft.jit``. Plans come from :mod:`fusetree.schedule`, kernels from :mod:`fusetree.codegen` compiled
and launched by :mod:`fusetree.backends`.
"""

from .kernels import cache_info
from .realization import (
    assign,
    clear_cache,
    compute_gemm,
    fold_sliced_sum,
    realize,
    realize_node,
    set_buffer,
    write_barrier,
    write_group,
)
from .state import HOOK, PENDING, STORES, check_readable, drop, reset_stats, stats
from .stores import defer, deferring, flush, queued_store

__all__ = ["HOOK", "PENDING", "STORES", "assign", "cache_info", "check_readable", "clear_cache", "compute_gemm", "defer",
           "deferring", "drop", "flush", "fold_sliced_sum", "queued_store", "realize", "realize_node", "reset_stats", "set_buffer",
           "stats", "write_barrier", "write_group"]  # fmt: skip
