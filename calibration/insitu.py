"""Collectives in place: what each collective of a real training step costs where training
calls it (``python -m microbench insitu``, :mod:`microbench.insitu`).

The collectives section times each op back to back. Inside a step the same op and size cost more
(caches filled by the layers' compute, the gather's copy into the activation), for small calls
several times more. That is not a property of the op and its size alone: the same call costs
several times more after a large convolution than after a small dense layer (evidence:
docs/evidence.md, "Collectives in place"). So this model keeps each measured call as a point,
keyed by what the simulator knows when it prices the call: the workload, the parallelism
(``data``: the gradient allreduce; ``model``: the layer-wise allgathers and allreduces), the op,
the layer and the batch, at the ranks measured.

A point is the median over steps of the per-step minimum over ranks (the rank that arrived
last waits for nobody: the call's own cost), with its distribution-free 95% interval and the
mean seconds a rank spent waiting in the call beyond it. The benchmark takes a point's steps in
rounds, moments seconds apart (:func:`microbench.insitu.sample_rounds`), because the same call
costs up to 2x more at one moment than at another on a shared machine; the point's median is
over all of them, the machine's typical state, and each round's median over it is one draw of
the state: the pooled log-deviations (``log_deviations_``) are what the prediction band draws
the in-place cost from (:func:`pdlsim.costmodel.uncertainty.insitu_draw`).
:meth:`InSituModel.seconds` interpolates a call's time linearly in the batch between measured
batches (held at the nearest measured batch outside them);
:class:`pdlsim.costmodel.model.ProfileCostModel` adds its excess over the back-to-back prediction
to the collective, at any scale.

**The step's skew.** The benchmark also times each rank's compute before the step's barrier (op
``compute``, not a collective, so not a point). Its median over ranks and steps goes on the
barrier's point as ``compute_s``, and :meth:`InSituModel.wait_fraction` is the barrier's mean
wait over it: the ranks' skew as a share of the step's compute, measured in the step training
runs (:func:`pdlsim.costmodel.insitu.in_place_sync` sizes the jitter model's sync by it). A mean
over 100 steps is moved by the few in which a rank was held up, so one batch's share can come out
several times the trainer's in one calibration and near it in the next, while the trainer's
holds steady across batches (evidence: docs/evidence.md, "Skew in place"); the share is pooled
over the batches measured (the waits' sum over the computes' sum), three times the steps.

**Co-location in place.** Rank 0 also times its compute of each step alone right after each
round's steps, while the other ranks idle (statistic ``alone``; layer-wise its own slices with
the collectives local). Each round's median of the ranks' compute in place over its median
alone is the co-location factor of that moment, taken seconds apart and so free of the
machine's speed; their median over rounds goes on the barrier's point as ``colocation``
(:meth:`InSituModel.colocations`): how much the other ranks and the step's collectives slow a
rank's compute, where the jitter benchmark's 2-rank steps have no collective between them.

**A layer-wise rank's share.** Layer-wise, rank 0 also times the whole network's same step
alone (statistic ``whole``: the unsplit network, by the same code on one rank). Each round's
median of its part alone over the whole alone is the share of the network's compute a rank's
slices take, free of the machine's speed; their median over rounds goes on the barrier's point
as ``share`` (:meth:`InSituModel.shares`).

**The update in place.** Data parallel, the benchmark also times the SGD update after the
allreduce (op ``update``), which the ranks run together on what the reduction just wrote. Its
median over ranks and steps goes on the barrier's point as ``update_s``, and
:meth:`InSituModel.update_fraction` is its share of the compute before the barrier: both taken
in the same steps, so the share holds whatever the machine's speed was.

``to_dict()``: ``{"model": "insitu", "points": [{"workload", "parallel", "op", "layer",
"batch", "ranks", "ranks_per_node", "threads", "bytes", "median_s", "wait_s", "n_samples",
"rounds", "intervals": {"median_s": {"low", "high", "confidence"}}}], "log_deviations": [...]}``
and ``compute_s``, ``update_s``, ``colocation`` and ``share`` on barrier points (profiles
written before rounds lack ``rounds`` and ``log_deviations``: one round, none; before the
compute, the update, the compute alone or the whole network alone was timed, ``compute_s``,
``update_s``, ``colocation`` or ``share``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from microbench.insitu import split_rounds
from microbench.measurement import Measurement

from .readers import _measurements

__all__ = ["InSituModel", "InSituPoint"]

_KEYS = ("workload", "parallel", "op", "layer", "batch", "ranks", "ranks_per_node", "threads")
OWN_WORK = ("compute", "update")  # a rank's own work in the step: not a collective, not a point


@dataclass(frozen=True)
class InSituPoint:
    """One collective of one step, measured in place (module docstring)."""

    workload: str
    parallel: str
    op: str
    layer: str
    batch: int
    ranks: int
    ranks_per_node: int
    threads: int
    bytes: int
    median_s: float
    ci_low_s: float
    ci_high_s: float
    wait_s: float
    n_samples: int
    rounds: int = 1  # the moments its samples were taken at
    compute_s: float | None = None  # barrier points: the ranks' compute before it (median)
    update_s: float | None = None  # data-parallel barrier points: the update in place (median)
    colocation: float | None = None  # barrier points: compute in place / alone
    share: float | None = None  # layer-wise barrier points: rank 0's part alone / the whole's


def _step_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A point's key (:data:`_KEYS`) without its op and layer: the step it was timed in."""
    return key[:2] + key[4:]


