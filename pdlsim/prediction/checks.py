"""What ``pdlsim predict`` and ``pdlsim sweep`` refuse before simulating anything.

* **Sizes out of any real machine's range**: more than :data:`MAX_GPUS_PER_NODE` GPUs,
  :data:`MAX_PROCS_PER_NODE` ranks or :data:`MAX_THREADS` threads per node, or more than
  :data:`MAX_NODES` nodes. A typo (a million GPUs per node) would otherwise be simulated.
* **What-if factors out of any real machine's range**: ``--network-scale``,
  ``--latency-scale``, ``--slow-factor`` and ``--speeds`` beyond a factor of
  :data:`MAX_FACTOR` either way, or buckets above :data:`MAX_BUCKET_MB`. A typo (``1e300``)
  would otherwise price steps of 1e300 seconds.
* **Simulations that would run for hours**: more than :data:`MAX_ITERATIONS` simulated steps
  or :data:`MAX_SAMPLES` band samples (each one a short simulation of its own), or more than
  :data:`MAX_LAYER_STEPS` layer steps in all (:func:`check_work`: a deep network multiplies
  counts that are each in range). The mean step settles within hundreds of steps; a count with
  extra zeros is refused at once, not after hours of simulating.
* **Power figures out of any real machine's range** (the Python API's values, which no flag
  parser has checked): watts above :data:`MAX_WATTS`, more than :data:`MAX_SOCKETS` sockets
  or :data:`MAX_CORES_PER_SOCKET` cores per socket.
* **A step larger than the epoch**: the global batch (samples per step) above the workload's
  epoch (:mod:`pdlsim.prediction.epoch`, or ``--dataset-samples``) is no training run.
* **A setting the configuration would ignore** (:func:`check_applicable`): a GPU ranks'
  setting on CPU ranks, ``overlap=False`` where nothing overlaps, a proportional balance of
  ranks that all run at one speed. The command line refuses the flags themselves
  (:func:`pdlsim.cli.predict.check_flags`); this check holds for the Python API and for
  ``pdlsim sweep --vary`` too, whose values no flag parser has seen.
* **A layout that does not fit in memory**: the bytes per rank against the GPU preset's memory,
  or for CPU ranks against the profile's host memory shared by the ranks of a node (skipped
  where the profile does not say). ``--allow-oversubscribed-memory`` predicts it anyway.

Every refusal is one :class:`~microbench.errors.UserError` line that names the need, the limit
and what to change.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from microbench.argtypes import MAX_BATCH
from microbench.errors import UserError
from microbench.memory import usable_memory_bytes
from pdlsim.costmodel.limits import MAX_WATTS, watts_problem
from pdlsim.costmodel.presets import MAX_GPUS_PER_NODE
from pdlsim.prediction.energy import power_preset

__all__ = [
    "MAX_BUCKET_MB",
    "MAX_CORES_PER_SOCKET",
    "MAX_FACTOR",
    "MAX_LAYER_STEPS",
    "MAX_SYNC_EVERY",
    "MAX_GPUS_PER_NODE",
    "MAX_NODES",
    "MAX_PREDICTIONS",
    "MAX_PROCS_PER_NODE",
    "MAX_SOCKETS",
    "MAX_THREADS",
    "MAX_WATTS",
    "DEFAULT_SCHEDULE",
    "PARALLEL_MODES",
    "SCHEDULES",
    "GPU_SETTINGS",
    "check_applicable",
    "check_bounds",
    "gpu_only_error",
    "check_cluster",
    "check_epoch",
    "check_factors",
    "check_work",
    "check_memory",
    "check_power",
    "layerwise_mode",
    "single_node_note",
    "unused_inter_node",
    "samples_per_step",
]

MAX_NODES = 1_000_000  # above the largest machines built (tens of thousands of nodes)
MAX_PROCS_PER_NODE = 1024  # CPU ranks: a few hundred cores per node at most
MAX_THREADS = 1024
# Simulated steps: 10,000 take seconds, 100,000 about a minute (the band adds --samples x 20).
MAX_ITERATIONS = 100_000
MAX_SAMPLES = 10_000  # band samples, each a simulation of min(--iterations, 20) steps
BAND_ITERATIONS = 20  # the steps of each band sample, at most (pdlsim.prediction.core)
# Layer steps one prediction may simulate (a layer's forward and backward on one step of one
# simulation, per micro-batch in a pipeline): the simulator plays tens of thousands a second on
# a small machine, so this is minutes. The step and sample counts above are each in range for a
# small network, but a deep one (thousands of layers) multiplies them into hours.
MAX_LAYER_STEPS = 10_000_000
MAX_FACTOR = 1e6  # a what-if that scales a link or a rank a million-fold (either way) is a typo
MAX_BUCKET_MB = 2.0**20  # 1 TiB: past any model's gradients (and any collective's size)
# 1 byte: a smaller bucket holds no gradient byte (1e-300 MiB was taken as 1 byte, silently)
MIN_BUCKET_MB = 2.0**-20
MAX_SYNC_EVERY = 1000  # local SGD periods run to hundreds of steps; the simulator plays whole ones
# Predictions one sweep (or one --vary) makes: each takes a fraction of a second to seconds, so
# a list with extra zeros would run for days; it is refused before the first.
MAX_PREDICTIONS = 1000
# Above these a figure is a typo: no node holds 16 sockets or a socket a thousand cores (nor
# draws MAX_WATTS, 100 kW, per socket or GPU).
MAX_SOCKETS = 16
MAX_CORES_PER_SOCKET = 1024


def check_bounds(cfg: Any) -> None:
    """Counts and sizes of ``cfg`` (a :class:`~pdlsim.prediction.config.PredictConfig`) in range."""
    checks = (
        ("--nodes", cfg.nodes, 1, MAX_NODES),
        ("--gpus", cfg.gpus, 0, MAX_GPUS_PER_NODE),
        ("--procs-per-node", cfg.procs_per_node, 1, MAX_PROCS_PER_NODE),
        ("--threads", cfg.threads, 1, MAX_THREADS),
        ("--batch", cfg.batch, 1, MAX_BATCH),
        ("--samples", cfg.samples, 1, MAX_SAMPLES),
        ("--iterations", cfg.iterations, 1, MAX_ITERATIONS),
        ("--dataset-samples", cfg.dataset_samples or 1, 1, 10**15),
        ("--stages", cfg.stages or 1, 1, MAX_PROCS_PER_NODE * MAX_NODES),
        ("--microbatches", cfg.microbatches or 1, 1, MAX_BATCH),
        ("--sync-every", cfg.sync_every, 1, MAX_SYNC_EVERY),
        ("--grad-accum", cfg.grad_accum, 1, MAX_BATCH),
        ("--step-time-accum", cfg.step_time_accum or 1, 1, MAX_BATCH),
        ("--seed", cfg.seed, 0, None),  # the Python API's: numpy refuses a negative one deep down
    )
    for flag, value, least, most in checks:
        if value < least:
            word = {"--gpus": "0 or more", "--batch": "positive", "--samples": "positive"}
            raise UserError(f"{flag} must be {word.get(flag, f'at least {least}')}, got {value}")
        if most is not None and value > most:
            raise UserError(f"{flag} must be at most {most:,}, got {value:,}")
    if not MIN_BUCKET_MB <= cfg.bucket_mb <= MAX_BUCKET_MB:
        raise UserError(
            f"--bucket-mb must be from {MIN_BUCKET_MB:.3g} (1 byte) to {MAX_BUCKET_MB:,.0f} "
            f"(1 TiB), got {cfg.bucket_mb:g}"
        )
    check_factors(cfg)
    check_power(cfg)


# Settings that describe GPU ranks, by the flag that sets them away from their default: CPU
# ranks would ignore them, and a prediction that silently drops a setting is a wrong answer.
GPU_SETTINGS = {
    "gpu_preset": "--gpu-preset", "node": "--node", "step_time": "--step-time",
    "step_time_accum": "--step-time-accum", "mfu": "--mfu", "layer_times": "--layer-times",
    "pinned": "--pageable", "prefetch": "--prefetch", "gpu_watts": "--gpu-watts",
}  # fmt: skip


def gpu_only_error(flag: str) -> UserError:
    """The one line that refuses a GPU ranks' ``flag`` on CPU ranks."""
    return UserError(
        f"{flag} describes GPU ranks, and this configuration has none: add --gpus G or drop {flag}"
    )


