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
the compute model's error on a network it never saw: the term's quality, and the band's spread.

**The band's spread has two parts**, because the step has two parts that err differently: the
kernels, priced from tables and scaled by the factor, and the glue, Python whose cost moves with
the op's kind and the interpreter's state. With ``g`` a step's glue share (its glue over its
predicted step), its log error is drawn with sigma ``hypot(sigma_kernels (1 - g),
sigma_glue g)``, the two spreads fitted to the leave-one-out residuals, each network at the
glue share its left-out fit gave it, by maximum likelihood (normal errors, independent parts),
each with a 95% profile-likelihood interval.
A step of large kernels then gets the kernels' spread, a step of tiny calls the glue's; one
spread for both had to be the wider for every step.

``to_dict()`` (the profile's ``models.kernels.step_terms``)::

    {"<threads>": {"factor", "per_op_s", "per_step_s", "sigma_kernels", "sigma_glue",
                   "intervals": {"factor" | "per_op_s" | "per_step_s" | "sigma_kernels"
                                 | "sigma_glue": {"low", "high"}},
                   "points": [[kernels_s, op_calls, step_s], ...]}}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from .stats import fit_quality, nonneg_relative_fit, robust_sigma

__all__ = ["StepTerms", "fit", "fit_step_terms"]

_NAMES = ("factor", "per_op_s", "per_step_s")
_SPREAD_BOUNDS = (1e-4, 5.0)  # log sigmas the spreads' fit may reach: exact to wild


@dataclass(frozen=True)
class StepTerms:
    """The interplay factor and the glue at one thread count, and the log spreads of a
    left-out step's kernels and glue (module docstring)."""

    factor: float = 1.0
    per_op_s: float = 0.0
    per_step_s: float = 0.0
    sigma_kernels: float = 0.0  # log spread of a left-out step's kernel part
    sigma_glue: float = 0.0  # log spread of a left-out step's glue part
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    points: tuple[tuple[float, int, float], ...] = ()  # (kernels_s, op_calls, step_s) fitted

    def step_s(self, kernels_s: float, op_calls: int) -> float:
        """A step's seconds from its kernels' table seconds and its op calls."""
        return kernels_s * self.factor + self.glue_s(op_calls)

    def glue_s(self, op_calls: int) -> float:
        """The glue's seconds of a step of ``op_calls`` op calls."""
        return self.per_op_s * op_calls + self.per_step_s

    def sigma(self, kernels_s: float, op_calls: int) -> float:
        """The log sigma of the error of a step of ``kernels_s`` table seconds and
        ``op_calls`` op calls, from its glue share (module docstring)."""
        step = self.step_s(kernels_s, op_calls)
        share = self.glue_s(op_calls) / step if step > 0 else 0.0
        return math.hypot(self.sigma_kernels * (1.0 - share), self.sigma_glue * share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "per_op_s": self.per_op_s,
            "per_step_s": self.per_step_s,
            "sigma_kernels": self.sigma_kernels,
            "sigma_glue": self.sigma_glue,
            "intervals": self.intervals,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> StepTerms:
        """The terms of a profile; one from before the two spreads has them fitted again from
        its points, or, with too few, both at its single ``sigma``."""
        terms = cls(
            factor=float(doc.get("factor", 1.0)),
            per_op_s=float(doc.get("per_op_s", 0.0)),
            per_step_s=float(doc.get("per_step_s", 0.0)),
            sigma_kernels=float(doc.get("sigma_kernels", doc.get("sigma", 0.0))),
            sigma_glue=float(doc.get("sigma_glue", doc.get("sigma", 0.0))),
            intervals=dict(doc.get("intervals", {})),
            points=tuple((float(a), int(n), float(s)) for a, n, s in doc.get("points", [])),
        )
        if "sigma_kernels" in doc or not terms.points:
            return terms
        left_out = _left_out(np.asarray(terms.points, dtype=float))
        return terms if left_out is None else _with_spreads(terms, *left_out)


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


def _separable(rows: np.ndarray) -> bool:
    """Whether rows (kernels, ops, step) can separate the factor from the glue."""
    return len(rows) >= len(_NAMES) and len({int(n) for n in rows[:, 1]}) >= 2


def _left_out(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's step predicted by the terms fitted without it, and its glue share in that
    prediction (None from fewer rows than a left-out fit needs)."""
    if len(rows) <= len(_NAMES) + 1 or not _separable(rows):
        return None
    design = _design(rows[:, 0], rows[:, 1])
    predicted, shares = np.empty(len(rows)), np.empty(len(rows))
    for i in range(len(rows)):
        kept = np.delete(rows, i, axis=0)
        x, _ = nonneg_relative_fit(_design(kept[:, 0], kept[:, 1]), kept[:, 2])
        predicted[i] = max(float(design[i] @ x), 1e-12)
        shares[i] = min((x[1] * rows[i, 1] + x[2]) / predicted[i], 1.0)
    return predicted, shares


def _spreads(
    residuals: np.ndarray, shares: np.ndarray
) -> tuple[float, float, dict[str, dict[str, float]]]:
    """``sigma_kernels`` and ``sigma_glue`` of log residuals at their glue shares, by maximum
    likelihood (module docstring), and their 95% profile-likelihood intervals (each the range
    where twice the likelihood's fall, the other spread refitted, stays under chi-square(1)'s
    95% point; a side the rows cannot bound reaches the fit's limit). Both start at the
    residuals' robust spread, so a part no row shows stays there, with an interval that says
    so."""
    start = min(max(robust_sigma(residuals), _SPREAD_BOUNDS[0]), _SPREAD_BOUNDS[1])
    limits = np.log(_SPREAD_BOUNDS)

    def nll(log_sigmas: np.ndarray) -> float:
        kernels, glue = np.exp(log_sigmas)
        var = (kernels * (1.0 - shares)) ** 2 + (glue * shares) ** 2
        return float(0.5 * np.sum(residuals**2 / var + np.log(var)))

    bounds = [tuple(limits)] * 2
    best = optimize.minimize(nll, np.log([start, start]), method="L-BFGS-B", bounds=bounds)
    level = float(stats.chi2.ppf(0.95, 1))
    intervals: dict[str, dict[str, float]] = {}
    for i, name in enumerate(("sigma_kernels", "sigma_glue")):

        def fall(value: float, i: int = i) -> float:
            def at(other: float) -> float:
                pair = np.empty(2)
                pair[i], pair[1 - i] = value, other
                return nll(pair)

            refit = optimize.minimize_scalar(at, bounds=tuple(limits), method="bounded")
            return 2.0 * (min(refit.fun, at(best.x[1 - i])) - best.fun) - level

        here, edges = float(best.x[i]), []
        for end in limits:
            inside = fall(float(end)) <= 0.0 or here == end
            edges.append(float(end) if inside else optimize.brentq(fall, *sorted((here, end))))
        intervals[name] = {"low": float(np.exp(edges[0])), "high": float(np.exp(edges[1]))}
    kernels, glue = np.exp(best.x)
    return float(kernels), float(glue), intervals


def _with_spreads(terms: StepTerms, predicted: np.ndarray, shares: np.ndarray) -> StepTerms:
    """``terms`` with the spreads of its points' left-out predictions and their intervals."""
    times = np.asarray(terms.points, dtype=float)[:, 2]
    kernels, glue, intervals = _spreads(np.log(predicted / times), shares)
    return replace(terms, sigma_kernels=kernels, sigma_glue=glue,
                   intervals={**terms.intervals, **intervals})  # fmt: skip


def fit(
    points: list[tuple[float, int, float]], priced: Sequence[float] | None = None
) -> tuple[StepTerms, dict[str, Any] | None]:
    """The step terms of rows (alone_s, op_calls, step_s) at one thread count, fitted on
    ``priced``, each row's kernels' table seconds (default: their seconds alone; module
    docstring), with the spreads from each row predicted by a fit without it, and that
    leave-one-out quality (None from fewer rows than a left-out fit needs)."""
    rows = np.asarray(points, dtype=float)
    if priced is not None:
        rows = np.column_stack([np.asarray(priced, dtype=float), rows[:, 1:]])
    if not _separable(rows):
        kept = tuple((float(k), int(o), float(s)) for k, o, s in rows)
        return StepTerms(points=kept), None  # glue and factor cannot be separated
    terms = _fit(rows)
    left_out = _left_out(rows)
    if left_out is None:
        return terms, None
    design = _design(rows[:, 0], rows[:, 1])
    fitted = design @ np.array([terms.factor, terms.per_op_s, terms.per_step_s])
    return _with_spreads(terms, *left_out), fit_quality(rows[:, 2], fitted, left_out[0]).to_dict()


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
