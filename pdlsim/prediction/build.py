"""A configuration made concrete: its cluster, scenario and profile-backed cost model, the
network and GPU it rests on, and the bytes per rank; everything refused up front
(:mod:`pdlsim.prediction.checks`) is refused here, before any simulation."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from microbench.errors import UserError, shown_text
from microbench.machine import gpu_name
from pdlsim.costmodel.corrections import parse_corrections
from pdlsim.costmodel.limits import MIN_TIME_S
from pdlsim.costmodel.presets import (
    DEFAULT_NETWORK_PRESET,
    DEFAULT_NODE_PRESET,
    HARDWARE,
    GpuPreset,
    Hardware,
    NetworkPreset,
    NodePreset,
    load_hardware,
)
from pdlsim.costmodel.training import Training
from pdlsim.prediction.checks import (
    check_applicable,
    check_bounds,
    check_epoch,
    check_memory,
    check_work,
    layerwise_mode,
)
from pdlsim.prediction.config import PredictConfig, parse_rate, parse_time, resolve_profile
from pdlsim.prediction.epoch import dataset_samples
from pdlsim.prediction.gpu_layers import with_layer_times
from pdlsim.prediction.gpu_step import with_given_step
from pdlsim.prediction.memory import memory_per_rank
from pdlsim.prediction.reliability import check_checkpoint_flags
from pdlsim.prediction.whatif import apply_to_cost, rank_speeds, scenario_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from microbench.workload import Workload
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.sim import Cluster, Scenario

    MemoryOf = Callable[[Cluster, Scenario, ProfileCostModel], dict[str, int]]

__all__ = ["Checked", "build", "check_config", "resolve_gpus", "resolve_network"]


def resolve_network(
    cfg: PredictConfig,
    fitted: Any | None,
    hardware: Hardware = HARDWARE,
    default: str = DEFAULT_NETWORK_PRESET,
) -> NetworkPreset | None:
    """The inter-node link a prediction takes: None for the profile's own ``fitted`` one (a
    regime's inter-node fit, with ``a_s`` and ``b_s_per_byte``) when no flag names another;
    else ``--network``'s preset (a name or a file), or the ``default`` preset where the profile
    has none, with ``--inter-bw``/``--inter-lat`` replacing its figures. Given one of the two
    alone, the other comes from ``--network``'s preset if named, else from the profile's fit
    where it has one. GPU ranks pass ``fitted=None``: a host's fit is not their NICs."""
    if cfg.network is None and cfg.inter_bw is None and cfg.inter_lat is None:
        return None if fitted is not None else hardware.network(default)
    if cfg.network is None and fitted is not None:
        latency = fitted.a_s if fitted.a_s >= MIN_TIME_S else 0.0  # a fit's 1e-13 s is 0
        base = NetworkPreset(
            "profile", latency, 1.0 / max(fitted.b_s_per_byte, 1e-15), "the profile's fit",
            kind="given",
        )  # fmt: skip
    else:
        base = hardware.resolve("network", cfg.network or default)
    if cfg.inter_bw is None and cfg.inter_lat is None:
        return base
    bw = parse_rate(cfg.inter_bw, "--inter-bw") if cfg.inter_bw else base.bandwidth_bytes_per_s
    lat = parse_time(cfg.inter_lat, "--inter-lat") if cfg.inter_lat else base.latency_s
    return replace(base, name="given", latency_s=lat, bandwidth_bytes_per_s=bw,
                   source="--inter-bw/--inter-lat", kind="given")  # fmt: skip


def resolve_gpus(
    cfg: PredictConfig, hardware: Hardware, default_node: str | None = None
) -> tuple[NodePreset | None, GpuPreset | None]:
    """GPU ranks' node (``--node``; default ``default_node``, else
    :data:`DEFAULT_NODE_PRESET`) and GPU (``--gpu-preset``, default the node's; ``none``: the
    profile's measured GPU alone). Looked up for CPU ranks too, which use neither: a typo
    fails either way."""
    node = hardware.resolve("node", cfg.node or default_node or DEFAULT_NODE_PRESET)
    if cfg.gpu_preset == "none":
        gpu = None
    else:
        gpu = hardware.resolve("gpu", cfg.gpu_preset or node.gpu)
    if cfg.gpus > node.gpus_per_node:
        raise UserError(
            f"--gpus {cfg.gpus}: node '{node.name}' holds {node.gpus_per_node} GPUs; give "
            f"--node with a larger node (pdlsim hardware list), or more --nodes"
        )
    return node, gpu


