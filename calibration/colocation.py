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
unmeasured model the median factor of the measured models at that R. Where the calibration
also ran the node-fill benchmark (:mod:`calibration.nodefill`), the factor above the largest
measured R is carried on by the node's own slowdown instead of held:

    factor(R) = factor(R_max) * max(1, S(R) / S(R_max)),

the interval likewise from the kernels' range of S(R) (more busy cores never speed a core up,
so a ratio below one, a noisy level, carries nothing). The node fill's stragglers, the slowest
process over the median one, are carried the same way (:meth:`ColocationModel.straggler`): the
factor above is every rank's, the straggler one rank's more, which the others wait for.

A **span** (:meth:`ColocationModel.add_moments`: ``pdlsim validate``'s 2-rank jitter checks
between its training launches, one moment each) is the stretch of time the predictions are for.
A point with at least :data:`~calibration.drift.MIN_MOMENTS` span moments takes its factor from
those alone: the median over moments of each moment's ratio of medians, with a bootstrap
interval over the moments. Each moment's ratio is of blocks interleaved within seconds, so it is
free of the speed level that moment caught. A calibration's two minutes can see factors a few
percent away from the hour after them, and every 2-rank row moves with them (evidence:
docs/evidence.md, "Co-location").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from .drift import MIN_MOMENTS
from .nodefill import NodeFill, fit_node_fill
from .profile_checks import FieldError, whole_count
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
    span_moments: int = 0  # moments of a span the factor was taken from; 0: the calibration's

    @property
    def label(self) -> str:
        return f"{self.model}-b{self.batch}-t{self.threads}-r{self.ranks_per_node}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["intervals"] = {"factor": out.pop("factor_interval")}
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ColocationPoint:
        """The point :meth:`to_dict` wrote; :class:`FieldError` for a count a hand edit broke
        (ranks per node below the two a co-location factor compares with one, a batch or
        thread count below one), which :meth:`ColocationModel.factor` would else take as the
        measured ranks per node and silently interpolate or carry from."""
        for key, least in (("batch", 1), ("threads", 1), ("ranks_per_node", 2)):
            whole_count(key, doc.get(key), least)
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


class _Moment(NamedTuple):
    ratio: float  # median together / median alone, within the moment
    samples_alone: int
    samples_together: int


def _moment_ratios(rows: pd.DataFrame) -> dict[tuple[str, int, int, int], list[_Moment]]:
    """{(model, batch, threads, ranks per node): one :class:`_Moment` per moment} of the jitter
    rows with a ``params.moment`` and both statistics."""
    if "params.moment" not in rows:
        return {}
    rows = rows[rows["params.moment"].notna()]
    statistic = rows.get("params.statistic", pd.Series("per_rank", index=rows.index))
    statistic = statistic.fillna("per_rank")
    out: dict[tuple[str, int, int, int], list[_Moment]] = {}
    for _, moment in rows.groupby(rows["params.moment"].astype(str)):
        alone = _pooled(moment[statistic.loc[moment.index] == "alone"])
        for key, together in _pooled(moment[statistic.loc[moment.index] == "per_rank"]).items():
            if key[3] >= 2 and key in alone:
                ratio = float(_ratio_of_medians(together, alone[key]))
                out.setdefault(key, []).append(_Moment(ratio, len(alone[key]), len(together)))
    return out


