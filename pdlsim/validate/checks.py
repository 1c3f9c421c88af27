"""What ``pdlsim validate`` checks before any work: one place, called first by
:func:`pdlsim.validate.run.run_validation`, so that every problem it can know up front is one
line before the calibration (ten minutes) or the first launch, never found at the end.

* :func:`check_out`: the report directory and every path the run writes under it (a file
  where a folder goes was a traceback, or a calibration lost); a previous validation there is
  refused, never overwritten.
* :func:`check_counts`: ``repeats``, ``steps`` and ``seed`` within bounds (a seed of hundreds
  of digits named workloads no file system takes, and drew forever).
* :func:`check_models`: every workload trains on CPU ranks and, with "model" in ``parallel``,
  splits layer-wise as ``pdlsim train --parallel model`` wants it (a dropout or a one-neuron
  layer failed the first model-parallel launch, after the calibration).
* :func:`check_fits`: at least one data-parallel mode fits the cores (with none, the run
  calibrated, launched nothing and failed drawing an empty report).
* :func:`check_names`: every workload has a name of its own, so that no two configurations
  share a run folder (the second launch found the first one's records and failed mid-run).
* :func:`check_memory`: every launch's synthetic data fits memory as ``pdlsim train`` wants it
  (a large ``--steps`` was refused by the first launch, after the calibration).
* :func:`check_profile`: a given profile's every model section builds, it measured CPU ranks
  (which every validation trains), and the held-out draw is unseen by it, before the held-out
  workloads are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import check_folder_exists, check_writable
from microbench.nn.sliced import check_splittable
from microbench.threads import available_cores
from microbench.workload import CPU_MODEL_KINDS, load_workload
from pdlsim.validate.plan import RunSpec, check_unseen, draw_heldout

__all__ = [
    "MAX_REPEATS",
    "MAX_SEED",
    "check_before_work",
    "check_counts",
    "check_fits",
    "check_memory",
    "check_models",
    "check_names",
    "check_out",
    "check_profile",
]

# Launches per configuration: each round launches every configuration once (80 or so, minutes
# per round), so 1,000 rounds are weeks; the bound keeps a typo from planning forever.
MAX_REPEATS = 1_000
# The held-out workloads are named <kind>-s<seed>-<i> and their run folders after them: a seed
# of numpy's legacy range keeps every name short (one of hundreds of digits was refused by the
# name check at every draw, and the draw tried again forever).
MAX_SEED = 2**32 - 1
REPORT_FILES = ("validation.csv", "validation.json", "parity.png")
FOLDERS = ("runs", "workloads", "calibration")  # what a validation writes under OUT
PREVIOUS = ("runs", "workloads", "calibration", "speed")  # a non-empty one: a validation was here


def check_before_work(cfg: Any) -> None:
    """Every check of this module on ``cfg`` (a :class:`~pdlsim.validate.plan.ValidateConfig`),
    cheapest first."""
    check_counts(cfg)
    check_models(cfg)
    check_fits(cfg)
    check_out(cfg.out)
    drawn = draw_heldout(cfg)
    check_names(cfg, drawn)
    check_memory(cfg, drawn)
    if cfg.profile is not None:
        check_profile(cfg, drawn)


def check_counts(cfg: Any) -> None:
    """``repeats`` between 1 and :data:`MAX_REPEATS`, ``steps`` at least 2 (a warm-up and a
    timed step), ``seed`` between 0 and :data:`MAX_SEED`."""
    if not 1 <= cfg.repeats <= MAX_REPEATS:
        raise UserError(f"--repeats must be between 1 and {MAX_REPEATS:,}, got {cfg.repeats:,}")
    if cfg.steps < 2:
        raise UserError(f"--steps must be at least 2 (a warm-up step and a timed one), got "
                        f"{cfg.steps}")  # fmt: skip
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and {MAX_SEED:,}, got {cfg.seed:,}; give a "
                        "smaller one (each seed draws its own held-out set)")  # fmt: skip


def check_models(cfg: Any) -> None:
    """Every ``--models`` workload loads and trains on CPU ranks; with "model" in
    ``cfg.parallel``, each splits over every rank count of ``cfg.model_procs`` by the rule
    ``pdlsim train --parallel model`` applies (:func:`microbench.nn.sliced.check_splittable`:
    a chain of the kinds it splits, a dense layer of at least one neuron per rank), so that a
    workload the first model-parallel launch would refuse is one line before the calibration."""
    for model in cfg.models:
        try:
            workload = load_workload(model)
        except UserError as exc:  # which flag named it: the workload's own line is after
            raise UserError(f"--models: {exc}") from None
        workload.require(CPU_MODEL_KINDS, "pdlsim validate")
        if "model" not in cfg.parallel:
            continue
        if not workload.is_chain:
            raise UserError(
                f"--models {model}: a graph is not split layer-wise (--parallel model takes "
                "chains); give --parallel data"
            )
        for procs in cfg.model_procs:
            try:
                check_splittable(workload, procs)
            except UserError as exc:  # its fix names train's flags: say validate's
                reason = str(exc).rsplit("; ", 1)[0]
                raise UserError(
                    f"--models {model} is not split layer-wise over {procs} ranks ({reason}); "
                    "give --parallel data"
                ) from None


def check_fits(cfg: Any) -> None:
    """With "data" in ``cfg.parallel``, at least one of ``cfg.modes`` fits the cores (P x T at
    most the cores): the others are not run, and with none the validation had no data-parallel
    row to measure (it calibrated, launched nothing and failed at its report)."""
    cores = available_cores()
    if "data" in cfg.parallel and all(p * t > cores for p, t in cfg.modes):
        listed = ",".join(f"{p}x{t}" for p, t in cfg.modes)
        raise UserError(
            f"--modes {listed}: no mode fits this machine's {cores} core(s) (P x T at most "
            f"{cores}), so none would run; list at least one that fits, like 1x1"
        )


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
    from pdlsim.train.data import synthetic_overflow
    from pdlsim.validate.measure import TEST_SAMPLES, launch_samples

    cores = available_cores()
    fits = [p for p, t in cfg.modes if p * t <= cores] if "data" in cfg.parallel else []
    ranks = max(fits, default=1)
    batch = max(cfg.batches)
    largest = [(load_workload(m), batch * ranks) for m in cfg.models]
    largest += [(w, max(batches) * ranks) for w, batches in drawn]
    for workload, global_batch in largest:
        samples = launch_samples(cfg.steps, global_batch)
        # every rank draws the training and the test set whole
        overflow = synthetic_overflow(workload, samples + TEST_SAMPLES, ranks)
        if overflow is not None:
            need, available = overflow
            one_step = launch_samples(1, global_batch) + TEST_SAMPLES
            fewer = synthetic_overflow(workload, one_step, ranks) is None
            raise UserError(
                f"--steps {cfg.steps}: a launch of {workload.name} at a global batch of "
                f"{global_batch} draws {samples:,} synthetic samples on each of its {ranks} "
                f"rank(s), {need / 2**30:.1f} GiB with the test sets, "
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
    devices = profile.model("compute").devices  # every validation trains CPU ranks
    if "cpu" not in devices:
        raise UserError(
            f"--profile {cfg.profile}: the profile measured compute on {', '.join(devices)}, "
            "not on CPU ranks, and validate trains CPU ranks; give a profile calibrated on "
            "CPUs, or drop --profile to calibrate here"
        )  # fmt: skip
    check_unseen(
        cfg.profile,
        [RunSpec(f"{w.name}.json", 1, 1, b, heldout=True) for w, bs in drawn for b in bs],
    )