def check_applicable(cfg: Any) -> None:
    """Refuse a setting of ``cfg`` that differs from its default where the configuration
    ignores it: GPU settings (:data:`GPU_SETTINGS`) on CPU ranks, CPU ranks' processes and
    threads on GPU ranks, no overlap where nothing overlaps (model, pipeline, inference), a
    proportional balance without ranks of other speeds. Config-level, so that the Python API
    and ``sweep --vary`` values are held to what the command line's flags are."""
    defaults = {f.name: f.default for f in fields(cfg)}
    if cfg.gpus == 0:
        for name, flag in GPU_SETTINGS.items():
            if getattr(cfg, name) != defaults[name]:
                raise gpu_only_error(flag)
    else:
        for name in ("procs_per_node", "threads"):
            if getattr(cfg, name) != defaults[name]:
                flag = "--" + name.replace("_", "-")
                raise UserError(
                    f"{flag} is for CPU ranks; with --gpus every GPU is one rank: drop {flag} "
                    "(or --gpus for CPU ranks)"
                )
    if not cfg.overlap and (cfg.parallel != "data" or cfg.inference):
        raise UserError(
            "--no-overlap is for data-parallel training (gradient buckets overlapping the "
            "backward); model, pipeline and inference overlap nothing: drop it"
        )
    if cfg.balance == "proportional" and not (cfg.speeds or cfg.slow_ranks):
        raise UserError(
            "--balance proportional splits the batch by rank speed, and every rank runs at one "
            "speed: add --slow-ranks K --slow-factor F or --speeds, or drop --balance"
        )


