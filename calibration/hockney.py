"""Hockney alpha-beta model, ``T(m) = alpha + beta * m``, with message-size regimes found from
the data.

One straight line is wrong for real MPI: eager and rendezvous protocols, shared-memory copy
paths and caches give each size range its own latency and bandwidth (an ordinary least-squares
line through a 2-rank allreduce can get a negative latency and miss mid sizes by an order of
magnitude; a relative-error line still misses the largest sizes; evidence: docs/evidence.md,
"Collectives benchmark"). So the sorted sizes are cut into up to ``max_regimes`` contiguous
segments, each with its own alpha and beta:

* **Relative error.** Times span six orders of magnitude, so each segment minimises
  ``sum(((alpha + beta m - t) / t)^2)``: weights ``1/t``, every point counts alike.
* **Non-negative.** ``alpha, beta >= 0`` (a negative latency is a failed fit, not a fast
  network): a bounded linear least-squares problem, solved with ``scipy.optimize.nnls`` (the
  same problem as ``lsq_linear(bounds=(0, inf))``, an order of magnitude faster, which matters
  inside the segmentation search and the bootstrap).
* **Breakpoints at measured sizes**, at least ``min_points`` points per segment; the best cut
  for every number of segments comes from dynamic programming over all segments (segmented
  least squares, :mod:`calibration.segments`), so nothing is hard-coded.
* **How many regimes**: by leave-one-out cross-validation (each point predicted by the best
  cut of the others, breakpoints re-found): the fewest regimes whose median held-out relative
  error is within 5% of the best plus the measurement noise (the median relative standard
  error of the points' medians, from their raw samples; 0.5% without them). The median,
  because a point left out at a regime boundary is predicted by the wrong line whatever the
  truth, so a mean would punish every real breakpoint. BIC in relative-error space,
  ``n ln(RSS/n) + (3k - 1) ln n``, is the alternative (``criterion="bic"``), but real curves
  are not lines plus Gaussian noise: one stretch that no line fits (on the development
  machine, the two largest allreduce sizes, past a cliff) inflates the variance estimate and
  BIC then refuses breakpoints that cross-validation shows to be real.
* **Intervals**: bootstrap over each point's raw samples with the breakpoints held fixed (the
  intervals are conditional on the regimes found; re-cutting in every round would make the
  parameters of different rounds incomparable).

Prediction between two regimes switches at the geometric mean of the last size of one and the
first size of the next; below the smallest measured size the first regime applies, and above the
largest the last regime (its bandwidth is the large-message asymptote, which is what the
largest sizes measure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .segments import best_segmentations, bic, line_design, segment_costs
from .stats import (
    FitError,
    FitQuality,
    Interval,
    bootstrap_params,
    fit_quality,
    median_relative_se,
    nonneg_relative_fit,
    percentile_intervals,
)

__all__ = ["HockneyModel", "Regime"]

_CV_SLACK = 0.005  # without raw samples: half a percentage point does not buy a regime


@dataclass(frozen=True)
class Regime:
    """One message-size range with its own latency and per-byte time."""

    min_bytes: int
    max_bytes: int
    alpha_s: float
    beta_s_per_byte: float
    alpha_ci: Interval | None = None
    beta_ci: Interval | None = None

    def time_s(self, nbytes: Any) -> np.ndarray:
        return self.alpha_s + self.beta_s_per_byte * np.asarray(nbytes, dtype=float)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """1 / beta (inf when beta is 0: a latency-only regime)."""
        return math.inf if self.beta_s_per_byte == 0 else 1.0 / self.beta_s_per_byte

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_bytes": int(self.min_bytes),
            "max_bytes": int(self.max_bytes),
            "alpha_s": float(self.alpha_s),
            "beta_s_per_byte": float(self.beta_s_per_byte),
            "alpha_ci": None if self.alpha_ci is None else self.alpha_ci.to_dict(),
            "beta_ci": None if self.beta_ci is None else self.beta_ci.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Regime:
        def interval(key: str) -> Interval | None:
            return None if data.get(key) is None else Interval.from_dict(data[key])

        return cls(
            int(data["min_bytes"]),
            int(data["max_bytes"]),
            float(data["alpha_s"]),
            float(data["beta_s_per_byte"]),
            interval("alpha_ci"),
            interval("beta_ci"),
        )


class HockneyModel:
    """``T(m) = alpha + beta m`` per message-size regime, regimes found from the data.

    ``criterion``: ``"cv"`` (default) picks the number of regimes by the median leave-one-out
    relative error, the fewest regimes within ``parsimony`` (5%) of the best plus the noise of
    the medians; ``"bic"`` by BIC (see the module notes).
    ``fit`` returns self; fitted: ``regimes_`` (list of :class:`Regime`, ascending sizes),
    ``quality_`` (:class:`~calibration.stats.FitQuality`, its leave-out error from the
    leave-one-out refits, which re-find the breakpoints), ``selection_`` (the criterion's value
    for each number of regimes; None where no cut with enough points exists).
    """

    def __init__(
        self,
        max_regimes: int = 4,
        min_points: int = 3,
        criterion: str = "cv",
        parsimony: float = 0.05,
        n_boot: int = 200,
        seed: int = 0,
        confidence: float = 0.95,
    ) -> None:
        if max_regimes < 1 or min_points < 2:
            raise ValueError("max_regimes must be >= 1 and min_points >= 2")
        if criterion not in ("cv", "bic"):
            raise ValueError(f"criterion must be 'cv' or 'bic', got {criterion!r}")
        self.max_regimes, self.min_points = max_regimes, min_points
        self.criterion, self.parsimony = criterion, parsimony
        self.n_boot, self.seed, self.confidence = n_boot, seed, confidence

    # ------------------------------------------------------------------------------- fit
    def _options(
        self, sizes: np.ndarray, times: np.ndarray, limit: int
    ) -> dict[int, tuple[float, list[int]]]:
        """``k -> (rss, starts)``: the best cut into k regimes, for k up to ``limit``."""
        if limit <= 1 or len(sizes) < 2 * self.min_points:
            design = line_design(sizes)
            return {1: (nonneg_relative_fit(design, times)[1], [0])}
        return best_segmentations(segment_costs(sizes, times, self.min_points), limit)

    def _held_out(self, sizes: np.ndarray, times: np.ndarray, limit: int) -> np.ndarray:
        """``pred[k - 1, i]``: point i predicted by the best k-regime fit of the others."""
        n = len(sizes)
        pred = np.full((limit, n), np.nan)
        for i in range(n):
            keep = np.arange(n) != i
            x, y = sizes[keep], times[keep]
            for k, (_, starts) in self._options(x, y, limit).items():
                pred[k - 1, i] = _predict(_regimes(x, y, starts), sizes[i : i + 1])[0]
        return pred

    def fit(self, sizes_bytes: Any, times_s: Any, samples: Sequence[Any] | None = None):
        """Fit to measured ``times_s`` (the medians) at ``sizes_bytes``; returns self.

        ``samples``: the raw samples of each point (same order), for bootstrap intervals;
        without them (or with ``n_boot=0``) the intervals are None.
        """
        sizes = np.asarray(sizes_bytes, dtype=float).ravel()
        times = np.asarray(times_s, dtype=float).ravel()
        if sizes.shape != times.shape:
            raise FitError(f"Hockney fit: {sizes.size} sizes but {times.size} times")
        if np.unique(sizes).size < 2:
            raise FitError("Hockney fit: need at least two different message sizes")
        if not (np.all(np.isfinite(times)) and np.all(times > 0) and np.all(sizes >= 0)):
            raise FitError("Hockney fit: times must be positive and sizes non-negative")
        if samples is not None and len(samples) != sizes.size:
            raise FitError(f"Hockney fit: {len(samples)} sample lists for {sizes.size} points")
        order = np.argsort(sizes, kind="stable")
        sizes, times = sizes[order], times[order]
        n = sizes.size
        limit = max(1, min(self.max_regimes, n // self.min_points))
        options = self._options(sizes, times, limit)
        bics: list[float | None] = [None] * limit
        for k, (rss, _) in options.items():
            bics[k - 1] = bic(rss, n, k)
        cv: list[float | None] = [None] * limit
        held = None
        if n >= 3:
            held = self._held_out(sizes, times, max(1, min(limit, (n - 1) // self.min_points)))
            for k in range(1, held.shape[0] + 1):
                if k in options and np.all(np.isfinite(held[k - 1])):
                    cv[k - 1] = float(np.median(np.abs(held[k - 1] - times) / times))
        scores = cv if self.criterion == "cv" and any(c is not None for c in cv) else bics
        valid = {k: scores[k - 1] for k in options if scores[k - 1] is not None}
        if scores is cv:
            best = min(valid.values())
            slack = _CV_SLACK
            if samples is not None:
                slack = float(np.median(median_relative_se(samples)))
            limit_cv = best * (1.0 + self.parsimony) + slack
            chosen = min(k for k, c in valid.items() if c <= limit_cv)
        else:
            chosen = min(valid, key=lambda k: (valid[k], k))
        starts = options[chosen][1]
        self.selection_ = {
            "criterion": "cv" if scores is cv else "bic",
            "chosen_regimes": chosen,
            "cv_rel_error_by_regimes": cv,
            "bic_by_regimes": bics,
        }
        intervals: list[Interval | None] = [None] * (2 * len(starts))
        if samples is not None and self.n_boot > 0:
            ordered = [samples[i] for i in order]
            rounds = bootstrap_params(
                lambda medians: _lines(sizes, medians, starts), ordered, self.n_boot, self.seed
            )
            estimate = _lines(sizes, times, starts)
            found = percentile_intervals(rounds, self.confidence)
            intervals = [ci.including(v) for ci, v in zip(found, estimate, strict=True)]
        self.regimes_ = _regimes(sizes, times, starts, intervals)
        leave_out = None
        if held is not None and chosen <= held.shape[0] and np.all(np.isfinite(held[chosen - 1])):
            leave_out = held[chosen - 1]
        self.quality_ = fit_quality(times, self.predict(sizes), leave_out)
        return self

    # --------------------------------------------------------------------------- predict
    def predict(self, sizes_bytes: Any) -> np.ndarray:
        """Predicted seconds at ``sizes_bytes`` (array in, array out)."""
        return _predict(self.regimes_, np.asarray(sizes_bytes, dtype=float))

    def regime_of(self, nbytes: float) -> Regime:
        """The regime whose line predicts ``nbytes``."""
        return self.regimes_[int(np.searchsorted(_switches(self.regimes_), nbytes, "right"))]

    @property
    def breakpoints_bytes_(self) -> list[float]:
        """Sizes where prediction switches regime (geometric means between regimes)."""
        return [float(b) for b in _switches(self.regimes_)]

    # ------------------------------------------------------------------------ to/from dict
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "hockney",
            "formula": "alpha_s + beta_s_per_byte * bytes, per regime",
            "max_regimes": self.max_regimes,
            "min_points": self.min_points,
            "regimes": [r.to_dict() for r in self.regimes_],
            "selection": dict(self.selection_),
            "extrapolation": "first regime below the smallest measured size, last above the "
            "largest; the switch between regimes at the geometric mean of their end sizes",
            "quality": self.quality_.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HockneyModel:
        selection = dict(data.get("selection") or {})
        model = cls(
            int(data.get("max_regimes", 4)),
            int(data.get("min_points", 3)),
            criterion=selection.get("criterion", "cv"),
        )
        model.regimes_ = [Regime.from_dict(r) for r in data["regimes"]]
        if not model.regimes_:
            raise ValueError("a Hockney model needs at least one regime")
        model.selection_ = selection
        model.quality_ = FitQuality.from_dict(data["quality"])
        return model


def _lines(sizes: np.ndarray, times: np.ndarray, starts: Sequence[int]) -> np.ndarray:
    """``(alpha, beta)`` of each regime, flattened."""
    bounds = [*starts, len(sizes)]
    design = line_design(sizes)
    fits = [
        nonneg_relative_fit(design[a:b], times[a:b])[0]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return np.concatenate(fits)


def _regimes(
    sizes: np.ndarray,
    times: np.ndarray,
    starts: Sequence[int],
    intervals: Sequence[Interval | None] | None = None,
) -> list[Regime]:
    params = _lines(sizes, times, starts)
    intervals = intervals or [None] * len(params)
    bounds = [*starts, len(sizes)]
    return [
        Regime(
            int(sizes[a]),
            int(sizes[b - 1]),
            float(params[2 * r]),
            float(params[2 * r + 1]),
            intervals[2 * r],
            intervals[2 * r + 1],
        )
        for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]


def _switches(regimes: Sequence[Regime]) -> np.ndarray:
    return np.array(
        [
            math.sqrt(a.max_bytes * b.min_bytes)
            for a, b in zip(regimes[:-1], regimes[1:], strict=True)
        ],
        dtype=float,
    )


def _predict(regimes: Sequence[Regime], sizes: np.ndarray) -> np.ndarray:
    index = np.searchsorted(_switches(regimes), sizes, side="right")
    alpha = np.array([r.alpha_s for r in regimes])[index]
    beta = np.array([r.beta_s_per_byte for r in regimes])[index]
    return alpha + beta * sizes
