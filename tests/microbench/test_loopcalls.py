"""Every loop point of the full kernel sweep can be built on the sweep's buffers, and every
compiled loop it times is compiled first, over the cores, where numba's cache is cold."""

from __future__ import annotations

import pytest

from microbench import kernelwarm
from microbench.kernelbench import MAX_ELEMENTS, KernelPlan, Pool, loop_points
from microbench.kernels.callspec import call_features
from microbench.kernelwarm import NOT_COMPILED, WARM_ELEMENTS, first_calls
from microbench.loopcalls import loop_fn
from tests.kernel_plans import TINY


def test_the_largest_point_of_every_loop_builds_on_the_sweeps_buffers():
    largest: dict[str, tuple] = {}
    for threads in (1, 2):
        for kernel, variant, dims in loop_points(KernelPlan(threads=(1, 2)), threads):
            elements = call_features(kernel, dims)[0]
            if elements > largest.get(variant, (0,))[0]:
                largest[variant] = (elements, kernel, dims)
    pool = Pool(MAX_ELEMENTS, 6, 0)
    for variant, (_, kernel, dims) in largest.items():
        assert callable(loop_fn(pool, kernel, variant, dims)), variant


@pytest.mark.parametrize("plan", [KernelPlan(threads=(1, 2)), TINY], ids=["full", "tiny"])
def test_the_first_calls_cover_every_compiled_loop_the_sweep_times_at_its_smallest(plan):
    points = [p for t in plan.threads for p in loop_points(plan, t) if p[0] not in NOT_COMPILED]
    calls = first_calls(plan)
    assert {(v, len(d)) for v, calls_of in calls.items() for _, d in calls_of} == {
        (v, len(d)) for _, v, d in points
    }
    for variant, calls_of in calls.items():
        for _, dims in calls_of:
            same = [sum(d) for k, v, d in points if v == variant and len(d) == len(dims)]
            assert sum(dims) == min(same)
    pool = Pool(WARM_ELEMENTS, 6, 0)  # the operands the compiling processes use fit them all
    for variant, calls_of in calls.items():
        for kernel, dims in calls_of:
            assert callable(loop_fn(pool, kernel, variant, dims)), variant


def test_a_cold_cache_is_compiled_over_the_processes_and_one_process_is_left_to_the_sweep(
    monkeypatch,
):
    two = {"relu_serial": [("relu", (4096,))], "relu_mask_serial": [("relu_mask", (4096,))]}
    monkeypatch.setattr(kernelwarm, "first_calls", lambda plan: two)
    monkeypatch.setattr(kernelwarm, "cold_cache", lambda: True)
    plan = KernelPlan(threads=(1,))
    assert kernelwarm.compile_loops(plan, 1) == (0, 0.0)  # one core: the sweep compiles
    variants, seconds = kernelwarm.compile_loops(plan, 2)  # spawned: a fresh interpreter each
    assert variants == 2 and seconds > 0
    monkeypatch.setattr(kernelwarm, "cold_cache", lambda: False)
    assert kernelwarm.compile_loops(plan, 2) == (0, 0.0)  # a warm cache: nothing to do


def test_a_machine_that_cannot_start_processes_leaves_the_compiling_to_the_sweep(monkeypatch):
    def no_processes(*args, **kwargs):
        raise OSError("no /dev/shm")

    monkeypatch.setattr(kernelwarm, "cold_cache", lambda: True)
    monkeypatch.setattr(kernelwarm, "ProcessPoolExecutor", no_processes)
    assert kernelwarm.compile_loops(KernelPlan(threads=(1,)), 2) == (0, 0.0)
