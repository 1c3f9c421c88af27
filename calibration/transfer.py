"""Host <-> device copies: a Hockney alpha-beta curve per direction and host memory kind.

Each of H2D/D2H from pinned/pageable memory gets its own :class:`calibration.hockney.HockneyModel`
fitted to ``python -m microbench copies`` records, regimes found from the data as for the
collectives: a pinned copy is often one line (DMA setup plus the link's bandwidth), while a
pageable one is staged through a driver buffer in chunks and may bend where the staging
changes. Above the largest measured size the last regime applies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .hockney import HockneyModel
from .readers import copy_points
from .stats import FitError

__all__ = ["DIRECTIONS", "TransferModel"]

DIRECTIONS = ("h2d", "d2h")


def _kind(pinned: bool) -> str:
    return "pinned" if pinned else "pageable"


class TransferModel:
    """Copy time by direction ("h2d"/"d2h") and host memory (pinned or pageable).

    ``fit(df)`` takes records or :func:`calibration.readers.copy_points` and returns self;
    fitted: ``curves_`` (``(direction, pinned) -> HockneyModel``).
    """

    def __init__(self, max_regimes: int = 4, n_boot: int = 200, seed: int = 0) -> None:
        self.max_regimes, self.n_boot, self.seed = max_regimes, n_boot, seed

    def fit(self, df: pd.DataFrame) -> TransferModel:
        points = copy_points(df)
        self.curves_: dict[tuple[str, bool], HockneyModel] = {}
        for (direction, pinned), group in points.groupby(["direction", "pinned"]):
            if direction not in DIRECTIONS:
                raise FitError(f"copies: unknown direction {direction!r} (expected h2d or d2h)")
            model = HockneyModel(self.max_regimes, n_boot=self.n_boot, seed=self.seed)
            try:
                model.fit(group["bytes"], group["median_s"], list(group["samples"]))
            except FitError as exc:
                raise FitError(f"copies {direction} {_kind(bool(pinned))}: {exc}") from None
            self.curves_[(str(direction), bool(pinned))] = model
        return self

    def predict(self, direction: str, nbytes: Any, pinned: bool = True) -> np.ndarray:
        """Seconds to copy ``nbytes`` in ``direction`` from pinned or pageable host memory."""
        key = (direction, bool(pinned))
        if key not in self.curves_:
            known = ", ".join(f"{d} {_kind(p)}" for d, p in sorted(self.curves_))
            raise KeyError(f"no {direction} {_kind(pinned)} copies were measured (have: {known})")
        return self.curves_[key].predict(nbytes)

    def quality_dict(self) -> dict[str, Any]:
        return {f"{d}_{_kind(p)}": m.quality_.to_dict() for (d, p), m in self.curves_.items()}

    def to_dict(self) -> dict[str, Any]:
        """``{"model": "transfer", "directions": {"h2d": {"pinned": <hockney>, ...}, ...}}``."""
        directions: dict[str, dict[str, Any]] = {}
        for (direction, pinned), model in sorted(self.curves_.items()):
            directions.setdefault(direction, {})[_kind(pinned)] = model.to_dict()
        return {"model": "transfer", "directions": directions}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransferModel:
        model = cls()
        model.curves_ = {}
        for direction, kinds in data["directions"].items():
            for kind, curve in kinds.items():
                if kind not in ("pinned", "pageable"):
                    raise ValueError(f"transfer.directions.{direction}: unknown kind {kind!r}")
                model.curves_[(direction, kind == "pinned")] = HockneyModel.from_dict(curve)
        return model