class ColocationModel:
    """Step slowdown of R ranks per node against one, per (model, batch, threads)."""

    def __init__(self, n_boot: int = 200, confidence: float = 0.95, seed: int = 0) -> None:
        self.n_boot, self.confidence, self.seed = n_boot, confidence, seed
        self.points_: list[ColocationPoint] = []
        self.node_fill_: NodeFill | None = None

    def fit(self, df: pd.DataFrame) -> ColocationModel:
        """From "jitter" measurement records (per-rank rows; no pair of R and 1: no points)
        and "nodefill" records where there are some."""
        self.node_fill_ = fit_node_fill(df)
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
            interval = self._interval((together, alone), _ratio_of_medians, factor, rng)
            self.points_.append(
                ColocationPoint(
                    model, batch, threads, per_node, factor, interval, len(alone), len(together)
                )
            )
        return self

    def add_moments(self, df: pd.DataFrame) -> ColocationModel:
        """Take each point with at least ``MIN_MOMENTS`` moments among the jitter runs of
        ``df`` (a span's, each labelled by ``params.moment``) from those moments alone (the
        module docstring); points with fewer keep the calibration's factor."""
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "jitter")]
        if rows.empty or any(f"params.{k}" not in rows for k in _KEYS):
            return self
        rng = np.random.default_rng(self.seed)
        points = {(p.model, p.batch, p.threads, p.ranks_per_node): p for p in self.points_}
        for key, moments in sorted(_moment_ratios(rows).items()):
            if len(moments) < MIN_MOMENTS:
                continue
            ratios = np.array([m.ratio for m in moments])
            factor = float(np.median(ratios))
            interval = self._interval((ratios,), np.median, factor, rng)
            alone = sum(m.samples_alone for m in moments)
            together = sum(m.samples_together for m in moments)
            points[key] = ColocationPoint(*key, factor, interval, alone, together, len(moments))
        self.points_ = list(points.values())
        return self

    def _interval(
        self, samples: tuple[np.ndarray, ...], statistic: Any, factor: float, rng: Any
    ) -> Interval:
        """A percentile bootstrap interval of ``statistic`` (each sample set resampled on its
        own) that includes ``factor``; the point itself where there is nothing to resample."""
        if self.n_boot < 2 or min(len(x) for x in samples) < 2 or not any(map(np.ptp, samples)):
            return Interval(factor, factor, self.confidence)
        ci = stats.bootstrap(
            samples,
            statistic,
            n_resamples=self.n_boot,
            confidence_level=self.confidence,
            method="percentile",
            random_state=rng,
        ).confidence_interval
        return Interval(float(ci.low), float(ci.high), self.confidence).including(factor)

    # ------------------------------------------------------------------------ queries
    def factor(self, model: str, threads: int, ranks_per_node: int) -> tuple[float, Interval]:
        """The slowdown at ``ranks_per_node`` (see the module docstring for what is held)."""
        if ranks_per_node <= 1 or not self.points_:
            return 1.0, Interval(1.0, 1.0)
        by_ranks: dict[int, list[ColocationPoint]] = {}
        for p in self._chosen(model, threads):
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
            carried = self.carried_by_node_fill(ranks_per_node)
            if carried is None:
                return value, Interval(low, high)
            ratio, ratio_low, ratio_high = carried
            return value * ratio, Interval(low * ratio_low, high * ratio_high)
        grid = np.array([1, *known], dtype=float)
        columns = np.array([(1.0, 1.0, 1.0), *(measured[r] for r in known)]).T
        value, low, high = (float(np.interp(ranks_per_node, grid, c)) for c in columns)
        return value, Interval(low, high)

    def carried_by_node_fill(self, ranks_per_node: int) -> tuple[float, float, float] | None:
        """``(ratio, low, high)`` by which the factor at the largest measured ranks per node
        is carried to ``ranks_per_node`` above it (module docstring); None where nothing is
        carried: no node fill measured, none measured above those ranks, or not above them."""
        fill = self.node_fill_
        return None if fill is None else self._carried(fill.slowdown, ranks_per_node)

    def straggler(self, ranks_per_node: int) -> tuple[float, float, float] | None:
        """``(ratio, low, high)``: how many times slower than the others the slowest of
        ``ranks_per_node`` ranks runs, above the largest measured ranks per node: the node
        fill's stragglers carried as its slowdown is, ``max(1, T(R) / T(R_max))``; None where
        nothing is carried (as :meth:`carried_by_node_fill`, or a node fill without them)."""
        fill = self.node_fill_
        if fill is None or fill.stragglers is None:
            return None
        return self._carried(fill.straggler, ranks_per_node)  # type: ignore[arg-type]

    def _carried(
        self, series: Callable[[int], tuple[float, float, float]], ranks_per_node: int
    ) -> tuple[float, float, float] | None:
        """A node-fill ``series`` at ``ranks_per_node`` over its value at the largest ranks per
        node measured here, at least 1 (more busy cores never speed a core up); None at or
        below those ranks, or where the fill measured nothing above them (a 2-core node)."""
        held = self.max_ranks_per_node
        fill = self.node_fill_
        if fill is None or ranks_per_node <= held or fill.levels[-1] <= held:
            return None
        base, _, _ = series(held)
        value, low, high = series(ranks_per_node)
        ratio = max(1.0, value / base)
        return ratio, min(ratio, max(1.0, low / base)), max(ratio, high / base)

    def span_moments(self, model: str, threads: int) -> int:
        """The span moments behind :meth:`factor`'s points for ``model`` and ``threads`` (the
        most of any); 0: the calibration's."""
        return max((p.span_moments for p in self._chosen(model, threads)), default=0)

    def _chosen(self, model: str, threads: int) -> list[ColocationPoint]:
        """The points a lookup uses (module docstring): the model's at the thread count, else
        the model's, else any model's at the thread count, else all."""
        return (
            [p for p in self.points_ if (p.model, p.threads) == (model, threads)]
            or [p for p in self.points_ if p.model == model]
            or [p for p in self.points_ if p.threads == threads]
            or self.points_
        )

    @property
    def max_ranks_per_node(self) -> int:
        return max((p.ranks_per_node for p in self.points_), default=1)

    # ------------------------------------------------------------------------ files
    def quality_dict(self) -> dict[str, Any]:
        widths = [p.factor_interval.high - p.factor_interval.low for p in self.points_]
        return {"n_points": len(self.points_), "max_interval_width": max(widths, default=None)}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "points": {p.label: p.to_dict() for p in self.points_},
            "confidence": self.confidence,
            "held_above_ranks_per_node": self.max_ranks_per_node,
        }
        if self.node_fill_ is not None:
            out["node_fill"] = self.node_fill_.to_dict()
            del out["held_above_ranks_per_node"]
            out["carried_above_ranks_per_node"] = self.max_ranks_per_node
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ColocationModel:
        model = cls(confidence=float(doc.get("confidence", 0.95)))
        model.points_ = []
        for label, point in doc["points"].items():
            try:
                model.points_.append(ColocationPoint.from_dict(point))
            except FieldError as exc:  # its field, as the profile's colocation section has it
                raise exc.within(f"points.{label}") from None
        if doc.get("node_fill") is not None:
            try:
                model.node_fill_ = NodeFill.from_dict(doc["node_fill"])
            except FieldError as exc:  # its field, as the profile's colocation section has it
                raise exc.within("node_fill") from None
        return model
