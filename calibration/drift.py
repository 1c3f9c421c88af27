"""Drift: how the speed of the same training step moves between moments minutes apart.

On a shared machine the speed of identical work drifts (other tenants, frequency, memory
placement): a step measured now and the same step measured two minutes later differ by more than
either median's confidence interval. On a shared VM it need not even be a gentle drift: a
neighbour on the same physical core can switch the speed between two levels tens of percent
apart every few seconds to a minute (evidence: docs/evidence.md, "Drift"). The prediction must
say which speed it assumes, and its band must carry the others, or a measurement taken at
another moment falls outside it however right the model is.

A calibration run measures the very same step (model, batch, thread count) at several moments:
the compute benchmark's whole step (less its mini-batch gather), the jitter benchmark's step at
one rank, at more ranks the step of rank 0 alone (:mod:`calibration.colocation`), and the
speed checks ``pdlsim bench`` spreads over the calibration (``microbench speed``, one per
``moment``). For each step with at least two of these medians:

* the **typical speed** is the median of its medians, and each moment's **log-deviation** from
  it is one draw of the machine's state. The pooled deviations are the empirical speed
  distribution (``log_deviations``); the simulator's band draws one of them per sample for the
  host's compute (:meth:`pdlsim.costmodel.model.ProfileCostModel.perturbed`), so its P50 is at the
  typical speed and its P10..P90 spans the speeds the calibration saw.
* each step's **level** (:meth:`DriftModel.step_level`) is its typical time over the compute
  benchmark's: the whole-step rows the simulator scales its ops to
  (:class:`pdlsim.costmodel.stepscale.StepScale`) are multiplied by it, so that predictions
  describe the typical speed, not the moment the compute stage happened to see. The compute stage
  takes seconds per step and the speed may switch in between, so each step gets its own level when
  the speed checks timed it (they time every step the compute stage times); a step with fewer
  than :data:`MIN_MOMENTS` moments gets the **compute stage's offset**
  (``compute_log_offset``), the median over steps of the compute moment's log-deviation.
* ``sigma`` is the standard deviation of the deviations from each step's mean log-median
  (degrees of freedom: measurements minus steps), a lognormal sigma with a chi-square 95%
  interval: the drift in one number, for reports.

The **forward-only step** (what ``pdlsim train --inference`` computes) is timed at the same
moments: by the compute benchmark beside its step, and by each speed check in alternation with
the step, sample for sample (``forward_medians_s``). Its median over the step's median at one
moment is free of that moment's speed; :meth:`DriftModel.forward_fraction`, the median of those
ratios over the moments, is the forward-only step's share of the training step, which the
simulator applies to the step's typical time (:mod:`pdlsim.costmodel.stepscale`). A lone
forward-only median cannot be brought to the typical speed: its own step's level says nothing of
the level the forward pass itself caught, and one timed on the other speed level puts a forward
pass far off.

A **span** (:meth:`DriftModel.add_moments` with ``span=True``: ``pdlsim validate``'s speed
checks between its training launches) is the stretch of time the predictions are for. A step
with at least :data:`MIN_MOMENTS` span moments takes its typical time, deviations and
forward-only share from those alone; the calibration's moments, timed before the span, only say
where the compute stage sat. Pooled with them, the typical time would mix the calibration's
speed with the span's, which can differ by several percent, and every row of a run would move
with it (evidence: docs/evidence.md, "Drift").

**GPU steps** (a GPU's training step, driven by one host thread) drift too, and not with the GPU
alone: a small network's step on a GPU is the host launching kernels: a launch-bound step (flat
in the batch) moves by tens of percent from one calibration to the next, while a GPU-bound step
holds within a few percent (evidence: docs/evidence.md, "Drift"). The compute stage's GPU step
and the speed checks' GPU steps (``microbench speed --gpu-batch``) are moments of their own
steps (keys ``mlp-b32-gpu``) and set those steps' typical time as above; their deviations are
pooled apart (:meth:`DriftModel.log_deviations` of "gpu"), so that a GPU rank's band draws the
GPU steps' drift and a CPU rank's the host's. ``sigma`` and the compute offset stay the host's;
a GPU step with fewer than :data:`MIN_MOMENTS` moments keeps its compute-stage time (level 1).

Everything derives from ``medians_s``, so a profile fitted before the speed checks existed
loads with its deviations and offset recomputed from the medians it kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from microbench.errors import UserError
from microbench.jitter import FORWARD_NAME
from microbench.op_records import INFERENCE_WITH_GATHER, STEP_WITH_GATHER

from .profile_checks import FieldError, is_number, shown
from .stats import Interval

__all__ = ["COMPUTE_MOMENT", "DriftModel"]

COMPUTE_MOMENT = "compute step"
MIN_MOMENTS = 3  # a step's own typical time needs this many moments; fewer: the pooled offset
DEVICES = ("cpu", "gpu")


class DriftModel:
    """Lognormal sigma of repeated medians of the same step (see the module docstring)."""

    def __init__(self, confidence: float = 0.95) -> None:
        self.confidence = confidence
        self.sigma_ = 0.0
        self.interval_ = Interval(0.0, 0.0, confidence)
        self.medians_: dict[str, dict[str, float]] = {}
        self.forward_medians_: dict[str, dict[str, float]] = {}  # forward-only, same moments
        self.log_deviations_ = np.zeros(0)  # the host's (CPU steps)
        self.gpu_log_deviations_ = np.zeros(0)  # the GPU steps' (module docstring)
        self.compute_log_offset_ = 0.0
        self.span_moments_: set[str] = set()  # labels of the span's moments (docstring)

    def fit(self, df: pd.DataFrame) -> DriftModel:
        """From compute ("op" step and data rows, CPU and GPU), jitter (per-rank at 1 rank,
        "alone") and speed measurement records; fewer than two medians of any one step: no
        drift."""
        rows = df[df["type"] == "measurement"]
        compute = rows[(rows["benchmark"] == "compute") & (rows["name"] == "op")]
        jitter = rows[rows["benchmark"] == "jitter"]
        gathers = {
            _key(r): float(np.median(r["samples"]))
            for _, r in compute.iterrows()
            if r.get("params.phase") == "data"
        }
        for _, r in compute.iterrows():
            phase = r.get("params.phase")
            if phase not in ("step", "inference") or _device(r) not in DEVICES:
                continue
            median = float(np.median(r["samples"]))
            if r.get("params.op") in (STEP_WITH_GATHER, INFERENCE_WITH_GATHER):
                median -= gathers.get(_key(r), 0.0)
            into = self.medians_ if phase == "step" else self.forward_medians_
            _add(into, _key(r), COMPUTE_MOMENT, median)
        for _, r in jitter.iterrows():
            statistic = r.get("params.statistic")
            alone = statistic == "alone"
            if not alone and not (statistic == "per_rank" and r.get("params.ranks") == 1):
                continue
            ranks = r.get("params.ranks")  # an "alone" record without its count: unnamed
            count = "" if pd.isna(ranks) else f" at {int(ranks)}"
            where = f"jitter alone{count}" if alone else "jitter at 1"
            moment = r.get("params.moment")
            where += f" ({moment})" if isinstance(moment, str) else ""
            _add(self.medians_, _key(r), where, float(np.median(r["samples"])))
        return self.add_moments(rows)

    def add_moments(self, df: pd.DataFrame, span: bool = False) -> DriftModel:
        """Add the speed records (``microbench speed``) of ``df``, one moment each by its
        label, to the medians this model holds, and derive again: how ``pdlsim validate``
        extends a profile's moments over the span of its training runs (``span``: these
        moments are the span the predictions are for, module docstring)."""
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "speed")]
        for _, r in rows.iterrows():
            into = self.forward_medians_ if r.get("name") == FORWARD_NAME else self.medians_
            moment = str(r.get("params.moment"))
            _add(into, _key(r), moment, float(np.median(r["samples"])))
            if span:
                self.span_moments_.add(moment)
        self._derive()
        return self

    def _typical_moments(self, moments: dict[str, float]) -> dict[str, float]:
        """The moments a step's typical time is the median of: the span's where it has
        :data:`MIN_MOMENTS` of them, else all (module docstring)."""
        own = {m: t for m, t in moments.items() if m in self.span_moments_}
        return own if len(own) >= MIN_MOMENTS else moments

    def _typical_log(self, moments: dict[str, float]) -> float:
        """log of a step's typical time: the median of its typical moments' logs."""
        return float(np.median(np.log(list(self._typical_moments(moments).values()))))

    def _repeated_logs(self, device: str) -> list[np.ndarray]:
        """Per step of ``device`` timed at two moments or more: the logs of its typical
        moments' medians."""
        return [
            np.log(list(self._typical_moments(m).values()))
            for key, m in self.medians_.items()
            if len(m) >= 2 and _key_device(key) == device
        ]

    def _derive(self) -> None:
        """sigma and its interval, the log-deviations and the compute offset (docstring)."""
        repeated = self._repeated_logs("cpu")
        from_mean = [logs - np.mean(logs) for logs in repeated]
        dof = sum(len(d) for d in from_mean) - len(from_mean)
        if dof >= 1:
            ss = float(sum(np.sum(d**2) for d in from_mean))
            self.sigma_ = float(np.sqrt(ss / dof))
            tail = (1 - self.confidence) / 2
            low = np.sqrt(ss / stats.chi2.ppf(1 - tail, dof))
            high = np.sqrt(ss / stats.chi2.ppf(tail, dof))
            self.interval_ = Interval(float(low), float(high), self.confidence)
        self.log_deviations_ = _pooled_deviations(repeated)
        self.gpu_log_deviations_ = _pooled_deviations(self._repeated_logs("gpu"))
        offsets = [
            np.log(m[COMPUTE_MOMENT]) - self._typical_log(m)
            for key, m in self.medians_.items()
            if len(m) >= 2 and COMPUTE_MOMENT in m and _key_device(key) == "cpu"
        ]
        self.compute_log_offset_ = float(np.median(offsets)) if offsets else 0.0

    def log_deviations(self, device: str = "cpu") -> np.ndarray:
        """The pooled log-deviations of ``device``'s steps: the speeds a band draws from."""
        return self.gpu_log_deviations_ if device == "gpu" else self.log_deviations_

    def step_level(self, model: str, batch: int, threads: int, device: str = "cpu") -> float:
        """Typical time / the compute stage's time of this step: the median of its moments
        over its compute moment when it has at least :data:`MIN_MOMENTS` of them, else, on the
        CPU, the compute stage's offset over every step, exp(-``compute_log_offset``), and on
        a GPU 1 (the host's offset says nothing of it)."""
        moments = self.medians_.get(_step_key(model, batch, threads, device), {})
        if len(moments) >= MIN_MOMENTS and COMPUTE_MOMENT in moments:
            return float(np.exp(self._typical_log(moments)) / moments[COMPUTE_MOMENT])
        return 1.0 if device == "gpu" else float(np.exp(-self.compute_log_offset_))

    def typical_log_sigma(
        self, model: str, batch: int, threads: int, device: str = "cpu"
    ) -> float | None:
        """The standard error of :meth:`step_level`'s typical time, in log units: how well its
        median over the step's moments is known (1.2533 x their standard deviation / sqrt(n),
        the median's under a normal law); None where :meth:`step_level` does not use them."""
        moments = self.medians_.get(_step_key(model, batch, threads, device), {})
        if len(moments) < MIN_MOMENTS or COMPUTE_MOMENT not in moments:
            return None
        logs = np.log(list(self._typical_moments(moments).values()))
        return float(1.2533 * np.std(logs, ddof=1) / np.sqrt(logs.size))

    def forward_fraction(
        self, model: str, batch: int, threads: int, device: str = "cpu"
    ) -> float | None:
        """The forward-only step over the training step, the median over the moments that
        timed both (module docstring); None where none did."""
        key = _step_key(model, batch, threads, device)
        steps = self._typical_moments(self.medians_.get(key, {}))
        forwards = self.forward_medians_.get(key, {})
        ratios = [forwards[m] / steps[m] for m in forwards if m in steps]
        return float(np.median(ratios)) if ratios else None

    def quality_dict(self) -> dict[str, Any]:
        return {"n_steps": sum(len(m) >= 2 for m in self.medians_.values())}

    def to_dict(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma_,
            "intervals": {"sigma": self.interval_.to_dict()},
            "compute_log_offset": self.compute_log_offset_,
            "log_deviations": [float(d) for d in self.log_deviations_],
            "gpu_log_deviations": [float(d) for d in self.gpu_log_deviations_],
            "medians_s": self.medians_,
            "forward_medians_s": self.forward_medians_,
            "span_moments": sorted(self.span_moments_),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DriftModel:
        model = cls()
        model.sigma_ = float(doc["sigma"])
        model.interval_ = Interval.from_dict(doc["intervals"]["sigma"])
        model.medians_ = _medians(doc.get("medians_s", {}), "medians_s")
        model.forward_medians_ = _medians(doc.get("forward_medians_s", {}), "forward_medians_s")
        model.span_moments_ = set(doc.get("span_moments", []))
        model._derive()  # the stored derived fields are for readers; the medians decide
        return model


def _medians(doc: Any, field: str) -> dict[str, dict[str, float]]:
    """``medians_s`` as :meth:`DriftModel.to_dict` wrote it: per step, per moment, a median
    above 0 (as :func:`_add` keeps them; a zero would be divided by when a step is priced), else
    a :class:`FieldError` naming the field."""
    if not isinstance(doc, Mapping):
        raise FieldError(field, f"must be an object, got {shown(doc)}")
    out: dict[str, dict[str, float]] = {}
    for key, moments in doc.items():
        if not isinstance(moments, Mapping):
            raise FieldError(f"{field}.{key}", f"must be an object, got {shown(moments)}")
        for moment, median in moments.items():
            if not is_number(median) or median <= 0:
                raise FieldError(
                    f"{field}.{key}.{moment}", f"a median time must be > 0, got {median!r}"
                )
        out[key] = {moment: float(median) for moment, median in moments.items()}
    return out


def _add(into: dict[str, dict[str, float]], key: str, where: str, median_s: float) -> None:
    if median_s > 0:
        into.setdefault(key, {})[where] = median_s


def _pooled_deviations(repeated: list[np.ndarray]) -> np.ndarray:
    """Each step's log-medians less their median, pooled and sorted."""
    if not repeated:
        return np.zeros(0)
    return np.sort(np.concatenate([logs - np.median(logs) for logs in repeated]))


def _device(row: pd.Series) -> str:
    """A record's device; records from before speed checks timed GPUs name none: the CPU."""
    device = row.get("params.device")
    return device if isinstance(device, str) else "cpu"


def _key(row: pd.Series) -> str:
    """The step key of a record (:func:`_step_key`); a one-line UserError naming the record
    when it lacks a field the key is made of (edited, or another tool's records): without a
    batch or thread count there is no key, and without a model the step would be one of its
    own."""
    for field in ("model", "batch", "threads"):
        if pd.isna(row.get(f"params.{field}")):
            where = f"{row.get('source', 'records')}:{row.get('source_line', '?')}"
            raise UserError(
                f"{where}: the {row.get('benchmark')} record {row.get('name')!r} lacks "
                f"params.{field}, which keys its step; re-run the benchmark"
            )  # fmt: skip
    return _step_key(row["params.model"], row["params.batch"], row["params.threads"], _device(row))


def _step_key(model: str, batch: Any, threads: Any, device: str = "cpu") -> str:
    """The key of one step's medians: ``mlp-b32-t1`` on the CPU, ``mlp-b32-gpu`` on a GPU
    (driven by one host thread, whatever the records say of threads)."""
    return f"{model}-b{int(batch)}-" + ("gpu" if device == "gpu" else f"t{int(threads)}")


def _key_device(key: str) -> str:
    return "gpu" if key.endswith("-gpu") else "cpu"
