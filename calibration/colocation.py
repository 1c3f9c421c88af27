"""Co-location: how much slower one rank's training step is while other ranks of its node run
theirs at the same time.

Ranks on one node share memory bandwidth, the last-level cache and the power budget, so the
same step takes longer on each of R busy ranks than on one rank alone. The jitter benchmark
(``microbench jitter``) times one identical step on every rank at once and, in blocks
interleaved with those, on rank 0 alone while the others idle (statistic "alone"), so:

    factor(model, batch, threads, R) = median of every rank's step times at R ranks per node
                                      / median of rank 0's step times alone in the same run

with a bootstrap interval of that ratio of medians (:func:`scipy.stats.bootstrap`, each sample
set resampled on its own). Records without "alone" samples (an older jitter run) are compared
with the run at one rank per node of the same model, batch and thread count instead: measured
minutes apart, that ratio also carries whatever else the machine was doing meanwhile.

:meth:`ColocationModel.factor` answers any (model, threads, R): the measured point where there
is one (the median over batches); between measured R, linear in R from 1 at one rank; above the
largest measured R, the factor at that R (held, not extrapolated: an assumption the consumer
reports); an unmeasured thread count takes the model's points at the measured ones, and an
unmeasured model the median factor of the measured models at that R.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .stats import Interval

__all__ = ["ColocationModel", "ColocationPoint"]

_KEYS = ("model", "batch", "threads", "ranks_per_node")


@dataclass(frozen=True)
class ColocationPoint:
    model: str
    batch: int
    threads: int
    ranks_per_node: int
    factor: float
    factor_interval: Interval
    samples_alone: int
    samples_together: int

    @property
    def label(self) -> str:
        return f"{self.model}-b{self.batch}-t{self.threads}-r{self.ranks_per_node}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["intervals"] = {"factor": out.pop("factor_interval")}
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ColocationPoint:
        rest = {k: v for k, v in doc.items() if k != "intervals"}
        return cls(**rest, factor_interval=Interval.from_dict(doc["intervals"]["factor"]))


def _pooled(rows: pd.DataFrame) -> dict[tuple[str, int, int, int], np.ndarray]:
    """Every record's samples pooled per (model, batch, threads, ranks per node)."""
    out = {}
    if rows.empty:
        return out
    for key, group in rows.groupby([f"params.{k}" for k in _KEYS]):
        model, batch, threads, per_node = key
        values = np.concatenate([np.asarray(s, dtype=float) for s in group["samples"]])
        out[(str(model), int(batch), int(threads), int(per_node))] = values
    return out


def _ratio_of_medians(together: np.ndarray, alone: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(together, axis=axis) / np.median(alone, axis=axis)


class ColocationModel:
    """Step slowdown of R ranks per node against one, per (model, batch, threads)."""

    def __init__(self, n_boot: int = 200, confidence: float = 0.95, seed: int = 0) -> None:
        self.n_boot, self.confidence, self.seed = n_boot, confidence, seed
        self.points_: list[ColocationPoint] = []

    def fit(self, df: pd.DataFrame) -> ColocationModel:
        """From "jitter" measurement records (per-rank rows); no pair of R and 1: no points."""
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "jitter")]
        missing = [f"params.{k}" for k in _KEYS if f"params.{k}" not in rows]
        if rows.empty or missing:
            return self
        statistic = rows.get("params.statistic", pd.Series("per_rank", index=rows.index))
        statistic = statistic.fillna("per_rank")
        pooled = {s: _pooled(rows[statistic == s]) for s in ("per_rank", "alone")}
        rng = np.random.default_rng(self.seed)
        for (model, batch, threads, per_node), together in sorted(pooled["per_rank"].items()):
            alone = pooled["alone"].get((model, batch, threads, per_node))
            if alone is None:
                alone = pooled["per_rank"].get((model, batch, threads, 1))
            if per_node < 2 or alone is None:
                continue
            factor = float(_ratio_of_medians(together, alone))
            interval = Interval(factor, factor, self.confidence)
            if self.n_boot >= 2 and min(len(together), len(alone)) >= 2:
                ci = stats.bootstrap(
                    (together, alone),
                    _ratio_of_medians,
                    n_resamples=self.n_boot,
                    confidence_level=self.confidence,
                    method="percentile",
                    random_state=rng,
                ).confidence_interval
                interval = Interval(float(ci.low), float(ci.high), self.confidence).including(
                    factor
                )
            self.points_.append(
                ColocationPoint(
                    model, batch, threads, per_node, factor, interval, len(alone), len(together)
                )
            )
        return self

    # ------------------------------------------------------------------------ queries
    def factor(self, model: str, threads: int, ranks_per_node: int) -> tuple[float, Interval]:
        """The slowdown at ``ranks_per_node`` (see the module docstring for what is held)."""
        if ranks_per_node <= 1 or not self.points_:
            return 1.0, Interval(1.0, 1.0)
        chosen = (
            [p for p in self.points_ if (p.model, p.threads) == (model, threads)]
            or [p for p in self.points_ if p.model == model]
            or [p for p in self.points_ if p.threads == threads]
            or self.points_
        )
        by_ranks: dict[int, list[ColocationPoint]] = {}
        for p in chosen:
            by_ranks.setdefault(p.ranks_per_node, []).append(p)
        measured = {
            r: (
                float(np.median([p.factor for p in ps])),
                float(np.median([p.factor_interval.low for p in ps])),
                float(np.median([p.factor_interval.high for p in ps])),
            )
            for r, ps in by_ranks.items()
        }
        known = sorted(measured)
        if ranks_per_node >= known[-1]:
            value, low, high = measured[known[-1]]
            return value, Interval(low, high)
        grid = np.array([1, *known], dtype=float)
        columns = np.array([(1.0, 1.0, 1.0), *(measured[r] for r in known)]).T
        value, low, high = (float(np.interp(ranks_per_node, grid, c)) for c in columns)
        return value, Interval(low, high)

    @property
    def max_ranks_per_node(self) -> int:
        return max((p.ranks_per_node for p in self.points_), default=1)

    # ------------------------------------------------------------------------ files
    def quality_dict(self) -> dict[str, Any]:
        widths = [p.factor_interval.high - p.factor_interval.low for p in self.points_]
        return {"n_points": len(self.points_), "max_interval_width": max(widths, default=None)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": {p.label: p.to_dict() for p in self.points_},
            "confidence": self.confidence,
            "held_above_ranks_per_node": self.max_ranks_per_node,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ColocationModel:
        model = cls(confidence=float(doc.get("confidence", 0.95)))
        model.points_ = [ColocationPoint.from_dict(p) for p in doc["points"].values()]
        return model
