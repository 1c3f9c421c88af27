"""Jitter per workload: one :class:`~calibration.jitter.JitterModel` for each model the jitter
benchmark ran.

Relative step-time jitter is not a property of the machine alone: a short step (a fraction of a
millisecond) is moved by an interrupt or a scheduler tick by tens of percent, a long one (tens
of milliseconds) by a few. Pooled, the short steps' tail sets the expected wait for the slowest
rank of every workload, several times what a long step's own records give (evidence:
docs/evidence.md, "Jitter"). So each workload gets its own fit, from its own records (every rank
count and thread count of that model pooled); the simulator takes the workload's fit when there
is one and the pooled ``jitter`` section otherwise.

``to_dict()`` (``models.jitter_models``): ``{"models": {name: JitterModel.to_dict()}}``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .jitter import JitterModel

__all__ = ["JitterModels"]


class JitterModels:
    """A :class:`JitterModel` per workload name (``params.model`` of the jitter records)."""

    def __init__(self, n_boot: int = 200, seed: int = 0) -> None:
        self.n_boot, self.seed = n_boot, seed
        self.models_: dict[str, JitterModel] = {}

    def fit(self, df: pd.DataFrame) -> JitterModels:
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "jitter")]
        if rows.empty or "params.model" not in rows:
            return self
        for name, group in rows.groupby(rows["params.model"].astype(str)):
            self.models_[name] = JitterModel(n_boot=self.n_boot, seed=self.seed).fit(group)
        return self

    def add_moments(self, df: pd.DataFrame) -> JitterModels:
        """Each workload's jitter runs of ``df`` added to its model's moments
        (:meth:`JitterModel.add_moments`); workloads without a model are left out."""
        if "params.model" in df:
            for name, model in self.models_.items():
                model.add_moments(df[df["params.model"].astype(str) == name])
        return self

    def get(self, name: str | None) -> JitterModel | None:
        return self.models_.get(name) if name is not None else None

    def quality_dict(self) -> dict[str, Any]:
        return {name: m.quality_dict() for name, m in self.models_.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"models": {name: m.to_dict() for name, m in self.models_.items()}}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> JitterModels:
        out = cls()
        out.models_ = {name: JitterModel.from_dict(m) for name, m in doc["models"].items()}
        return out