# Settings of the links between nodes, by their flags, with the value that leaves them unset.
INTER_NODE_SETTINGS = {
    "network": ("--network", None), "inter_bw": ("--inter-bw", None),
    "inter_lat": ("--inter-lat", None), "network_scale": ("--network-scale", 1.0),
    "latency_scale": ("--latency-scale", 1.0),
}  # fmt: skip


def unused_inter_node(settings: Any, nodes: int) -> str | None:
    """Why an inter-node network setting of ``settings`` (a config or parsed flags) changes
    nothing, when every configuration has one node (``nodes``, the most of them): one node has
    no links to other nodes. None when there is none such. A warning, not a refusal: a scaling
    study loops over node counts from 1 with the same flags. (A sweep that reaches two nodes
    uses it in its larger rows.)"""
    if nodes != 1:  # a count below 1 is check_bounds' to refuse
        return None
    for name, (flag, unset) in INTER_NODE_SETTINGS.items():
        if getattr(settings, name, unset) != unset:
            return single_node_note(flag)
    return None


def single_node_note(flag: str) -> str:
    """What is said of an inter-node ``flag`` where there is one node."""
    return (
        f"{flag} describes the network between nodes, and one node has none: it changes "
        "nothing here (give --nodes 2 or more to use it)"
    )


def check_power(cfg: Any) -> None:
    """The power model's figures (:mod:`pdlsim.prediction.energy`) within a real machine's:
    ``--cpu-watts``/``--gpu-watts`` as 0 <= IDLE <= BUSY <= :data:`MAX_WATTS`,
    ``--node-other-watts`` up to it, each figure 0 or a real part's
    (:func:`~pdlsim.costmodel.presets.watts_problem`: ``1e-300`` W is a typo), ``--cpu-sockets``
    within :data:`MAX_SOCKETS` x :data:`MAX_CORES_PER_SOCKET`; ``--power-preset`` a known one
    (read after the simulation, a typo there was found only then)."""
    if cfg.power_preset is not None:
        power_preset(cfg.power_preset)
    for flag, pair in (("--cpu-watts", cfg.cpu_watts), ("--gpu-watts", cfg.gpu_watts)):
        if pair is not None and not 0 <= pair[0] <= pair[1] <= MAX_WATTS:
            raise UserError(
                f"{flag} must be IDLE,BUSY watts with 0 <= IDLE <= BUSY <= {MAX_WATTS:,.0f} "
                f"(e.g. 80,270), got {pair[0]:g},{pair[1]:g}"
            )
        for state, watts in zip(("IDLE", "BUSY"), pair or (), strict=False):
            problem = watts_problem(watts, f"{flag} {state}")
            if problem:
                raise UserError(problem)
    other = cfg.node_other_watts
    if other is not None and not 0 <= other <= MAX_WATTS:
        raise UserError(f"--node-other-watts must be from 0 to {MAX_WATTS:,.0f}, got {other:g}")
    problem = None if other is None else watts_problem(other, "--node-other-watts")
    if problem:
        raise UserError(problem)
    if cfg.cpu_sockets is not None:
        sockets, cores = cfg.cpu_sockets
        if not (1 <= sockets <= MAX_SOCKETS and 1 <= cores <= MAX_CORES_PER_SOCKET):
            raise UserError(
                f"--cpu-sockets must be SOCKETSxCORES from 1x1 to "
                f"{MAX_SOCKETS}x{MAX_CORES_PER_SOCKET}, got {sockets}x{cores}"
            )


