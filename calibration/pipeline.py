"""From a run directory of microbench records to a fitted profile: every modeler in one call.

Each modeler reads the records of its own benchmark from one DataFrame. A benchmark that was
not run (copies on a machine without a GPU) leaves its model out (null in the profile); one
that was run but cannot be fitted is an error naming the benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from calibration.colocation import ColocationModel
from calibration.communication import CollectiveModels
from calibration.compression import CompressionModel
from calibration.compute import ComputeModel
from calibration.drift import DriftModel
from calibration.jitter import JitterModel
from calibration.kernels import KernelModel
from calibration.overlap import OverlapModel
from calibration.profile import Profile, read_sources
from calibration.profile_checks import NULLABLE_MODELS, REQUIRED_MODEL_KEYS
from calibration.record_checks import (
    MACHINE_IDENTITY,
    check_measurements,
    check_no_copies,
    check_one_machine,
    check_sweeps_ended,
)
from calibration.storage import StorageModel
from calibration.transfer import TransferModel
from microbench.errors import UserError
from microbench.records import RecordsError, load_dataframe

# profile section -> (benchmark whose records it needs, "a+b" for several: the section is fitted
# where the first one's records are; modeler factory). A section the profile cannot be without
# (the loader's REQUIRED_MODEL_KEYS, less the nullable) is an error when its records are missing,
# named by benchmark; any other is left out (null).
_SECTIONS: dict[str, tuple[str, Callable[[int, int], Any]]] = {
    "collectives": ("collectives", lambda n, s: CollectiveModels(n_boot=n, seed=s)),
    "compute": ("compute", lambda n, s: ComputeModel(n_boot=n, seed=s)),
    "transfer": ("copies", lambda n, s: TransferModel(n_boot=n, seed=s)),
    "jitter": ("jitter", lambda n, s: JitterModel(n_boot=n, seed=s)),
    "overlap": ("interference", lambda n, s: OverlapModel(n_boot=n, seed=s)),
    "colocation": ("jitter+nodefill", lambda n, s: ColocationModel(n_boot=n, seed=s)),
    "drift": ("compute+jitter+speed", lambda n, s: DriftModel()),
    "compression": ("compression", lambda n, s: CompressionModel(n_boot=n, seed=s)),
    "storage": ("storage", lambda n, s: StorageModel(n_boot=n, seed=s)),
    "kernels": ("kernels+speed", lambda n, s: KernelModel()),
}


def load_measurements(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Every "measurement" record under ``run_dir``; a one-line UserError if there are none."""
    path = Path(run_dir)
    try:
        frame = load_dataframe(path, type="measurement")
    except FileNotFoundError as exc:
        raise UserError(f"cannot read records from {path}: {exc}") from None
    except RecordsError as exc:  # a damaged or foreign file among the run's: say the way on
        raise UserError(
            f"cannot read records from {path}: {exc}; move that file out of the directory, "
            "or re-run its benchmark"
        ) from None
    if frame.empty:
        raise UserError(f"{path} holds no measurement records; run 'pdlsim bench' first")
    check_measurements(frame, str(path))
    check_one_machine(frame, str(path))
    root = path if path.is_dir() else path.parent  # sources are relative to it
    files = [root / source for source in frame["source"].unique()]
    check_sweeps_ended(files, root)
    check_no_copies(files, root)
    return frame


def with_kernel_sweeps(
    frame: pd.DataFrame, run_dirs: Sequence[str | os.PathLike[str]]
) -> pd.DataFrame:
    """``frame`` with the kernel sweep records of each of ``run_dirs`` added: sweeps of the same
    machine taken at other moments, so that the kernel model's step terms and band see the
    machine's state move between them (:mod:`calibration.kernels`). A one-line UserError for a
    run without a kernel sweep or one from another kind of machine (the records' CPU model,
    cores or architecture differ, as ``--from`` compares its own records; the host name may:
    a cluster's jobs land on other nodes of one partition)."""
    parts = [frame]
    mine = {key: _identity(frame, key) for key in MACHINE_IDENTITY}
    for run_dir in run_dirs:
        other = load_measurements(run_dir)
        sweep = other[other["benchmark"] == "kernels"]
        if sweep.empty:
            raise UserError(f"--kernels-from {run_dir}: no kernel sweep records there")
        for key, value in mine.items():
            theirs = _identity(sweep, key)
            if theirs != value:
                raise UserError(
                    f"--kernels-from {run_dir}: measured on another machine ({key[8:]} "
                    f"{theirs} against {value}); pool sweeps of one machine only"
                )
        parts.append(sweep.assign(source=[f"{run_dir}/{s}" for s in sweep["source"]]))
    return pd.concat(parts, ignore_index=True, sort=False) if len(parts) > 1 else frame


def _identity(frame: pd.DataFrame, key: str) -> str:
    values = frame[key].dropna().astype(str).unique() if key in frame else ()
    return ",".join(sorted(values)) or "unknown"


def kernel_sweep_files(run_dirs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The records files of ``run_dirs`` that hold their kernel sweeps."""
    return [f for d in run_dirs for f in sorted(Path(d).rglob("kernels*.jsonl"))]


def fit_profile(
    run_dir: str | os.PathLike[str],
    n_boot: int = 200,
    seed: int = 0,
    kernel_runs: Sequence[str | os.PathLike[str]] = (),
    frame: pd.DataFrame | None = None,
) -> tuple[Profile, dict[str, Any]]:
    """The profile fitted to the records under ``run_dir`` (``frame``: those records, as
    :func:`load_measurements` read them, when the caller has them already), and the kernel
    sweeps of ``kernel_runs`` (:func:`with_kernel_sweeps`), and the fitted model objects."""
    if frame is None:
        frame = load_measurements(run_dir)
    frame = with_kernel_sweeps(frame, kernel_runs)
    # the headers read (and checked) before the fits, so that a damaged one is named at once
    machine, sources = read_sources([run_dir, *kernel_sweep_files(kernel_runs)])
    models: dict[str, Any] = {}
    for section, (benchmark, make) in _SECTIONS.items():
        names = benchmark.split("+")
        rows = frame[frame["benchmark"].isin(names)]
        if not (rows["benchmark"] == names[0]).any():
            if section in REQUIRED_MODEL_KEYS and section not in NULLABLE_MODELS:
                raise UserError(
                    f"{run_dir} has no {benchmark} records, which the {section} model needs; "
                    f"run 'pdlsim bench' (or 'python -m microbench {benchmark}') into it"
                )
            models[section] = None
            continue
        try:
            models[section] = make(n_boot, seed).fit(rows)
        except UserError as exc:
            raise UserError(f"fitting the {section} model: {exc}") from None
        except KeyError as exc:  # a column the fitter reads that no record of it has
            field = exc.args[0] if exc.args else None
            if not (isinstance(field, str) and field.startswith("params.") and field not in rows):
                raise
            raise UserError(
                f"fitting the {section} model: no {benchmark} record holds '{field}', which "
                f"it reads (records edited, or written by another tool); re-run 'python -m "
                f"microbench {names[0]}'"
            ) from None
    return Profile.from_models(models, machine, sources), models
