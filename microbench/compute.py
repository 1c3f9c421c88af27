"""Compute benchmarks: the real network's ops, GEMM and triad, on the CPU and on a GPU.

For each thread count (:func:`microbench.threads.set_threads`), each workload and each batch
size, every op of the real network is timed as training runs it, forward and backward, plus the
loss, the SGD update and the whole step (:mod:`microbench.network_ops`); next to them, square
float32 GEMMs and the STREAM triad as references for what the machine can do
(:mod:`microbench.reference`). On a GPU the same runs once, on CuPy arrays at GPU batch sizes,
timed with CUDA events. Every point is sampled under :mod:`microbench.sampling` (warm-up
discarded) and written as one "measurement" record the moment it is done.

Record params (benchmark "compute"; every record also has ``threads``, ``device`` ("cpu" or
"gpu") and ``oversubscribed`` (threads above the available cores)):

* name "op": ``model``, ``op`` (the op's layer names joined by "+", or "update", "step", the
  loss layer's name), ``layers``, ``kind`` (lead layer kind; "sgd" for the update, "step"),
  ``phase`` ("forward", "backward", "loss", "update", "step", "inference": the forward-only
  step), ``batch``, ``flops``, ``bytes``.
* name "gemm": ``m``, ``n``, ``k``, ``flops`` (2 m n k), ``dtype``.
* name "triad": ``bytes`` (3 arrays x 8 B x elements, per pass), ``elements``, ``dtype``.

GPU records carry ``threads`` 1: the GPU part runs once, driven by one host thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from microbench.cli import BenchmarkError
from microbench.gpu import Gpu, event_timed
from microbench.measurement import Measurement
from microbench.records import RecordWriter
from microbench.sampling import Point, SamplingPolicy, measure, report_point, timed
from microbench.sizes import format_time
from microbench.threads import available_cores, set_threads
from microbench.workload import Workload

__all__ = [
    "DEFAULT_BATCHES",
    "FULL_POLICY",
    "GEMM_SIZES",
    "GPU_BATCHES",
    "GPU_GEMM_SIZES",
    "QUICK_BATCHES",
    "QUICK_GEMM_SIZES",
    "QUICK_GPU_GEMM_SIZES",
    "QUICK_POLICY",
    "ComputePlan",
    "Point",
    "format_summary",
    "run_compute",
]

# This module loads no numba (the network and the references are imported when a run starts),
# so that a command can set NUMBA_NUM_THREADS for oversubscribed thread counts first.
FULL_POLICY = SamplingPolicy(warmup=3, min_samples=10, max_samples=200, time_cap_s=1.0)
QUICK_POLICY = SamplingPolicy(warmup=1, min_samples=5, max_samples=30, time_cap_s=0.05)
DEFAULT_BATCHES = (16, 32, 64, 128)
QUICK_BATCHES = (32, 64)
GPU_BATCHES = (64, 256, 1024)
GEMM_SIZES = (256, 512, 1024, 2048)
QUICK_GEMM_SIZES = (256, 1024)
GPU_GEMM_SIZES = (1024, 2048, 4096, 8192)
QUICK_GPU_GEMM_SIZES = (1024, 4096)
LR, MOMENTUM = 0.05, 0.0  # pdlsim train's defaults


@dataclass(frozen=True)
class ComputePlan:
    """What one compute run measures. ``gpu`` None: no GPU part; ``cpu`` False: no CPU part."""

    workloads: tuple[Workload, ...]
    threads: tuple[int, ...]
    batches: tuple[int, ...]
    gpu_batches: tuple[int, ...]
    gemm_sizes: tuple[int, ...]
    gpu_gemm_sizes: tuple[int, ...]
    policy: SamplingPolicy
    cpu: bool = True
    gpu: Gpu | None = None
    lr: float = LR
    momentum: float = MOMENTUM
    seed: int = 0


@dataclass(frozen=True)
class _Target:
    """Where points run and how they are timed."""

    device: str
    xp: Any
    timed: Callable[[Callable[[], object]], Callable[[], float]]
    synchronize: Callable[[], None]
    clock: str


def _cpu_target() -> _Target:
    return _Target("cpu", np, timed, lambda: None, "perf_counter")


def _gpu_target(gpu: Gpu) -> _Target:
    return _Target("gpu", gpu.cupy, lambda fn: event_timed(gpu, fn), gpu.synchronize, "cuda_event")


def run_compute(
    plan: ComputePlan, writer: RecordWriter | None, progress: TextIO | None = None
) -> list[Measurement]:
    """Measure everything ``plan`` asks for; each point is written to ``writer`` (when given)
    as soon as it is measured and reported as one line on ``progress``."""
    results: list[Measurement] = []

    def record(point: Point, target: _Target) -> Measurement:
        m = measure(
            target.timed(point.fn),
            plan.policy,
            benchmark="compute",
            name=point.name,
            params=point.params,
        )
        if point.cleanup is not None:
            point.cleanup()
        results.append(m)
        report_point(
            m, writer, progress, _label(m), policy=plan.policy.to_dict(), clock=target.clock
        )
        return m

    if plan.cpu:
        _run_target(plan, _cpu_target(), None, plan.threads, record)
    if plan.gpu is not None:
        _run_target(plan, _gpu_target(plan.gpu), plan.gpu, (1,), record)
    return results


def _run_target(
    plan: ComputePlan,
    target: _Target,
    gpu: Gpu | None,
    threads: tuple[int, ...],
    record: Callable[[Point, _Target], Measurement],
) -> None:
    from microbench.memory import available_memory_bytes
    from microbench.network_ops import network_points
    from microbench.nn import SGD, Network
    from microbench.reference import (
        DEFAULT_LLC_BYTES,
        GPU_TRIAD_MIN_TOTAL_BYTES,
        TRIAD_MIN_TOTAL_BYTES,
        TriadArrays,
        gemm_point,
        last_level_cache_bytes,
        triad_elements,
    )

    cores = available_cores()

    def base(t: int) -> dict[str, Any]:
        return {"threads": t, "device": target.device, "oversubscribed": t > cores}

    # References first, with the triad's big arrays allocated once for every thread count.
    if gpu is None:
        cache = last_level_cache_bytes() or DEFAULT_LLC_BYTES
        elements = triad_elements(cache, available_memory_bytes(), TRIAD_MIN_TOTAL_BYTES)
        sizes = plan.gemm_sizes
    else:
        cache = gpu.l2_cache_bytes() or DEFAULT_LLC_BYTES
        elements = triad_elements(cache, gpu.free_memory_bytes(), GPU_TRIAD_MIN_TOTAL_BYTES)
        sizes = plan.gpu_gemm_sizes
    triad = TriadArrays(elements, gpu)
    for t in threads:
        set_threads(t)
        record(triad.point(base(t)), target)
        if not triad.check():
            raise BenchmarkError(f"triad on the {target.device} computed a wrong result")
        for n in sizes:
            record(gemm_point(target.xp, n, base(t), plan.seed), target)
            if gpu is not None:
                gpu.release_pools()
    del triad
    if gpu is not None:
        gpu.release_pools()

    batches = plan.batches if gpu is None else plan.gpu_batches
    for workload in plan.workloads:
        net = Network(workload, seed=plan.seed, xp=target.xp)
        opt = SGD(plan.lr, plan.momentum, xp=target.xp)
        for t in threads:
            set_threads(t)
            for batch in batches:
                params = {"model": workload.name, **base(t)}
                for point in network_points(net, opt, batch, params, target.synchronize, plan.seed):
                    record(point, target)
        del net, opt
        if gpu is not None:
            gpu.release_pools()


def _label(m: Measurement) -> str:
    p = m.params
    where = f"{p['device']} t={p['threads']}"
    if m.name == "op":
        what = f"{p['model']} b={p['batch']} {p['op']} {p['phase']}"
    elif m.name == "gemm":
        what = f"gemm {p['n']}^3  {p['flops'] / m.median / 1e9:.1f} GFLOP/s"
    else:
        what = f"triad {p['bytes'] / 2**20:.0f} MiB  {p['bytes'] / m.median / 1e9:.2f} GB/s"
    return f"{where:<10} {what:<48}"


# ---------------------------------------------------------------------------------- summary


def format_summary(records: Iterable[Mapping[str, Any]]) -> str:
    """Plain-text tables of a compute run's "measurement" records: GEMM GFLOP/s and triad
    GB/s per size and thread count, then per model and batch the measured step against the
    sum of its ops' medians (forward, backward, loss, update), which should be close, and the
    mini-batch gather before the step (host only)."""
    refs: list[str] = []
    steps: dict[tuple[str, str, int, int], dict[str, float]] = {}
    for record in records:
        if record.get("type") != "measurement" or record.get("benchmark") != "compute":
            continue
        p, median = record["params"], Measurement.from_record(record).median
        flag = " (oversubscribed)" if p.get("oversubscribed") else ""
        if record["name"] == "gemm":
            rate = f"{p['flops'] / median / 1e9:10.1f} GFLOP/s"
            refs.append(_ref_row("gemm", f"{p['n']}^3", p, median, rate + flag))
        elif record["name"] == "triad":
            rate = f"{p['bytes'] / median / 1e9:10.2f} GB/s"
            refs.append(_ref_row("triad", f"{p['bytes'] / 2**20:.0f} MiB", p, median, rate + flag))
        elif record["name"] == "op":
            key = (p["model"], p["device"], int(p["batch"]), int(p["threads"]))
            sums = steps.setdefault(key, {"ops": 0.0, "step": float("nan"), "data": float("nan")})
            if p["phase"] in ("step", "data", "inference"):
                sums[p["phase"]] = median
            else:
                sums["ops"] += median
    lines = []
    if refs:
        header = f"{'kernel':<8}{'size':>12}{'device':>8}{'threads':>9}{'median':>12}  rate"
        lines += [header, *refs]
    if steps:
        lines += [""] if refs else []
        lines.append(
            f"{'model':<10}{'device':>8}{'batch':>7}{'threads':>9}{'step':>12}{'sum of ops':>12}"
            f"{'ops/step':>10}{'data':>12}{'fwd only':>12}"
        )
        for (model, device, batch, t), sums in steps.items():
            measured = sums["step"] > 0  # NaN (no step record: an interrupted run) is not
            step = format_time(sums["step"]) if measured else "-"
            ratio = f"{sums['ops'] / sums['step']:.2f}" if measured else "-"
            data = format_time(sums["data"]) if sums["data"] > 0 else "-"
            inference = sums.get("inference", 0.0)
            forward_only = format_time(inference) if inference > 0 else "-"
            lines.append(
                f"{model:<10}{device:>8}{batch:>7}{t:>9}{step:>12}"
                f"{format_time(sums['ops']):>12}{ratio:>10}{data:>12}{forward_only:>12}"
            )
    return "\n".join(lines)


def _ref_row(kernel: str, size: str, p: Mapping[str, Any], median: float, rate: str) -> str:
    return f"{kernel:<8}{size:>12}{p['device']:>8}{p['threads']:>9}{format_time(median):>12}{rate}"
