"""What a training step costs beyond its kernels, fitted from the step benchmark alone.

A step's kernels, each timed alone with its operands left in cache by itself, do not add up to
the step (:mod:`microbench.kernelbench`, "step"). Two physical effects make the difference:

* **Interplay** ``factor``: inside a step each kernel finds the caches holding the previous
  kernel's data, not its own, and the next kernel's operands not yet there; its time is the
  alone time times a factor (about 1.1-1.25 on a small shared VM).
* **Glue** ``per_<kind>_op_s``, ``per_step_s``: the Python between kernels (the layer's method,
  its array views, numba dispatch), per op call (a layer's forward or backward, the loss, the
  update) by the kind of op, which sets how much Python it runs (:data:`OP_KINDS`: a dense
  op's, a convolution's, any other's), and per step.

One least-squares fit in relative error (:func:`calibration.stats.nonneg_relative_fit`) of
``step = factor(threads) * alone + sum over kinds of per_<kind>_op_s * ops of that kind +
per_step_s`` over the benchmark's networks at every thread count: tiny ones of both kinds that
pin the glue, random ones at random batches that pin the factors. The glue is one for all
thread counts (an op's Python runs on the calling thread whatever the kernels' threads; fitted
per thread count, it was lost at two threads in the noise of numba's parallel launches). Each
parameter has a 95% interval from the fit's covariance (Student t on the residual variance).

Each network is then predicted as a workload never seen is: its kernels priced by the kernel
tables (not timed alone), times the factor, plus the glue, both fitted without it. Those
leave-one-out log residuals are the compute model's error on a network it never saw, tables
included: the term's quality, and ``sigma`` per thread count, their robust spread, which the
prediction band draws for the whole step.

``to_dict()`` (the profile's ``models.kernels.step_terms``)::

    {"<threads>": {"factor", "per_dense_op_s", "per_conv_op_s", "per_other_op_s",
                   "per_step_s", "sigma", "intervals": {"<parameter>": {"low", "high"}},
                   "points": [[alone_s, dense ops, conv ops, other ops, step_s], ...]}}

(the glue and its intervals the same at every thread count).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from microbench.kernels.calls import op_calls
from microbench.workload import LayerInfo, Workload

from .stats import fit_quality, nonneg_relative_fit, robust_sigma

__all__ = ["OP_KINDS", "StepTerms", "fit", "fit_step_terms", "op_kinds"]

OP_KINDS = ("dense", "conv", "other")  # the glue's op kinds: how much Python an op runs
_GLUE = tuple(f"per_{kind}_op_s" for kind in OP_KINDS)
_NAMES = ("factor", *_GLUE, "per_step_s")


def op_kinds(
    workload: Workload, training: bool = True, layers: Sequence[LayerInfo] | None = None
) -> list[str]:
    """The :data:`OP_KINDS` kind of each of ``op_calls(workload, training, layers)``."""
    kind = {info.index: info.kind for info in (workload.layers if layers is None else layers)}
    named = {"dense": "dense", "conv2d": "conv"}
    return [
        named.get(kind.get(layer, ""), "other") for layer, _ in op_calls(workload, training, layers)
    ]


def _counts(kinds: Sequence[str]) -> tuple[int, ...]:
    return tuple(sum(k == kind for k in kinds) for kind in OP_KINDS)


@dataclass(frozen=True)
class StepTerms:
    """The interplay factor and the glue at one thread count (module docstring)."""

    factor: float = 1.0
    per_dense_op_s: float = 0.0
    per_conv_op_s: float = 0.0
    per_other_op_s: float = 0.0
    per_step_s: float = 0.0
    sigma: float = 0.0  # log spread of the leave-one-out residuals, tables priced
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    points: tuple[tuple[float, ...], ...] = ()  # (alone_s, dense, conv, other ops, step_s)

    def per_op_s(self, kind: str) -> float:
        """The glue of one op call of ``kind`` (:data:`OP_KINDS`)."""
        return float(getattr(self, f"per_{kind}_op_s"))

    def step_s(self, kernels_s: float, kinds: Sequence[str]) -> float:
        """A step's seconds from its kernels' seconds alone and its ops' kinds."""
        glue = sum(self.per_op_s(kind) for kind in kinds) + self.per_step_s
        return kernels_s * self.factor + glue

    def to_dict(self) -> dict[str, Any]:
        return {
            **{name: float(getattr(self, name)) for name in _NAMES},
            "sigma": self.sigma,
            "intervals": self.intervals,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> StepTerms:
        return cls(
            **{name: float(doc.get(name, 1.0 if name == "factor" else 0.0)) for name in _NAMES},
            sigma=float(doc.get("sigma", 0.0)),
            intervals=dict(doc.get("intervals", {})),
            points=tuple(tuple(float(v) for v in p) for p in doc.get("points", [])),
        )


def _design(rows: np.ndarray, threads: Sequence[int], kernels: np.ndarray) -> np.ndarray:
    """Columns (kernels at each of ``threads``, dense ops, conv ops, other ops, 1) of rows
    (threads, alone, dense, conv, other, step), their kernels' seconds ``kernels``."""
    factors = [np.where(rows[:, 0] == t, kernels, 0.0) for t in threads]
    return np.column_stack([*factors, rows[:, 2:5], np.ones(len(rows))])


def _intervals(
    design: np.ndarray, times: np.ndarray, x: np.ndarray, rss: float
) -> list[float | None]:
    """95% half-widths of ``x``, fitted in relative error, from the fit's covariance (Student
    t on the residual variance); None from no more rows than parameters."""
    n, p = design.shape
    if n <= p:
        return [None] * p
    weighted = design / times[:, None]
    cov = rss / (n - p) * np.linalg.pinv(weighted.T @ weighted)
    return list(float(stats.t.ppf(0.975, n - p)) * np.sqrt(np.clip(np.diag(cov), 0.0, None)))


def fit(
    points: Sequence[Sequence[float]], priced: Sequence[float] | None = None
) -> tuple[dict[int, StepTerms], dict[str, Any]]:
    """The step terms per thread count from rows (threads, alone_s, dense ops, conv ops, other
    ops, step_s): one fit, a factor per thread count and the glue shared by all (the Python of
    an op runs on the calling thread, whatever the kernels' threads). ``sigma`` and the quality
    per thread count come from each row predicted by a fit without it from ``priced``, its
    kernels' table seconds (default: their seconds alone). A thread count whose rows cannot
    separate the factor from the glue (fewer than two op mixes) or too few rows in all: kernels
    as alone, no glue, no quality."""
    rows = np.asarray(points, dtype=float).reshape(-1, 6)
    threads = sorted({int(t) for t in rows[:, 0]})
    if len(rows) <= len(threads) + len(OP_KINDS) + 1 or len({tuple(r[2:5]) for r in rows}) < 2:
        return {t: StepTerms() for t in threads}, {}
    basis = rows[:, 1] if priced is None else np.asarray(priced, dtype=float)
    x, rss = nonneg_relative_fit(_design(rows, threads, rows[:, 1]), rows[:, 5])
    fitted = _design(rows, threads, basis) @ x
    left_out = np.empty(len(rows))
    for i in range(len(rows)):
        kept = np.delete(rows, i, axis=0)
        xi, _ = nonneg_relative_fit(_design(kept, threads, kept[:, 1]), kept[:, 5])
        left_out[i] = (_design(rows[i : i + 1], threads, basis[i : i + 1]) @ xi)[0]
    half = _intervals(_design(rows, threads, rows[:, 1]), rows[:, 5], x, rss)
    names = [*(f"factor@{t}" for t in threads), *_NAMES[1:]]
    intervals = {
        name: {"low": max(float(v - h), 0.0), "high": float(v + h)}
        for name, v, h in zip(names, x, half, strict=True)
        if h is not None
    }
    glue = dict(zip(_NAMES[1:], (float(v) for v in x[len(threads) :]), strict=True))
    out: dict[int, StepTerms] = {}
    quality: dict[str, Any] = {}
    for j, t in enumerate(threads):
        mine = rows[:, 0] == t
        residuals = np.log(np.maximum(left_out[mine], 1e-12) / rows[mine, 5])
        own = {"factor": intervals.get(f"factor@{t}")} if f"factor@{t}" in intervals else {}
        out[t] = StepTerms(
            factor=float(x[j]), **glue, sigma=robust_sigma(residuals),
            intervals={**own, **{k: intervals[k] for k in _NAMES[1:] if k in intervals}},
            points=tuple(tuple(map(float, r[1:])) for r in rows[mine]),
        )  # fmt: skip
        if mine.sum() > 1:
            quality[str(t)] = fit_quality(rows[mine, 5], fitted[mine], left_out[mine]).to_dict()
    return out, quality


def fit_step_terms(
    rows: pd.DataFrame, price: Callable[[Workload, int, int], float] | None = None
) -> tuple[dict[int, StepTerms], dict[str, Any]]:
    """Step terms per thread count from the kernel sweep's "step" and "step_alone" records
    (one of each per network and thread count), and their leave-one-out quality per thread
    count; ``price(workload, batch, threads)``: a network's kernels' table seconds, for the
    leave-one-out predictions (:func:`fit`)."""
    keys = ["params.threads", "params.workload_json", "params.batch"]
    if rows.empty or not set(keys) <= set(rows.columns):
        return {}, {}
    medians = rows[keys + ["name"]].assign(median=[float(np.median(s)) for s in rows["samples"]])
    steps = medians[medians["name"] == "step"].drop(columns="name")
    alone = medians[medians["name"] == "step_alone"].drop(columns="name")
    joined = steps.merge(alone, on=keys, suffixes=("_step", "_alone"))
    workloads = [
        Workload.from_dict(json.loads(text), "step benchmark network")
        for text in joined["params.workload_json"]
    ]
    points = [
        (int(t), a, *_counts(op_kinds(w)), step)
        for t, a, w, step in zip(joined["params.threads"], joined["median_alone"], workloads,
                                 joined["median_step"], strict=True)
    ]  # fmt: skip
    priced = None
    if price is not None:
        batches = joined["params.batch"].astype(int)
        priced = [price(w, int(b), int(p[0])) for w, b, p in zip(workloads, batches, points,
                                                                    strict=True)]  # fmt: skip
    return fit(points, priced)
