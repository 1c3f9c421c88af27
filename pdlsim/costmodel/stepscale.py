"""From per-op predictions to what a training step really costs: the profile's whole-step rows.

Ops timed one at a time add up to less (small batches) or more (large ones) than the same ops
run back to back as a training step: caches, allocator state and per-call overheads differ
(:mod:`microbench.network_ops`). The compute microbenchmark therefore also times the whole step
(phase ``step``, on the host with the mini-batch gather first, as a training loop runs it) and
the gather alone (phase ``data``) for every model, batch and thread count it measures.
:class:`StepScale` keeps those rows (a host step less its gather: the gather is added apart)
and answers:

* :meth:`StepScale.ratio`: measured step / sum of the predicted ops of that step. For a model
  the profile measured: at the thread count (else the nearest measured one below, else the
  smallest), interpolated linearly in log(batch) between measured batches and held beyond them.
  A model the profile did not measure (a workload file) gets the median ratio of every measured
  step at that thread count. ``z`` moves each measured step time by z standard deviations, in
  log units, for the prediction band: of its interval (sigma = width / 3.92), or, where the
  drift model set its typical time from the step's moments, of that typical time
  (:meth:`StepScale.with_sigma`; the moments' own spread is the band's drift draw): a short
  compute stage's interval can be far wider than the step's real spread, and a band moved by it
  reaches absurdly fast steps (evidence: docs/evidence.md, "Whole-step correction").
* The same for a forward-only step (``forward_ops_s`` given): its measured time / the sum of the
  predicted forward ops and loss. Its rows (:meth:`StepScale.with_forward`) are the step rows at
  the typical speed times the forward-only step's measured share of the step
  (:meth:`calibration.drift.DriftModel.forward_fraction`, a ratio timed side by side). A forward
  pass alone does not pay all of the training step's evictions, so the forward-only step is a
  smaller share of the step than its forward ops are of the step's ops (evidence:
  docs/evidence.md, "Whole-step correction"). Without such rows forward-only steps take the
  training step's ratio.
* :meth:`StepScale.data_time_s`: the gather's seconds at a batch: a straight line in the batch
  through the model's measured rows (one row: proportional), else a straight line in bytes
  through every measured row.

The predicted ops are supplied by the caller (``ops_s``): the scale then corrects whatever
per-op model the caller uses, perturbed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from microbench.op_records import STEP_WITH_GATHER

__all__ = ["StepRow", "StepScale", "threads_row"]

_Z95 = 1.959963984540054
OpsFn = Callable[[str, int, int, str], float]  # (model, batch, threads, device) -> seconds


@dataclass(frozen=True)
class StepRow:
    device: str
    model: str
    threads: int
    batch: int
    time_s: float
    sigma_s: float


@dataclass(frozen=True)
class StepScale:
    steps: tuple[StepRow, ...] = ()
    data: tuple[StepRow, ...] = ()  # gather rows (host only)
    data_bytes_per_sample: dict[str, float] = field(default_factory=dict)
    inference: tuple[StepRow, ...] = ()  # forward-only steps (:meth:`with_forward`)

    @classmethod
    def from_table(cls, table: Iterable[Any]) -> StepScale:
        """From a compute model's op table (:class:`calibration.optable.OpTime` entries)."""
        table = list(table)
        gathers = {
            (e.device, e.model, int(e.threads), int(e.batch)): e.time_s
            for e in table
            if e.phase == "data"
        }
        steps, data, per_sample = [], [], {}
        for e in table:
            if e.phase not in ("step", "data"):
                continue
            key = (e.device, e.model, int(e.threads), int(e.batch))
            time_s = e.time_s
            if e.phase == "step" and e.op == STEP_WITH_GATHER:  # the gather is added apart
                time_s = max(time_s - gathers.get(key, 0.0), 0.0)
            sigma = max(e.high_s - e.low_s, 0.0) / (2 * _Z95)
            row = StepRow(e.device, e.model, int(e.threads), int(e.batch), time_s, sigma)
            (steps if e.phase == "step" else data).append(row)
            if e.phase == "data" and e.batch > 0:
                per_sample[e.model] = e.bytes / e.batch
        return cls(tuple(steps), tuple(data), per_sample)

    def rescaled(self, factor: Callable[[StepRow], float]) -> StepScale:
        """The same rows with each whole step's time (and sigma) multiplied by ``factor(row)``:
        the drift model's level, from the moment measured to the typical speed."""
        steps = tuple(
            replace(r, time_s=r.time_s * factor(r), sigma_s=r.sigma_s * factor(r))
            for r in self.steps
        )
        return replace(self, steps=steps)

    def with_sigma(self, sigma: Callable[[StepRow], float | None]) -> StepScale:
        """The same rows with each whole step's sigma replaced by ``sigma(row)`` where that is
        not None: the uncertainty of its typical time, once the drift model has set it."""
        steps = []
        for r in self.steps:
            new = sigma(r)
            steps.append(r if new is None else replace(r, sigma_s=float(new)))
        return replace(self, steps=tuple(steps))

    def with_forward(self, fraction: Callable[[StepRow], float | None]) -> StepScale:
        """Forward-only rows: each step row (time and sigma) times ``fraction(row)``, the
        forward-only step's share of it; rows without a fraction get none."""
        rows = []
        for r in self.steps:
            share = fraction(r)
            if share is not None and share > 0:
                rows.append(replace(r, time_s=r.time_s * share, sigma_s=r.sigma_s * share))
        return replace(self, inference=tuple(rows))

    def __bool__(self) -> bool:
        return bool(self.steps or self.data)

    def measured_models(self, device: str) -> list[str]:
        return sorted({r.model for r in self.steps if r.device == device})

    # ------------------------------------------------------------------------ step ratio
    def ratio(
        self,
        ops_s: OpsFn,
        device: str,
        model: str | None,
        batch: int,
        threads: int,
        z: float = 0.0,
        forward_ops_s: OpsFn | None = None,
    ) -> float:
        """Measured step / predicted ops (module docstring); 1 where nothing was measured.
        With ``forward_ops_s`` (a forward-only step's predicted ops): the model's forward-only
        rows' ratio where it has them, else the training step's."""
        rows = [r for r in self.inference if r.device == device and r.model == model]
        if forward_ops_s is not None and rows:
            ops_s = forward_ops_s
        else:
            rows = [r for r in self.steps if r.device == device]
        if not rows:
            return 1.0
        own = [r for r in rows if r.model == model]
        if not own:
            at = threads_row(sorted({r.threads for r in rows}), threads)
            found = [self._one(ops_s, r, z) for r in rows if r.threads == at]
            return float(np.median(found))
        at = threads_row(sorted({r.threads for r in own}), threads)
        own = sorted((r for r in own if r.threads == at), key=lambda r: r.batch)
        logs = np.log([r.batch for r in own])
        ratios = [self._one(ops_s, r, z) for r in own]
        return float(np.interp(np.log(batch), logs, ratios))

    @staticmethod
    def _one(ops_s: OpsFn, row: StepRow, z: float) -> float:
        """The row's step over its ops, the step moved by ``z`` sigmas in log units (a time
        never reaches 0, however wide a few samples' interval was)."""
        ops = ops_s(row.model, row.batch, row.threads, row.device)
        if ops <= 0:
            return 1.0
        moved = row.time_s * np.exp(z * row.sigma_s / row.time_s) if row.time_s > 0 else 0.0
        return float(moved) / ops

    def source(self, device: str, model: str | None, inference: bool = False) -> str:
        if not any(r.device == device for r in self.steps):
            return "no whole-step rows: ops as measured one by one"
        own = [r for r in self.inference if (r.device, r.model) == (device, model)]
        if inference and own:
            batches = sorted({r.batch for r in own})
            return (
                f"scaled to the measured {model} steps times their forward-only share, timed "
                f"side by side (batches {_csv(batches)})"
            )
        if model in self.measured_models(device):
            batches = sorted(
                {r.batch for r in self.steps if (r.device, r.model) == (device, model)}
            )
            return f"scaled to the measured {model} steps (batches {_csv(batches)})"
        return "scaled by the median whole-step/ops ratio of the measured models"

    # ------------------------------------------------------------------------ gather
    def data_time_s(self, model: str | None, batch: int, bytes_per_sample: float) -> float:
        """Seconds to gather one mini-batch on the host; 0 where nothing was measured."""
        if not self.data:
            return 0.0
        own = [r for r in self.data if r.model == model]
        if own:
            by_batch = _median_by([r.batch for r in own], [r.time_s for r in own])
            return _line(by_batch, float(batch))
        points = [
            (r.batch * self.data_bytes_per_sample.get(r.model, 0.0), r.time_s) for r in self.data
        ]
        by_bytes = _median_by([b for b, _ in points], [t for _, t in points])
        return _line(by_bytes, batch * bytes_per_sample)


def threads_row(measured: list[int], threads: int) -> int:
    """The measured thread count that stands for ``threads``: the nearest measured at or
    below it, else the smallest measured."""
    below = [t for t in measured if t <= threads]
    return max(below) if below else min(measured)


def _median_by(xs: list[float], ys: list[float]) -> dict[float, float]:
    groups: dict[float, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        groups.setdefault(float(x), []).append(y)
    return {x: float(np.median(v)) for x, v in groups.items()}


def _line(points: dict[float, float], x: float) -> float:
    """A least-squares line through ``points`` at ``x`` (one point: through the origin);
    never negative."""
    xs, ys = np.array(sorted(points)), np.array([points[k] for k in sorted(points)])
    if len(xs) == 1:
        return float(max(ys[0] * x / xs[0], 0.0)) if xs[0] > 0 else float(ys[0])
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(max(intercept + slope * x, 0.0))


def _csv(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)
