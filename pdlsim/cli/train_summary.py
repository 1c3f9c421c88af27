"""What ``pdlsim train`` says and keeps at the end of a run: the summary (epoch time, the step
and its phases in steady state, memory) on stdout and ``summary.json`` in the run directory."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from microbench.fileio import atomic_write_text, special_kind
from pdlsim.train.config import warmup_steps

if TYPE_CHECKING:
    from pdlsim.train.loop import TrainResult

__all__ = [
    "SUMMARY_NAME",
    "check_run_outputs",
    "finish_run",
    "format_memory",
    "format_summary",
    "steady_phases",
]

SUMMARY_NAME = "summary.json"
_CHECKPOINTS = "checkpoint-step*.npz"  # pdlsim.train.checkpoint's names


def check_run_outputs(run_dir: Path) -> None:
    """Refuse, before any training, a run directory where a name the run writes under is
    taken by something that is not a regular file (a directory, a FIFO): the write at the end
    would fail after all the work, or block on the FIFO. The one line names it and the fix."""
    if not run_dir.is_dir():
        return
    taken = [run_dir / SUMMARY_NAME, *sorted(run_dir.glob(_CHECKPOINTS))]
    for path in taken:
        kind = special_kind(path)
        if kind is not None:
            raise UserError(
                f"--out {run_dir}: {path} is {kind}, where the run writes its "
                f"{'summary' if path.name == SUMMARY_NAME else 'checkpoints'}; move it aside, "
                "or give another --out"
            )


def steady_phases(steps: list[dict[str, float]]) -> tuple[dict[str, float], int, float]:
    """Mean seconds per phase over the steps after the warm-up (:func:`warmup_steps`), the
    number of warm-up steps and their mean step time: the first steps compile (numba) and fill
    caches, and averaged in they would overstate a step several times over."""
    k = warmup_steps(len(steps))
    kept = steps[k:]
    means = {name: sum(s[name] for s in kept) / len(kept) for name in kept[0]}
    warm_s = sum(sum(s.values()) for s in steps[:k]) / k if k else 0.0
    return means, k, warm_s


def format_summary(result: TrainResult) -> str:
    """The run's summary: epoch time and throughput as measured (warm-up included), the step
    time and its phases in steady state (rank 0, after the warm-up), the warm-up apart."""
    last = result.epochs[-1]
    mean_epoch_s = sum(e.time_s for e in result.epochs) / len(result.epochs)
    lines = [
        f"time per epoch {mean_epoch_s:.3f} s, {last.samples_per_s:,.0f} samples/s "
        "(last epoch, warm-up included)"
    ]
    if result.step_phases_s:
        phases, k, warm_s = steady_phases(result.step_phases_s)
        steady = len(result.step_phases_s) - k
        warm = f"after {k} warm-up steps of {1e3 * warm_s:.2f} ms mean" if k else "no warm-up"
        where = f"rank 0, mean of {steady} steps {warm}"
    else:  # a resumed run that had no step left: the epoch's means
        phases, where = last.phase_mean_s, "last epoch, mean over ranks"
    step_s = sum(phases.values())
    lines += [
        f"step time {1e3 * step_s:.2f} ms in steady state ({where})",
        f"{'phase':<10}{'ms/step':>10}{'share':>9}",
    ]
    for name, seconds in phases.items():
        share = 100 * seconds / step_s if step_s > 0 else 0.0
        lines.append(f"{name:<10}{1e3 * seconds:>10.3f}{share:>8.1f}%")
    lines.append(format_memory(last))
    return "\n".join(lines)


def format_memory(epoch: Any) -> str:
    """One line: measured peak memory per rank, and the part of it the model's arrays take."""
    mib = 2.0**20
    line = f"peak memory per rank {epoch.peak_rss_bytes_max / mib:.1f} MiB resident"
    if epoch.device_pool_bytes_max is not None:
        line += f", GPU pool {epoch.device_pool_bytes_max / mib:.1f} MiB"
    parts = epoch.model_state_bytes
    detail = ", ".join(
        f"{k.replace('_', ' ')} {v / mib:.2f}" for k, v in parts.items() if k != "total"
    )
    return f"{line} (max over ranks); model state {parts['total'] / mib:.2f} MiB ({detail})"


def finish_run(result: TrainResult) -> None:
    """Print the run's summary and write ``summary.json`` beside its records."""
    if not result.epochs:
        return
    print(format_summary(result))
    if result.last_checkpoint is not None:
        print(f"checkpoint (weights, optimizer, data order): {result.last_checkpoint}")
    summary = {
        "config": result.config.to_dict(),
        "epochs": [asdict(e) for e in result.epochs],
        "run_dir": str(result.run_dir),
    }
    atomic_write_text(result.run_dir / SUMMARY_NAME, json.dumps(summary, indent=2) + "\n")
