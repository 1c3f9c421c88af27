"""Overlap: how much of an allreduce hides behind computation, and what each costs the other.

From "interference" records (``comm_alone``, ``compute_alone``, ``both`` per method, message
size, rank count and compute target; :mod:`microbench.interference`), per point:

* overlap fraction, IMB-NBC's definition: max(0, min(1, (t_comm + t_cpu - t_both) /
  min(t_comm, t_cpu))), the share of the shorter activity that ran hidden under the longer;
  when the computation is the longer (backward against a gradient bucket) it is the share of
  the allreduce that is hidden, which is what :meth:`OverlapModel.hidden_fraction` answers;
* compute slowdown: the computation's own time inside ``both`` over its time alone;
* comm slowdown: the communication thread's own Allreduce time inside ``both`` over the same
  alone (thread method only: a non-blocking collective's duration is not observable).

t are medians; intervals come from the bootstrap over every raw sample stream
(:func:`calibration.stats.bootstrap_intervals`). Across message sizes a method's figures are
interpolated in log size and held constant beyond the measured range; several compute targets
at one size are combined by their median, or the nearest is used when the caller says how long
its computation is. Points at one rank measure MPI's local copy, not a network: they are used
only when no point has more ranks, and the model says so (``ranks``).

``to_dict()`` (``models.overlap``): ``{"definition": "imb_nbc", "ranks", "methods": {method:
{figure: {"bytes": [...], "values": [...]}}}, "points": [OverlapPoint.to_dict(), ...]}``, the
figures being ``overlap_fraction``, ``compute_slowdown`` and ``comm_slowdown``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError

from .stats import Interval, bootstrap_intervals

__all__ = ["OverlapModel", "OverlapPoint", "overlap_fraction"]

_KEYS = ("method", "bytes", "ranks", "threads", "compute_s_target")
FIGURES = ("overlap_fraction", "compute_slowdown", "comm_slowdown")


def overlap_fraction(t_comm: float, t_cpu: float, t_both: float) -> float:
    """IMB-NBC's overlap, as a fraction in [0, 1]."""
    return float(max(0.0, min(1.0, (t_comm + t_cpu - t_both) / min(t_comm, t_cpu))))


@dataclass(frozen=True)
class OverlapPoint:
    """One method at one size, rank count and compute target; ``comm_slowdown`` None for nbc."""

    method: str
    bytes: int
    ranks: int
    threads: int
    compute_s_target: float
    comm_s: float
    compute_s: float
    both_s: float
    overlap_fraction: float
    compute_slowdown: float
    comm_slowdown: float | None
    intervals: dict[str, Interval]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["intervals"] = {k: v.to_dict() for k, v in self.intervals.items()}
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> OverlapPoint:
        values = {k: doc[k] for k in cls.__dataclass_fields__ if k != "intervals"}
        intervals = {k: Interval.from_dict(v) for k, v in (doc.get("intervals") or {}).items()}
        return cls(**values, intervals=intervals)


def _samples(value: Any) -> np.ndarray | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    array = np.asarray(value, dtype=float).ravel()
    return array if array.size else None


def _figures(m: np.ndarray, thread: bool) -> np.ndarray:
    """[overlap, compute slowdown, comm slowdown (NaN for nbc)] from the stream medians:
    comm alone, compute alone, both, compute inside both, then comm inside both and alone."""
    comm_slow = m[4] / m[5] if thread else np.nan
    return np.array([overlap_fraction(m[0], m[1], m[2]), m[3] / m[1], comm_slow])


