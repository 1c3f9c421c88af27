"""Drift: how much the same training step's median moves between measurements minutes apart.

On a shared machine the speed of identical work drifts (other tenants, frequency, memory
placement): a step measured now and the same step measured two minutes later differ by more
than either median's confidence interval. The prediction band must carry that, or a
measurement taken at another moment falls outside it however right the model is.

A calibration run measures the very same step (model, batch, thread count) several times, at
different moments: the compute benchmark's whole step (less its mini-batch gather), the jitter
benchmark's step at one rank, and at more ranks the step of rank 0 alone (:mod:`calibration.
colocation`). For each model with at least two of these medians, their log-deviations from the
model's mean log-median are pooled; the drift is the standard deviation of those deviations
(degrees of freedom: measurements minus models), a lognormal sigma, with a chi-square 95%
interval. The simulator's band draws one factor exp(N(0, sigma)) per sample for the host's
compute (:meth:`pdlsim.costmodel.ProfileCostModel.perturbed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from microbench.network_ops import STEP_WITH_GATHER

from .stats import Interval

__all__ = ["DriftModel"]


class DriftModel:
    """Lognormal sigma of repeated medians of the same step (see the module docstring)."""

    def __init__(self, confidence: float = 0.95) -> None:
        self.confidence = confidence
        self.sigma_ = 0.0
        self.interval_ = Interval(0.0, 0.0, confidence)
        self.medians_: dict[str, dict[str, float]] = {}

    def fit(self, df: pd.DataFrame) -> DriftModel:
        """From compute ("op" step and data rows) and jitter (per-rank at 1 rank, "alone")
        measurement records; fewer than two medians of any one step: sigma 0."""
        rows = df[df["type"] == "measurement"]
        compute = rows[(rows["benchmark"] == "compute") & (rows["name"] == "op")]
        jitter = rows[rows["benchmark"] == "jitter"]
        gathers = {
            _key(r): float(np.median(r["samples"]))
            for _, r in compute.iterrows()
            if r.get("params.phase") == "data"
        }
        for _, r in compute.iterrows():
            if r.get("params.phase") != "step" or r.get("params.device") != "cpu":
                continue
            median = float(np.median(r["samples"]))
            if r.get("params.op") == STEP_WITH_GATHER:
                median -= gathers.get(_key(r), 0.0)
            self._add(_key(r), "compute step", median)
        for _, r in jitter.iterrows():
            statistic = r.get("params.statistic")
            alone = statistic == "alone"
            if not alone and not (statistic == "per_rank" and r.get("params.ranks") == 1):
                continue
            where = f"jitter {'alone at ' + str(int(r['params.ranks'])) if alone else 'at 1'}"
            self._add(_key(r), where, float(np.median(r["samples"])))
        deviations = [
            np.log(list(m.values())) - np.mean(np.log(list(m.values())))
            for m in self.medians_.values()
            if len(m) >= 2
        ]
        dof = sum(len(d) for d in deviations) - len(deviations)
        if dof >= 1:
            ss = float(sum(np.sum(d**2) for d in deviations))
            self.sigma_ = float(np.sqrt(ss / dof))
            tail = (1 - self.confidence) / 2
            low = np.sqrt(ss / stats.chi2.ppf(1 - tail, dof))
            high = np.sqrt(ss / stats.chi2.ppf(tail, dof))
            self.interval_ = Interval(float(low), float(high), self.confidence)
        return self

    def _add(self, key: str, where: str, median_s: float) -> None:
        if median_s > 0:
            self.medians_.setdefault(key, {})[where] = median_s

    def quality_dict(self) -> dict[str, Any]:
        return {"n_steps": sum(len(m) >= 2 for m in self.medians_.values())}

    def to_dict(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma_,
            "intervals": {"sigma": self.interval_.to_dict()},
            "medians_s": self.medians_,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DriftModel:
        model = cls()
        model.sigma_ = float(doc["sigma"])
        model.interval_ = Interval.from_dict(doc["intervals"]["sigma"])
        model.medians_ = {k: dict(v) for k, v in doc.get("medians_s", {}).items()}
        return model


def _key(row: pd.Series) -> str:
    return f"{row['params.model']}-b{int(row['params.batch'])}-t{int(row['params.threads'])}"
