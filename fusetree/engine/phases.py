"""Host time of each phase of an eager realization, for benchmarks/host_overhead.py."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from . import executor
from .realization import context, run_group


def per_call(fn: Callable[[], Any], sync: Callable[[], None], n: int = 2000, repeats: int = 7) -> float:
    """Host µs per call of ``fn``: the median over ``repeats`` loops of ``n`` calls, each loop
    ended by ``sync()`` (a device synchronize, or nothing on the CPU), after a warm-up."""
    for _ in range(min(n, 200)):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)


def phases(
    build: Callable[[], Any], sync: Callable[[], None], n: int = 2000, repeats: int = 7
) -> dict[str, float]:
    """µs per call of each phase of realizing the array ``build()`` makes (a single elementwise
    tree): building it, the plan lookup (a hit), allocating the output, binding the arguments,
    the launch, and the realization of the prebuilt tree as a whole."""
    a = build()
    root = a._node
    device, shape = root.device, root.shape
    out = run_group([root], [], device, shape)[0]  # compiles, caches the plan
    ctx = context(device)
    be = ctx.be
    key = (root.key, len(shape))
    plan = ctx.plans[key]
    step = plan.single
    assert step is not None, "phases() times a single elementwise kernel"
    leaves = root.leaves

    def bind() -> list:
        args: list = []
        for x, strided in zip(leaves, step.forms):
            if x.op == "buffer":
                args.extend(executor.bind_leaf(be, x, strided))
            else:
                args.append(be.scalar_arg(x))
        return args

    def launch() -> None:
        be.launch(step.launcher, bind(), [out], step.out_layouts, shape)

    res = {
        "build the tree": per_call(build, sync, n, repeats),
        "plan lookup (hit)": per_call(lambda: ctx.plans.get(key), sync, n, repeats),
        "allocate the output": per_call(lambda: be.empty(shape, root.dtype), sync, n, repeats),
        "bind arguments": per_call(bind, sync, n, repeats),
        "bind + launch": per_call(launch, sync, n, repeats),
        "realize the prebuilt tree (lookup, alloc, bind, launch)": per_call(
            lambda: run_group([root], [], device, shape), sync, n, repeats
        ),
    }
    return res