class Checked(NamedTuple):
    """What :func:`check_config` read from a configuration, for :func:`build` to use as read
    (not parse again): the workload and the corrections switched on."""

    workload: Workload
    corrections: frozenset[str]


def check_config(cfg: PredictConfig) -> Checked:
    """The checks that need no profile (bounds, parallelism flags, the workload, the step
    against the epoch, the checkpoint flags), one-line errors; the workload and corrections
    they read. :func:`build` runs them first; ``sweep`` runs ``build`` over every row
    (:func:`pdlsim.prediction.core.check_prediction`) before simulating the first."""
    from microbench.workload import Workload

    check_bounds(cfg)
    corrections = parse_corrections(cfg.corrections)  # a typo is the one line, before any warning
    layerwise_mode(cfg)
    check_applicable(cfg)
    check_checkpoint_flags(cfg)  # their typos, before the simulation that precedes their use
    workload = Workload.load(cfg.model, cfg.tokens)
    check_work(cfg, len(workload.layers), workload.name)
    check_epoch(cfg, dataset_samples(workload.name, cfg.dataset_samples))
    return Checked(workload, corrections)


def build(
    cfg: PredictConfig, memory: MemoryOf | None = None
) -> tuple[Cluster, Scenario, ProfileCostModel, dict[str, Any], dict[str, int]]:
    """The cluster, scenario and cost model of a configuration, where the numbers came from,
    and the bytes per rank (``memory``; default :func:`memory_per_rank`): everything refused
    up front (:mod:`pdlsim.prediction.checks`) is refused here, before any simulation."""
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.costmodel.profile_links import fitted_inter
    from pdlsim.sim import Cluster, Scenario
    from pdlsim.sim.collectives import ALLREDUCE_ALGORITHMS
    from pdlsim.sim.nccl import ALGORITHMS as NCCL_ALGORITHMS

    workload, corrections = check_config(cfg)
    profile, profile_name = resolve_profile(cfg.profile)
    hardware = load_hardware(cfg.hardware)
    measured_gpu = gpu_name(profile.machine)  # the node that holds it, unless --node says
    by_gpu = hardware.node_for_device(measured_gpu) if measured_gpu and not cfg.node else None
    node, preset = resolve_gpus(cfg, hardware, by_gpu)
    if cfg.gpus > 0:
        if cfg.algorithm is not None and cfg.algorithm not in NCCL_ALGORITHMS:
            what = "is one of MPICH's" if cfg.algorithm in ALLREDUCE_ALGORITHMS else "is unknown"
            raise UserError(
                f"--algorithm {shown_text(cfg.algorithm)} {what}; GPU ranks run NCCL's: "
                f"{', '.join(NCCL_ALGORITHMS)}"
            )
        network = resolve_network(cfg, None, hardware, default=node.network)
    else:
        network = resolve_network(cfg, fitted_inter(profile), hardware)
    gpu = preset if cfg.gpus > 0 else None
    if cfg.gpus > 0:
        cluster = Cluster.gpus(cfg.nodes, cfg.gpus)
    else:
        cluster = Cluster.cpus(cfg.nodes, cfg.procs_per_node, cfg.threads)
    speeds = rank_speeds(cfg, cluster.ranks)
    if speeds is not None:
        cluster = replace(cluster, speeds=speeds)
    bucket_bytes = max(1, int(cfg.bucket_mb * 2**20))
    training = checked_training(cfg, cluster.device, profile)
    if cluster.device == "cpu":
        check_cpu_measured(profile)
        check_kernels_timed(profile, workload, cfg.batch, cfg.threads, training.optimizer,
                            not cfg.inference)  # fmt: skip
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
        training=training,
        **scenario_options(cfg),
    )
    cost = ProfileCostModel.from_profile(
        profile, network, gpu, cluster.device, bucket_bytes, workload.name,
        cluster.ranks_per_node, inference=cfg.inference,
        corrections=corrections, description=workload,
        assumptions=hardware.assumptions, training=training, node=node,
    )  # fmt: skip
    cost = apply_to_cost(cfg, cost)
    cost, given = with_layer_times(cfg, cost, workload)  # refuses --step-time/--mfu beside it
    if not given:
        cost, given = with_given_step(cfg, scenario, cost, workload)
    cost = replace(cost, provenance={**cost.provenance, **given})
    cluster, cost = with_straggler(cfg, cluster, cost)
    provenance = {"profile": profile_name, "measured": profile.measured_on, **cost.provenance}
    if cost.pace is not None:  # a busy node's collectives (pdlsim.costmodel.node_sharing)
        provenance["collective pace"] = cost.pace.source()
    if gpu is not None:
        provenance["gpu_preset"] = f"{gpu.name} ({gpu.kind}: {gpu.source})"
    if cluster.device == "gpu":
        chosen = "" if by_gpu in (None, DEFAULT_NODE_PRESET) else (
            f"; the node of the profile's {measured_gpu}")  # fmt: skip
        provenance["node"] = f"{node.name} ({node.kind}: {node.source}{chosen})"
    if cfg.hardware is not None:
        provenance["hardware"] = hardware.source
    if not training.is_default:
        provenance["training"] = training.source()
    need = (memory or _data_memory)(cluster, scenario, cost)
    check_memory(cfg, need["total"], cluster.device, cost.gpu, profile.machine,
                 cluster.ranks_per_node)  # fmt: skip
    return cluster, scenario, cost, provenance, need


