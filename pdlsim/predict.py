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
of a few steps: cheap, and still carries the jitter); P10/P50/P90 of their mean step times.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from pdlsim.corrections import parse_corrections
from pdlsim.parallel_predict import layerwise_mode, run_layerwise
from pdlsim.prediction_doc import band_step_times, prediction_document
from pdlsim.presets import (
    DEFAULT_GPU_PRESET,
    DEFAULT_NETWORK_PRESET,
    NetworkPreset,
    gpu_preset,
    network_preset,
)
from pdlsim.whatif import apply_to_cost, rank_speeds, scenario_options

if TYPE_CHECKING:  # the heavy modules are imported where used: building the parser stays light
    from calibration.profile import Profile
    from pdlsim.costmodel import ProfileCostModel
    from pdlsim.sim import Cluster, Scenario

__all__ = [
    "DATASET_SAMPLES",
    "PredictConfig",
    "parse_rate",
    "parse_time",
    "run_prediction",
]

DATASET_SAMPLES = {"cnn": 50_000, "mlp": 60_000}  # CIFAR-10 and MNIST training sets
BAND_ITERATIONS = 20
_RATE = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kMGT]?)(B|b|bit)/s\s*$")
_TIME = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*(d|h|min|s|ms|us|ns)\s*$")
_SECONDS = {"d": 86400.0, "h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_rate(text: str) -> float:
    """'25GB/s' -> 25e9 bytes/s; '100Gb/s' (bits) -> 12.5e9."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"expected a bandwidth like 25GB/s or 100Gb/s, got '{text}'")
    value = float(m.group(1)) * _PREFIX[m.group(2)]
    return value if m.group(3) == "B" else value / 8


def parse_time(text: str) -> float:
    """'2us' -> 2e-6 s; 'ns', 'us', 'ms', 's', 'min', 'h' and 'd' are understood."""
    m = _TIME.match(text)
    if not m:
        raise UserError(f"expected a time like 2us, 1.5ms, 60s or 5000h, got '{text}'")
    return float(m.group(1)) * _SECONDS[m.group(2)]


@dataclass(frozen=True)
class PredictConfig:
    nodes: int = 1
    gpus: int = 0  # per node; 0: CPU ranks
    procs_per_node: int = 1
    threads: int = 1
    model: str = "cnn"
    batch: int = 32
    profile: str | None = None
    network: str | None = None
    inter_bw: str | None = None
    inter_lat: str | None = None
    gpu_preset: str = DEFAULT_GPU_PRESET
    iterations: int = 100
    bucket_mb: float = 25.0
    overlap: bool = True
    pinned: bool = True
    prefetch: bool = False
    seed: int = 0
    samples: int = 20
    dataset_samples: int | None = None
    algorithm: str | None = None
    power_preset: str | None = None  # power model (pdlsim.energy); None: by device
    cpu_watts: tuple[float, float] | None = None  # idle, busy W per socket
    gpu_watts: tuple[float, float] | None = None  # idle, busy W per GPU
    node_other_watts: float | None = None
    cpu_sockets: tuple[int, int] | None = None  # sockets, cores per socket
    parallel: str = "data"  # data, model or pipeline (pdlsim.parallel_predict)
    stages: int | None = None  # pipeline stages
    microbatches: int | None = None  # micro-batches per pipeline step
    schedule: str | None = None  # gpipe or 1f1b (default)
    inference: bool = False  # forward pass only
    compression: str | None = None  # what-ifs (pdlsim.whatif): none, fp16, topk:F
    sync_every: int = 1  # local SGD: allreduce every k-th step
    network_scale: float = 1.0  # inter-node bandwidth x
    latency_scale: float = 1.0  # inter-node latency x
    slow_ranks: int = 0  # the last K ranks ...
    slow_factor: float | None = None  # ... F times slower
    speeds: tuple[float, ...] | None = None  # or one speed per rank
    balance: str = "static"  # batch per rank: static or proportional to speed
    checkpoint_every: str | None = None  # steps, or "auto" (pdlsim.reliability)
    checkpoint_bw: str | None = None
    checkpoint_latency: str | None = None
    mtbf: str | None = None  # per node
    restart_time: str | None = None
    corrections: str = "all"  # named corrections switched on (pdlsim.corrections)


# The profile a prediction uses without --profile: the first of these that is packaged. The
# 2-core EPYC's, which the README's examples print (its kernel tables price any workload);
# xeon-2core and h100-16core are there for --profile.
DEFAULT_PROFILES = ("reference", "epyc-2core")


def resolve_profile(name: str | None) -> tuple[Profile, str]:
    from calibration.profile import ProfileError, load_profile, packaged_profile_names

    if name is None:
        names = packaged_profile_names()
        if not names:
            raise UserError("no packaged reference profile is installed; give --profile PATH")
        name = next((n for n in DEFAULT_PROFILES if n in names), names[0])
    try:
        return load_profile(name), name
    except ProfileError as exc:
        raise UserError(f"--profile: {exc}") from None


def resolve_network(cfg: PredictConfig, profile_has_inter: bool) -> NetworkPreset | None:
    if cfg.network is None and cfg.inter_bw is None and cfg.inter_lat is None:
        return None if profile_has_inter else network_preset(DEFAULT_NETWORK_PRESET)
    base = network_preset(cfg.network or DEFAULT_NETWORK_PRESET)
    if cfg.inter_bw is None and cfg.inter_lat is None:
        return base
    bw = parse_rate(cfg.inter_bw) if cfg.inter_bw else base.bandwidth_bytes_per_s
    lat = parse_time(cfg.inter_lat) if cfg.inter_lat else base.latency_s
    return NetworkPreset("given", lat, bw, "--inter-bw/--inter-lat", kind="given")


# Upper bounds on the sizes a prediction takes: far beyond any real cluster or run, and below
# what numpy can allocate or a C long can hold, so that a typo with extra zeros is one clear
# line instead of an allocation failure or an overflow deep in the simulator.
MAX_RANKS = 2**24
SIZE_LIMITS = (
    ("--nodes", "nodes", MAX_RANKS),
    ("--gpus", "gpus", 2**16),
    ("--procs-per-node", "procs_per_node", 2**16),
    ("--threads", "threads", 2**16),
    ("--batch", "batch", 2**24),
    ("--iterations", "iterations", 10**7),
    ("--samples", "samples", 10**6),
    ("--dataset-samples", "dataset_samples", 10**15),
    ("--stages", "stages", 2**16),
    ("--microbatches", "microbatches", 2**20),
)


def check_sizes(cfg: PredictConfig) -> None:
    """:class:`UserError` for a size beyond :data:`SIZE_LIMITS` or too many ranks in all."""
    for flag, name, most in SIZE_LIMITS:
        value = getattr(cfg, name)
        if value is not None and value > most:
            raise UserError(f"{flag} {value:,} is more than this simulator handles ({most:,})")
    ranks = cfg.nodes * (cfg.gpus or cfg.procs_per_node)
    if ranks > MAX_RANKS:
        raise UserError(
            f"{ranks:,} ranks in all is more than this simulator handles ({MAX_RANKS:,}); "
            "use fewer nodes or fewer ranks per node"
        )


def build(cfg: PredictConfig) -> tuple[Cluster, Scenario, ProfileCostModel, dict[str, Any]]:
    """The cluster, scenario and cost model of a configuration, and where the numbers came from."""
    from microbench.workload import load_workload
    from pdlsim.costmodel import ProfileCostModel
    from pdlsim.insitu_cost import sync_parallelism
    from pdlsim.sim import Cluster, Scenario

    if cfg.nodes < 1:
        raise UserError(f"--nodes must be at least 1, got {cfg.nodes}")
    for flag, value, ok in (
        ("--gpus", cfg.gpus, cfg.gpus >= 0),
        ("--batch", cfg.batch, cfg.batch >= 1),
        ("--bucket-mb", cfg.bucket_mb, cfg.bucket_mb > 0),
        ("--samples", cfg.samples, cfg.samples >= 1),
    ):
        if not ok:
            least = "0 or more" if flag == "--gpus" else "positive"
            raise UserError(f"{flag} must be {least}, got {value}")
    check_sizes(cfg)
    profile, profile_name = resolve_profile(cfg.profile)
    workload = load_workload(cfg.model)
    has_inter = any(r.inter is not None for r in _regimes(profile))
    network = resolve_network(cfg, has_inter)
    # looked up even for CPU ranks, which use none: a typo fails either way
    preset = None if cfg.gpu_preset == "none" else gpu_preset(cfg.gpu_preset)
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
    )  # fmt: skip
    cost = apply_to_cost(cfg, cost)
    provenance = {"profile": profile_name, **cost.provenance}
    if gpu is not None:
        provenance["gpu_preset"] = f"{gpu.name} (data sheet: {gpu.source})"
    return cluster, scenario, cost, provenance


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
        return run_layerwise(cfg, build, trace, DATASET_SAMPLES, BAND_ITERATIONS)

    from pdlsim.sim import Cluster, simulate, write_chrome_trace

    try:
        cluster, scenario, cost, provenance = build(cfg)
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
        dataset=cfg.dataset_samples or DATASET_SAMPLES.get(scenario.workload.name, 50_000),
        memory=memory_per_rank(cluster, scenario),
        provenance=provenance,
        gpu=cost.gpu,
        buckets=[asdict(x) for x in result.buckets],
    )  # fmt: skip
