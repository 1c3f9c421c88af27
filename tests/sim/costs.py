"""A made-up machine for simulator tests: round numbers, so expected times are easy to derive.

These are not measurements and nothing outside the tests uses them; real predictions take
their numbers from a calibrated profile.
"""

from __future__ import annotations

from typing import Any

from pdlsim.sim import LinearCostModel, LinkCost

EXAMPLE = {
    "cpu_flops_per_s": 2.0e10,
    "cpu_serial_fraction": 0.05,
    "cpu_layer_overhead_s": 0.0,
    "gpu_flops_per_s": 2.0e13,
    "gpu_kernel_latency_s": 5.0e-6,
    "intra": LinkCost(1.0e-6, 1.0e11, 1.0e12),
    "inter": LinkCost(5.0e-6, 1.25e10, 1.0e12),
    "transfer_latency_s": 1.0e-5,
    "pinned_bandwidth_bytes_per_s": 2.5e10,
    "pageable_bandwidth_bytes_per_s": 1.0e10,
}


def example_cost(**overrides: Any) -> LinearCostModel:
    return LinearCostModel(**{**EXAMPLE, **overrides})
