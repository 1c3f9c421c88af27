"""``pdlsim predict --parallel model|pipeline`` and ``--inference``: the layer-wise modes.

``--parallel data`` (the default) without ``--inference`` is :mod:`pdlsim.prediction.core`'s own
path, unchanged. Everything else is predicted here, from the same profile, cluster and cost model
(:func:`pdlsim.prediction.build.build`):

* ``--parallel model``: tensor parallelism over all ranks, one model replica
  (:mod:`pdlsim.sim.tensor`). ``--batch`` is the batch the ranks share: the scaling is
  **strong**, and the speedup is at the same global batch.
* ``--parallel pipeline --stages S --microbatches M [--schedule gpipe|1f1b]``: R = ranks / S
  data-parallel replicas of an S-stage pipeline (:mod:`pdlsim.sim.pipeline`); ``--batch`` is
  the batch of one pipeline, split into M micro-batches.
* ``--inference``: the forward pass only, in any mode; ``--parallel data --inference`` is every
  rank running the forward on its own batch, with no communication at all.

Speedup is the throughput over that of one rank (same device and threads) running the whole
model, forward and backward as the mode does, on the batch of one replica: for model
parallelism and a single pipeline, the same batch (strong scaling). Efficiency = speedup /
ranks. The band and the epoch are computed as for data parallelism.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from pdlsim.prediction.build import build
from pdlsim.prediction.checks import DEFAULT_SCHEDULE, check_cluster
from pdlsim.prediction.epoch import dataset_samples

if TYPE_CHECKING:
    from pdlsim.prediction.config import PredictConfig

__all__ = ["plan_memory", "run_layerwise"]


def plan_memory(cfg: PredictConfig) -> Any:
    """The ``memory`` argument of :func:`~pdlsim.prediction.build.build` for ``cfg``'s
    layer-wise mode: the bytes per rank of the mode's plan, its layout checked first
    (:func:`~pdlsim.prediction.checks.check_cluster`), so that ``build`` refuses what the
    simulation would, before any simulating."""
    from pdlsim.prediction.memory import layerwise_memory
    from pdlsim.sim.pipeline import build_pipeline_plan
    from pdlsim.sim.tensor import build_tensor_plan

    def memory(cluster, scenario, cost) -> dict[str, int]:
        w = scenario.workload
        check_cluster(cfg, cluster.ranks, cluster.ranks_per_node, len(w.layers), w.name)
        if cfg.parallel == "pipeline":
            schedule = cfg.schedule or DEFAULT_SCHEDULE
            plan = build_pipeline_plan(
                cluster, scenario, cost, cfg.stages, cfg.microbatches, schedule, cfg.inference
            )
        elif cfg.parallel == "model":
            plan = build_tensor_plan(cluster, scenario, cost, cfg.inference)
        else:  # data-parallel inference: every rank alone
            plan = build_tensor_plan(cluster, scenario, cost, True, 1)
        return layerwise_memory(cfg, SimpleNamespace(plan=plan), scenario)

    return memory


def run_layerwise(cfg: PredictConfig, trace: str | None, band_iterations: int) -> dict[str, Any]:
    """Predict ``cfg`` in its layer-wise mode: the JSON object ``pdlsim predict`` prints."""
    from pdlsim.prediction.document import band_step_times, prediction_document
    from pdlsim.sim import Cluster, simulate, write_chrome_trace
    from pdlsim.sim.pipeline_engine import simulate_pipeline
    from pdlsim.sim.tensor import simulate_tensor

    inference = cfg.inference
    schedule = cfg.schedule or DEFAULT_SCHEDULE

    def run(cluster, scenario, cost, trace_on: bool = False):
        if cfg.parallel == "model":
            return simulate_tensor(cluster, scenario, cost, inference, None, trace_on)
        if cfg.parallel == "pipeline":
            return simulate_pipeline(
                cluster, scenario, cost, cfg.stages, cfg.microbatches, schedule, inference, trace_on
            )
        return simulate_tensor(cluster, scenario, cost, True, 1, trace_on)  # data inference

    try:
        cluster, scenario, cost, provenance, need = build(cfg, plan_memory(cfg))
        w = scenario.workload
        result = run(cluster, scenario, cost, trace is not None)
        one = Cluster(1, 1, cluster.threads_per_rank, cluster.device)
        alone = replace(cost, ranks_per_node=1)  # one device: nothing shares its node
        if inference:
            base = simulate_tensor(one, scenario, alone, True, 1)
        else:
            base = simulate(one, scenario, alone)
        iterations = min(cfg.iterations, band_iterations)
        band = band_step_times(run, cluster, scenario, cost, cfg.samples, cfg.seed, iterations)
    except ValueError as exc:  # ConfigError and the cost model's own checks
        raise UserError(str(exc)) from None
    b, devices = result.breakdown, cluster.ranks
    details = result.to_dict()
    for key in ("engine", "step_time_s", "breakdown"):
        details.pop(key)
    if cfg.parallel == "model":
        replicas = 1
        details["scaling"] = "strong: every rank works on the same batch"
    elif cfg.parallel == "pipeline":
        replicas = result.plan.replicas
        details["stage_count"] = cfg.stages
        details["microbatches"] = cfg.microbatches
        details["scaling"] = "strong: the pipeline's batch" if replicas == 1 else "weak in replicas"
    else:
        replicas = devices
        details["replicas"] = devices
        details["scaling"] = "weak: a batch per rank, no communication"
    out = prediction_document(
        cfg, cluster, b, band,
        base_step_s=base.step_time_s,
        replicas=replicas,
        samples_per_step=replicas * scenario.batch_per_rank,
        dataset=dataset_samples(w.name, cfg.dataset_samples),
        memory=need,
        provenance=provenance,
        gpu=getattr(cost, "gpu", None),
        buckets=[],
        parallel={"mode": cfg.parallel, "inference": inference, **details},
    )  # fmt: skip
    if trace is not None and result.timeline is not None:  # last: a failed run keeps the old one
        write_chrome_trace(trace, result.timeline, f"--trace {trace}")
    return out
