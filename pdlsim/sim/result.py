"""What a prediction says: the step time and its breakdown, per step and averaged.

The breakdown is a partition of one rank's step [start, end) by what that rank is doing at each
instant: computing (its own work: the exposed part of the mini-batch copy, forward, backward,
interference, update), communicating (at least one of its collectives in progress), both, or
neither (idle: it is waiting for the slowest rank to reach a collective). So

    T_compute = time computing            T_comm    = time a collective is in progress
    T_overlap = time doing both           T_sync    = time doing neither

and T_step = T_compute + T_comm + T_sync - T_overlap holds by construction (inclusion-exclusion
over a partition). With one communication stream T_comm is the sum of the collectives'
durations. The rank is a typical one (see :mod:`pdlsim.sim.engine`): the slowest rank of a step
never idles, so T_sync is what a typical rank loses waiting for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .cluster import Cluster, Scenario, StepPlan
    from .trace import Timeline

__all__ = [
    "BucketReport",
    "Prediction",
    "StepBreakdown",
    "account",
    "bucket_reports",
    "mean_breakdown",
]

Interval = tuple[float, float]


@dataclass(frozen=True)
class StepBreakdown:
    """One step (or the mean of several): T_step and its four terms, plus two details."""

    step_s: float
    compute_s: float
    comm_s: float
    sync_s: float
    overlap_s: float
    h2d_exposed_s: float = 0.0  # part of compute_s: waiting for the mini-batch copy
    pace_factor: float = 1.0  # the slowest rank's compute factor (jitter), 1.0 without jitter

    @property
    def residual_s(self) -> float:
        """T_step - (T_compute + T_comm + T_sync - T_overlap): zero up to rounding."""
        return self.step_s - (self.compute_s + self.comm_s + self.sync_s - self.overlap_s)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class BucketReport:
    index: int
    layers: tuple[str, ...]
    nbytes: int
    algorithm: str
    collective_s: float  # alone on idle links
    wire_bytes: int = 0  # what each rank sends (less than nbytes when compressed)
    compress_s: float = 0.0  # compression before the collective, expansion after
    decompress_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """A prediction from one engine (``"simulator"`` or ``"analytic"``)."""

    engine: str
    cluster: Cluster
    scenario: Scenario
    breakdown: StepBreakdown  # means over the measured steps (warm-up left out)
    steps: tuple[StepBreakdown, ...]  # the measured steps
    buckets: tuple[BucketReport, ...]
    timeline: Timeline | None = None

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_s

    @property
    def step_times_s(self) -> np.ndarray:
        return np.array([step.step_s for step in self.steps])

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "step_time_s": self.step_time_s,
            "breakdown": self.breakdown.to_dict(),
            "buckets": [asdict(bucket) for bucket in self.buckets],
        }


def bucket_reports(plan: StepPlan) -> tuple[BucketReport, ...]:
    return tuple(
        BucketReport(
            b.index,
            b.layers,
            b.nbytes,
            b.algorithm,
            b.collective_s,
            b.wire_bytes,
            b.compress_s,
            b.decompress_s,
        )
        for b in plan.buckets
    )


def mean_breakdown(steps: Sequence[StepBreakdown]) -> StepBreakdown:
    fields = np.array(
        [
            (s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s, s.h2d_exposed_s, s.pace_factor)
            for s in steps
        ]
    )
    return StepBreakdown(*(float(v) for v in fields.mean(axis=0)))


def _merge(intervals: Sequence[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _measure(intervals: Sequence[Interval]) -> float:
    total = 0.0
    for a, b in intervals:
        total += b - a
    return total


def _intersection(xs: Sequence[Interval], ys: Sequence[Interval]) -> float:
    """Measure of the intersection of two sorted lists of disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def account(
    start_s: float,
    end_s: float,
    compute: Sequence[Interval],
    comm: Sequence[Interval],
    h2d_exposed_s: float = 0.0,
    pace_factor: float = 1.0,
) -> StepBreakdown:
    """The breakdown of one rank's step from what it did when (see the module docstring).

    ``compute``: the rank's own work, disjoint intervals; ``comm``: its collectives' spans,
    which may overlap each other (several streams)."""
    clip = [(max(a, start_s), min(b, end_s)) for a, b in comm]
    comm_merged = _merge(clip)
    compute_sorted = _merge(compute)
    busy = _merge(list(compute_sorted) + comm_merged)
    return StepBreakdown(
        step_s=end_s - start_s,
        compute_s=_measure(compute_sorted),
        comm_s=_measure(comm_merged),
        sync_s=(end_s - start_s) - _measure(busy),
        overlap_s=_intersection(compute_sorted, comm_merged),
        h2d_exposed_s=h2d_exposed_s,
        pace_factor=pace_factor,
    )
