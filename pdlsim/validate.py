"""``pdlsim validate``: real training runs against predictions from a microbenchmark profile.

For every configuration (workload, P ranks x T threads, batch per rank) ``pdlsim train`` is
launched ``repeats`` times, each a separate process (or ``mpiexec``) launch into
``OUT/runs/<config>/r<k>``. A launch's step time is the median, over the steps after the
warm-up (:func:`warmup_steps`: the first max(5, 10%) steps: numba compiles, first touch), of the
per-step ``step_s`` taken as the **maximum over ranks** (a synchronous step ends when its
slowest rank does). The configuration's measured figure is the median over launches, its
interval the **min..max over launches**.

The prediction uses the same profile for every configuration and the scenario that
``pdlsim train`` really runs: one bucket holding every gradient, no overlap, CPU ranks (no
copies). Nothing measured by the training runs feeds the prediction: the profile is
calibrated from microbenchmarks only, and its provenance is reported.

Speedup is the throughput ratio against the serial run (P1T1) at the same batch per rank:
``P x T_serial / T_config``, measured with measured times, predicted with predicted times.
Configurations with P x T above the cores are run and reported, flagged ``oversubscribed``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbench.errors import UserError

__all__ = [
    "RunSpec",
    "ValidateConfig",
    "measure",
    "measured_step_times",
    "plan_matrix",
    "predict_spec",
    "run_validation",
    "warmup_steps",
]

MODES = {(1, 1): "serial", (1, 2): "threads", (2, 1): "mpi", (2, 2): "hybrid", (4, 1): "mpi"}
FULL_BATCHES = (16, 32, 64)
TEST_SAMPLES = 64  # the held-out evaluation after the epoch is not timed; keep it short


@dataclass(frozen=True)
class RunSpec:
    """One configuration: a workload, P ranks x T threads, batch per rank."""

    model: str
    procs: int
    threads: int
    batch: int

    @property
    def mode(self) -> str:
        return MODES.get((self.procs, self.threads), "hybrid" if self.threads > 1 else "mpi")

    @property
    def label(self) -> str:
        return f"{self.model}-p{self.procs}t{self.threads}-b{self.batch}"

    def oversubscribed(self, cores: int) -> bool:
        return self.procs * self.threads > cores


@dataclass(frozen=True)
class ValidateConfig:
    out: Path
    profile: str | None = None
    repeats: int = 3
    steps: int = 40
    quick: bool = False
    models: tuple[str, ...] = ("mlp", "cnn")
    modes: tuple[tuple[int, int], ...] = tuple(MODES)
    batches: tuple[int, ...] = FULL_BATCHES
    band_samples: int = 20
    target_run_s: float = 2.0  # timed seconds per launch: steps = target / predicted step
    max_steps: int = 300


def steps_for(cfg: ValidateConfig, predicted_step_s: float) -> int:
    """Steps per launch: enough for ``target_run_s`` at the *predicted* step time (short MLP
    steps need many to settle), between ``cfg.steps`` and ``cfg.max_steps``."""
    wanted = math.ceil(cfg.target_run_s / max(predicted_step_s, 1e-6))
    return int(min(max(wanted, cfg.steps), max(cfg.max_steps, cfg.steps)))


def plan_matrix(cfg: ValidateConfig) -> list[RunSpec]:
    """Every (model, mode, batch); --quick keeps all batches for the first model only and the
    middle batch for the others (so at least one workload still has three batch sizes)."""
    specs = []
    for i, model in enumerate(cfg.models):
        batches = cfg.batches
        if cfg.quick and i > 0:
            batches = (cfg.batches[len(cfg.batches) // 2],)
        for batch in batches:
            for procs, threads in cfg.modes:
                specs.append(RunSpec(model, procs, threads, batch))
    return specs


def warmup_steps(n_steps: int) -> int:
    """Steps discarded at the start of a run: max(5, 10%), leaving at least one."""
    return min(max(5, math.ceil(0.1 * n_steps)), max(n_steps - 1, 0))


def _read_steps(run_dir: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """{rank: {global_step: train_step record}} from a run directory."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for path in sorted(run_dir.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "train_step":
                out.setdefault(int(rec["rank"]), {})[int(rec["global_step"])] = rec
    if not out:
        raise UserError(f"no train_step records in {run_dir}")
    return out


