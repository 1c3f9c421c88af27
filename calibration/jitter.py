"""Jitter: the distribution of one step's compute time, and what the slowest of P ranks costs.

A synchronous data-parallel step waits for the slowest rank, so a step costs E[max of P draws]
of the per-rank compute time, not its typical value. Times are taken relative to their rank's
median (a rank that is systematically slower is a straggler, not jitter), pooled, and kept two
ways: the empirical distribution (sorted atoms, thinned to at most :data:`MAX_ATOMS`) and a
parametric family (lognormal, gamma or normal, fitted by maximum likelihood and chosen by AIC
or by the Kolmogorov-Smirnov statistic).

``expected_max_factor(P)`` is E[max of P iid draws] in units of the median step, of one
distribution (:class:`calibration.splice.Spliced`): the atoms up to the quantile level whose
upper tail holds :data:`MIN_TAIL_SAMPLES` samples (1 - 20/n), the fitted family's tail above,
shifted to meet them. The simulator draws from the same distribution (:meth:`sample`,
:meth:`quantile`, :meth:`upper_quantile`), so that its slowest rank is the one the expected
maxima price.

``sync_fraction(P) = expected_max_factor(P) - expected_max_factor(1)``: T_sync as a fraction of
the median step. It is checked against the measured per-step maximum over ranks when the
records have one.

**The typical moment.** How noisy a step is depends on the moment: on a shared machine the same
two ranks' per-step skew (each rank against its own median, the max over ranks less their mean,
averaged over steps) can be several times larger in one run than in runs of the same hour
(evidence: docs/evidence.md, "Jitter"). So the bench times the step at P >= 2 at several moments
(``params.moment``), and each run at P >= 2 gives its measured skew over what the pooled fit
predicts for P iid draws. Their median is ``scale``, and every factor x the model gives (the
expected maxima, the draws) is ``1 + scale * (x - 1)``: the distribution shrunk or stretched
about its median, so that its sync at the measured P is the typical moment's while the shape of
its tail still extrapolates to more ranks. Without runs at P >= 2, ``scale`` is 1.

``to_dict()`` (``models.jitter``): ``family``, ``criterion``, ``params`` (the family's, with
``intervals``), ``candidates`` (each family's params, AIC, KS statistic and p-value),
``median_s``, ``n_samples``, ``empirical_max_ranks``, ``quantile_summary``, ``quantiles`` (the
atoms, before ``scale``), ``scale`` and ``moments`` (each run at P >= 2: its label, ranks,
measured skew and the iid prediction), ``sync_table`` (ranks 1..1024 and their sync fraction,
for reading), ``checks``, ``quality``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from microbench.errors import UserError

from .profile_checks import FieldError
from .splice import Spliced
from .stats import Interval, fit_quality

__all__ = ["CONFIG_KEYS", "FAMILIES", "Family", "JitterModel", "config_runs", "frozen_family"]

# name -> (scipy distribution, fixed arguments for fit, parameter names as stored)
FAMILIES: dict[str, tuple[Any, dict[str, float], tuple[str, ...]]] = {
    "lognormal": (stats.lognorm, {"floc": 0.0}, ("sigma", "scale")),
    "gamma": (stats.gamma, {"floc": 0.0}, ("shape", "scale")),
    "normal": (stats.norm, {}, ("loc", "scale")),
}
MAX_ATOMS = 2000
MIN_TAIL_SAMPLES = 20
MAX_SCALE = 2.0  # the typical moment's skew over the iid prediction, at most (docstring)
QUANTILE_PROBS = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
SYNC_TABLE_RANKS = tuple(2**k for k in range(11))
CONFIG_KEYS = ("params.model", "params.batch", "params.threads", "params.ranks")


def config_runs(rows: pd.DataFrame, keys: Sequence[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """The rows of each run, grouped by the values of ``keys`` (those of them ``rows`` has) as
    text, a missing value being a value of its own ("none"): a run without a ``--moment``
    label is one run, not none, whichever way the installed pandas converts a missing value."""
    present = [k for k in keys if k in rows]
    if not present or rows.empty:
        return {}
    labels = [rows[k].astype(object).where(rows[k].notna(), "none").astype(str) for k in present]
    return {tuple(key): group for key, group in rows.groupby(labels)}


def frozen_family(family: str, params: dict[str, float]) -> Family:
    """The scipy distribution of ``family`` at ``params`` (as stored in a profile)."""
    dist, fixed, names = FAMILIES[family]
    if family == "normal":
        return Family(dist, (), float(params["loc"]), float(params["scale"]))
    return Family(dist, (float(params[names[0]]),), fixed["floc"], float(params["scale"]))


@dataclass(frozen=True)
class Family:
    """A scipy distribution at fixed parameters, its methods called with them. scipy's own
    frozen distribution builds a new distribution object, docstrings included (about 1.3 ms),
    and a prediction's band draws new parameters for every sample; the figures are the same."""

    dist: Any
    shape: tuple[float, ...]
    loc: float
    scale: float

    def _at(self) -> dict[str, float]:
        return {"loc": self.loc, "scale": self.scale}

    def ppf(self, q: Any) -> Any:
        return self.dist.ppf(q, *self.shape, **self._at())

    def isf(self, q: Any) -> Any:
        return self.dist.isf(q, *self.shape, **self._at())

    def cdf(self, x: Any) -> Any:
        return self.dist.cdf(x, *self.shape, **self._at())

    def logpdf(self, x: Any) -> Any:
        return self.dist.logpdf(x, *self.shape, **self._at())

    def mean(self) -> Any:
        return self.dist.mean(*self.shape, **self._at())

    def rvs(self, size: Any = None, random_state: Any = None) -> Any:
        return self.dist.rvs(*self.shape, **self._at(), size=size, random_state=random_state)


