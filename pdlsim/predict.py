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

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from pdlsim.presets import (
    DEFAULT_GPU_PRESET,
    DEFAULT_NETWORK_PRESET,
    NetworkPreset,
    gpu_preset,
    network_preset,
)

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
    "format_prediction",
]

DATASET_SAMPLES = {"cnn": 50_000, "mlp": 60_000}  # CIFAR-10 and MNIST training sets
BAND_ITERATIONS = 20
_RATE = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kMGT]?)(B|b|bit)/s\s*$")
_TIME = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*(s|ms|us|ns)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_rate(text: str) -> float:
    """'25GB/s' -> 25e9 bytes/s; '100Gb/s' (bits) -> 12.5e9."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"expected a bandwidth like 25GB/s or 100Gb/s, got '{text}'")
    value = float(m.group(1)) * _PREFIX[m.group(2)]
    return value if m.group(3) == "B" else value / 8


def parse_time(text: str) -> float:
    """'2us' -> 2e-6 s."""
    m = _TIME.match(text)
    if not m:
        raise UserError(f"expected a time like 2us, 1.5ms or 0s, got '{text}'")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]


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


def resolve_profile(name: str | None) -> tuple[Profile, str]:
    from calibration.profile import ProfileError, load_profile, packaged_profile_names

    if name is None:
        names = packaged_profile_names()
        if not names:
            raise UserError("no packaged reference profile is installed; give --profile PATH")
        name = "reference" if "reference" in names else names[0]
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


def build(cfg: PredictConfig) -> tuple[Cluster, Scenario, ProfileCostModel, dict[str, Any]]:
    """The cluster, scenario and cost model of a configuration, and where the numbers came from."""
    from microbench.workload import load_workload
    from pdlsim.costmodel import ProfileCostModel
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
    profile, profile_name = resolve_profile(cfg.profile)
    workload = load_workload(cfg.model)
    has_inter = any(r.inter is not None for r in _regimes(profile))
    network = resolve_network(cfg, has_inter)
    gpu = None
    if cfg.gpus > 0 and cfg.gpu_preset != "none":
        gpu = gpu_preset(cfg.gpu_preset)
    if cfg.gpus > 0:
        cluster = Cluster.gpus(cfg.nodes, cfg.gpus)
    else:
        cluster = Cluster.cpus(cfg.nodes, cfg.procs_per_node, cfg.threads)
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
    )
    cost = ProfileCostModel.from_profile(profile, network, gpu, cluster.device, bucket_bytes)
    provenance = {"profile": profile_name, **cost.provenance}
    if gpu is not None:
        provenance["gpu_preset"] = f"{gpu.name} (data sheet: {gpu.source})"
    return cluster, scenario, cost, provenance


def _regimes(profile: Profile) -> list[Any]:
    models = profile.model("collectives").models_
    return [r for m in models.values() for r in m.regimes_]


def memory_per_rank(cluster: Cluster, scenario: Scenario) -> dict[str, int]:
    """Bytes per rank: float32 weights and gradients, plain SGD (no optimizer state), the
    activations kept for backward at the batch, DDP bucket buffers (a flat copy of every
    gradient) when there is more than one rank, and the mini-batch input (twice with prefetch)."""
    w = scenario.workload
    batch = scenario.batch_per_rank
    inputs = w.layers[0].input_bytes_per_sample * batch * (2 if scenario.prefetch else 1)
    parts = {
        "weights": 4 * w.param_count,
        "gradients": w.gradient_bytes,
        "optimizer_state": 0,
        "activations": w.activation_bytes_per_sample * batch,
        "buffers": (w.gradient_bytes if cluster.ranks > 1 else 0) + inputs,
    }
    parts["total"] = sum(parts.values())
    return parts


def run_prediction(cfg: PredictConfig, trace: str | None = None) -> dict[str, Any]:
    """Predict one configuration: the JSON object ``pdlsim predict --json`` prints."""
    import numpy as np

    from pdlsim.sim import Cluster, simulate, write_chrome_trace

    try:
        cluster, scenario, cost, provenance = build(cfg)
        result = simulate(cluster, scenario, cost, trace=trace is not None)
        one = Cluster(1, 1, cluster.threads_per_rank, cluster.device)
        base = result if cluster.ranks == 1 else simulate(one, scenario, cost)
        band_scenario = replace(scenario, iterations=min(cfg.iterations, BAND_ITERATIONS))
        rng = np.random.default_rng(cfg.seed)
        band = [
            simulate(
                cluster, replace(band_scenario, seed=cfg.seed + 1 + i), cost.perturbed(rng)
            ).step_time_s
            for i in range(cfg.samples)
        ]
    except ValueError as exc:  # ConfigError and the cost model's own checks
        raise UserError(str(exc)) from None
    if trace is not None and result.timeline is not None:
        write_chrome_trace(trace, result.timeline)
    b = result.breakdown
    step, devices = b.step_s, cluster.ranks
    speedup = devices * base.step_time_s / step
    dataset = cfg.dataset_samples or DATASET_SAMPLES.get(scenario.workload.name, 50_000)
    per_step = devices * scenario.batch_per_rank
    memory = memory_per_rank(cluster, scenario)
    p10, p50, p90 = np.percentile(band, [10, 50, 90])
    out = {
        "step_time_s": step,
        "epoch_time_s": math.ceil(dataset / per_step) * step,
        "throughput_samples_per_s": per_step / step,
        "speedup": speedup,
        "efficiency": speedup / devices,
        "comm_overhead_pct": 100.0 * (b.comm_s - b.overlap_s) / step,
        "breakdown": {
            "compute_s": b.compute_s,
            "comm_s": b.comm_s,
            "sync_s": b.sync_s,
            "overlap_s": b.overlap_s,
        },
        "band": {"p10_s": float(p10), "p50_s": float(p50), "p90_s": float(p90)},
        "memory_bytes_per_rank": memory["total"],
        "memory_breakdown_bytes": memory,
        "gpu_utilization": (b.compute_s - b.h2d_exposed_s) / step
        if cluster.device == "gpu"
        else None,
        "single_device_step_time_s": base.step_time_s,
        "dataset_samples": dataset,
        "config": {**asdict(cfg), "mode": cluster.mode, "devices": devices},
        "buckets": [asdict(x) for x in result.buckets],
        "provenance": provenance,
        "data_sheet": sorted(k for k, v in provenance.items() if "data sheet" in v),
    }
    if cluster.device == "gpu" and cost.gpu is not None and memory["total"] > cost.gpu.memory_bytes:
        out["warning"] = f"needs {memory['total']:,} B per rank, more than the {cost.gpu.name}'s"
    return out


def cores_warning(cfg: PredictConfig) -> str | None:
    if cfg.gpus > 0:
        return None
    profile, _ = resolve_profile(cfg.profile)
    cores = profile.machine.get("cores_available") or profile.machine.get("physical_cores")
    used = cfg.procs_per_node * cfg.threads
    if isinstance(cores, int) and used > cores:
        return (
            f"pdlsim: warning: {used} cores per node asked, the profile's machine has {cores}: "
            "this predicts nodes like it with more cores"
        )
    return None


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def format_prediction(out: dict[str, Any]) -> str:
    c, b, band, m = out["config"], out["breakdown"], out["band"], out["memory_breakdown_bytes"]
    where = (
        f"{c['gpus']} GPUs"
        if c["gpus"]
        else f"{c['procs_per_node']} procs x {c['threads']} threads"
    )
    lines = [
        f"{c['model']} batch {c['batch']}/rank on {c['nodes']} nodes x {where} "
        f"({c['devices']} ranks, {c['mode']}), {c['iterations']} iterations",
        f"step time        {_fmt_s(out['step_time_s'])}   band P10/P50/P90 "
        f"{_fmt_s(band['p10_s'])} / {_fmt_s(band['p50_s'])} / {_fmt_s(band['p90_s'])}",
        f"epoch time       {_fmt_s(out['epoch_time_s'])}  ({out['dataset_samples']:,} samples)",
        f"throughput       {out['throughput_samples_per_s']:,.0f} samples/s",
        f"speedup          {out['speedup']:.2f} x one device   efficiency {out['efficiency']:.1%}",
        f"comm overhead    {out['comm_overhead_pct']:.1f}% of the step (exposed)",
        f"breakdown        compute {_fmt_s(b['compute_s'])} + comm {_fmt_s(b['comm_s'])} + sync "
        f"{_fmt_s(b['sync_s'])} - overlap {_fmt_s(b['overlap_s'])}",
        "memory per rank  " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in m.items()),
    ]
    if out["gpu_utilization"] is not None:
        lines.append(f"GPU utilisation  {out['gpu_utilization']:.1%} (compute busy / step)")
    lines.append("sources:")
    lines += [f"  {k}: {v}" for k, v in out["provenance"].items()]
    if out["data_sheet"]:
        lines.append(f"data-sheet figures (not measured): {', '.join(out['data_sheet'])}")
    if "warning" in out:
        lines.append(f"warning: {out['warning']}")
    return "\n".join(lines)


def add_common_options(p: argparse.ArgumentParser) -> None:
    from pdlsim.cli import non_negative_float

    p.add_argument("--model", default="cnn", metavar="NAME|PATH", help="workload (cnn)")
    p.add_argument("--profile", default=None, metavar="NAME|PATH", help="default: packaged")
    p.add_argument("--network", default=None, metavar="NAME", help="ib-hdr (default), ib-ndr, "
                   "roce-100g, eth-25g, eth-10g: data-sheet presets")  # fmt: skip
    p.add_argument("--inter-bw", default=None, metavar="RATE", help="e.g. 25GB/s, 100Gb/s")
    p.add_argument("--inter-lat", default=None, metavar="TIME", help="e.g. 2us")
    p.add_argument("--gpu-preset", default=DEFAULT_GPU_PRESET, metavar="NAME",
                   help="h100-sxm (default), a100-sxm, v100, none")  # fmt: skip
    p.add_argument("--iterations", type=int, default=100, help="simulated steps (100)")
    p.add_argument("--bucket-mb", type=non_negative_float, default=25.0, help="bucket MiB (25)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false")
    p.add_argument("--pinned", dest="pinned", action="store_true", default=True)
    p.add_argument("--pageable", dest="pinned", action="store_false")
    p.add_argument("--prefetch", action="store_true", help="copy the next batch during this step")
    p.add_argument("--algorithm", default=None, help="force an allreduce algorithm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=20, help="band samples (20)")
    p.add_argument("--dataset-samples", type=int, default=None, help="samples per epoch")


def add_predict_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("predict", help="predict one configuration (step, epoch, speedup)")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: CPU ranks)")
    p.add_argument("--procs-per-node", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (32)")
    add_common_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome trace")
    p.set_defaults(handler=run_predict_command)


def config_from_args(args: argparse.Namespace, **override: Any) -> PredictConfig:
    fields = PredictConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields}
    return PredictConfig(**{**values, **override})


def run_predict_command(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    out = run_prediction(cfg, trace=args.trace)
    warning = cores_warning(cfg)
    if warning:
        print(warning, file=sys.stderr)
    print(json.dumps(out, indent=2) if args.json else format_prediction(out))
    if args.trace:
        print(f"trace: {args.trace}", file=sys.stderr if args.json else sys.stdout)
    return 0