class OverlapModel:
    """Overlap fraction and slowdowns per method and message size; ``fit(df)`` on records."""

    def __init__(self, n_boot: int = 200, confidence: float = 0.95, seed: int = 0) -> None:
        self.n_boot, self.confidence, self.seed = n_boot, confidence, seed

    def fit(self, df: pd.DataFrame) -> OverlapModel:
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "interference")]
        if rows.empty:
            raise UserError("no interference records to fit the overlap model from")
        keys = [f"params.{k}" for k in _KEYS]
        missing = [k for k in keys if k not in rows]
        if missing:
            raise UserError(f"interference records lack {', '.join(missing)}")
        points = []
        for key, group in rows.groupby(keys, dropna=False):
            by_name = {row["name"]: row for _, row in group.iterrows()}
            if not {"comm_alone", "compute_alone", "both"} <= by_name.keys():
                continue
            points.append(self._point(dict(zip(_KEYS, key, strict=True)), by_name))
        if not points:
            raise UserError("interference records hold no complete (alone, alone, both) triple")
        self.ranks_ = max(p.ranks for p in points)
        self.points_ = sorted(
            (p for p in points if p.ranks == self.ranks_ or self.ranks_ < 2),
            key=lambda p: (p.method, p.bytes, p.compute_s_target, p.ranks),
        )
        return self

    def _point(self, key: dict[str, Any], rows: dict[str, pd.Series]) -> OverlapPoint:
        thread = key["method"] == "thread"
        streams = [_samples(rows[n]["samples"]) for n in ("comm_alone", "compute_alone", "both")]
        streams.append(_samples(rows["both"].get("compute_samples")))
        if streams[3] is None:  # no side timing: the computation inside both is unknown
            streams[3] = streams[1]
        if thread:
            inside = _samples(rows["both"].get("comm_samples"))
            alone = _samples(rows["comm_alone"].get("comm_samples"))
            thread = inside is not None and alone is not None
            streams += [inside, alone] if thread else []
        medians = np.array([np.median(s) for s in streams])
        values = _figures(medians, thread)
        intervals = {}
        if self.n_boot >= 2:
            found = bootstrap_intervals(
                lambda m: _figures(m, thread), streams, self.n_boot, self.seed, self.confidence
            )
            for name, value, interval in zip(FIGURES, values, found, strict=True):
                if np.isfinite(value):
                    intervals[name] = interval.including(float(value))
        return OverlapPoint(
            method=str(key["method"]),
            bytes=int(key["bytes"]),
            ranks=int(key["ranks"]),
            threads=int(key["threads"]),
            compute_s_target=float(key["compute_s_target"]),
            comm_s=float(medians[0]),
            compute_s=float(medians[1]),
            both_s=float(medians[2]),
            overlap_fraction=float(values[0]),
            compute_slowdown=float(values[1]),
            comm_slowdown=float(values[2]) if thread else None,
            intervals=intervals,
        )

    # ------------------------------------------------------------------------ predicting

    @property
    def methods(self) -> list[str]:
        return sorted({p.method for p in self.points_})

    def _curve(self, method: str, figure: str, compute_s: float | None) -> tuple[list, list]:
        chosen = [p for p in self.points_ if p.method == method]
        if not chosen:
            raise KeyError(f"no overlap measured for method {method!r} (have {self.methods})")
        sizes, values = [], []
        for size in sorted({p.bytes for p in chosen}):
            here = [p for p in chosen if p.bytes == size and getattr(p, figure) is not None]
            if not here:
                continue
            if compute_s is not None:
                nearest = min(here, key=lambda p: abs(np.log(p.compute_s_target / compute_s)))
                here = [p for p in here if p.compute_s_target == nearest.compute_s_target]
            sizes.append(size)
            values.append(float(np.median([getattr(p, figure) for p in here])))
        return sizes, values

    def _interpolate(self, nbytes: Any, method: str, figure: str, compute_s: float | None):
        sizes, values = self._curve(method, figure, compute_s)
        if not sizes:
            return None
        x = np.log(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        out = np.interp(x, np.log(sizes), values)
        return float(out) if np.ndim(out) == 0 else out

    def hidden_fraction(self, nbytes: Any, method: str = "thread", compute_s: float | None = None):
        """Share of an allreduce of ``nbytes`` hidden behind a longer computation, in [0, 1]."""
        return self._interpolate(nbytes, method, "overlap_fraction", compute_s)

    def compute_slowdown(self, nbytes: Any, method: str = "thread", compute_s: float | None = None):
        """Factor (>= ~1) by which a concurrent allreduce of ``nbytes`` slows the computation."""
        return self._interpolate(nbytes, method, "compute_slowdown", compute_s)

    def comm_slowdown(self, nbytes: Any, method: str = "thread", compute_s: float | None = None):
        """Factor by which computation slows the allreduce; None where not observable (nbc)."""
        return self._interpolate(nbytes, method, "comm_slowdown", compute_s)

    # ------------------------------------------------------------------------ serialising

    def quality_dict(self) -> dict[str, Any]:
        """No curve is fitted; how well the overlaps are resolved is their intervals' width."""
        widths = [
            p.intervals["overlap_fraction"].high - p.intervals["overlap_fraction"].low
            for p in self.points_
            if "overlap_fraction" in p.intervals
        ]
        return {
            "n_points": len(self.points_),
            "median_overlap_interval_width": float(np.median(widths)) if widths else None,
        }

    def to_dict(self) -> dict[str, Any]:
        methods = {}
        for method in self.methods:
            entry: dict[str, Any] = {}
            for figure in FIGURES:
                sizes, values = self._curve(method, figure, None)
                entry[figure] = {"bytes": sizes, "values": values}
            methods[method] = entry
        return {
            "definition": "imb_nbc",
            "ranks": self.ranks_,
            "methods": methods,
            "points": [p.to_dict() for p in self.points_],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> OverlapModel:
        model = cls()
        model.ranks_ = int(doc["ranks"])
        model.points_ = [OverlapPoint.from_dict(p) for p in doc["points"]]
        return model