def _own_medians(table: pd.DataFrame, op: str) -> dict[tuple[Any, ...], float]:
    """Per step (:func:`_step_key`): the median over every rank and step of its own work
    ``op`` (:data:`OWN_WORK`)."""
    rows = table[(table["op"] == op) & (table["statistic"] == "per_rank")]
    out = {}
    for key, group in rows.groupby(list(_KEYS), sort=True):
        samples = np.concatenate([np.asarray(s, dtype=float) for s in group["samples"]])
        out[_step_key(key)] = float(np.median(samples))
    return out


def _rounds_of(samples: Any, rounds: int) -> list[np.ndarray]:
    """A record's samples cut into its rounds (:func:`microbench.insitu.split_rounds`)."""
    values = np.asarray(samples, dtype=float)
    return np.split(values, np.cumsum(split_rounds(len(values), rounds))[:-1])


def _round_ratios(
    table: pd.DataFrame, numerator: str, denominator: str
) -> dict[tuple[Any, ...], float]:
    """Per step (:func:`_step_key`) whose op ``compute`` has both statistics: the median over
    rounds of the round's median of ``numerator`` (``per_rank``: every rank's samples) over
    its median of ``denominator`` (module docstring)."""
    out = {}
    rows = table[table["op"] == "compute"]
    for key, group in rows.groupby(list(_KEYS), sort=True):
        over = group[group["statistic"] == denominator]
        parts = group[group["statistic"] == numerator]
        if over.empty or parts.empty:
            continue
        rounds = int(group["rounds"].iloc[0])
        lone = _rounds_of(over["samples"].iloc[0], rounds)
        tops = [_rounds_of(s, rounds) for s in parts["samples"]]
        ratios = [
            np.median(np.concatenate([top[r] for top in tops])) / np.median(lone[r])
            for r in range(min(len(lone), *(len(top) for top in tops)))
        ]
        if ratios:
            out[_step_key(key)] = float(np.median(ratios))
    return out


