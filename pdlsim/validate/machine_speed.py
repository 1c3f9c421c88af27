"""The machine's speed during a validation, set against the profile the run is validated with.

A shared machine changes speed as its tenants come and go: calibrations an hour apart on the
same VM differed by as much as the model's error. So that a reader can tell a model's miss
from a slow spell, ``pdlsim validate`` times two reference kernels before each round of
launches and after the last, as the kernel sweep times them (its sampling policy; one
thread, operands its own, back to back), and divides the profile's price by the time: x1.10
means the machine ran 10% faster than when the profile was measured. The square GEMM
(:data:`PROBES`: 256 x 256 x 256) is bound by the cores; the skinny one (64 x 256 x 1024, a
1 MiB operand, an MLP layer's shape) also by the L2 cache, and on the 2-core VM it has slowed
by a quarter while the square one slowed by 8%; the serial relu over 2^21 floats
(8 MiB) by the last-level cache, which a VM shares with its tenants; the tiny training step
(:data:`TINY_STEP`, one of the step benchmark's networks whose kernels do next to no work) by
the Python and dispatch between kernels, which can slow down while both kernels keep their
speed (on the 2-core VM, a day on which the GEMM probe read x0.96 read x0.7 here). The figures
are reported beside the results, as the machine's state; no prediction reads them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from calibration.kernels import KernelModel
from microbench.kernelbench import FULL_POLICY
from microbench.kernels import loops
from microbench.kernels.calls import KernelCall
from microbench.kernels.steps import glue_workloads, step_fn
from microbench.sampling import median_s

__all__ = ["PROBES", "TINY_STEP", "machine_speed", "probe", "speed_line"]

# name -> the kernel call the profile's tables price (one thread)
PROBES: dict[str, KernelCall] = {
    "gemm 256^3": KernelCall("gemm_nn", (256, 256, 256), 0, "forward"),
    "gemm 64x256x1024": KernelCall("gemm_nn", (64, 256, 1024), 0, "forward"),
    "relu 2^21": KernelCall("relu", (2**21,), 0, "forward"),
}
TINY_STEP = "glue-dense2"  # the step benchmark's network timed whole, at batch 1


def _kernel(call: KernelCall) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    if call.kernel == "gemm_nn":
        m, n, k = call.dims
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        out = np.empty((m, n), dtype=np.float32)
        return lambda: np.matmul(a, b, out=out)
    x = rng.standard_normal(call.dims[0], dtype=np.float32)
    return lambda: loops.relu_serial(x)


def probe(model: KernelModel) -> dict[str, float]:
    """One probe: per reference (:data:`PROBES`, then "step TINY_STEP"), ``model``'s price at
    one thread (a kernel's table seconds; the tiny step's tables, interplay and glue) over its
    measured median seconds, timed with BLAS on one thread."""
    from threadpoolctl import threadpool_limits

    out = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for name, call in PROBES.items():
            out[name] = model.call_s(call, 1) / median_s(_kernel(call), FULL_POLICY)
        tiny = next(w for w in glue_workloads() if w.name == TINY_STEP)
        seconds = median_s(step_fn(tiny, 1), FULL_POLICY)
        out[f"step {TINY_STEP}"] = model.step_s(tiny, 1, 1) / seconds
    return out


def machine_speed(probes: list[dict[str, float]]) -> dict[str, Any] | None:
    """The report's ``machine_speed``: every probe, and per kernel the lowest, median and
    highest speed (None without probes: a profile without kernel tables)."""
    if not probes:
        return None
    return {
        "about": "profile table seconds / seconds measured now, one thread; reported, "
        "never folded into a prediction",
        "probes": probes,
        "range": {
            name: [
                min(p[name] for p in probes),
                statistics.median(p[name] for p in probes),
                max(p[name] for p in probes),
            ]
            for name in probes[0]
        },  # fmt: skip
    }


def speed_line(speed: dict[str, Any] | None) -> str | None:
    """One line of the text report: each kernel's speed range over the run's probes."""
    if not speed:
        return None
    parts = [f"{name} x{lo:.2f}..x{hi:.2f}" for name, (lo, _, hi) in speed["range"].items()]
    return (
        f"machine speed during the run against the profile's tables ({len(speed['probes'])} "
        f"probes; x>1 faster than at calibration): {', '.join(parts)}"
    )
