"""Gradient compression: a Hockney line ``a + b x bytes`` per method and phase.

Fitted to ``python -m microbench compression`` records: for each method (``fp16``, ``topk``)
and phase (``compress``, ``decompress``; top-k also ``scatter``, one further rank's
scatter-add), a :class:`calibration.hockney.HockneyModel` in the dense float32 gradient's bytes,
with regimes found from the data (a gradient that fits in the caches converts faster per byte
than one that streams from memory), bootstrap intervals from the raw samples and fit quality.
Top-k is measured at one density (``density_``, 1% by default); the cost model scales what
depends on k from there (:meth:`pdlsim.costmodel.model.ProfileCostModel.compression_time`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .hockney import HockneyModel
from .readers import POINT_COLUMNS, _measurements, _pool, is_points_frame
from .stats import FitError

__all__ = ["CompressionModel", "compression_points"]


def compression_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, phase, density, bytes) of ``python -m microbench compression``:
    ``method``, ``phase``, ``density`` (NaN for fp16), ``bytes``, ``median_s``, ``n_samples``,
    ``samples``, ``sources``; repeated points pool their samples."""
    if is_points_frame(df):
        return df
    rows = _measurements(
        df,
        "compression",
        ("params.method", "params.phase", "params.bytes", "samples"),
        "run `python -m microbench compression`",
    )
    density = rows.get("params.density")
    frame = pd.DataFrame(
        {
            "method": rows["params.method"].astype(str),
            "phase": rows["params.phase"].astype(str),
            "density": -1.0 if density is None else pd.to_numeric(density).fillna(-1.0),
            "bytes": rows["params.bytes"].astype(int),
            "samples": rows["samples"],
            "source": rows["source"] if "source" in rows.columns else "",
        }
    )
    points = _pool(frame, ["method", "phase", "density", "bytes"])
    points["density"] = points["density"].where(points["density"] >= 0, np.nan)
    columns = ["method", "phase", "density", "bytes", *POINT_COLUMNS, "sources"]
    return points[columns].sort_values(["method", "phase", "bytes"], ignore_index=True)


class CompressionModel:
    """Seconds to compress or expand a float32 gradient, by method and phase.

    ``fit(df)`` takes records or :func:`compression_points` and returns self; fitted:
    ``curves_`` (``(method, phase) -> HockneyModel``) and ``density_`` (``method -> the
    top-k density measured``; one density per method: several measured is a FitError).
    """

    def __init__(self, max_regimes: int = 3, n_boot: int = 200, seed: int = 0) -> None:
        self.max_regimes, self.n_boot, self.seed = max_regimes, n_boot, seed

    def fit(self, df: pd.DataFrame) -> CompressionModel:
        points = compression_points(df)
        self.curves_: dict[tuple[str, str], HockneyModel] = {}
        self.density_: dict[str, float] = {}
        for method, rows in points.groupby("method"):
            densities = rows["density"].dropna().unique()
            if len(densities) > 1:
                raise FitError(
                    f"compression {method}: measured at densities {sorted(densities)}; fit one "
                    "density at a time (one run directory per density)"
                )
            if len(densities) == 1:
                self.density_[str(method)] = float(densities[0])
            for phase, group in rows.groupby("phase"):
                model = HockneyModel(self.max_regimes, n_boot=self.n_boot, seed=self.seed)
                try:
                    model.fit(group["bytes"], group["median_s"], list(group["samples"]))
                except FitError as exc:
                    raise FitError(f"compression {method} {phase}: {exc}") from None
                self.curves_[(str(method), str(phase))] = model
        return self

    @property
    def methods(self) -> list[str]:
        return sorted({m for m, _ in self.curves_})

    def predict(self, method: str, phase: str, nbytes: Any) -> np.ndarray:
        """Seconds for ``phase`` of ``method`` on a gradient of ``nbytes`` float32 bytes."""
        if (method, phase) not in self.curves_:
            known = ", ".join(f"{m} {p}" for m, p in sorted(self.curves_))
            raise KeyError(f"no {method} {phase} was measured (have: {known})")
        return self.curves_[(method, phase)].predict(nbytes)

    def quality_dict(self) -> dict[str, Any]:
        return {f"{m}_{p}": model.quality_.to_dict() for (m, p), model in self.curves_.items()}

    def to_dict(self) -> dict[str, Any]:
        """``{"model": "compression", "methods": {"fp16": {"compress": <hockney>, ...}, ...},
        "density": {"topk": 0.01}}``."""
        methods: dict[str, dict[str, Any]] = {}
        for (method, phase), model in sorted(self.curves_.items()):
            methods.setdefault(method, {})[phase] = model.to_dict()
        return {"model": "compression", "methods": methods, "density": dict(self.density_)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompressionModel:
        model = cls()
        model.curves_ = {
            (method, phase): HockneyModel.from_dict(curve)
            for method, phases in data["methods"].items()
            for phase, curve in phases.items()
        }
        model.density_ = {k: float(v) for k, v in (data.get("density") or {}).items()}
        for method, value in model.density_.items():
            if not 0.0 < value <= 1.0:
                raise ValueError(f"compression.density.{method}: must be in (0, 1], got {value}")
        return model