def check_factors(cfg: Any) -> None:
    """The what-ifs' factors (:mod:`pdlsim.prediction.whatif`) within :data:`MAX_FACTOR` of 1."""
    factors = [("--network-scale", cfg.network_scale), ("--latency-scale", cfg.latency_scale)]
    if cfg.slow_factor is not None:
        factors.append(("--slow-factor", cfg.slow_factor))
    factors += [("--speeds", speed) for speed in cfg.speeds or ()]
    for flag, value in factors:
        if not 1 / MAX_FACTOR <= value <= MAX_FACTOR:
            raise UserError(
                f"{flag} must be a factor from {1 / MAX_FACTOR:g} to {MAX_FACTOR:g}, got "
                f"{value:g}; give a factor a real machine could differ by"
            )


def samples_per_step(cfg: Any) -> int:
    """The global batch: a batch per rank (data; times the micro-batches accumulated), one
    shared batch (model), a batch per pipeline replica (pipeline: ranks / stages replicas)."""
    ranks = cfg.nodes * (cfg.gpus or cfg.procs_per_node)
    if cfg.parallel == "model":
        return cfg.batch
    if cfg.parallel == "pipeline":
        return max(1, ranks // (cfg.stages or 1)) * cfg.batch
    return ranks * cfg.batch * getattr(cfg, "grad_accum", 1)


def check_work(cfg: Any, layers: int, name: str) -> None:
    """Refuse a prediction of more than :data:`MAX_LAYER_STEPS` layer steps: the run and the
    one-device baseline of ``--iterations`` steps each, and ``--samples`` band runs of
    min(``--iterations``, :data:`BAND_ITERATIONS`), each rounded up to whole local SGD periods,
    over the ``layers`` of workload ``name`` (and each pipeline micro-batch)."""
    k = cfg.sync_every

    def whole_periods(steps: int) -> int:
        return -(-steps // k) * k + 1  # and the warm-up step

    steps = 2 * whole_periods(cfg.iterations)
    steps += cfg.samples * whole_periods(min(cfg.iterations, BAND_ITERATIONS))
    micro = (cfg.microbatches or 1) if cfg.parallel == "pipeline" else 1
    work = layers * steps * micro
    if work > MAX_LAYER_STEPS:
        what = f" x {micro:,} micro-batches" if micro > 1 else ""
        fewer = ["--iterations", "--samples"] + ["--microbatches"] * (micro > 1)
        fewer += ["--sync-every"] * (k > 1)
        raise UserError(
            f"{steps:,} simulated steps of the {layers:,} layers of workload {name}{what} are "
            f"{work:,} layer steps, more than the {MAX_LAYER_STEPS:,} a prediction simulates "
            f"in minutes; give a smaller {', '.join(fewer[:-1])} or {fewer[-1]} (the mean "
            "step settles within hundreds of steps)"
        )


def check_epoch(cfg: Any, dataset: int) -> None:
    """Refuse a step that takes more samples than the epoch of ``dataset`` holds."""
    step = samples_per_step(cfg)
    if step > dataset:
        raise UserError(
            f"a step takes {step:,} samples, more than the epoch's {dataset:,}: give a smaller "
            "--batch, fewer ranks, or a larger --dataset-samples"
        )


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def check_memory(
    cfg: Any, need_bytes: int, device: str, gpu: Any, machine: dict[str, Any], per_node: int
) -> None:
    """Refuse a layout whose ``need_bytes`` per rank exceed the GPU's memory (``gpu``, a
    preset; None: unknown) or, for CPU ranks, the host memory in ``machine`` (profile
    metadata) shared by ``per_node`` ranks; unless ``cfg.allow_oversubscribed_memory``."""
    if cfg.allow_oversubscribed_memory:
        return
    anyway = "or --allow-oversubscribed-memory to predict it anyway"
    if device == "gpu":
        if gpu is not None and need_bytes > gpu.memory_bytes:
            raise UserError(
                f"needs {_gb(need_bytes)} per GPU, the {gpu.name} has {_gb(gpu.memory_bytes)}; "
                f"use more GPUs, model/pipeline parallelism, a smaller batch, {anyway}"
            )
        return
    host = usable_memory_bytes(machine)
    if host is None:
        return
    if need_bytes * per_node > host:
        share = f"{per_node} ranks per node share" if per_node > 1 else "one rank has"
        raise UserError(
            f"needs {_gb(need_bytes)} per rank, {share} the profile's host memory of "
            f"{_gb(host)}; use more nodes, fewer --procs-per-node, model/pipeline parallelism, "
            f"a smaller batch, {anyway}"
        )


PARALLEL_MODES = ("data", "model", "pipeline")


SCHEDULES = ("gpipe", "1f1b")  # pdlsim.sim.pipeline.SCHEDULES (not imported: numpy)


DEFAULT_SCHEDULE = "1f1b"


def layerwise_mode(cfg: Any) -> bool:
    """Check the parallelism flags (one-line errors); True when ``cfg`` is predicted layer by
    layer (:mod:`pdlsim.prediction.layerwise`): model or pipeline parallelism, or inference."""
    if cfg.parallel not in PARALLEL_MODES:
        raise UserError(
            f"--parallel must be one of {', '.join(PARALLEL_MODES)}, got {cfg.parallel}"
        )
    pipeline = cfg.parallel == "pipeline"
    for flag, value in (
        ("--stages", cfg.stages),
        ("--microbatches", cfg.microbatches),
        ("--schedule", cfg.schedule),
    ):
        if value is not None and not pipeline:
            raise UserError(f"{flag} is for pipelines: add --parallel pipeline, or drop {flag}")
    if pipeline:
        if cfg.stages is None or cfg.microbatches is None:
            raise UserError("--parallel pipeline needs --stages S and --microbatches M")
        if cfg.stages < 1 or cfg.microbatches < 1:
            raise UserError(
                f"--stages and --microbatches must be at least 1, got {cfg.stages} and "
                f"{cfg.microbatches}"
            )
        if cfg.microbatches > cfg.batch:
            raise UserError(
                f"--microbatches {cfg.microbatches} is more than --batch {cfg.batch}: every "
                "micro-batch needs a sample; lower --microbatches or raise --batch"
            )
    layerwise = cfg.parallel != "data" or cfg.inference
    if layerwise and getattr(cfg, "grad_accum", 1) != 1:
        raise UserError(
            "--grad-accum is for data-parallel training (one allreduce per optimizer step); "
            "a pipeline's micro-batches are --microbatches: drop --grad-accum"
        )
    if (
        layerwise
    ):  # the checkpoint what-ifs (pdlsim.prediction.reliability) read data-parallel results
        for flag in ("checkpoint_every", "checkpoint_bw", "checkpoint_latency", "mtbf",
                     "restart_time"):  # fmt: skip
            if getattr(cfg, flag, None) is not None:
                name = "--" + flag.replace("_", "-")
                raise UserError(
                    f"{name} is modelled for data-parallel training only; drop it, or drop "
                    "--parallel model/pipeline and --inference"
                )
    return layerwise


def check_cluster(cfg: Any, ranks: int, per_node: int, layers: int, name: str) -> None:
    if cfg.parallel != "pipeline":
        return
    s = cfg.stages
    if s > layers:
        raise UserError(f"--stages {s} is more than the {layers} layers of workload '{name}'")
    if ranks % s:
        raise UserError(
            f"--stages {s} must divide the {ranks} ranks: each data-parallel replica is one "
            "whole pipeline"
        )
    if ranks > s and per_node % s and s % per_node:
        raise UserError(
            f"--stages {s} must divide the {per_node} ranks per node or be a multiple of it "
            "(so that every pipeline replica sits alike on the nodes)"
        )
