"""The profile ``pdlsim validate`` predicts from: calibrated first, from microbenchmarks only.

Without ``--profile`` a validation benchmarks the machine itself (``pdlsim bench`` at
:data:`CALIBRATION_PROCS` ranks, the validated workloads, batches and thread counts) and fits
the profile, so that it describes the machine as it is while the training runs are measured; the
matrix also predicts 4 ranks, beyond what calibration ran. :func:`profile_provenance` is what the
report says about where the profile came from.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.threads import oversubscription

__all__ = [
    "CALIBRATION_PROCS",
    "STEAL_WARNING",
    "calibrate_now",
    "calibrated_ranks",
    "check_gpu_choice",
    "gpu_configurations",
    "machine_difference",
    "profile_provenance",
    "unread_stages",
]

STEAL_WARNING = 0.05  # CPU steal above which a measurement is flagged
CALIBRATION_PROCS = (1, 2)  # calibrate with up to 2 ranks; the matrix also predicts 4


def calibrate_now(cfg: Any, log: Any = print) -> tuple[Path, list[str]]:
    """Benchmark this machine now and fit a profile: ``OUT/calibration/profile.json``, and what
    disturbed the measurements (each also logged), for the report to carry beside the result."""
    from calibration.optable import inconsistent_steps
    from calibration.pipeline import fit_profile
    from microbench.compute import GPU_BATCHES
    from microbench.threads import available_cores
    from pdlsim.cli.bench_suite import BenchPlan, run_bench

    run_dir = cfg.out / "calibration"
    threads = tuple(range(1, max(t for _, t in cfg.modes) + 1))
    plan = BenchPlan(
        out=run_dir, model=",".join(cfg.models), procs=CALIBRATION_PROCS, threads=threads,
        batches=tuple(sorted(set(cfg.batches))), quick=cfg.quick,
        gpu_batches=tuple(sorted(set(GPU_BATCHES) | set(cfg.batches))),  # where a GPU is
        skip=unread_stages(cfg.modes, available_cores()),
    )  # fmt: skip
    log(f"calibrating from microbenchmarks into {run_dir} ...")
    result = run_bench(plan, progress=sys.stderr)
    if not result.ok:
        failed = ", ".join(s.name for s in result.stages if s.status != "ok")
        raise UserError(f"calibration benchmarks failed ({failed}); see {run_dir / 'logs'}")
    warnings = []
    stolen = {s.name: s.steal for s in result.stages if s.steal is not None}
    if stolen and max(stolen.values()) > STEAL_WARNING:
        worst = max(stolen, key=stolen.__getitem__)
        warnings.append(
            f"the hypervisor took up to {stolen[worst]:.0%} of the CPU during calibration "
            f"({worst}): its figures carry the neighbours' load"
        )
    profile, models = fit_profile(run_dir, n_boot=50 if cfg.quick else 200)
    warnings += inconsistent_steps(models["compute"].table_)
    for line in warnings:
        log(f"pdlsim: warning: {line}")
    return profile.save(run_dir / "profile.json"), warnings


def unread_stages(modes: Any, cores: int) -> tuple[str, ...]:
    """The benchmark stages whose models no validated prediction reads: gradient compression
    (no configuration compresses), and the node fill unless a configuration that fits the
    ``cores`` runs more ranks than the calibration (its straggler term starts above them)."""
    ranks = max((p for p, t in modes if oversubscription(p, t, cores) is None), default=1)
    return ("compression",) + (("nodefill",) if ranks <= max(CALIBRATION_PROCS) else ())


def calibrated_ranks(profile: str) -> int:
    """The most ranks per node the profile measured anything at: its collectives' process
    counts (``"P/Q"``: P ranks, Q per node) and its co-location's ranks per node; the
    calibration's own :data:`CALIBRATION_PROCS` where it says neither."""
    from pdlsim.prediction.config import resolve_profile

    prof, _ = resolve_profile(profile)
    found: list[int] = []
    collectives = (prof.models.get("collectives") or {}).get("collectives", {})
    for op in collectives.values():
        for count in (op.get("selection") or {}).get("process_counts", []):
            ranks, _, per_node = str(count).partition("/")
            if (per_node or ranks).isdecimal():
                found.append(int(per_node or ranks))
    colocation = prof.model("colocation") if prof.models.get("colocation") else None
    if colocation is not None and colocation.points_:
        found.append(colocation.max_ranks_per_node)
    return max(found, default=max(CALIBRATION_PROCS))


def machine_difference(measured_on: dict[str, Any], here: dict[str, Any]) -> str | None:
    """How the profile's machine differs from this one (CPU model, cores, architecture), or
    None where they agree or a side does not say."""
    labels = {"cpu_model": "CPU", "cores_available": "cores", "arch": "architecture"}
    diffs = [
        f"{label} {measured_on[key]} there, {here[key]} here"
        for key, label in labels.items()
        if measured_on.get(key) is not None
        and here.get(key) is not None
        and measured_on[key] != here[key]
    ]
    return "; ".join(diffs) or None


def profile_provenance(profile: str | None, calibrated_now: bool = False) -> dict[str, Any]:
    from microbench.machine import machine_identity
    from pdlsim.prediction.config import resolve_profile

    prof, name = resolve_profile(profile)
    when = "run by this validation just before the training runs" if calibrated_now else "given"
    machine = prof.machine
    out = {
        "profile": name,
        "created_utc": prof.created_utc,
        "source": "microbenchmarks only (pdlsim bench/calibrate); no training run is fitted",
        "calibration": when,
        "measured_on": f"{machine.get('cpu_model')}, {machine.get('cores_available')} cores, "
        f"host {machine.get('hostname')}",
        "benchmarks": sorted({b for s in prof.sources for b in s.benchmark.split(",")}),
    }
    difference = machine_difference(machine, machine_identity())
    if difference is not None:
        out["machine_warning"] = (
            f"the profile was measured on another machine ({difference}): the predictions "
            "are that machine's and the runs this one's; drop --profile to calibrate here"
        )
    return out


def check_gpu_choice(choice: str) -> str | None:
    """Why ``--gpu`` ``choice`` cannot be, before any work (None where it can): "on" with no
    GPU here."""
    if choice != "on":
        return None
    from microbench.gpu import find_gpu

    gpu, why = find_gpu()
    return None if gpu is not None else _no_gpu_for_on(why)


def _no_gpu_for_on(why: str) -> str:
    return f"--gpu on: no GPU here ({why}); use --gpu auto or off"


def gpu_configurations(choice: str, profile: str, log: Any = print) -> bool:
    """Whether validate adds the GPU configurations: ``choice`` "off" never, "auto" where a GPU
    is found and ``profile`` has a GPU model (else one line says why not), "on" the same but
    a missing GPU or GPU model is a :class:`UserError`."""
    if choice == "off":
        return False
    from microbench.gpu import find_gpu
    from pdlsim.prediction.config import resolve_profile

    gpu, why = find_gpu()
    if gpu is None:
        if choice == "on":
            raise UserError(_no_gpu_for_on(why))
        log(f"no GPU here ({why}): the GPU configurations are left out")
        return False
    prof, name = resolve_profile(profile)
    devices = (prof.models.get("compute") or {}).get("devices", {})
    if "gpu" not in devices:
        message = (
            f"the profile {name} has no GPU model (its compute was measured on "
            f"{', '.join(devices) or 'nothing'}); calibrate on this machine (drop --profile)"
        )
        if choice == "on":
            raise UserError(f"--gpu on: {message}")
        log(f"{message}: the GPU configurations are left out")
        return False
    return True
