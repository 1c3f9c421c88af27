"""Measurement: the raw samples of one measured quantity and the statistics of their median.

The figure a benchmark reports is the median, with a distribution-free confidence interval
(timings are skewed and heavy-tailed, so no normal approximation): see :func:`median_ci_ranks`.
Raw samples are always kept; statistics are computed on demand, as in Extra-P.

The stopping rule of :mod:`microbench.sampling` uses :func:`relative_ci_width` on a sorted
list it keeps up to date, so that the rule and :meth:`Measurement.relative_ci_width` are one
definition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

__all__ = ["Measurement", "MedianCI", "median_ci_ranks", "relative_ci_width"]

_EXACT_MAX_N = 20_000  # exact integer binomial sums up to here, log-space floats beyond


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float, bool]:
    """Ranks ``(j, k, achieved, enough)`` of the distribution-free confidence interval of a median.

    With ``n`` independent samples from a continuous distribution, the number B of samples
    below the true median is Binomial(n, 1/2), so the order statistics (1-based ranks) satisfy
    ``P(X_(j) < median < X_(k)) = P(j <= B <= k-1)``. ``j`` is the largest rank with
    ``P(B <= j-1) <= (1-confidence)/2`` and ``k = n + 1 - j`` (Le Boudec, "Performance Evaluation
    of Computer and Communication Systems", Thm 2.1; Hoefler & Belli, SC'15). ``achieved`` is
    the interval's exact coverage, at least ``confidence`` when ``enough``. When no such ``j``
    exists (n < 6 at 95%), the result is ``(1, n, achieved, False)``: the full sample range,
    whose coverage is below what was asked.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    half_alpha = (1.0 - confidence) / 2.0
    if n <= _EXACT_MAX_N:
        total, term, below, j = 2**n, 1, 0, 0  # term = C(n, i); below = 2^n P(B <= j-1)
        for i in range(n // 2 + 1):
            if (below + term) / total > half_alpha:
                break
            below, j = below + term, i + 1
            term = term * (n - i) // (i + 1)
        tail = below / total
    else:
        i = np.arange(1, n // 2 + 1)
        log_comb = np.concatenate([[0.0], np.cumsum(np.log(n - i + 1.0) - np.log(i))])
        cdf = np.cumsum(np.exp(log_comb - n * math.log(2.0)))
        j = int(np.searchsorted(cdf, half_alpha, side="right"))
        tail = float(cdf[j - 1]) if j else 0.0
    if j == 0:
        return 1, n, 1.0 - 2.0 * 0.5**n if n > 1 else 0.0, False
    return j, n + 1 - j, 1.0 - 2.0 * tail, True


def relative_ci_width(sorted_samples: Sequence[float], confidence: float = 0.95) -> float:
    """Full width of the median's confidence interval over |median|, from sorted samples.

    This is the quantity the stopping rule compares with its target: 0.05 means the interval
    spans 5% of the median (about +-2.5%). It is inf while there are too few samples for an
    interval at ``confidence`` (n < 6 at 95%) and when the median is 0 but the interval is not;
    a zero-width interval gives 0. ``sorted_samples`` must be ascending (not checked: callers
    keep a sorted list up to date sample by sample).
    """
    n = len(sorted_samples)
    j, k, _, enough = median_ci_ranks(n, confidence)
    width = float(sorted_samples[k - 1]) - float(sorted_samples[j - 1])
    mid = n // 2
    if n % 2:
        median = float(sorted_samples[mid])
    else:
        median = (float(sorted_samples[mid - 1]) + float(sorted_samples[mid])) / 2.0
    if not enough or (width > 0 and median == 0):
        return math.inf
    return width / abs(median) if width > 0 else 0.0


class MedianCI(tuple):
    """``(low, high)`` of a median's confidence interval, unpacking like a pair.

    Also carries ``confidence`` (asked), ``achieved`` (exact coverage of this interval) and
    ``too_few_samples``: True when n is too small for the confidence asked, in which case
    ``(low, high)`` is the full sample range and covers the median with only ``achieved``.
    """

    low: float
    high: float
    confidence: float
    achieved: float
    too_few_samples: bool

    def __new__(
        cls, low: float, high: float, confidence: float, achieved: float, too_few: bool
    ) -> MedianCI:
        self = super().__new__(cls, (low, high))
        self.low, self.high = low, high
        self.confidence, self.achieved, self.too_few_samples = confidence, achieved, too_few
        return self

    def __getnewargs__(self) -> tuple[float, float, float, float, bool]:  # for copy and pickle
        return self.low, self.high, self.confidence, self.achieved, self.too_few_samples


@dataclass(frozen=True, eq=False, repr=False)
class Measurement:
    """Raw samples of one measured quantity; statistics computed on demand (as in Extra-P).

    ``samples`` becomes a read-only 1-D float64 array; it must be non-empty and finite.
    """

    samples: np.ndarray
    benchmark: str | None = None
    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    unit: str = "s"
    warmup_discarded: int = 0
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        samples = np.array(self.samples, dtype=np.float64)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(f"samples must be a non-empty 1-D sequence, got shape {samples.shape}")
        if not np.isfinite(samples).all():
            raise ValueError("samples must be finite (a NaN or infinite sample is a failed run)")
        samples.flags.writeable = False
        object.__setattr__(self, "samples", samples)

    @property
    def n(self) -> int:
        return int(self.samples.size)

    @cached_property
    def sorted_samples(self) -> np.ndarray:
        return np.sort(self.samples)

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def mean(self) -> float:
        return float(self.samples.mean())

    @property
    def minimum(self) -> float:
        return float(self.sorted_samples[0])

    @property
    def maximum(self) -> float:
        return float(self.sorted_samples[-1])

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof=1); NaN for a single sample."""
        return float(self.samples.std(ddof=1)) if self.n > 1 else math.nan

    def median_ci(self, confidence: float = 0.95) -> MedianCI:
        """Distribution-free confidence interval of the median; see :func:`median_ci_ranks`."""
        j, k, achieved, enough = median_ci_ranks(self.n, confidence)
        s = self.sorted_samples
        return MedianCI(float(s[j - 1]), float(s[k - 1]), confidence, achieved, not enough)

    def relative_ci_width(self, confidence: float = 0.95) -> float:
        """(high - low) / |median|: the stopping criterion; see :func:`relative_ci_width`."""
        return relative_ci_width(self.sorted_samples, confidence)

    def summary(self, confidence: float = 0.95) -> dict[str, Any]:
        """The figures a reader wants without recomputing them (std is None for n=1)."""
        ci = self.median_ci(confidence)
        return {
            "n": self.n,
            "median": self.median,
            "median_ci_low": ci.low,
            "median_ci_high": ci.high,
            "confidence": confidence,
            "median_ci_too_few_samples": ci.too_few_samples,
            "mean": self.mean,
            "min": self.minimum,
            "max": self.maximum,
            "std": self.std if self.n > 1 else None,
        }

    def to_record(self, **extra: Any) -> dict[str, Any]:
        """A "measurement" record; ``extra`` adds fields (rank, threads...) but replaces none."""
        record = {
            "type": "measurement",
            "benchmark": self.benchmark,
            "name": self.name,
            "params": dict(self.params),
            "unit": self.unit,
            "samples": self.samples.tolist(),
            "warmup_discarded": self.warmup_discarded,
            "stop_reason": self.stop_reason,
            "summary": self.summary(),
        }
        clash = sorted(record.keys() & extra.keys())
        if clash:
            raise ValueError(f"extra fields would replace measurement fields: {clash}")
        return {**record, **extra}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Measurement:
        """Rebuild from a "measurement" record; a stored ``summary`` is ignored (recomputed)."""
        if record.get("type", "measurement") != "measurement":
            raise ValueError(f"not a measurement record: type {record.get('type')!r}")
        if "samples" not in record:
            raise ValueError("a measurement record needs 'samples'")
        return cls(
            samples=record["samples"],
            benchmark=record.get("benchmark"),
            name=record.get("name"),
            params=dict(record.get("params") or {}),
            unit=record.get("unit", "s"),
            warmup_discarded=int(record.get("warmup_discarded", 0)),
            stop_reason=record.get("stop_reason"),
        )

    def __repr__(self) -> str:
        label = "/".join(str(x) for x in (self.benchmark, self.name) if x is not None)
        return f"Measurement({label or '?'}, n={self.n}, median={self.median:.6g} {self.unit})"