def measured_step_times(run_dir: Path) -> tuple[list[float], dict[str, float]]:
    """Post-warm-up step times (max over ranks per step) and the median per-phase seconds
    (per step, the phases of the slowest rank)."""
    ranks = _read_steps(run_dir)
    common = sorted(set.intersection(*(set(r) for r in ranks.values())))
    kept = common[warmup_steps(len(common)) :]
    steps, phases = [], []
    for step in kept:
        recs = [ranks[r][step] for r in ranks]
        slowest = max(recs, key=lambda rec: rec["step_s"])
        steps.append(slowest["step_s"])
        phases.append(slowest["phases_s"])
    names = list(phases[0]) if phases else []
    return steps, {n: statistics.median(p[n] for p in phases) for n in names}


def launch_train(spec: RunSpec, steps: int, run_dir: Path) -> None:
    """One ``pdlsim train`` launch of ``spec`` into ``run_dir`` (its own process / mpiexec)."""
    from pdlsim.launch import run_supervised

    samples = max(steps * spec.procs * spec.batch, 256)
    command = [
        sys.executable, "-m", "pdlsim", "train", "--model", spec.model,
        "--procs", str(spec.procs), "--threads", str(spec.threads), "--batch", str(spec.batch),
        "--epochs", "1", "--max-steps", str(steps), "--samples", str(samples),
        "--test-samples", str(TEST_SAMPLES), "--out", str(run_dir),
    ]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    with log.open("w") as handle:
        status = run_supervised(command, env=dict(os.environ), stdout=handle, stderr=handle)
    if status != 0:
        raise UserError(f"training {spec.label} failed with status {status}; see {log}")


def measure(spec: RunSpec, cfg: ValidateConfig, steps: int) -> dict[str, Any]:
    """Launch ``spec`` ``cfg.repeats`` times; the median over launches and min..max interval."""
    medians, phase_runs = [], []
    for k in range(cfg.repeats):
        run_dir = cfg.out / "runs" / spec.label / f"r{k}"
        launch_train(spec, steps, run_dir)
        times, phases = measured_step_times(run_dir)
        medians.append(statistics.median(times))
        phase_runs.append(phases)
    phases = {n: statistics.median(p[n] for p in phase_runs) for n in phase_runs[0]}
    return {
        "measured_s": statistics.median(medians),
        "measured_low_s": float(min(medians)),
        "measured_high_s": float(max(medians)),
        "repeat_medians_s": medians,
        "measured_phases_s": phases,
        "steps": steps,
        "warmup_steps": warmup_steps(steps),
    }


def predict_spec(spec: RunSpec, cfg: ValidateConfig) -> dict[str, Any]:
    """The prediction of what ``pdlsim train`` runs: one bucket with every gradient, no
    overlap, CPU ranks on one node."""
    from microbench.workload import load_workload
    from pdlsim.predict import PredictConfig, run_prediction

    grad_mb = load_workload(spec.model).gradient_bytes / 2**20
    pcfg = PredictConfig(
        nodes=1, gpus=0, procs_per_node=spec.procs, threads=spec.threads, model=spec.model,
        batch=spec.batch, profile=cfg.profile, bucket_mb=math.ceil(grad_mb) + 1.0,
        overlap=False, iterations=50, samples=cfg.band_samples,
    )  # fmt: skip
    return run_prediction(pcfg)


def profile_provenance(profile: str | None) -> dict[str, Any]:
    from pdlsim.predict import resolve_profile

    prof, name = resolve_profile(profile)
    return {
        "profile": name,
        "created_utc": prof.created_utc,
        "source": "microbenchmarks only (pdlsim bench/calibrate); no training run is fitted",
        "benchmarks": sorted({b for s in prof.sources for b in s.benchmark.split(",")}),
    }


