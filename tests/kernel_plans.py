"""Kernel sweeps small enough for tests: real points of every kind, seconds instead of the quick
grid's minute."""

from __future__ import annotations

import dataclasses

from microbench.kernelbench import KernelPlan
from microbench.sampling import SamplingPolicy

TINY = KernelPlan(
    threads=(1,),
    gemm_dims=(1, 16, 256),
    gemm_max_flops=2**22,
    gemm_alias_n=(64,),
    gemm_alias_mk=((16, 2048),),
    loop_elements=(64, 4096),
    channel_runs=(1, 8),
    im2col_shapes=((3, 1, 1), (3, 1, 8)),
    policy=SamplingPolicy(warmup=0, min_samples=2, max_samples=2, time_cap_s=0.001),
    step_networks=2,
    step_rounds=2,
)
# TINY's GEMM grid and one shape of each loop kind, at one and two threads: the sweep's order at
# two thread counts, in a second rather than TINY's ten.
TWO_COUNTS = dataclasses.replace(
    TINY,
    threads=(1, 2),
    gemm_ragged_dims=(),
    gemm_partner_dims=(),
    gemm_alias_n=(),
    gemm_alias_mk=(),
    loop_elements=(64,),
    channel_runs=(1,),
    im2col_shapes=((3, 1, 1),),
    step_networks=0,
)
# TWO_COUNTS at one thread with TINY's step networks: the least sweep a profile's kernel model
# and step terms are fitted from, in about a second.
ONE_COUNT = dataclasses.replace(TWO_COUNTS, threads=(1,), step_networks=TINY.step_networks)
