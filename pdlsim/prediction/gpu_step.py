"""GPU compute from the user's own measurement: one GPU's step time (``--step-time``) or its
model-FLOPs utilisation (``--mfu``), split over the layers as the cost model prices them.

A data sheet's roofline says how a step's time divides among layers better than how long the
step takes; a measured single-GPU step says the second. So the prediction keeps the first and
takes the second: every GPU layer's compute is multiplied by one factor, chosen so that one GPU
at the same batch, precision and copy settings takes the given step. With gradient accumulation
(``--grad-accum K``) the given step is one GPU's time per micro-batch, which carries a K-th of
the optimizer's update, as a throughput measured with that accumulation says; a step measured at
another accumulation K1 (``--step-time-accum K1``, e.g. one GPU timed without accumulation, or a
vendor's single-GPU figure at a large one) carries a K1-th of it, and the prediction at K prices
the update once per K micro-batches all the same. With ``--mfu F``
the step is the workload's forward and backward FLOPs at the batch over F x the GPU's peak at
the precision. Either way the compute assumptions (the data sheet's efficiencies and launch cost)
no longer move the band: the step is given.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from microbench.errors import UserError
from pdlsim.prediction.config import PredictConfig, parse_time

__all__ = ["COMPUTE_ASSUMPTIONS", "given_compute", "with_given_step"]

COMPUTE_ASSUMPTIONS = ("gpu_flops_efficiency", "gpu_memory_efficiency", "gpu_kernel_launch_s")
MIN_MFU = 1e-6  # below it a GPU's step would take ages: a typo, not a measurement


def given_compute(cost: Any, **changes: Any) -> Any:
    """``cost`` with ``changes`` and its compute assumptions pinned at their values: a measured
    or given GPU step leaves them nothing to move in the band."""
    assumptions = dict(cost.assumptions)
    for name in COMPUTE_ASSUMPTIONS:
        a = assumptions[name]
        assumptions[name] = replace(a, low=a.value, high=a.value)
    return replace(cost, assumptions=assumptions, **changes)


def _target_s(cfg: PredictConfig, cost: Any, workload: Any) -> tuple[float, str]:
    if cfg.step_time is not None and cfg.mfu is not None:
        raise UserError("--step-time and --mfu both describe one GPU's step: give one of them")
    if cfg.step_time_accum is not None and cfg.step_time is None:
        raise UserError("--step-time-accum says how --step-time was measured: add --step-time "
                        "or drop --step-time-accum")  # fmt: skip
    if cfg.step_time_accum is not None and cfg.step_time_accum < 1:
        raise UserError(f"--step-time-accum must be a positive integer, got {cfg.step_time_accum}")
    if cfg.step_time is not None:
        seconds = parse_time(cfg.step_time, "--step-time")
        if seconds <= 0:
            raise UserError(f"--step-time must be above 0, got {cfg.step_time}")
        return seconds, f"--step-time {cfg.step_time}"
    if not MIN_MFU <= cfg.mfu <= 1:
        raise UserError(
            f"--mfu is a fraction of the GPU's peak from {MIN_MFU:g} to 1, got {cfg.mfu:g}"
        )
    if cost.gpu is None:
        raise UserError("--mfu needs the GPU's peak: give --gpu-preset NAME (not none)")
    flops = cfg.batch * (workload.forward_flops_per_sample + workload.backward_flops_per_sample)
    peak = cost.training.peak_flops_per_s(cost.gpu)
    return flops / (cfg.mfu * peak), f"--mfu {cfg.mfu:g} of {cost.gpu.name}'s {peak:.3g} FLOP/s"


def with_given_step(
    cfg: PredictConfig, scenario: Any, cost: Any, workload: Any
) -> tuple[Any, dict[str, str]]:
    """``cost`` with its GPU compute scaled to the given single-GPU step, and the provenance
    lines that say so; ``cost`` itself when neither flag is given."""
    if cfg.step_time is None and cfg.mfu is None and cfg.step_time_accum is None:
        return cost, {}
    if cfg.gpus == 0:
        raise UserError("--step-time and --mfu describe one GPU's step: add --gpus G")
    if cfg.parallel != "data" or cfg.inference:
        raise UserError("--step-time and --mfu are for data-parallel training on GPU ranks")
    from pdlsim.sim import Cluster
    from pdlsim.sim.cluster import build_plan

    target, given = _target_s(cfg, cost, workload)
    plan = build_plan(Cluster.gpus(1, 1), replace(scenario, accumulation=1), cost)
    copy_s = 0.0 if scenario.prefetch else plan.h2d_s
    # the given step holds a k-th of the update: the accumulation it was measured at
    k = cfg.step_time_accum or scenario.accumulation
    compute_s = plan.forward_s + plan.backward_s + plan.update_s / k
    if target <= copy_s or compute_s <= 0:
        raise UserError(
            f"{given}: one GPU's step of {target * 1e3:.3g} ms is not longer than copying its "
            f"batch ({copy_s * 1e3:.3g} ms): check the time, the batch, or add --prefetch"
        )
    factor = (target - copy_s) / compute_s
    lines = {
        "compute": f"given: one GPU's step {target * 1e3:.4g} ms at batch {cfg.batch} ({given}), "
        f"split over layers in proportion to the cost model's layer times (x{factor:.3g})"
    }
    return given_compute(cost, gpu_compute_factor=factor), lines