def with_straggler(
    cfg: PredictConfig, cluster: Cluster, cost: ProfileCostModel
) -> tuple[Cluster, ProfileCostModel]:
    """The cluster with its straggler (:mod:`pdlsim.costmodel.node_sharing`) where the cost
    model carries one and the ranks are data parallel; the layer-wise models assume identical
    ranks, so there the cost model drops it and says so."""
    if cost.straggler is None:
        return cluster, cost
    applied = not layerwise_mode(cfg)
    line = cost.straggler.source(applied)
    straggler = cost.straggler if applied else None
    cost = replace(cost, straggler=straggler, provenance={**cost.provenance, "stragglers": line})
    return (cluster if straggler is None else replace(cluster, straggler=straggler.factor)), cost


def check_cpu_measured(profile: Any) -> None:
    """UserError unless the profile's compute model measured CPU ranks: a profile of GPU
    layers alone prices no CPU step (it was a KeyError traceback deep in the compute model)."""
    devices = profile.model("compute").devices
    if "cpu" not in devices:
        raise UserError(
            f"the profile measured compute on {', '.join(devices) or 'no device'}, not on CPU "
            "ranks; predict GPU ranks (--gpus N) or give a profile calibrated on CPUs"
        )


def check_kernels_timed(
    profile: Any, workload: Workload, batch: int, threads: int, optimizer: str, training: bool
) -> None:
    """UserError unless the profile's kernel sweep timed every loop a CPU step of
    ``workload`` calls (the optimizer's update included): a profile from before a kernel
    existed names what it lacks, rather than failing inside the simulation. A profile without
    kernel tables prices ops by its per-op fits, and passes."""
    if not profile.models.get("kernels"):
        return
    from microbench.kernels.calls import step_calls  # numba: not when parsing flags

    timed = {variant.removesuffix("_serial") for variant, _ in profile.model("kernels").loops_}
    calls = step_calls(workload, batch, threads, training, optimizer=optimizer)
    missing = sorted({c.kernel for c in calls if not c.kernel.startswith("gemm_")} - timed)
    if missing:
        raise UserError(
            f"the profile's kernel sweep did not time {', '.join(missing)}, which a step of "
            f"{workload.name} calls (the profile predates them); recalibrate (pdlsim "
            "calibrate) or predict GPU ranks (--gpus N)"
        )


def checked_training(cfg: PredictConfig, device: str, profile: Any) -> Training:
    """The job's precision and optimizer, refused where the ranks cannot be priced for them:
    CPU ranks (float32, :meth:`Training.check_cpu`), a profile's measured GPU layers
    (float32), the layer-wise modes (their memory and messages are float32 SGD), fp16
    compression of gradients already 16-bit."""
    training = Training(cfg.precision, cfg.optimizer)
    if training.is_default:
        return training
    if device == "cpu":
        training.check_cpu()
    elif "gpu" in profile.model("compute").devices and training.precision != "fp32":
        raise UserError(
            "the profile's GPU layers were timed in fp32; --precision "
            f"{training.precision} is priced from the data sheet: use a profile without GPU "
            "measurements (or --precision fp32)"
        )
    if cfg.parallel != "data" or cfg.inference:
        raise UserError(
            f"--precision and --optimizer are priced for data-parallel training; --parallel "
            f"{cfg.parallel}{' --inference' if cfg.inference else ''} takes fp32 SGD"
        )
    if training.mixed and cfg.compression == "fp16":
        raise UserError(
            f"--compression fp16 casts float32 gradients to 16 bits; under --precision "
            f"{training.precision} they are 16-bit already: drop one of the two"
        )
    return training


def _data_memory(cluster: Cluster, scenario: Scenario, cost: Any) -> dict[str, int]:
    return memory_per_rank(cluster, scenario)
