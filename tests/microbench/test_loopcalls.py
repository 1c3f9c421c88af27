"""Every loop point of the full kernel sweep can be built on the sweep's buffers."""

from __future__ import annotations

from microbench.kernelbench import MAX_ELEMENTS, KernelPlan, _loop_points, _Pool
from microbench.kernels.callspec import call_features
from microbench.loopcalls import loop_fn


def test_the_largest_point_of_every_loop_builds_on_the_sweeps_buffers():
    largest: dict[str, tuple] = {}
    for threads in (1, 2):
        for kernel, variant, dims in _loop_points(KernelPlan(threads=(1, 2)), threads):
            elements = call_features(kernel, dims)[0]
            if elements > largest.get(variant, (0,))[0]:
                largest[variant] = (elements, kernel, dims)
    pool = _Pool(MAX_ELEMENTS, 6, 0)
    for variant, (_, kernel, dims) in largest.items():
        assert callable(loop_fn(pool, kernel, variant, dims)), variant
