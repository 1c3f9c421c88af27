"""Collective models across process counts: which algorithm, with which link parameters.

:class:`CollectiveModel` fits the cost formulas of :mod:`calibration.formulas` (ring, recursive
doubling, Rabenseifner, binomial, ...) to every measured ``(p, n, t)`` point of one collective
and picks the algorithm that best predicts **a process count it did not see**
(leave-one-process-count-out cross-validation): that is the extrapolation a cluster prediction
makes, from the 2-8 ranks a profile was measured at to hundreds.

* Fits are in relative error with ``a, b >= 0`` (:func:`calibration.stats.nonneg_relative_fit`).
  ``g`` (time per byte reduced) is not identifiable from one collective's timings (see
  :mod:`calibration.formulas`): it is fixed, at 0 unless given, and ``b`` absorbs it.
* Size regimes: MPI libraries switch algorithm and protocol by message size, so the sizes may be
  split where the Hockney fit (:class:`calibration.hockney.HockneyModel`) of the reference
  process count (the smallest with the most sizes) finds its regimes, each regime with its own
  algorithm and parameters. The split is kept when its cross-validated error beats one regime
  for all sizes by more than 5% plus the measurement noise.
* With one process count nothing can be cross-validated: each regime takes the usual large-message
  algorithm (:data:`calibration.formulas.DEFAULT_ALGORITHM`) and ``cv_error_`` is None.
* Points at one rank are left out: nothing moves, the time is a local copy.
* Two-level model: points whose ``ranks_per_node < ranks`` are fitted with the hierarchical
  formulas (:func:`calibration.formulas.two_level_coefficients`), intra-node ``a, b`` shared with
  the single-node points and inter-node ``a, b`` of their own. Records from one node cannot
  determine inter-node parameters: give them (a network preset) as ``inter_node``, and
  :meth:`CollectiveModel.predict` uses them for placements that span nodes.
* Intervals: bootstrap over the raw samples, algorithm and regimes held fixed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .collective_regimes import CollectiveRegime, InterNode, regime_indices, regime_times
from .formulas import ALGORITHMS, DEFAULT_ALGORITHM, design
from .hockney import HockneyModel
from .profile_checks import FieldError, shown, whole_count
from .readers import collective_points
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

__all__ = ["CollectiveModel", "CollectiveRegime", "InterNode"]  # the last two re-exported

_NOISE_DEFAULT = 0.005


class _Points:
    """The measured points of one collective as arrays (p >= 2 only)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.p = frame["ranks"].to_numpy(float)
        self.q = np.minimum(frame["ranks_per_node"].to_numpy(float), self.p)
        self.n = frame["bytes"].to_numpy(float)
        self.t = frame["median_s"].to_numpy(float)
        self.samples = list(frame["samples"])
        self.multi = self.q < self.p
        self.group = np.array([f"{int(a)}/{int(b)}" for a, b in zip(self.p, self.q, strict=True)])