def _mle(family: str, x: np.ndarray) -> dict[str, float] | None:
    """The maximum-likelihood parameters of ``family`` for ``x``, or None where scipy finds
    none (a gamma fit of samples nearly all one value fails in its root finder)."""
    dist, fixed, names = FAMILIES[family]
    try:
        with np.errstate(all="ignore"):
            fitted = dist.fit(x, **fixed)
    except (ValueError, RuntimeError, FloatingPointError):
        return None
    if not all(math.isfinite(float(v)) for v in fitted):
        return None
    if family == "normal":
        return {"loc": float(fitted[0]), "scale": float(fitted[1])}
    return {names[0]: float(fitted[0]), "scale": float(fitted[2])}


class JitterModel:
    """Per-step compute time relative to the median; ``fit(df)`` on "jitter" records."""

    def __init__(
        self,
        families: Sequence[str] = tuple(FAMILIES),
        criterion: str = "aic",
        n_boot: int = 200,
        confidence: float = 0.95,
        seed: int = 0,
    ) -> None:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown or not families:
            raise ValueError(f"families must be among {list(FAMILIES)}, got {list(families)}")
        if criterion not in ("aic", "ks"):
            raise ValueError(f"criterion must be 'aic' or 'ks', got {criterion!r}")
        self.families, self.criterion = tuple(families), criterion
        self.n_boot, self.confidence, self.seed = n_boot, confidence, seed

    # ------------------------------------------------------------------------ fitting

    def fit(self, df: pd.DataFrame) -> JitterModel:
        """Fit from a records DataFrame: per-rank "jitter" records, max-over-ranks for checks."""
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "jitter")]
        if rows.empty:
            raise UserError("no jitter records to fit the jitter model from (run the jitter bench)")
        statistic = rows.get("params.statistic", pd.Series("per_rank", index=rows.index))
        per_rank = rows[statistic.fillna("per_rank") == "per_rank"]
        maxima = rows[statistic == "max_over_ranks"]
        if per_rank.empty:
            raise UserError("jitter records hold no per-rank samples to fit a distribution to")
        self.fit_samples([np.asarray(s, dtype=float) for s in per_rank["samples"]])
        self._fit_scale(per_rank)
        # Check E[max over the measured ranks] against the measured per-step maximum, per run
        # configuration (key columns as text, so that missing values group too).
        runs = config_runs(per_rank, CONFIG_KEYS)
        for key, group in config_runs(maxima, CONFIG_KEYS).items():
            ranks = group.iloc[0].get("params.ranks")  # none given: one rank, as _add_runs reads it
            ranks = 1 if pd.isna(ranks) else int(ranks)
            if ranks < 2 or key not in runs:
                continue
            median = float(np.median(np.concatenate(list(runs[key]["samples"]))))
            measured = float(np.mean(np.concatenate(list(group["samples"])))) / median
            self.checks_.append(self._check(ranks, measured))
        return self

    def fit_samples(self, per_rank: Sequence[Sequence[float]]) -> JitterModel:
        """Fit from raw step times, one sequence per rank (or per run), in seconds."""
        relative = [np.asarray(s, float) / np.median(s) for s in per_rank if len(s) > 0]
        if not relative:
            raise UserError("no jitter samples to fit")
        x = np.sort(np.concatenate(relative))
        if x.size < 8 or not np.all(np.isfinite(x)) or x[0] <= 0:
            raise UserError(f"need at least 8 positive finite jitter samples, got {x.size}")
        if x[0] == x[-1]:  # no distribution to fit, and scipy's gamma fit fails on it
            raise UserError(
                f"the {x.size} jitter samples are all exactly their rank's median step: no "
                "spread to fit (records edited, or a timer too coarse for the step); re-run "
                "the jitter bench"
            )  # fmt: skip
        self.median_s_ = float(np.median(np.concatenate([np.asarray(s, float) for s in per_rank])))
        self.n_samples_ = int(x.size)
        idx = np.round(np.linspace(0, x.size - 1, min(x.size, MAX_ATOMS))).astype(int)
        self.atoms_ = x[idx]
        self.empirical_max_ranks_ = max(1, x.size // MIN_TAIL_SAMPLES)
        self.candidates_ = {}
        for family in self.families:
            params = _mle(family, x)
            if params is None:  # left out of the choice: the others still describe x
                continue
            frozen = frozen_family(family, params)
            loglik = float(np.sum(frozen.logpdf(x)))
            ks = stats.kstest(x, frozen.cdf)
            self.candidates_[family] = {
                "params": params,
                "aic": 2 * len(params) - 2 * loglik if math.isfinite(loglik) else None,
                "ks_statistic": float(ks.statistic),
                "ks_pvalue": float(ks.pvalue),
            }
        score = "aic" if self.criterion == "aic" else "ks_statistic"
        scored = {f: c[score] for f, c in self.candidates_.items() if c[score] is not None}
        if not scored:
            raise UserError(
                f"none of the families {', '.join(self.families)} fits the {x.size} jitter "
                "samples; re-run the jitter bench"
            )
        self.family_ = min(scored, key=scored.get)
        self.params_ = dict(self.candidates_[self.family_]["params"])
        self.intervals_ = self._bootstrap(x)
        probs = np.asarray(QUANTILE_PROBS)
        fitted_q = frozen_family(self.family_, self.params_).ppf(probs)
        self.quality_ = fit_quality(np.quantile(x, probs), fitted_q).to_dict()
        self.checks_ = []
        self.scale_, self.moments_ = 1.0, []
        return self

    def _fit_scale(self, per_rank: pd.DataFrame) -> None:
        """``scale`` and ``moments`` from the runs at P >= 2 (module docstring)."""
        self.moments_ = []
        self._add_runs(per_rank)

    def add_moments(self, df: pd.DataFrame) -> JitterModel:
        """Add the jitter runs at 2 or more ranks of ``df`` (one moment each) to ``moments``
        and take ``scale`` again over all of them; the fitted distribution stays: how
        ``pdlsim validate`` extends a profile's sync over the span of its training runs."""
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "jitter")]
        if not rows.empty:
            statistic = rows.get("params.statistic", pd.Series("per_rank", index=rows.index))
            self._add_runs(rows[statistic.fillna("per_rank") == "per_rank"])
        return self

    def _add_runs(self, per_rank: pd.DataFrame) -> None:
        ranks = per_rank.get("params.ranks", pd.Series(1, index=per_rank.index)).fillna(1)
        multi = per_rank[ranks.astype(int) >= 2]
        for run in config_runs(multi, (*CONFIG_KEYS, "params.moment")).values():
            samples = [np.asarray(x, dtype=float) for x in run["samples"]]
            n = min(len(x) for x in samples)
            if len(samples) < 2 or n < 2:
                continue
            table = np.array([x[:n] / np.median(x[:n]) for x in samples])
            moment = run.iloc[0].get("params.moment")
            self.moments_.append(
                {
                    "moment": moment if isinstance(moment, str) else None,
                    "ranks": len(samples),
                    "measured_skew": float(np.mean(table.max(axis=0) - table.mean(axis=0))),
                    "iid_skew": float(self._raw_max(len(samples)) - self._raw_max(1)),
                }
            )
        self._rescale()

    def _rescale(self) -> None:
        """``scale`` from ``moments``, each against this distribution's iid skew (recomputed,
        so that a profile written when the distribution was read otherwise gets the scale
        that matches it now)."""
        for m in self.moments_:
            m["iid_skew"] = float(self._raw_max(int(m["ranks"])) - self._raw_max(1))
        ratios = [m["measured_skew"] / m["iid_skew"] for m in self.moments_ if m["iid_skew"] > 0]
        self.scale_ = float(np.clip(np.median(ratios), 0.0, MAX_SCALE)) if ratios else 1.0

    def _bootstrap(self, x: np.ndarray) -> dict[str, Interval]:
        """Percentile bootstrap of the chosen family's parameters (widened to hold the value)."""
        names = FAMILIES[self.family_][2]
        if self.n_boot < 2:
            return {}
        result = stats.bootstrap(
            (x,),
            lambda s: np.array([self._resample_params(s)[k] for k in names]),
            n_resamples=self.n_boot,
            confidence_level=self.confidence,
            method="percentile",
            vectorized=False,
            random_state=np.random.default_rng(self.seed),
        )
        low, high = (np.atleast_1d(bound) for bound in result.confidence_interval)
        return {
            k: Interval(float(lo), float(hi), self.confidence).including(self.params_[k])
            for k, lo, hi in zip(names, low, high, strict=True)
        }

    def _resample_params(self, sample: np.ndarray) -> dict[str, float]:
        """The chosen family's parameters for one bootstrap resample; the full sample's for a
        resample it cannot be fitted to (one drawing a single value over and over), so that a
        rare degenerate draw narrows the interval a little instead of failing the fit."""
        return _mle(self.family_, sample) or self.params_

    def _check(self, ranks: int, measured_factor: float) -> dict[str, float]:
        predicted = float(self.expected_max_factor(ranks))
        return {
            "ranks": ranks,
            "measured_factor": measured_factor,
            "predicted_factor": predicted,
            "rel_error": abs(predicted - measured_factor) / measured_factor,
        }

    # ------------------------------------------------------------------------ predicting

    def expected_max_factor(self, ranks: int | Sequence[int] | np.ndarray) -> float | np.ndarray:
        """E[max of ``ranks`` iid draws] over the median step (1.0 means no cost), the draws
        scaled about the median by ``scale`` (module docstring)."""
        return 1.0 + self.scale_ * (self._raw_max(ranks) - 1.0)

    def _raw_max(self, ranks: int | Sequence[int] | np.ndarray) -> float | np.ndarray:
        """E[max of ``ranks`` iid draws] of the distribution itself, before ``scale``."""
        p = np.atleast_1d(np.asarray(ranks))
        if p.size and (np.any(p < 1) or np.any(p != np.floor(p))):
            raise ValueError(f"ranks must be integers >= 1, got {ranks!r}")
        out = self.spliced().expected_max(p.astype(np.int64))
        return float(out[0]) if np.ndim(ranks) == 0 else out

    def spliced(self) -> Spliced:
        """The atoms below the top 1 / ``empirical_max_ranks`` of the distribution, the fitted
        family's tail above (module docstring), before ``scale``."""
        p0 = self.empirical_max_ranks_
        switch = 1.0 - 1.0 / p0 if p0 > 1 else 0.0
        return Spliced(self.atoms_, frozen_family(self.family_, self.params_), switch)

    def with_sync(self, ranks: int, fraction: float) -> JitterModel:
        """A copy whose sync at ``ranks`` ranks is ``fraction`` of the median step (its
        ``scale`` set so, within [0, :data:`MAX_SCALE`]): the distribution's shape, and so how
        the sync grows with the ranks, stays."""
        raw = float(self._raw_max(ranks) - self._raw_max(1))
        new = copy.copy(self)
        if raw > 0:
            new.scale_ = float(np.clip(fraction / raw, 0.0, MAX_SCALE))
        return new

    def sync_fraction(self, ranks: int | Sequence[int] | np.ndarray) -> float | np.ndarray:
        """E[max of P] - E[one draw], over the median step: T_sync(P) / median step time."""
        return self.expected_max_factor(ranks) - float(self.expected_max_factor(1))

    def sample(
        self, rng: np.random.Generator, size: int | tuple[int, ...], source: str = "model"
    ) -> np.ndarray:
        """Draws of step time over the median, scaled about the median by ``scale``: from the
        model's distribution (atoms and fitted tail, the one the expected maxima are of), the
        fitted family alone, or resampled atoms."""
        if source == "model":
            raw = self.spliced().sample(rng, size)
        elif source == "empirical":
            raw = rng.choice(self.atoms_, size=size, replace=True)
        elif source == "fitted":
            raw = frozen_family(self.family_, self.params_).rvs(size=size, random_state=rng)
        else:
            raise ValueError(f"source must be 'model', 'fitted' or 'empirical', got {source!r}")
        return self.scaled(raw)

    def quantile(self, u: Any) -> np.ndarray:
        """The scaled factor at quantile level ``u`` of the model's distribution."""
        return self.scaled(self.spliced().quantile(u))

    def upper_quantile(self, tail: Any) -> np.ndarray:
        """The scaled factor exceeded with probability ``tail``, accurate for tiny tails."""
        return self.scaled(self.spliced().upper_quantile(tail))

    def scaled(self, raw: Any) -> np.ndarray:
        """Factors of the fitted distribution scaled about the median: 1 + scale (x - 1),
        never below 0."""
        return np.maximum(1.0 + self.scale_ * (np.asarray(raw, dtype=float) - 1.0), 0.0)

    # ------------------------------------------------------------------------ serialising

    def quality_dict(self) -> dict[str, Any]:
        """Fit quality: quantile agreement of the chosen family, and the max-over-ranks check."""
        worst = max((c["rel_error"] for c in self.checks_), default=None)
        return {**self.quality_, "max_over_ranks_rel_error": worst}

    def to_dict(self) -> dict[str, Any]:
        ranks = np.asarray(SYNC_TABLE_RANKS)
        return {
            "family": self.family_,
            "criterion": self.criterion,
            "params": {
                **self.params_,
                "intervals": {k: v.to_dict() for k, v in self.intervals_.items()},
            },
            "candidates": self.candidates_,
            "median_s": self.median_s_,
            "n_samples": self.n_samples_,
            "empirical_max_ranks": self.empirical_max_ranks_,
            "quantile_summary": dict(
                zip(
                    [f"p{round(q * 100)}" for q in QUANTILE_PROBS],
                    np.quantile(self.atoms_, QUANTILE_PROBS).tolist(),
                    strict=True,
                )
            ),
            "quantiles": self.atoms_.tolist(),
            "scale": self.scale_,
            "moments": self.moments_,
            "sync_table": {"ranks": ranks.tolist(), "fraction": self.sync_fraction(ranks).tolist()},
            "checks": self.checks_,
            "quality": self.quality_dict(),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> JitterModel:
        _check_section(doc)
        model = cls(
            families=tuple(doc["candidates"]) or (doc["family"],), criterion=doc["criterion"]
        )
        model.family_ = doc["family"]
        params = dict(doc["params"])
        intervals = params.pop("intervals", {}) or {}
        model.intervals_ = {k: Interval.from_dict(v) for k, v in intervals.items()}
        model.params_ = {k: float(v) for k, v in params.items()}
        model.candidates_ = doc["candidates"]
        model.median_s_ = float(doc["median_s"])
        model.n_samples_ = int(doc["n_samples"])
        model.empirical_max_ranks_ = int(doc["empirical_max_ranks"])
        model.atoms_ = np.asarray(doc["quantiles"], dtype=float)
        model.checks_ = list(doc.get("checks") or [])
        model.scale_ = float(doc.get("scale", 1.0))  # profiles before moments: unscaled
        model.moments_ = [dict(m) for m in doc.get("moments") or []]
        if model.moments_:
            model._rescale()
        quality = dict(doc.get("quality") or {})
        quality.pop("max_over_ranks_rel_error", None)
        model.quality_ = quality
        return model


def _check_section(doc: dict[str, Any]) -> None:
    """The fields of a profile's jitter section that the distribution is drawn from, as a fit
    writes them, else a :class:`FieldError` naming the field: a family scipy has, its
    parameters each a number and its shape and scale above 0 (a sigma of -1 makes every draw
    NaN), atoms sorted ascending, a scale from 0 to :data:`MAX_SCALE`."""
    family, criterion = doc["family"], doc["criterion"]
    if family not in FAMILIES:
        raise FieldError("family", f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if criterion not in ("aic", "ks"):
        raise FieldError("criterion", f"must be 'aic' or 'ks', got {criterion!r}")
    unknown = [name for name in doc["candidates"] if name not in FAMILIES]
    if unknown:
        raise FieldError(
            f"candidates.{unknown[0]}", f"unknown family; one of {', '.join(FAMILIES)}"
        )
    for name in FAMILIES[family][2]:
        value = doc["params"][name]
        positive = name != "loc"  # a normal's mean may be anything; every other is a width
        if not isinstance(value, (int, float)) or isinstance(value, bool) or (
            positive and not value > 0):  # fmt: skip
            raise FieldError(f"params.{name}", f"must be a number{' > 0' if positive else ''}, "
                             f"got {value!r}")  # fmt: skip
    atoms = doc["quantiles"]
    if any(b < a for a, b in zip(atoms, atoms[1:], strict=False)) or not atoms[0] > 0:
        raise FieldError("quantiles", "must be step times over the median, above 0 and sorted "
                         "ascending")  # fmt: skip
    scale = doc.get("scale", 1.0)
    if not 0 <= scale <= MAX_SCALE:
        raise FieldError("scale", f"must be from 0 to {MAX_SCALE:g}, got {scale!r}")
