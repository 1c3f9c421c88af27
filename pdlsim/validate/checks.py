"""What ``pdlsim validate`` checks before any work: one place, called first by
:func:`pdlsim.validate.run.run_validation`, so that every problem it can know up front is one
line before the calibration (ten minutes) or the first launch, never found at the end.

* :func:`check_out`: the report directory and every path the run writes under it (a file
  where a folder goes was a traceback, or a calibration lost); a previous validation there is
  refused, never overwritten.
* :func:`check_counts`: ``repeats`` and ``steps`` within bounds.
* :func:`check_names`: every workload has a name of its own, so that no two configurations
  share a run folder (the second launch found the first one's records and failed mid-run).
* :func:`check_memory`: every launch's synthetic data fits memory as ``pdlsim train`` wants it
  (a large ``--steps`` was refused by the first launch, after the calibration).
* :func:`check_profile`: a given profile's every model section builds, and the held-out draw
  is unseen by it, before the held-out workloads are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import check_folder_exists, check_writable
from pdlsim.validate.plan import RunSpec, check_unseen, draw_heldout

__all__ = [
    "MAX_REPEATS",
    "check_before_work",
    "check_counts",
    "check_memory",
    "check_names",
    "check_out",
    "check_profile",
]

# Launches per configuration: each round launches every configuration once (80 or so, minutes
# per round), so 1,000 rounds are weeks; the bound keeps a typo from planning forever.
MAX_REPEATS = 1_000
REPORT_FILES = ("validation.csv", "validation.json", "parity.png")
FOLDERS = ("runs", "workloads", "calibration")  # what a validation writes under OUT
PREVIOUS = ("runs", "workloads", "calibration", "speed")  # a non-empty one: a validation was here


def check_before_work(cfg: Any) -> None:
    """Every check of this module on ``cfg`` (a :class:`~pdlsim.validate.plan.ValidateConfig`),
    cheapest first."""
    check_counts(cfg)
    check_out(cfg.out)
    drawn = draw_heldout(cfg)
    check_names(cfg, drawn)
    check_memory(cfg, drawn)
    if cfg.profile is not None:
        check_profile(cfg, drawn)


def check_counts(cfg: Any) -> None:
    """``repeats`` between 1 and :data:`MAX_REPEATS`, ``steps`` at least 2 (a warm-up and a
    timed step)."""
    if not 1 <= cfg.repeats <= MAX_REPEATS:
        raise UserError(f"--repeats must be between 1 and {MAX_REPEATS:,}, got {cfg.repeats:,}")
    if cfg.steps < 2:
        raise UserError(f"--steps must be at least 2 (a warm-up step and a timed one), got "
                        f"{cfg.steps}")  # fmt: skip


def check_out(out: Path) -> None:
    """Refuse an output that is a file, holds a validation already (runs, workloads, a
    calibration or a report: nothing there is overwritten, and a validation's held-out
    workloads are its inputs), or has something other than a folder where a folder goes or
    other than a plain file where a report file goes (a FIFO, a device, a folder), or lies
    in a folder that does not exist (a mistyped one is not created)."""
    check_writable(out, "dir", "--out")
    check_folder_exists(out, "--out", "--out")
    for name in REPORT_FILES:
        check_writable(out / name, "file", "--out")
    for name in FOLDERS:
        check_writable(out / name, "dir", "--out")
    if out.is_dir():
        for path in sorted(out.glob("speedup-*.png")):
            check_writable(path, "file", "--out")
        held = [d for d in PREVIOUS if (out / d).is_dir() and any((out / d).iterdir())]
        if held or (out / "validation.json").exists():
            what = f"{held[0]}/" if held else "validation.json"
            raise UserError(
                f"--out {out} already holds a validation ({what}); choose a new directory "
                "(nothing there is overwritten)"
            )


def check_names(cfg: Any, drawn: list[tuple[Any, tuple[int, ...]]]) -> None:
    """Two workloads of one name (a preset and a file named like it, two files of one name in
    two folders, a file named like a held-out draw) would launch into one run folder: the
    configurations' labels are the name, so the second launch meets the first one's records."""
    seen: dict[str, str] = {}
    for model in cfg.models:
        name = Path(model).stem
        if name in seen:
            raise UserError(
                f"--models {seen[name]} and {model} are both named '{name}': their runs would "
                "share one folder; rename one of the files"
            )
        seen[name] = model
    for workload, _ in drawn:
        if workload.name in seen:
            raise UserError(
                f"--models {seen[workload.name]} is named like the held-out workload "
                f"'{workload.name}' drawn from --seed {cfg.seed}; rename the file or give "
                "another --seed"
            )


def check_memory(cfg: Any, drawn: list[tuple[Any, tuple[int, ...]]]) -> None:
    """Every launch trains one epoch of at least ``steps`` x its global batch synthetic
    samples (:func:`~pdlsim.validate.plan.steps_for` never asks fewer); refuse the run where a
    workload's largest launch would not fit memory by ``pdlsim train``'s own rule
    (:func:`pdlsim.train.data.synthetic_overflow`), as that launch would, minutes in. Only
    the launches that run count: modes that fit the cores."""
    from microbench.threads import available_cores
    from microbench.workload import load_workload
    from pdlsim.train.data import synthetic_overflow
    from pdlsim.validate.measure import launch_samples

    cores = available_cores()
    fits = [p for p, t in cfg.modes if p * t <= cores] if "data" in cfg.parallel else []
    ranks = max(fits, default=1)
    batch = max(cfg.batches)
    largest = [(load_workload(m), batch * ranks) for m in cfg.models]
    largest += [(w, max(batches) * ranks) for w, batches in drawn]
    for workload, global_batch in largest:
        samples = launch_samples(cfg.steps, global_batch)
        overflow = synthetic_overflow(workload, samples)
        if overflow is not None:
            need, available = overflow
            fewer = synthetic_overflow(workload, launch_samples(1, global_batch)) is None
            raise UserError(
                f"--steps {cfg.steps}: a launch of {workload.name} at a global batch of "
                f"{global_batch} trains {samples:,} synthetic samples, {need / 2**30:.1f} GiB, "
                f"more than half the {available / 2**30:.1f} GiB of memory available; give "
                + (
                    "fewer --steps"
                    if fewer
                    else "smaller --batches (one step of that batch alone does not fit)"
                )
            )


def check_profile(cfg: Any, drawn: list[tuple[Any, tuple[int, ...]]]) -> None:
    """The given profile, every model section built (a section that reads but cannot be used
    failed when first priced, after the held-out workloads were written), and none of the
    held-out draw measured by it."""
    from pdlsim.prediction.config import resolve_profile

    profile, _ = resolve_profile(cfg.profile)
    for name in profile.models:
        try:
            profile.model(name)
        except KeyError:  # a section no modeler reads (the loader names unknown ones)
            continue
        except UserError as exc:
            raise UserError(f"--profile: {exc}") from None
    check_unseen(
        cfg.profile,
        [RunSpec(f"{w.name}.json", 1, 1, b, heldout=True) for w, bs in drawn for b in bs],
    )