class CollectiveModel:
    """Algorithm and link parameters of one collective across process counts and sizes.

    ``fit(df)`` takes records (:func:`microbench.records.load_dataframe`) or
    :func:`calibration.readers.collective_points` and returns self. Fitted: ``regimes_``
    (:class:`CollectiveRegime`, ascending sizes), ``algorithm_`` and ``params_`` (per regime),
    ``cv_error_`` (mean relative error of each point predicted from the other process counts,
    None with one), ``quality_``, ``hockney_`` (per ``(ranks, ranks_per_node)``),
    ``selection_`` (which process counts were oversubscribed among them). ``inter_node``:
    given inter-node parameters, used across nodes when the records came from one node.
    ``drop_oversubscribed``: leave out points with more ranks on a node than it has cores
    (their times show cores time-shared, which no network model extrapolates).
    """

    def __init__(
        self,
        op: str,
        g_s_per_byte: float | None = None,
        inter_node: InterNode | None = None,
        max_regimes: int = 4,
        parsimony: float = 0.05,
        n_boot: int = 200,
        seed: int = 0,
        confidence: float = 0.95,
        drop_oversubscribed: bool = False,
    ) -> None:
        if op not in ALGORITHMS:
            raise ValueError(f"no cost formulas for {op!r}; known: {', '.join(ALGORITHMS)}")
        self.op, self.g_s_per_byte, self.inter_node = op, g_s_per_byte, inter_node
        self.max_regimes, self.parsimony = max_regimes, parsimony
        self.n_boot, self.seed, self.confidence = n_boot, seed, confidence
        self.drop_oversubscribed = drop_oversubscribed

    # ------------------------------------------------------------------------------- fit
    def _candidates(self, pts: _Points, idx: np.ndarray) -> list[tuple[str, str | None]]:
        inters: list[str | None] = [None]
        if np.any(pts.multi[idx]):
            inters = list(ALGORITHMS[self.op])
        return [(alg, inter) for alg in ALGORITHMS[self.op] for inter in inters]

    def _solve(self, pts: _Points, cand: tuple[str, str | None], idx: np.ndarray, t: np.ndarray):
        x, offset = design(self.op, cand[0], cand[1], pts.p[idx], pts.q[idx], pts.n[idx], self._g)
        return nonneg_relative_fit(x, t, offset)[0]

    def _predict_points(self, pts, cand, theta, idx) -> np.ndarray:
        x, offset = design(self.op, cand[0], cand[1], pts.p[idx], pts.q[idx], pts.n[idx], self._g)
        return x @ theta + offset

    def _held_out(self, pts: _Points, cand: tuple[str, str | None], idx: np.ndarray):
        """Each point of ``idx`` predicted from the other process counts (None: one group)."""
        groups = pts.group[idx]
        if np.unique(groups).size < 2:
            return None
        pred = np.empty(idx.size)
        for label in np.unique(groups):
            out = groups == label
            theta = self._solve(pts, cand, idx[~out], pts.t[idx[~out]])
            pred[out] = self._predict_points(pts, cand, theta, idx[out])
        return pred

    def _fit_regimes(self, pts: _Points, bounds: list[np.ndarray]) -> tuple[list, Any]:
        """Choose and fit each regime; returns (choices, pooled held-out predictions or None)."""
        choices, held = [], np.full(pts.t.size, np.nan)
        for idx in bounds:
            scores: dict[tuple[str, str | None], float | None] = {}
            preds = {}
            for cand in self._candidates(pts, idx):
                pred = self._held_out(pts, cand, idx)
                preds[cand] = pred
                scores[cand] = (
                    None if pred is None else float(np.mean(np.abs(pred - pts.t[idx]) / pts.t[idx]))
                )
            valid = {c: s for c, s in scores.items() if s is not None}
            if valid:
                chosen = min(valid, key=valid.get)
                held[idx] = preds[chosen]
            else:
                default = DEFAULT_ALGORITHM[self.op]
                chosen = next(c for c in scores if c[0] == default and c[1] in (None, default))
            choices.append((idx, chosen, scores))
        return choices, (held if np.all(np.isfinite(held)) else None)

    def fit(self, df: pd.DataFrame) -> CollectiveModel:
        points = collective_points(df)
        points = points[points["op"] == self.op]
        ones = int((points["ranks"] < 2).sum())
        points = points[points["ranks"] >= 2].reset_index(drop=True)
        crowded = points[points["oversubscribed"]] if "oversubscribed" in points else points[:0]
        if self.drop_oversubscribed:
            points = points.drop(crowded.index).reset_index(drop=True)
        if points.empty:
            raise FitError(f"{self.op}: no measurements at 2 or more ranks to fit")
        if not np.all(points["median_s"].to_numpy() > 0):
            raise FitError(f"{self.op}: a measured time is not positive")
        self._g = 0.0 if self.g_s_per_byte is None else float(self.g_s_per_byte)
        pts = _Points(points)
        self.hockney_ = self._fit_hockney(points)
        segmentations = {"single": [np.arange(pts.t.size)]}
        edges = self._reference_switches()
        if edges.size:
            which = np.searchsorted(edges, pts.n, side="right")
            split = [np.flatnonzero(which == r) for r in range(edges.size + 1)]
            segmentations["split"] = [s for s in split if s.size]
        fitted = {name: self._fit_regimes(pts, b) for name, b in segmentations.items()}
        errors = {
            name: None if held is None else float(np.mean(np.abs(held - pts.t) / pts.t))
            for name, (_, held) in fitted.items()
        }
        scored = {name: e for name, e in errors.items() if e is not None}
        if scored:  # one regime for all sizes unless the split is clearly better
            noise = float(np.median(median_relative_se(pts.samples))) or _NOISE_DEFAULT
            limit = min(scored.values()) * (1 + self.parsimony) + noise
            single = scored.get("single", np.inf) <= limit
            name = "single" if single else min(scored, key=scored.__getitem__)
        else:  # nothing to cross-validate: trust the Hockney regimes (validated over sizes)
            name = "split" if "split" in fitted else "single"
        choices, held = fitted[name]
        self.regimes_ = [self._finish(pts, idx, cand, scores) for idx, cand, scores in choices]
        self.cv_error_ = errors[name]
        self.selection_ = {
            "segmentation": name,
            "criterion": "leave-one-process-count-out mean relative error",
            "cv_rel_error_by_segmentation": errors,
            "process_counts": sorted(set(pts.group.tolist())),
            "left_out_one_rank_points": ones,
            "oversubscribed_process_counts": sorted(
                {
                    f"{p}/{q}"
                    for p, q in zip(crowded["ranks"], crowded["ranks_per_node"], strict=True)
                }
            ),
        }
        self.quality_ = fit_quality(pts.t, self._predict_arrays(pts.n, pts.p, pts.q), held)
        return self

    def _fit_hockney(self, points: pd.DataFrame) -> dict[tuple[int, int], HockneyModel]:
        fits = {}
        for (p, q), group in points.groupby(["ranks", "ranks_per_node"]):
            if group["bytes"].nunique() >= 2:
                model = HockneyModel(self.max_regimes, n_boot=self.n_boot, seed=self.seed)
                fits[(int(p), int(q))] = model.fit(
                    group["bytes"], group["median_s"], list(group["samples"])
                )
        return fits

    def _reference_switches(self) -> np.ndarray:
        """Regime switches of the reference Hockney fit: the single-node process count with the
        most sizes, the smallest such (the least disturbed by oversubscription)."""
        if not self.hockney_:
            return np.array([])
        single = [k for k in self.hockney_ if k[1] >= k[0]] or list(self.hockney_)
        ref = min(single, key=lambda k: (-self.hockney_[k].quality_.n_points, k))
        return np.asarray(self.hockney_[ref].breakpoints_bytes_, dtype=float)

    def _finish(self, pts: _Points, idx: np.ndarray, cand, scores) -> CollectiveRegime:
        theta = self._solve(pts, cand, idx, pts.t[idx])
        names = ["a_s", "b_s_per_byte", "a_inter_s", "b_inter_s_per_byte"][: theta.size]
        intervals: dict[str, Interval] = {}
        if self.n_boot > 0:
            rounds = bootstrap_params(
                lambda medians: self._solve(pts, cand, idx, medians),
                [pts.samples[i] for i in idx],
                self.n_boot,
                self.seed,
            )
            found = percentile_intervals(rounds, self.confidence)
            for name, ci, value in zip(names, found, theta, strict=True):
                intervals[name] = ci.including(value)
        inter = None
        if cand[1] is not None:
            inter_ci = {
                key: intervals[name]
                for key, name in (("a_s", "a_inter_s"), ("b_s_per_byte", "b_inter_s_per_byte"))
                if name in intervals
            }
            inter = InterNode(float(theta[2]), float(theta[3]), cand[1], "fitted", inter_ci)
        return CollectiveRegime(
            min_bytes=int(pts.n[idx].min()),
            max_bytes=int(pts.n[idx].max()),
            algorithm=cand[0],
            a_s=float(theta[0]),
            b_s_per_byte=float(theta[1]),
            g_s_per_byte=self._g,
            intervals={k: v for k, v in intervals.items() if k in ("a_s", "b_s_per_byte")},
            cv_rel_error=scores[cand],
            candidates={_label(c): s for c, s in scores.items()},
            inter=inter,
        )

    # --------------------------------------------------------------------------- predict
    def predict(self, nbytes: Any, ranks: Any, ranks_per_node: Any = None) -> np.ndarray:
        """Predicted seconds (arrays broadcast). ``ranks_per_node`` None: all on one node;
        fewer than ``ranks``: the two-level model (needs inter-node parameters)."""
        n, p = np.broadcast_arrays(np.asarray(nbytes, float), np.asarray(ranks, float))
        q = p if ranks_per_node is None else np.asarray(ranks_per_node, float)
        q = np.where(np.isnan(q), p, np.broadcast_to(q, p.shape))
        return self._predict_arrays(n.ravel(), p.ravel(), q.ravel()).reshape(p.shape)

    def regime_for(self, nbytes: float) -> CollectiveRegime:
        """The size regime ``nbytes`` falls in."""
        return self.regimes_[int(regime_indices(self.regimes_, nbytes))]

    def _predict_arrays(self, n: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        return regime_times(self.op, self.regimes_, self.inter_node, n, p, q)

    @property
    def algorithm_(self) -> list[str]:
        """The chosen algorithm of each regime (ascending sizes)."""
        return [r.algorithm for r in self.regimes_]

    @property
    def params_(self) -> list[dict[str, float]]:
        """``a_s``, ``b_s_per_byte``, ``g_s_per_byte`` of each regime."""
        return [
            {"a_s": r.a_s, "b_s_per_byte": r.b_s_per_byte, "g_s_per_byte": r.g_s_per_byte}
            for r in self.regimes_
        ]

    # ------------------------------------------------------------------------ to/from dict
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "collective_algorithms",
            "op": self.op,
            "g_source": "given" if self.g_s_per_byte is not None else "absorbed into b",
            "regimes": [r.to_dict() for r in self.regimes_],
            "inter_node": None if self.inter_node is None else self.inter_node.to_dict(),
            "cv_rel_error": self.cv_error_,
            "selection": self.selection_,
            "quality": self.quality_.to_dict(),
            "hockney": [
                {"ranks": p, "ranks_per_node": q, "fit": m.to_dict()}
                for (p, q), m in sorted(self.hockney_.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectiveModel:
        inter = data.get("inter_node")
        regimes = [CollectiveRegime.from_dict(r) for r in data["regimes"]]
        if not regimes:
            raise ValueError(f"{data.get('op')}: a collective model needs at least one regime")
        for i, regime in enumerate(regimes):
            _check_regime(str(data["op"]), i, regime)
        g = regimes[0].g_s_per_byte if data.get("g_source") == "given" else None
        model = cls(str(data["op"]), g, None if inter is None else InterNode.from_dict(inter))
        model.regimes_ = regimes
        model._g = regimes[0].g_s_per_byte
        cv = data.get("cv_rel_error")
        model.cv_error_ = None if cv is None else float(cv)
        model.selection_ = dict(data.get("selection") or {})
        model.quality_ = FitQuality.from_dict(data["quality"])
        stored = data.get("hockney") or []
        if not isinstance(stored, list):
            raise FieldError("hockney", f"must be a list, got {shown(stored)}")
        model.hockney_ = {
            _hockney_key(i, h): HockneyModel.from_dict(h["fit"]) for i, h in enumerate(stored)
        }
        return model


def _check_regime(op: str, i: int, regime: CollectiveRegime) -> None:
    """A stored regime's algorithm is one of ``op``'s formulas and its sizes a range (a
    :class:`FieldError` naming the field: a hand edit would else extrapolate by another law or
    send every size to the wrong regime)."""
    known = ALGORITHMS.get(op, {})
    if known and regime.algorithm not in known:
        raise FieldError(f"regimes[{i}].algorithm", f"{shown(regime.algorithm)} is not an "
                         f"algorithm of {op}; one of {', '.join(known)}")  # fmt: skip
    if regime.min_bytes < 0:
        raise FieldError(f"regimes[{i}].min_bytes", f"must be >= 0, got {regime.min_bytes}")
    if regime.max_bytes < regime.min_bytes:
        raise FieldError(f"regimes[{i}].max_bytes", f"{regime.max_bytes} is below min_bytes "
                         f"{regime.min_bytes}: a regime's sizes are a range")  # fmt: skip


def _hockney_key(i: int, entry: Any) -> tuple[int, int]:
    """``(ranks, ranks_per_node)`` of the ``i``-th stored Hockney fit: whole counts, at least
    one rank per node and no more than the ranks (:class:`FieldError` naming the field, else
    a hand edit would silently move the ranks per node the collectives' pace is held at,
    :func:`pdlsim.costmodel.profile_links.collective_ranks_per_node`)."""
    if not isinstance(entry, dict):
        raise FieldError(f"hockney[{i}]", f"must be an object, got {shown(entry)}")
    ranks, per_node = (
        whole_count(f"hockney[{i}].{key}", entry.get(key), 1) for key in ("ranks", "ranks_per_node")
    )
    if per_node > ranks:
        raise FieldError(f"hockney[{i}].ranks_per_node", f"{per_node} ranks per node of "
                         f"{ranks} ranks; a node holds at most all the ranks")  # fmt: skip
    return ranks, per_node


def _label(cand: tuple[str, str | None]) -> str:
    return cand[0] if cand[1] is None else f"{cand[0]}+inter:{cand[1]}"