def run_validation(cfg: ValidateConfig, log: Any = print) -> dict[str, Any]:
    """Measure and predict every configuration of :func:`plan_matrix`; write the report."""
    from microbench.threads import available_cores
    from pdlsim.validate_report import build_rows, summarize, write_outputs

    check_out(cfg.out)
    if cfg.repeats < 1 or cfg.steps < 2:
        raise UserError("--repeats must be at least 1 and --steps at least 2")
    provenance = profile_provenance(cfg.profile)
    cores = available_cores()
    specs = plan_matrix(cfg)
    started = time.perf_counter()
    results = []
    for i, spec in enumerate(specs, 1):
        pred = predict_spec(spec, cfg)
        meas = measure(spec, cfg, steps_for(cfg, pred["band"]["p50_s"]))
        results.append((spec, meas, pred))
        log(
            f"[{i}/{len(specs)}] {spec.label}: measured {meas['measured_s'] * 1e3:.3f} ms, "
            f"predicted {pred['band']['p50_s'] * 1e3:.3f} ms"
        )
    rows = build_rows(results, cores)
    report = {
        "provenance": provenance,
        "cores": cores,
        "min_steps_per_run": cfg.steps,
        "warmup": "first max(5, 10%) steps of each launch discarded",
        "repeats": cfg.repeats,
        "interval": "min..max of the per-launch medians",
        "speedup": "throughput / throughput of P1T1 at the same batch per rank",
        "elapsed_s": time.perf_counter() - started,
        "summary": summarize(rows),
        "rows": rows,
    }
    report["files"] = write_outputs(report, cfg.out)
    return report


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    if (out / "runs").exists() and any((out / "runs").iterdir()):
        raise UserError(f"--out {out} already holds runs; choose a new directory")


def add_validate_parser(commands: argparse._SubParsersAction) -> None:
    from pdlsim.cli import positive_int

    p = commands.add_parser(
        "validate", help="run real training over a matrix, predict each, report the error"
    )
    p.add_argument("--quick", action="store_true", help="fewer steps and launches (< 5 min)")
    p.add_argument("--profile", default=None, metavar="NAME|PATH", help="default: packaged")
    p.add_argument("--repeats", type=positive_int, default=None, help="launches each (3; quick 2)")
    p.add_argument("--steps", type=positive_int, default=None, help="min steps per launch (40; 20)")
    p.add_argument("--models", default="mlp,cnn", metavar="NAME,...", help="workloads (mlp,cnn)")
    p.add_argument("--batches", default=None, metavar="B,...", help="batches per rank (16,32,64)")
    p.add_argument("--modes", default=None, metavar="PxT,...", help="e.g. 1x1,2x1 (all five)")
    p.add_argument("--breakdown", action="store_true", help="print measured vs predicted phases")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="report directory")
    p.set_defaults(handler=run_validate_command)


def _parse_modes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        modes = tuple(tuple(int(v) for v in m.lower().split("x")) for m in text.split(","))
    except ValueError:
        raise UserError(f"--modes: expected PxT,... like 1x1,2x1, got '{text}'") from None
    if any(len(m) != 2 or min(m) < 1 for m in modes):
        raise UserError(f"--modes: expected PxT,... like 1x1,2x1, got '{text}'")
    return modes  # type: ignore[return-value]


def run_validate_command(args: argparse.Namespace) -> int:
    from pdlsim.cli import int_list
    from pdlsim.validate_report import format_breakdown, format_report

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    extra: dict[str, Any] = {}
    if args.batches:
        try:
            extra["batches"] = int_list(args.batches)
        except argparse.ArgumentTypeError as exc:
            raise UserError(f"--batches: {exc}") from None
    if args.modes:
        extra["modes"] = _parse_modes(args.modes)
    cfg = ValidateConfig(
        out=args.out or Path("runs") / "validate" / stamp,
        profile=args.profile,
        repeats=args.repeats or (2 if args.quick else 3),
        steps=args.steps or (20 if args.quick else 40),
        target_run_s=0.25 if args.quick else 2.0,
        max_steps=120 if args.quick else 300,
        quick=args.quick,
        models=tuple(m for m in args.models.split(",") if m),
        band_samples=10 if args.quick else 20,
        **extra,
    )
    report = run_validation(cfg, log=lambda s: print(s, file=sys.stderr))
    print(format_report(report))
    if args.breakdown:
        print(format_breakdown(report["rows"]))
    return 0
