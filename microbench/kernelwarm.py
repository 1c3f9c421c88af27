"""Compile every numba loop the kernel sweep times, spread over the cores, before any timing.

numba compiles a kernel on its first call and keeps the machine code in its cache beside the
source (``cache=True``), where every later process loads it in well under a second. On a
machine that has never run pdlsim, the sweep would compile its 63 loop variants one after the
other: 87 s on the 2-core EPYC VM, a third of a ``pdlsim validate --quick``, spent on one core
while the others idle. :func:`compile_loops` makes one first call of each variant (each
``(variant, number of dims)`` the sweep's loop points have, at their smallest size) in a pool
of processes, one variant per task, so that no two processes write the same kernel's cache
index. With the cache warm it does nothing: the sweep loads each loop as it reaches it. The
trainer calls the same kernels.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from microbench.kernelbench import KernelPlan, Pool, loop_points
from microbench.loopcalls import loop_fn

__all__ = ["compile_loops", "first_calls"]

# Operands of the first calls: the smallest loop point of each variant fits (reshape refuses
# one that does not, by name).
WARM_ELEMENTS = 2**20
# numpy's own calls among the sweep's loops: nothing to compile (the gather's data set is
# sized beyond the caches, larger than these operands)
NOT_COMPILED = frozenset({"gather", "copy", "copy_runs", "uniform"})


def first_calls(plan: KernelPlan) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Per loop variant the sweep times at any of ``plan.threads``, one (kernel, dims) for each
    number of dims it is called with: the smallest such point (numba compiles one
    specialisation per array rank; sizes share it)."""
    smallest: dict[tuple[str, int], tuple[str, tuple[int, ...]]] = {}
    for threads in plan.threads:
        for kernel, variant, dims in loop_points(plan, threads):
            if kernel in NOT_COMPILED:
                continue
            key = (variant, len(dims))
            if key not in smallest or sum(dims) < sum(smallest[key][1]):
                smallest[key] = (kernel, dims)
    calls: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for (variant, _), call in sorted(smallest.items()):
        calls.setdefault(variant, []).append(call)
    return calls


def _compile(variant: str, calls: list[tuple[str, tuple[int, ...]]]) -> float:
    """The first call of ``variant`` at each of ``calls``; seconds taken (compiling, or loading
    from the cache)."""
    started = time.perf_counter()
    pool = Pool(WARM_ELEMENTS, 6, 0)
    for kernel, dims in calls:
        loop_fn(pool, kernel, variant, dims)()
    return time.perf_counter() - started


def cold_cache() -> bool:
    """Whether numba's cache lacks the loops (a machine that never ran pdlsim, or a new
    numba): one small loop's first call here missed it. A cache that lacks only some loops
    reads as warm, and the sweep compiles those as it reaches them."""
    from microbench.kernels import loops

    loops.relu_serial(np.zeros(8, np.float32))
    return bool(loops.relu_serial.stats.cache_misses)


def compile_loops(plan: KernelPlan, processes: int) -> tuple[int, float]:
    """Where the cache is cold (:func:`cold_cache`) and ``processes`` > 1, compile every loop
    variant of ``plan`` over that many processes (fresh interpreters: a forked one would
    inherit this one's numba threads). Returns the variants compiled and the seconds they
    took, summed over the processes; (0, 0.0) where nothing needed it."""
    if processes <= 1 or not cold_cache():
        return 0, 0.0
    calls = first_calls(plan)
    # the parallel drivers compile several times slower than the serial ones: first in line
    order = sorted(calls, key=lambda v: v.endswith("_serial"))
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
            seconds = list(pool.map(_compile, order, [calls[v] for v in order]))
    except (OSError, BrokenProcessPool):  # no processes to be had (a container without
        return 0, 0.0  # /dev/shm, a worker killed): the sweep compiles each loop as before
    return len(order), sum(seconds)
