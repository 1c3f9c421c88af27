"""From a run directory of microbench records to a fitted profile: every modeler in one call.

Each modeler reads the records of its own benchmark from one DataFrame. A benchmark that was
not run (copies on a machine without a GPU) leaves its model out (null in the profile); one
that was run but cannot be fitted is an error naming the benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
from calibration.storage import StorageModel
from calibration.transfer import TransferModel
from microbench.errors import UserError
from microbench.records import RecordsError, load_dataframe

# profile section -> (benchmark whose records it needs, "a+b" for several: the section is fitted
# where the first one's records are; modeler factory, required)
_SECTIONS: dict[str, tuple[str, Callable[[int, int], Any], bool]] = {
    "collectives": ("collectives", lambda n, s: CollectiveModels(n_boot=n, seed=s), True),
    "compute": ("compute", lambda n, s: ComputeModel(n_boot=n, seed=s), True),
    "transfer": ("copies", lambda n, s: TransferModel(n_boot=n, seed=s), False),
    "jitter": ("jitter", lambda n, s: JitterModel(n_boot=n, seed=s), True),
    "overlap": ("interference", lambda n, s: OverlapModel(n_boot=n, seed=s), False),
    "colocation": ("jitter", lambda n, s: ColocationModel(n_boot=n, seed=s), False),
    "drift": ("compute+jitter+speed", lambda n, s: DriftModel(), False),
    "compression": ("compression", lambda n, s: CompressionModel(n_boot=n, seed=s), False),
    "storage": ("storage", lambda n, s: StorageModel(n_boot=n, seed=s), False),
    "kernels": ("kernels+speed", lambda n, s: KernelModel(), False),
}


def load_measurements(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Every "measurement" record under ``run_dir``; a one-line UserError if there are none."""
    path = Path(run_dir)
    try:
        frame = load_dataframe(path, type="measurement")
    except (FileNotFoundError, RecordsError) as exc:
        raise UserError(f"cannot read records from {path}: {exc}") from None
    if frame.empty:
        raise UserError(f"{path} holds no measurement records; run 'pdlsim bench' first")
    return frame


def fit_profile(
    run_dir: str | os.PathLike[str], n_boot: int = 200, seed: int = 0
) -> tuple[Profile, dict[str, Any]]:
    """The profile fitted to the records under ``run_dir``, and the fitted model objects."""
    frame = load_measurements(run_dir)
    models: dict[str, Any] = {}
    for section, (benchmark, make, required) in _SECTIONS.items():
        names = benchmark.split("+")
        rows = frame[frame["benchmark"].isin(names)]
        if not (rows["benchmark"] == names[0]).any():
            if required:
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
    machine, sources = read_sources([run_dir])
    return Profile.from_models(models, machine, sources), models
