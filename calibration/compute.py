"""Compute: an op's time from its FLOPs and bytes, per device and thread count, and thread scaling.

``ComputeModel().fit(df)`` reads "compute" records (names "op", "gemm", "triad") and fits, for
each device and thread count, the roofline of :mod:`calibration.roofline` (peak from the largest
GEMM, bandwidth from the triad, an efficiency-by-size curve per op class), and, per device, the
thread scaling of each phase (:mod:`calibration.scaling`: Amdahl and USL, one chosen). The
measured op table (:mod:`calibration.optable`) is kept beside them: ``op_time`` answers a
measured op from its own median, an unmeasured batch from the nearest measured one rescaled by
the curve, an unmeasured thread count through the phase's scaling law; ``predict`` answers any
(FLOPs, bytes) from the curves. Every fitted parameter carries a bootstrap interval over the
raw samples, every curve its fit quality with leave-one-out error.

A device without a GEMM (or triad) record at some thread count falls back to the best rate its
ops reached as the roof; the ``references`` of that curve say so.

``to_dict()`` (the profile's ``models.compute``)::

    {"modeler": "roofline_efficiency",
     "devices": {"cpu": {
         "threads": {"1": {"peak_flops_per_s", "bandwidth_bytes_per_s", "efficiency_max",
                           "half_efficiency_flops", "bandwidth_efficiency", "overhead_s",
                           "intervals": {<each of those>: {"low", "high", "confidence"}},
                           "classes": {"dense:forward": {"efficiency_max",
                                       "half_efficiency_flops", "intervals": {...}}},
                           "references": {"peak_source", "bandwidth_source", "gemm_flops",
                                          "triad_bytes"},
                           "quality": {FitQuality}}},
         "scaling": {"forward" | ... | "all": ScalingFit.to_dict()}}},
     "table": [OpTime.to_dict(), ...]}
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError

from .optable import NON_OP_PHASES, OpTime, op_class, read_op_table
from .profile_checks import FieldError
from .roofline import SCALARS, Roofline, fit_roofline
from .scaling import ALL, ScalingFit, phase_scaling
from .stats import Interval, bootstrap_params, fit_quality, leave_one_out, percentile_intervals

__all__ = ["ComputeModel"]


def _largest(rows: pd.DataFrame, column: str) -> pd.Series | None:
    return None if rows.empty else rows.loc[rows[column].astype(float).idxmax()]


def _contain(interval: Interval, value: float) -> dict[str, float]:
    return interval.including(float(value)).to_dict()


class ComputeModel:
    """Rooflines per (device, threads), thread scaling per device and phase, the op table."""

    def __init__(self, n_boot: int = 200, confidence: float = 0.95, seed: int = 0) -> None:
        self.n_boot, self.confidence, self.seed = n_boot, confidence, seed

    # ------------------------------------------------------------------------ fitting

    def fit(self, df: pd.DataFrame) -> ComputeModel:
        rows = df[(df["type"] == "measurement") & (df["benchmark"] == "compute")]
        for column, default in (("params.device", "cpu"), ("params.threads", 1)):
            values = rows[column] if column in rows else pd.Series(default, index=rows.index)
            rows = rows.assign(**{column: values.fillna(default)})
        ops = rows[rows["name"] == "op"]
        if ops.empty:
            raise UserError("no compute op records to fit the compute model from")
        self.table_ = read_op_table(ops)
        self.curves_: dict[tuple[str, int], Roofline] = {}
        self.intervals_: dict[tuple[str, int], dict[str, Any]] = {}
        self.quality_: dict[tuple[str, int], dict[str, Any]] = {}
        self.references_: dict[tuple[str, int], dict[str, Any]] = {}
        for device, threads in sorted({(e.device, e.threads) for e in self.table_}):
            here = rows[(rows["params.device"] == device) & (rows["params.threads"] == threads)]
            entries = [
                e
                for e in self.table_
                if (e.device, e.threads) == (device, threads) and e.phase not in NON_OP_PHASES
            ]
            if entries:
                self._fit_curve(device, threads, entries, here)
        self.scaling_ = {}
        for device in self.devices:
            entries = [e for e in self.table_ if e.device == device]
            fits = phase_scaling(entries, self.n_boot, self.seed, self.confidence)
            if fits:
                self.scaling_[device] = fits
        return self

    def _fit_curve(
        self, device: str, threads: int, entries: list[OpTime], here: pd.DataFrame
    ) -> None:
        gemm = _largest(here[here["name"] == "gemm"], "params.flops")
        triad = _largest(here[here["name"] == "triad"], "params.bytes")
        f = np.array([e.flops for e in entries])
        b = np.array([e.bytes for e in entries])
        labels = [e.op_class for e in entries]
        points = [np.asarray(r["samples"], float) for r in (gemm, triad) if r is not None]
        points += [np.asarray(e.samples, float) for e in entries]

        def roofs(medians: np.ndarray) -> tuple[float, float, np.ndarray]:
            i, t = 0, medians[-len(entries) :]
            peak, bw = np.max(f / t), np.max(b / t)  # without references: the best op's rates
            if gemm is not None:
                peak, i = float(gemm["params.flops"]) / medians[0], 1
            if triad is not None:
                bw = float(triad["params.bytes"]) / medians[i]
            return max(float(peak), 1.0), max(float(bw), 1.0), t

        medians = np.array([np.median(p) for p in points])
        peak, bw, t = roofs(medians)
        roof = fit_roofline(f, b, t, peak, bw, labels)

        def refit(m: np.ndarray) -> np.ndarray:
            p, w, tt = roofs(m)
            return fit_roofline(f, b, tt, p, w, labels, start=roof).vector()

        key = (device, threads)
        self.curves_[key] = roof
        self.intervals_[key] = self._intervals(roof, refit, points)

        def fit_predict(train: np.ndarray, y: np.ndarray, test: np.ndarray) -> np.ndarray:
            tr = [labels[i] for i in train]
            fitted = fit_roofline(f[train], b[train], y, peak, bw, tr, start=roof)
            return fitted.time_s(f[test], b[test], [labels[i] for i in test])

        pred = roof.time_s(f, b, labels)
        loo = leave_one_out(fit_predict, np.arange(t.size), t) if t.size >= 3 else None
        self.quality_[key] = fit_quality(t, pred, loo).to_dict()
        self.references_[key] = {
            "peak_source": "gemm" if gemm is not None else "best_op",
            "bandwidth_source": "triad" if triad is not None else "best_op",
            "gemm_flops": None if gemm is None else float(gemm["params.flops"]),
            "triad_bytes": None if triad is None else float(triad["params.bytes"]),
        }

    def _intervals(self, roof: Roofline, refit: Any, points: list[np.ndarray]) -> dict[str, Any]:
        if self.n_boot < 2:
            return {"scalars": {}, "classes": {}}
        rows = bootstrap_params(refit, points, self.n_boot, self.seed)
        found = percentile_intervals(rows, self.confidence)
        scalars = {k: _contain(i, getattr(roof, k)) for k, i in zip(SCALARS, found, strict=False)}
        classes, rest = {}, found[len(SCALARS) :]
        for j, (name, (e, h)) in enumerate(roof.classes.items()):
            classes[name] = {
                "efficiency_max": _contain(rest[2 * j], e),
                "half_efficiency_flops": _contain(rest[2 * j + 1], h),
            }
        return {"scalars": scalars, "classes": classes}

    # ------------------------------------------------------------------------ predicting

    @property
    def devices(self) -> list[str]:
        return sorted({d for d, _ in self.curves_})

    def _speedup(self, device: str, phase: str | None, threads: int) -> float:
        fits = self.scaling_.get(device, {})
        fit = fits.get(phase) or fits.get(ALL)
        return 1.0 if fit is None else float(fit.speedup_at(threads))

    def _nearest_threads(self, device: str, threads: int, have: set[int]) -> int:
        if not have:
            raise KeyError(f"nothing measured on device {device!r} (have {self.devices})")
        below = [n for n in have if n <= threads]
        return max(below) if below else min(have)

    def predict(
        self,
        flops: Any,
        nbytes: Any,
        threads: int = 1,
        device: str = "cpu",
        kind: str | None = None,
        phase: str | None = None,
    ) -> Any:
        """Seconds for ops of ``flops`` and ``nbytes`` from the fitted curves.

        ``kind`` and ``phase`` pick the op class's curve (the pooled one if that class was not
        measured); a thread count not measured uses the nearest one below, scaled by the
        phase's fitted speedup law.
        """
        have = {n for d, n in self.curves_ if d == device}
        ref = self._nearest_threads(device, threads, have)
        label = op_class(kind, phase) if kind and phase else None
        time = self.curves_[(device, ref)].time_s(flops, nbytes, label)
        if ref != threads:
            time = time * self._speedup(device, phase, ref) / self._speedup(device, phase, threads)
        return float(time) if np.ndim(time) == 0 else time

    def op_time(
        self,
        op: str,
        phase: str,
        batch: int,
        threads: int = 1,
        device: str = "cpu",
        model: str | None = None,
    ) -> float:
        """Seconds of a measured op: its median where measured at this batch and thread count."""
        entries = [
            e
            for e in self.table_
            if (e.op, e.phase, e.device) == (op, phase, device) and model in (None, e.model)
        ]
        if not entries:
            raise KeyError(f"op {op!r} phase {phase!r} was not measured on {device!r}")
        models = {e.model for e in entries}
        if len(models) > 1:
            raise KeyError(f"op {op!r} was measured in several models {sorted(models)}: say which")
        ref = self._nearest_threads(device, threads, {e.threads for e in entries})
        if ref != threads:
            time = self.op_time(op, phase, batch, ref, device, model)
            return time * self._speedup(device, phase, ref) / self._speedup(device, phase, threads)
        here = sorted((e for e in entries if e.threads == threads), key=lambda e: e.batch)
        near = min(here, key=lambda e: (abs(np.log(e.batch / batch)), e.batch))
        if near.batch == batch:
            return near.time_s
        flops = near.flops * batch / near.batch
        nbytes = near.bytes * batch / near.batch
        if len({e.batch for e in here}) >= 2:  # weights do not scale with batch
            slope, intercept = np.polyfit([e.batch for e in here], [e.bytes for e in here], 1)
            nbytes = max(slope * batch + intercept, 0.0)
        curve = self.curves_[(device, threads)]
        ratio = curve.time_s(flops, nbytes, near.op_class) / curve.time_s(
            near.flops, near.bytes, near.op_class
        )
        return float(near.time_s * ratio)

    # ------------------------------------------------------------------------ serialising

    def quality_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (device, threads), quality in self.quality_.items():
            out.setdefault(device, {})[str(threads)] = quality
        return out

    def to_dict(self) -> dict[str, Any]:
        devices: dict[str, Any] = {}
        for (device, threads), roof in self.curves_.items():
            entry = roof.to_dict()
            found = self.intervals_[(device, threads)]
            entry["intervals"] = found["scalars"]
            for name, intervals in found["classes"].items():
                entry["classes"][name]["intervals"] = intervals
            entry["references"] = self.references_[(device, threads)]
            entry["quality"] = self.quality_[(device, threads)]
            slot = devices.setdefault(device, {"threads": {}, "scaling": {}})
            slot["threads"][str(threads)] = entry
        for device, fits in self.scaling_.items():
            devices[device]["scaling"] = {phase: fit.to_dict() for phase, fit in fits.items()}
        return {
            "modeler": "roofline_efficiency",
            "devices": devices,
            "table": [e.to_dict() for e in self.table_],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ComputeModel:
        model = cls()
        model.table_ = [OpTime.from_dict(e) for e in doc["table"]]
        model.curves_, model.intervals_, model.quality_, model.references_ = {}, {}, {}, {}
        model.scaling_ = {}
        for device, slot in doc["devices"].items():
            for threads, entry in slot["threads"].items():
                key = (device, _thread_count(f"devices.{device}.threads.{threads}", threads))
                model.curves_[key] = Roofline.from_dict(entry)
                classes = {
                    name: c.get("intervals", {}) for name, c in entry.get("classes", {}).items()
                }
                model.intervals_[key] = {"scalars": entry.get("intervals", {}), "classes": classes}
                model.quality_[key] = entry.get("quality", {})
                model.references_[key] = entry.get("references", {})
            if slot.get("scaling"):
                model.scaling_[device] = {}
                for phase, fit in slot["scaling"].items():
                    try:
                        model.scaling_[device][phase] = ScalingFit.from_dict(fit)
                    except FieldError as exc:
                        raise exc.within(f"devices.{device}.scaling.{phase}") from None
        return model


def _thread_count(field: str, key: Any) -> int:
    """A ``threads`` key of the profile's compute section as the count it names: text of a
    whole number >= 1 ("2"); a hand edit to "0" would be priced as a measured thread count,
    and "x" names no count at all."""
    if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) >= 1):
        raise FieldError(field, f"a thread count must be a whole number >= 1, got {key!r}")
    return int(key)
