"""Statistics every fit shares: fit quality, bootstrap intervals, leave-out predictions.

Timings span many orders of magnitude (8 B allreduce in microseconds, 64 MiB in tens of
milliseconds), so quality is judged in relative error, ``|pred - true| / true``: an absolute
criterion would only see the largest messages. R^2 is reported too, in linear space, because
people expect it; it says little about the small end, the relative errors do.

Parameter intervals come from a nonparametric bootstrap over the raw samples (Efron &
Tibshirani, ch. 13, percentile interval): each round resamples every measured point's samples
with replacement, takes each point's median (the figure microbench reports), refits, and the
spread of the refitted parameters over rounds is the interval. This keeps the measurement noise
of each point, heavy tails included, without assuming a distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats
from scipy.optimize import nnls

from microbench.errors import UserError

__all__ = [
    "FitError",
    "FitQuality",
    "Interval",
    "bootstrap_intervals",
    "bootstrap_params",
    "fit_quality",
    "leave_group_out",
    "leave_one_out",
    "median_relative_se",
    "nonneg_relative_fit",
    "percentile_intervals",
    "relative_errors",
    "robust_rms",
    "robust_sigma",
]


class FitError(UserError, ValueError):
    """Data that cannot be fitted (too few points, non-positive times): one line, exit 2."""


@dataclass(frozen=True)
class Interval:
    """A confidence interval of one fitted parameter (95% unless said otherwise)."""

    low: float
    high: float
    confidence: float = 0.95

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def including(self, value: float) -> Interval:
        """This interval widened to reach ``value`` (a point estimate).

        A percentile bootstrap interval can miss the estimate from all the data when the
        bootstrap distribution is lopsided, which happens for badly determined parameters
        (one pinned at its bound of 0 in some rounds); the profile requires every interval to
        contain its value, and widening is the conservative repair.
        """
        return Interval(min(self.low, value), max(self.high, value), self.confidence)

    def to_dict(self) -> dict[str, float]:
        return {"low": float(self.low), "high": float(self.high), "confidence": self.confidence}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interval:
        return cls(float(data["low"]), float(data["high"]), float(data.get("confidence", 0.95)))


@dataclass(frozen=True)
class FitQuality:
    """How well a fitted model reproduces what was measured.

    ``median_rel_error``/``max_rel_error``: over the fitted points, in-sample.
    ``leave_out_rel_error``: the median relative error of each point predicted by a fit that did
    not see it (leave-one-out, or leave-one-process-count-out for the collective models); None
    when not computed. ``r2``: coefficient of determination in linear space (1.0 for a perfect
    fit; 0.0 rather than NaN when the measured values are all equal and the fit is not exact,
    as scikit-learn's ``r2_score`` does).
    """

    r2: float
    median_rel_error: float
    max_rel_error: float
    leave_out_rel_error: float | None
    n_points: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitQuality:
        leave_out = data.get("leave_out_rel_error")
        return cls(
            r2=float(data["r2"]),
            median_rel_error=float(data["median_rel_error"]),
            max_rel_error=float(data["max_rel_error"]),
            leave_out_rel_error=None if leave_out is None else float(leave_out),
            n_points=int(data["n_points"]),
        )


def relative_errors(y_true: Any, y_pred: Any) -> np.ndarray:
    """``|pred - true| / true`` element-wise; ``y_true`` must be positive and finite."""
    y_true = np.asarray(y_true, dtype=float)
    y_pred = np.asarray(y_pred, dtype=float)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"shapes differ: y_true {y_true.shape}, y_pred {y_pred.shape}")
    if not (np.all(np.isfinite(y_true)) and np.all(y_true > 0)):
        raise ValueError("relative errors need positive, finite measured values")
    return np.abs(y_pred - y_true) / y_true


def nonneg_relative_fit(
    design: np.ndarray, times: np.ndarray, offset: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """``x >= 0`` minimising ``sum(((offset + design @ x - t) / t)^2)``: ``(x, rss)``.

    The least-squares fit in relative error that every cost model here uses (weights ``1/t``),
    with its parameters bounded below by 0: ``scipy.optimize.nnls``, the same problem as
    ``lsq_linear(bounds=(0, inf))`` but an order of magnitude faster, which matters inside
    segmentation searches and bootstraps. ``offset``: a known part of each time (a cost whose
    parameters are given, not fitted). Columns are scaled to unit norm for the solve (their
    magnitudes differ by the message sizes, up to 1e8) and the solution scaled back; an
    all-zero column gets 0.
    """
    times = np.asarray(times, dtype=float)
    target = np.ones(len(times)) if offset is None else 1.0 - np.asarray(offset) / times
    weighted = np.asarray(design, dtype=float) / times[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    norms[norms == 0] = 1.0
    x, residual = nnls(weighted / norms, target)
    return x / norms, float(residual) ** 2


def robust_sigma(residuals: Any) -> float:
    """Standard deviation from the median absolute deviation (a few wild points don't count);
    0 for no residuals."""
    x = np.asarray(residuals, dtype=float).ravel()
    if x.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def robust_rms(errors: Any) -> float:
    """The root mean square of ``errors`` (bias included) that a few wild points don't move:
    ``sqrt(median(e^2) / median of chi-square(1))``, which is sigma for errors drawn from
    N(0, sigma^2); 0 for no errors."""
    x = np.asarray(errors, dtype=float).ravel()
    if x.size == 0:
        return 0.0
    return float(np.sqrt(np.median(x**2) / stats.chi2.median(1)))


def median_relative_se(samples_per_point: Sequence[Any]) -> np.ndarray:
    """Standard error of each point's median over the median, from its raw samples.

    The large-sample formula ``1.2533 sigma / sqrt(n)`` with sigma the scaled median absolute
    deviation (robust to the heavy tails of timings). It is the noise floor below which
    differences between fits say nothing: the model selections use it as their slack.
    """
    out = []
    for samples in samples_per_point:
        x = np.asarray(samples, dtype=float).ravel()
        median = float(np.median(x))
        sigma = robust_sigma(x)
        out.append(1.2533 * sigma / np.sqrt(x.size) / median if median > 0 else np.inf)
    return np.asarray(out)


def fit_quality(y_true: Any, y_pred: Any, leave_out_pred: Any = None) -> FitQuality:
    """Quality of ``y_pred`` against positive ``y_true``; see :class:`FitQuality`.

    ``leave_out_pred``: predictions of each point by a fit that did not see it (same shape as
    ``y_true``), e.g. from :func:`leave_one_out`; its median relative error is reported.
    """
    y_true = np.asarray(y_true, dtype=float)
    y_pred = np.asarray(y_pred, dtype=float)
    errors = relative_errors(y_true, y_pred)
    if errors.size == 0:
        raise ValueError("fit_quality needs at least one point")
    ss_res = float(np.sum((y_true - y_pred) ** 2))
    ss_tot = float(np.sum((y_true - y_true.mean()) ** 2))
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:
        r2 = 1.0 if ss_res == 0 else 0.0
    leave_out = None
    if leave_out_pred is not None:
        leave_out = float(np.median(relative_errors(y_true, leave_out_pred)))
    return FitQuality(
        r2=float(r2),
        median_rel_error=float(np.median(errors)),
        max_rel_error=float(np.max(errors)),
        leave_out_rel_error=leave_out,
        n_points=int(y_true.size),
    )


def bootstrap_params(
    refit: Callable[[np.ndarray], np.ndarray],
    samples_per_point: Sequence[Any],
    n_boot: int = 200,
    seed: int = 0,
) -> np.ndarray:
    """Parameters refitted on ``n_boot`` bootstrap replicates: shape ``(n_boot, n_params)``.

    ``samples_per_point``: one 1-D array of raw samples per measured point. Each round draws
    every point's samples with replacement (as many as it has), takes each point's median and
    calls ``refit(medians)``, which returns the parameter vector. The rows are what prediction
    bands propagate; :func:`percentile_intervals` turns them into intervals.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    points = [np.asarray(s, dtype=float).ravel() for s in samples_per_point]
    if not points or any(p.size == 0 for p in points):
        raise ValueError("every point needs at least one raw sample")
    rng = np.random.default_rng(seed)
    medians = np.empty((n_boot, len(points)))
    for j, samples in enumerate(points):
        draws = rng.integers(0, samples.size, size=(n_boot, samples.size))
        medians[:, j] = np.median(samples[draws], axis=1)
    rows = [np.asarray(refit(medians[i]), dtype=float).ravel() for i in range(n_boot)]
    return np.vstack(rows)


def percentile_intervals(params: np.ndarray, confidence: float = 0.95) -> list[Interval]:
    """Percentile interval of each column of bootstrap ``params`` (rows = rounds)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    params = np.atleast_2d(np.asarray(params, dtype=float))
    tail = 100.0 * (1.0 - confidence) / 2.0
    low = np.percentile(params, tail, axis=0)
    high = np.percentile(params, 100.0 - tail, axis=0)
    return [Interval(float(lo), float(hi), confidence) for lo, hi in zip(low, high, strict=True)]


def bootstrap_intervals(
    refit: Callable[[np.ndarray], np.ndarray],
    samples_per_point: Sequence[Any],
    n_boot: int = 200,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[Interval]:
    """Percentile bootstrap interval of each fitted parameter; see :func:`bootstrap_params`."""
    return percentile_intervals(
        bootstrap_params(refit, samples_per_point, n_boot, seed), confidence
    )


def leave_group_out(
    fit_predict: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    x: Any,
    y: Any,
    groups: Any,
) -> np.ndarray:
    """Predictions of each point by a fit on the points of all other groups.

    ``fit_predict(x_train, y_train, x_test) -> y_test_pred``; ``x`` has one row (or value) per
    point. With ``groups`` = the process count this is leave-one-process-count-out, the
    extrapolation a cluster prediction relies on. Needs at least two groups.
    """
    x, y, groups = np.asarray(x), np.asarray(y, dtype=float), np.asarray(groups)
    if not len(x) == len(y) == len(groups):
        raise ValueError(f"lengths differ: x {len(x)}, y {len(y)}, groups {len(groups)}")
    labels = np.unique(groups)
    if labels.size < 2:
        raise ValueError("leaving a group out needs at least two groups")
    predictions = np.empty(len(y))
    for label in labels:
        out = groups == label
        predictions[out] = np.asarray(fit_predict(x[~out], y[~out], x[out]), dtype=float)
    return predictions


def leave_one_out(
    fit_predict: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], x: Any, y: Any
) -> np.ndarray:
    """Prediction of each point from a fit without it (``fit_predict`` as in
    :func:`leave_group_out`)."""
    return leave_group_out(fit_predict, x, y, np.arange(len(np.asarray(y))))
