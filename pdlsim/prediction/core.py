"""``pdlsim predict``: a calibrated profile, a cluster, a prediction (``pdlsim sweep``: many).

Defaults (so that ``pdlsim predict --nodes 16 --gpus 4`` works on a fresh install): the packaged
reference profile for the host, the ``cnn`` workload (the CIFAR-10 CNN) at 32 samples per rank,
the ``ib-hdr`` network preset (unless the profile has fitted inter-node parameters), the
``h100-sxm`` GPU preset, 25 MiB buckets with overlap on, pinned copies, 100 iterations.

Definitions: scaling is weak (the batch is per rank); speedup is the throughput over that of one
device of the same kind (one GPU, or one process with the same threads), simulated too;
efficiency = speedup / devices; communication overhead = exposed communication (T_comm -
T_overlap) over T_step; epoch = ceil(dataset / (ranks x batch)) steps, dataset by workload
(:data:`DATASET_SAMPLES`, 50,000 for a workload file unless ``--dataset-samples``).

The band: ``--samples`` K cost models drawn with :meth:`ProfileCostModel.perturbed`, each
simulated with its own jitter seed for min(iterations, :data:`BAND_ITERATIONS`) steps (the mean
of a few steps: cheap, and still carries the jitter); P10/P50/P90 of their mean step times,
relative to their median, around the predicted step (:mod:`pdlsim.prediction.document`): the P50 is
the step time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from pdlsim.costmodel.corrections import parse_corrections
from pdlsim.costmodel.presets import (
    DEFAULT_NETWORK_PRESET,
    HARDWARE,
    Hardware,
    NetworkPreset,
    load_hardware,
)
from pdlsim.prediction.checks import check_bounds, check_epoch, check_memory
from pdlsim.prediction.config import PredictConfig, parse_rate, parse_time, resolve_profile
from pdlsim.prediction.document import band_step_times, prediction_document
from pdlsim.prediction.epoch import DATASET_SAMPLES, dataset_samples
from pdlsim.prediction.layerwise import layerwise_mode, run_layerwise
from pdlsim.prediction.whatif import apply_to_cost, rank_speeds, scenario_options

if TYPE_CHECKING:  # the heavy modules are imported where used: building the parser stays light
    from collections.abc import Callable

    from calibration.profile import Profile
    from microbench.workload import Workload
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.sim import Cluster, Scenario

    MemoryOf = Callable[[Cluster, Scenario, ProfileCostModel], dict[str, int]]

__all__ = [
    "DATASET_SAMPLES",
    "check_config",
    "run_prediction",
]

BAND_ITERATIONS = 20


def resolve_network(
    cfg: PredictConfig, profile_has_inter: bool, hardware: Hardware = HARDWARE
) -> NetworkPreset | None:
    if cfg.network is None and cfg.inter_bw is None and cfg.inter_lat is None:
        return None if profile_has_inter else hardware.network(DEFAULT_NETWORK_PRESET)
    base = hardware.network(cfg.network or DEFAULT_NETWORK_PRESET)
    if cfg.inter_bw is None and cfg.inter_lat is None:
        return base
    bw = parse_rate(cfg.inter_bw) if cfg.inter_bw else base.bandwidth_bytes_per_s
    lat = parse_time(cfg.inter_lat) if cfg.inter_lat else base.latency_s
    return NetworkPreset("given", lat, bw, "--inter-bw/--inter-lat", kind="given")


def check_config(cfg: PredictConfig) -> Workload:
    """The checks that need no profile (bounds, parallelism flags, the workload, the step
    against the epoch), one-line errors; the workload. ``sweep`` runs them over every row
    before simulating the first."""
    from microbench.workload import Workload

    check_bounds(cfg)
    layerwise_mode(cfg)
    workload = Workload.load(cfg.model)
    check_epoch(cfg, dataset_samples(workload.name, cfg.dataset_samples))
    return workload


def build(
    cfg: PredictConfig, memory: MemoryOf | None = None
) -> tuple[Cluster, Scenario, ProfileCostModel, dict[str, Any], dict[str, int]]:
    """The cluster, scenario and cost model of a configuration, where the numbers came from,
    and the bytes per rank (``memory``; default :func:`memory_per_rank`): everything refused
    up front (:mod:`pdlsim.prediction.checks`) is refused here, before any simulation."""
    from pdlsim.costmodel.insitu import sync_parallelism
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.sim import Cluster, Scenario

    workload = check_config(cfg)
    profile, profile_name = resolve_profile(cfg.profile)
    hardware = load_hardware(cfg.hardware)
    has_inter = any(r.inter is not None for r in _regimes(profile))
    network = resolve_network(cfg, has_inter, hardware)
    # looked up even for CPU ranks, which use none: a typo fails either way
    preset = None if cfg.gpu_preset == "none" else hardware.gpu(cfg.gpu_preset)
    gpu = preset if cfg.gpus > 0 else None
    if cfg.gpus > 0:
        cluster = Cluster.gpus(cfg.nodes, cfg.gpus)
    else:
        cluster = Cluster.cpus(cfg.nodes, cfg.procs_per_node, cfg.threads)
    speeds = rank_speeds(cfg, cluster.ranks)
    if speeds is not None:
        cluster = replace(cluster, speeds=speeds)
    bucket_bytes = max(1, int(cfg.bucket_mb * 2**20))
    scenario = Scenario(
        workload,
        cfg.batch,
        bucket_bytes=bucket_bytes,
        overlap=cfg.overlap,
        prefetch=cfg.prefetch,
        pinned=cfg.pinned,
        iterations=cfg.iterations,
        seed=cfg.seed,
        algorithm=cfg.algorithm,
        **scenario_options(cfg),
    )
    cost = ProfileCostModel.from_profile(
        profile, network, gpu, cluster.device, bucket_bytes, workload.name,
        cluster.ranks_per_node, inference=cfg.inference, batch=cfg.batch,
        parallel=sync_parallelism(cfg.parallel, cfg.inference),
        corrections=parse_corrections(cfg.corrections), description=workload,
        assumptions=hardware.assumptions,
    )  # fmt: skip
    cost = apply_to_cost(cfg, cost)
    provenance = {"profile": profile_name, **cost.provenance}
    if gpu is not None:
        provenance["gpu_preset"] = f"{gpu.name} (data sheet: {gpu.source})"
    if cfg.hardware is not None:
        provenance["hardware"] = hardware.source
    need = (memory or _data_memory)(cluster, scenario, cost)
    check_memory(cfg, need["total"], cluster.device, cost.gpu, profile.machine,
                 cluster.ranks_per_node)  # fmt: skip
    return cluster, scenario, cost, provenance, need


def _data_memory(cluster: Cluster, scenario: Scenario, cost: Any) -> dict[str, int]:
    return memory_per_rank(cluster, scenario)


def _regimes(profile: Profile) -> list[Any]:
    models = profile.model("collectives").models_
    return [r for m in models.values() for r in m.regimes_]


def memory_per_rank(cluster: Cluster, scenario: Scenario) -> dict[str, int]:
    """Bytes per rank: float32 weights and gradients, plain SGD (no optimizer state), the
    activations kept for backward at the batch, the convolutions' im2col workspace (the column
    matrix of each conv layer, and its gradient where the layer passes one back: what an
    im2col + GEMM convolution allocates), on GPU ranks DDP bucket buffers (a flat copy of every
    gradient) when there is more than one rank (CPU ranks allreduce in place), and the
    mini-batch input (twice with prefetch)."""
    w = scenario.workload
    batch = scenario.batch_per_rank
    inputs = w.layers[0].input_bytes_per_sample * batch * (2 if scenario.prefetch else 1)
    buckets = w.gradient_bytes if cluster.ranks > 1 and cluster.device == "gpu" else 0
    parts = {
        "weights": 4 * w.param_count,
        "gradients": w.gradient_bytes,
        "optimizer_state": 0,
        "activations": w.activation_bytes_per_sample * batch,
        "workspace": batch * sum(im2col_bytes_per_sample(info) for info in w.layers),
        "buffers": buckets + inputs,
    }
    parts["total"] = sum(parts.values())
    return parts


def im2col_bytes_per_sample(info: Any) -> int:
    """A conv layer's column matrix per sample (out h x out w rows of k x k x c_in floats),
    twice where it passes an input gradient back (the columns' gradient); 0 for other layers."""
    if info.kind != "conv2d":
        return 0
    k = info.layer.get("kernel")
    cols = math.prod(info.output_shape[1:]) * k * k * info.input_shape[0] * 4
    return cols * (2 if info.needs_input_grad else 1)


def run_prediction(cfg: PredictConfig, trace: str | None = None) -> dict[str, Any]:
    """Predict one configuration: the JSON object ``pdlsim predict --json`` prints."""
    if layerwise_mode(cfg):  # model or pipeline parallelism, or inference
        return run_layerwise(cfg, build, trace, BAND_ITERATIONS)

    from pdlsim.sim import Cluster, simulate, write_chrome_trace

    try:
        cluster, scenario, cost, provenance, memory = build(cfg)
        result = simulate(cluster, scenario, cost, trace=trace is not None)
        one = Cluster(1, 1, cluster.threads_per_rank, cluster.device)
        alone = replace(cost, ranks_per_node=1)  # one device: nothing shares its node
        base = result if cluster.ranks == 1 else simulate(one, scenario, alone)
        iterations = min(cfg.iterations, BAND_ITERATIONS)
        band = band_step_times(simulate, cluster, scenario, cost, cfg.samples, cfg.seed, iterations)
    except ValueError as exc:  # ConfigError and the cost model's own checks
        raise UserError(str(exc)) from None
    if trace is not None and result.timeline is not None:
        write_chrome_trace(trace, result.timeline)
    devices = cluster.ranks
    return prediction_document(
        cfg, cluster, result.breakdown, band,
        base_step_s=base.step_time_s,
        replicas=devices,
        samples_per_step=devices * scenario.batch_per_rank,
        dataset=dataset_samples(scenario.workload.name, cfg.dataset_samples),
        memory=memory,
        provenance=provenance,
        gpu=cost.gpu,
        buckets=[asdict(x) for x in result.buckets],
    )  # fmt: skip
