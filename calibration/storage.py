"""Checkpoint storage: ``time = latency + bytes / write bandwidth`` for an atomic, durable write.

Fitted to ``python -m microbench storage`` records (temporary file, write, fsync, rename,
directory fsync: what ``pdlsim train`` does per checkpoint) with the Hockney alpha-beta fit
(:class:`calibration.hockney.HockneyModel`): alpha is the latency (file creation, two fsyncs,
the rename), 1/beta the write bandwidth. Regimes are found from the data, as for the copies:
small files may be dominated by the fsyncs' fixed cost and a device's write cache, large ones
by its sustained bandwidth; with one line the fit keeps one. Intervals come from the bootstrap
over the raw samples, fit quality from leave-one-out. :meth:`StorageModel.cost` gives the
latency and bandwidth of the regime that covers a file size, which is what
:mod:`pdlsim.prediction.reliability` prices a checkpoint with.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .hockney import HockneyModel
from .readers import POINT_COLUMNS, _measurements, _pool, is_points_frame
from .stats import FitError

__all__ = ["StorageModel", "storage_points"]


def storage_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per file size of ``python -m microbench storage``: ``bytes``, ``median_s``,
    ``n_samples``, ``samples``, ``sources``; repeated sizes pool their samples."""
    if is_points_frame(df):
        return df
    rows = _measurements(
        df,
        "storage",
        ("params.bytes", "samples"),
        "run `python -m microbench storage` or `pdlsim bench`",
    )
    frame = pd.DataFrame(
        {
            "bytes": rows["params.bytes"].astype(int),
            "samples": rows["samples"],
            "source": rows["source"] if "source" in rows.columns else "",
        }
    )
    points = _pool(frame, ["bytes"])
    return points[["bytes", *POINT_COLUMNS, "sources"]].sort_values("bytes", ignore_index=True)


def _filesystems(df: pd.DataFrame) -> list[dict[str, str]]:
    """The distinct ``params.filesystem`` entries of the records (type and mount point)."""
    columns = ["params.filesystem.type", "params.filesystem.mount_point"]
    if not all(c in df.columns for c in columns):
        return []
    pairs = {(str(k), str(m)) for k, m in df[columns].dropna().itertuples(index=False)}
    return [{"type": kind, "mount_point": mount} for kind, mount in sorted(pairs)]


class StorageModel:
    """Seconds to write one checkpoint file of a given size, atomically and durably.

    ``fit(df)`` takes records or :func:`storage_points` and returns self; fitted: ``curve_``
    (a :class:`~calibration.hockney.HockneyModel` in the file's bytes) and ``filesystems_``
    (the file systems measured, from the records; empty when they do not say).
    """

    def __init__(self, max_regimes: int = 3, n_boot: int = 200, seed: int = 0) -> None:
        self.max_regimes, self.n_boot, self.seed = max_regimes, n_boot, seed

    def fit(self, df: pd.DataFrame) -> StorageModel:
        points = storage_points(df)
        model = HockneyModel(self.max_regimes, n_boot=self.n_boot, seed=self.seed)
        try:
            model.fit(points["bytes"], points["median_s"], list(points["samples"]))
        except FitError as exc:
            raise FitError(f"storage: {exc}") from None
        self.curve_ = model
        self.filesystems_ = [] if is_points_frame(df) else _filesystems(df)
        return self

    def predict(self, nbytes: Any) -> np.ndarray:
        """Seconds to write files of ``nbytes`` (array in, array out)."""
        return self.curve_.predict(nbytes)

    @property
    def latency_s(self) -> float:
        """The fixed cost of one write: the intercept of the smallest files' regime (a later
        regime's intercept is where its line meets zero bytes, not a latency)."""
        return self.curve_.regimes_[0].alpha_s

    def cost(self, nbytes: float) -> tuple[float, float]:
        """``(latency_s, write_bytes_per_s)`` of the regime covering ``nbytes``; the bandwidth
        is inf where that regime's fitted beta is 0 (its time does not grow with size)."""
        regime = self.curve_.regime_of(nbytes)
        beta = regime.beta_s_per_byte
        return regime.alpha_s, (math.inf if beta == 0 else 1.0 / beta)

    def quality_dict(self) -> dict[str, Any]:
        return {"atomic_write": self.curve_.quality_.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """``{"model": "storage", "operation": "atomic_write", "write": <hockney>,
        "filesystems": [{"type", "mount_point"}]}``."""
        return {
            "model": "storage",
            "operation": "atomic_write: temporary file, write, fsync, rename, directory fsync",
            "write": self.curve_.to_dict(),
            "filesystems": list(self.filesystems_),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StorageModel:
        model = cls()
        model.curve_ = HockneyModel.from_dict(data["write"])
        model.filesystems_ = [dict(f) for f in data.get("filesystems") or ()]
        return model