class InSituModel:
    """Every measured in-place collective (``points_``); ``fit(df)`` returns self."""

    def __init__(self) -> None:
        self.points_: list[InSituPoint] = []
        self.log_deviations_ = np.zeros(0)

    def fit(self, df: pd.DataFrame) -> InSituModel:
        rows = _measurements(
            df,
            "insitu",
            ("params.statistic", "params.model", "params.layer", "samples"),
            "run `python -m microbench insitu` under mpiexec or `pdlsim bench`",
        )
        rounds_of = rows["params.rounds"] if "params.rounds" in rows.columns else None
        columns = {
            "workload": "params.model", "parallel": "params.parallel", "op": "name",
            "layer": "params.layer", "batch": "params.batch", "ranks": "params.ranks",
            "ranks_per_node": "params.ranks_per_node", "threads": "params.threads",
        }  # fmt: skip
        table = pd.DataFrame({key: rows[col] for key, col in columns.items()})
        table["statistic"], table["samples"] = rows["params.statistic"], rows["samples"]
        table["bytes"] = rows["params.bytes"]
        table["rounds"] = 1 if rounds_of is None else rounds_of.fillna(1).astype(int)
        points, deviations = [], []
        computes, updates = _own_medians(table, "compute"), _own_medians(table, "update")
        colocations = _round_ratios(table, "per_rank", "alone")
        shares = _round_ratios(table, "alone", "whole")
        for key, group in table.groupby(list(_KEYS), sort=True):
            own = group[group["statistic"] == "min_over_ranks"]
            if own.empty or key[2] in OWN_WORK:
                continue
            samples = np.concatenate([np.asarray(s, float) for s in own["samples"]])
            moments = [
                float(np.median(part))
                for s, r in zip(own["samples"], own["rounds"], strict=True)
                for part in _rounds_of(s, r)
            ]
            ranks = group[group["statistic"] == "per_rank"]["samples"]
            mean_in_call = [float(np.mean(s)) for s in ranks]
            wait = float(np.mean(mean_in_call)) - float(np.mean(samples)) if mean_in_call else 0.0
            measured = Measurement(samples)
            ci = measured.median_ci()
            fields = dict(zip(_KEYS, key, strict=True))
            points.append(
                InSituPoint(
                    **{k: (v if k in ("workload", "parallel", "op", "layer") else int(v))
                       for k, v in fields.items()},
                    bytes=int(own["bytes"].iloc[0]),
                    median_s=measured.median,
                    ci_low_s=float(ci.low),
                    ci_high_s=float(ci.high),
                    wait_s=max(wait, 0.0),
                    n_samples=measured.n,
                    rounds=len(moments),
                    compute_s=computes.get(_step_key(key)) if key[2] == "barrier" else None,
                    update_s=updates.get(_step_key(key)) if key[2] == "barrier" else None,
                    colocation=colocations.get(_step_key(key)) if key[2] == "barrier" else None,
                    share=shares.get(_step_key(key)) if key[2] == "barrier" else None,
                )
            )  # fmt: skip
            if len(moments) >= 2:
                deviations += list(np.log(np.asarray(moments) / measured.median))
        self.points_ = points
        self.log_deviations_ = np.sort(np.asarray(deviations, dtype=float))
        return self

    def moment_sigma(self) -> float:
        """The standard deviation of the rounds' log-deviations (0 with fewer than two)."""
        return float(np.std(self.log_deviations_, ddof=1)) if self.log_deviations_.size > 1 else 0.0

    def calls(self, workload: str, parallel: str) -> list[InSituPoint]:
        """The points of one workload and parallelism at the most ranks measured on one node
        (those are the ones a node of the cluster runs like)."""
        found = [p for p in self.points_ if p.workload == workload and p.parallel == parallel]
        one_node = [p for p in found if p.ranks_per_node >= p.ranks] or found
        if not one_node:
            return []
        most = max(p.ranks for p in one_node)
        return [p for p in one_node if p.ranks == most]

    def seconds(
        self, workload: str, parallel: str, op: str, layer: str, batch: int
    ) -> tuple[float, InSituPoint] | None:
        """The call's in-place seconds at ``batch`` (interpolated, module docstring) and the
        nearest measured point (its ranks and placement); None where it was not measured."""
        found = sorted(
            (p for p in self.calls(workload, parallel) if p.op == op and p.layer == layer),
            key=lambda p: p.batch,
        )
        if not found:
            return None
        batches = np.array([p.batch for p in found], dtype=float)
        seconds = float(np.interp(batch, batches, [p.median_s for p in found]))
        nearest = found[int(np.argmin(np.abs(batches - batch)))]
        return seconds, nearest

    def wait_fraction(
        self, workload: str, parallel: str, batch: int
    ) -> tuple[float, InSituPoint] | None:
        """The step barrier's mean wait over the ranks' compute before it, pooled over the
        batches measured (their waits' sum over their computes' sum: module docstring), and
        the point nearest ``batch``; None where the profile did not time the compute with the
        barrier."""
        found = [p for p in self.calls(workload, parallel) if p.op == "barrier" and p.compute_s]
        if not found:
            return None
        nearest = min(found, key=lambda p: (abs(p.batch - batch), p.batch))
        return sum(p.wait_s for p in found) / sum(p.compute_s for p in found), nearest

    def update_fraction(
        self, workload: str, parallel: str, batch: int
    ) -> tuple[float, InSituPoint] | None:
        """The update in place over the ranks' compute before the barrier at ``batch``
        (interpolated like :meth:`seconds`) and the nearest measured point; None where the
        profile did not time the update (module docstring)."""
        return self._share_of_compute(workload, parallel, batch, lambda p: p.update_s)

    def colocations(self, workload: str, parallel: str) -> list[InSituPoint]:
        """The barrier points of one workload and parallelism that carry a co-location factor
        in place (module docstring), by batch; none where rank 0 did not time its compute
        alone."""
        return self._carrying(workload, parallel, "colocation")

    def shares(self, workload: str, parallel: str) -> list[InSituPoint]:
        """The barrier points of one layer-wise step that carry rank 0's share of the whole
        network's compute (module docstring), by batch; none where rank 0 did not time both
        alone."""
        return self._carrying(workload, parallel, "share")

    def _carrying(self, workload: str, parallel: str, name: str) -> list[InSituPoint]:
        found = (p for p in self.calls(workload, parallel) if getattr(p, name) is not None)
        return sorted(found, key=lambda p: p.batch)

    def _share_of_compute(
        self,
        workload: str,
        parallel: str,
        batch: int,
        part: Callable[[InSituPoint], float | None],
    ) -> tuple[float, InSituPoint] | None:
        found = sorted(
            (
                p
                for p in self.calls(workload, parallel)
                if p.op == "barrier" and p.compute_s and part(p) is not None
            ),
            key=lambda p: p.batch,
        )
        if not found:
            return None
        batches = np.array([p.batch for p in found], dtype=float)
        fractions = [part(p) / p.compute_s for p in found]
        nearest = found[int(np.argmin(np.abs(batches - batch)))]
        return float(np.interp(batch, batches, fractions)), nearest

    def quality_dict(self) -> dict[str, Any]:
        """Per op: the points and the widest relative 95% interval of their medians."""
        out: dict[str, Any] = {}
        for op in sorted({p.op for p in self.points_}):
            mine = [p for p in self.points_ if p.op == op]
            widest = max((p.ci_high_s - p.ci_low_s) / p.median_s for p in mine)
            out[op] = {"n_points": len(mine), "max_rel_ci_width": float(widest)}
        out["moments"] = {"n": int(self.log_deviations_.size), "sigma": self.moment_sigma()}
        return out

    def to_dict(self) -> dict[str, Any]:
        points = []
        for p in self.points_:
            doc = asdict(p)
            for optional in ("compute_s", "update_s", "colocation", "share"):
                if doc[optional] is None:
                    del doc[optional]
            low, high = doc.pop("ci_low_s"), doc.pop("ci_high_s")
            doc["intervals"] = {"median_s": {"low": low, "high": high, "confidence": 0.95}}
            points.append(doc)
        return {
            "model": "insitu", "points": points,
            "log_deviations": [float(d) for d in self.log_deviations_],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InSituModel:
        model = cls()
        model.log_deviations_ = np.sort(np.asarray(data.get("log_deviations", []), dtype=float))
        for doc in data["points"]:
            fields = {k: v for k, v in doc.items() if k != "intervals"}
            ci = doc["intervals"]["median_s"]
            model.points_.append(InSituPoint(**fields, ci_low_s=ci["low"], ci_high_s=ci["high"]))
        return model
