"""What a training step costs beyond its kernels, fitted from the step benchmark alone.

A step's kernels, each timed alone with its operands left in cache by itself, do not add up to
the step (:mod:`microbench.kernelbench`, "step"). Two physical effects make the difference:

* **Interplay** ``factor``: inside a step each kernel finds the caches holding the previous
  kernel's data, not its own, and the next kernel's operands not yet there; its time is the
  alone time times a factor (about 1.2-1.3 on a small shared VM).
* **Glue** ``per_op_s``, ``per_step_s``: the Python between kernels (the layer's method, the
  array allocations, numba dispatch), per op call (a layer's forward or backward, the loss, the
  update) and per step.

Per thread count, one least-squares fit in relative error (:func:`calibration.stats.
nonneg_relative_fit`) of ``step = factor * kernels + per_op_s * op_calls + per_step_s`` over the
benchmark's networks: tiny ones that pin the glue, random ones at random batches that pin the
factor. ``kernels`` is what a prediction multiplies: the network's kernels priced by the kernel
tables (its calls timed alone where no tables are given). The tables, timed over and over on
operands a call leaves in cache, price a step's calls a few percent below the same calls timed
once each after other work; fitted on the calls alone, the factor missed that and every network
left out came out 2-8% fast. Fitted on the tables' price, the factor is the step over what the
tables say, interplay and that table bias together, and the tables' error on each network is
part of the fit's scatter. Each parameter has a 95% interval from the fit's covariance (Student
t on the residual variance). Each network is then predicted as a workload never seen is: priced
by the tables, with the factor and glue fitted without it. Those leave-one-out log residuals are
the compute model's error on a network it never saw: the term's quality, and ``sigma``, their
robust spread, which the prediction band draws for the whole step.

``to_dict()`` (the profile's ``models.kernels.step_terms``)::

    {"<threads>": {"factor", "per_op_s", "per_step_s", "sigma",
                   "intervals": {"factor" | "per_op_s" | "per_step_s": {"low", "high"}},
                   "points": [[kernels_s, op_calls, step_s], ...]}}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .stats import fit_quality, nonneg_relative_fit, robust_sigma

__all__ = ["StepTerms", "fit", "fit_step_terms"]

_NAMES = ("factor", "per_op_s", "per_step_s")


@dataclass(frozen=True)
class StepTerms:
    """The interplay factor and the glue at one thread count (module docstring)."""

    factor: float = 1.0
    per_op_s: float = 0.0
    per_step_s: float = 0.0
    sigma: float = 0.0  # log spread of the leave-one-out residuals, tables priced
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    points: tuple[tuple[float, int, float], ...] = ()  # (kernels_s, op_calls, step_s) fitted

    def step_s(self, kernels_s: float, op_calls: int) -> float:
        """A step's seconds from its kernels' table seconds and its op calls."""
        return kernels_s * self.factor + self.per_op_s * op_calls + self.per_step_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "per_op_s": self.per_op_s,
            "per_step_s": self.per_step_s,
            "sigma": self.sigma,
            "intervals": self.intervals,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> StepTerms:
        return cls(
            factor=float(doc.get("factor", 1.0)),
            per_op_s=float(doc.get("per_op_s", 0.0)),
            per_step_s=float(doc.get("per_step_s", 0.0)),
            sigma=float(doc.get("sigma", 0.0)),
            intervals=dict(doc.get("intervals", {})),
            points=tuple((float(a), int(n), float(s)) for a, n, s in doc.get("points", [])),
        )


def _design(kernels: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """The fit's columns (kernels' seconds, op calls, 1), one row per network."""
    return np.column_stack([kernels, ops, np.ones(len(ops))])


def _fit(points: np.ndarray) -> StepTerms:
    """The three parameters of rows (kernels, ops, step) with their 95% intervals (no
    leave-one-out: see :func:`fit`)."""
    design, times = _design(points[:, 0], points[:, 1]), points[:, 2]
    x, rss = nonneg_relative_fit(design, times)
    n, p = design.shape
    intervals: dict[str, dict[str, float]] = {}
    if n > p:
        weighted = design / times[:, None]
        cov = rss / (n - p) * np.linalg.pinv(weighted.T @ weighted)
        half = float(stats.t.ppf(0.975, n - p)) * np.sqrt(np.clip(np.diag(cov), 0.0, None))
        for name, value, h in zip(_NAMES, x, half, strict=True):
            intervals[name] = {"low": max(float(value - h), 0.0), "high": float(value + h)}
    return StepTerms(*(float(v) for v in x), intervals=intervals,
                     points=tuple((float(a), int(o), float(s)) for a, o, s in points))  # fmt: skip


def fit(
    points: list[tuple[float, int, float]], priced: Sequence[float] | None = None
) -> tuple[StepTerms, dict[str, Any] | None]:
    """The step terms of rows (alone_s, op_calls, step_s) at one thread count, fitted on
    ``priced``, each row's kernels' table seconds (default: their seconds alone; module
    docstring), with ``sigma`` from each row predicted by a fit without it, and that
    leave-one-out quality (None from fewer rows than a left-out fit needs)."""
    rows = np.asarray(points, dtype=float)
    if priced is not None:
        rows = np.column_stack([np.asarray(priced, dtype=float), rows[:, 1:]])
    if len(rows) < len(_NAMES) or len({int(n) for n in rows[:, 1]}) < 2:
        kept = tuple((float(k), int(o), float(s)) for k, o, s in rows)
        return StepTerms(points=kept), None  # glue and factor cannot be separated
    terms = _fit(rows)
    if len(rows) <= len(_NAMES) + 1:
        return terms, None
    design = _design(rows[:, 0], rows[:, 1])
    fitted = design @ np.array([terms.factor, terms.per_op_s, terms.per_step_s])
    left_out = np.empty(len(rows))
    for i in range(len(rows)):
        kept = np.delete(rows, i, axis=0)
        x, _ = nonneg_relative_fit(_design(kept[:, 0], kept[:, 1]), kept[:, 2])
        left_out[i] = design[i] @ x
    residuals = np.log(np.maximum(left_out, 1e-12) / rows[:, 2])
    terms = replace(terms, sigma=robust_sigma(residuals))
    return terms, fit_quality(rows[:, 2], fitted, left_out).to_dict()


def fit_step_terms(
    rows: pd.DataFrame, price: Callable[[str, int, int], float] | None = None
) -> tuple[dict[int, StepTerms], dict[str, Any]]:
    """Step terms per thread count from the kernel sweep's "step" and "step_alone" records
    (one of each per network and thread count), and their leave-one-out quality per thread
    count; ``price(workload_json, batch, threads)``: a network's kernels' table seconds, for
    the leave-one-out predictions (:func:`fit`)."""
    keys = ["params.threads", "params.workload_json", "params.batch", "params.op_calls"]
    if rows.empty or not set(keys) <= set(rows.columns):
        return {}, {}
    if "source" in rows:  # a step pairs with its calls alone from the same sweep, not another's
        keys.append("source")
    medians = rows[keys + ["name"]].assign(median=[float(np.median(s)) for s in rows["samples"]])
    steps = medians[medians["name"] == "step"].drop(columns="name")
    alone = medians[medians["name"] == "step_alone"].drop(columns="name")
    joined = steps.merge(alone, on=keys, suffixes=("_step", "_alone"))
    out: dict[int, StepTerms] = {}
    quality: dict[str, Any] = {}
    for threads, part in joined.groupby("params.threads"):
        points = list(zip(part["median_alone"], part["params.op_calls"].astype(int),
                          part["median_step"], strict=True))  # fmt: skip
        priced = None
        if price is not None:
            networks = zip(part["params.workload_json"], part["params.batch"], strict=True)
            priced = [price(str(w), int(b), int(threads)) for w, b in networks]
        out[int(threads)], q = fit(points, priced)
        if q is not None:
            quality[str(int(threads))] = q
    return out, quality
