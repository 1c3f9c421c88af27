"""Measuring one configuration: ``pdlsim train`` launched under a supervisor, its per-step
records read back into the slowest rank's post-warm-up step times, phases and memory."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.records import RecordsError, read_records
from pdlsim.train.config import warmup_steps
from pdlsim.validate.plan import RunSpec, ValidateConfig

TEST_SAMPLES = 64  # the held-out evaluation after the epoch is not timed; keep it short


def run_records(run_dir: Path, pattern: str, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` records of the files ``pattern`` of one training launch, in file order,
    read as every records file is (a last line cut off by a killed writer is skipped with a
    warning); a damaged file is one line naming it."""
    found = []
    for path in sorted(run_dir.glob(pattern)):
        try:
            _, records = read_records(path)
        except RecordsError as exc:
            raise UserError(
                f"cannot read the training records {exc}; validate into a new --out"
            ) from None
        found += [rec for rec in records if rec["type"] == kind]
    return found


def _read_steps(run_dir: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """{rank: {global_step: train_step record}} from a run directory."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for rec in run_records(run_dir, "rank*.jsonl", "train_step"):
        out.setdefault(int(rec["rank"]), {})[int(rec["global_step"])] = rec
    if not out:
        raise UserError(f"no train_step records in {run_dir}")
    return out


def measured_step_times(run_dir: Path) -> tuple[list[float], dict[str, float]]:
    """Post-warm-up step times (max over ranks per step) and the median per-phase seconds
    (per step, the phases of the slowest rank), plus ``skew``: the median over steps of the
    ranks' mean ``wait``. The slowest rank hardly waits; the mean over ranks is the step's
    max less its mean, what the model calls T_sync."""
    ranks = _read_steps(run_dir)
    common = sorted(set.intersection(*(set(r) for r in ranks.values())))
    kept = common[warmup_steps(len(common)) :]
    steps, phases, skews = [], [], []
    for step in kept:
        recs = [ranks[r][step] for r in ranks]
        slowest = max(recs, key=lambda rec: rec["step_s"])
        steps.append(slowest["step_s"])
        phases.append(slowest["phases_s"])
        skews.append(statistics.fmean(rec["phases_s"].get("wait", 0.0) for rec in recs))
    names = list(phases[0]) if phases else []
    medians = {n: statistics.median(p[n] for p in phases) for n in names}
    return steps, {**medians, "skew": statistics.median(skews) if skews else 0.0}


def measured_memory(run_dir: Path) -> dict[str, int]:
    """From the run's last epoch record: the peak resident memory of the biggest rank, and the
    bytes of the arrays training allocated (its own count, in ``pdlsim predict``'s parts)."""
    epochs = run_records(run_dir, "rank0*.jsonl", "train_epoch")
    if not epochs:
        raise UserError(f"no train_epoch record in {run_dir}")
    last = epochs[-1]
    return {
        "peak_rss_bytes": int(last["peak_rss_bytes_max"]),
        "model_state_bytes": int(last["model_state_bytes"]["total"]),
    }


def launch_samples(steps: int, global_batch: int) -> int:
    """The synthetic samples a launch of ``steps`` steps trains on: one epoch of them, and
    never fewer than 256."""
    return max(steps * global_batch, 256)


def launch_train(spec: RunSpec, steps: int, run_dir: Path, extra: tuple[str, ...] = ()) -> None:
    """One ``pdlsim train`` launch of ``spec`` (and ``extra`` flags) into ``run_dir``."""
    from pdlsim.train.launch import run_supervised

    global_batch = spec.batch * (1 if spec.parallel == "model" else spec.procs)
    samples = launch_samples(steps, global_batch)
    command = [
        sys.executable, "-m", "pdlsim", "train", "--model", spec.model,
        "--procs", str(spec.procs), "--threads", str(spec.threads), "--batch", str(spec.batch),
        "--epochs", "1", "--max-steps", str(steps), "--samples", str(samples),
        "--test-samples", str(TEST_SAMPLES), "--out", str(run_dir), *spec.train_flags, *extra,
    ]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    with log.open("w") as handle:
        status = run_supervised(command, env=dict(os.environ), stdout=handle, stderr=handle)
    if status != 0:
        said = _last_line(log)
        raise UserError(
            f"training {spec.label} failed with status {status}"
            + (f" ({said})" if said else "")
            + f"; see {log}"
        )


def _last_line(log: Path, most: int = 300) -> str:
    """The last non-blank line of a launch's log (what the failing command said), shortened
    to ``most`` characters; empty when there is none."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return said if len(said) <= most else said[: most - 3] + "..."


def measure_launch(spec: RunSpec, cfg: ValidateConfig, steps: int, k: int) -> dict[str, Any]:
    """Launch ``k`` of ``spec``: its median step, median phases, memory and CPU steal."""
    from microbench.cpustat import cpu_times, steal_fraction

    run_dir = cfg.out / "runs" / spec.label / f"r{k}"
    before = cpu_times()
    launch_train(spec, steps, run_dir)
    steal = steal_fraction(before, cpu_times())
    times, phases = measured_step_times(run_dir)
    return {
        "median_s": statistics.median(times),
        "phases_s": phases,
        "memory": measured_memory(run_dir),
        "steal": steal,
    }


def summarize_launches(launches: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """A configuration's launches: the median over launches, min..max interval."""
    medians = [launch["median_s"] for launch in launches]
    phase_runs = [launch["phases_s"] for launch in launches]
    memory = [launch["memory"] for launch in launches]
    steal = [launch["steal"] for launch in launches]
    phases = {n: statistics.median(p[n] for p in phase_runs) for n in phase_runs[0]}
    return {
        "measured_peak_rss_bytes": max(m["peak_rss_bytes"] for m in memory),
        "measured_model_state_bytes": memory[0]["model_state_bytes"],
        "measured_s": statistics.median(medians),
        "measured_low_s": float(min(medians)),
        "measured_high_s": float(max(medians)),
        "repeat_medians_s": medians,
        "measured_phases_s": phases,
        "steps": steps,
        "warmup_steps": warmup_steps(steps),
        "steal_max": None if None in steal else max(steal),
    }
