"""The machine's compute model: what each kernel costs, fitted from the kernel sweep alone.

``KernelModel().fit(df)`` reads the "kernels" records (:mod:`microbench.kernelbench`) and
holds two measured terms, each with a physical meaning and its own benchmark:

* **Kernel tables**: a GEMM's seconds over (m, n, k) per layout and thread count, a loop's over
  (elements, inner run) per driver and thread count (:mod:`calibration.kernel_tables`).
  :meth:`KernelModel.call_s` prices any :class:`~microbench.kernels.calls.KernelCall` from them.
* **Glue** (:attr:`KernelModel.glue_`): the Python between kernels, per op call (an op's forward
  or backward, the loss, the update) and per step, fitted by least squares to tiny networks'
  steps less their kernels' table times, with 95% intervals.

Each table's neighbour residuals (a grid point predicted from its neighbours) give the relative
error of a shape between grid points (:attr:`KernelModel.spread_`), which the prediction band
uses.

**Its own generalisation** (:attr:`KernelModel.quality_`, the profile's fit quality): the
tables' neighbour errors pooled per family (each point predicted without itself); the glue with
each tiny network left out of its fit in turn; and whole training steps (``microbench speed``'s
``step_compute``: forward, backward and update of the calibration's workloads at its batches
and thread counts) against the model's price of them, per workload, batch and thread count.
The model fits nothing to any workload or batch, so every step is a leave-one-workload-out and
leave-one-batch-out prediction: its in-sample and leave-out errors are the same by construction.

``to_dict()`` (the profile's ``models.kernels``)::

    {"modeler": "kernel_tables",
     "gemm": {"<layout>": {"<threads>": GemmTable.to_dict()}},
     "loops": {"<variant>": {"<threads>": LoopTable.to_dict()}},
     "glue": {"per_op_s", "per_step_s", "intervals": {...}, "points"},
     "spread": {"gemm": <log sigma>, "loops": <log sigma>}}

``quality_dict()`` (the profile's ``fit_quality.kernels``)::

    {"gemm" | "loops" | "glue": FitQuality,
     "steps": {"workload": {...}, "batch": {...}, "threads": {...}}: FitQuality each,
     "tables": {"<table>": {"points", "median_abs_log_error", "p90_abs_log_error"}}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from microbench.errors import UserError
from microbench.kernels.calls import KernelCall, call_features, op_calls, step_calls
from microbench.workload import Workload, load_workload

from .kernel_tables import GemmTable, LoopTable
from .stats import fit_quality

__all__ = ["KernelModel"]

_Z95 = float(stats.norm.ppf(0.975))


def _medians(rows: pd.DataFrame) -> np.ndarray:
    return np.array([float(np.median(s)) for s in rows["samples"]])


def _robust_sigma(residuals: np.ndarray) -> float:
    """Standard deviation from the median absolute deviation (a few wild points don't count)."""
    if residuals.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(residuals - np.median(residuals))))


def _nearest_threads(have: Sequence[int], threads: int) -> int:
    below = [t for t in have if t <= threads]
    return max(below) if below else min(have)


class KernelModel:
    """Kernel tables and the glue (module docstring)."""

    def fit(self, df: pd.DataFrame) -> KernelModel:
        """Fit to ``df``'s "kernels" records; its "speed" records, if any, are the steps the
        model is checked on (module docstring), never fitted."""
        measured = df[df["type"] == "measurement"]
        rows = measured[measured["benchmark"] == "kernels"]
        if rows.empty:
            raise UserError("no kernel sweep records to fit the kernel model from")
        gemm = rows[rows["name"] == "gemm"]
        self.gemm_: dict[tuple[str, int], GemmTable] = {}
        for (layout, threads), part in gemm.groupby(["params.layout", "params.threads"]):
            keys = zip(part["params.m"], part["params.n"], part["params.k"], strict=True)
            medians = _medians(part)
            points = {tuple(int(v) for v in key): t for key, t in zip(keys, medians, strict=True)}
            self.gemm_[(str(layout), int(threads))] = GemmTable.from_points(points)
        loops = rows[rows["name"] == "loop"]
        self.loops_: dict[tuple[str, int], LoopTable] = {}
        for (variant, threads), part in loops.groupby(["params.variant", "params.threads"]):
            points = zip(part["params.elements"], part["params.run"], _medians(part), strict=True)
            self.loops_[(str(variant), int(threads))] = LoopTable.from_points(
                (int(e), int(r), t) for e, r, t in points
            )
        if not self.gemm_ or not self.loops_:
            raise UserError("the kernel sweep records hold no GEMM or no loop points")
        self.quality_: dict[str, Any] = {}
        self._fit_glue(rows[rows["name"] == "glue"])
        self._fit_spread()
        self._check_steps(measured[measured["benchmark"] == "speed"])
        return self

    # ----------------------------------------------------------------------------- glue
    def _fit_glue(self, rows: pd.DataFrame) -> None:
        self.glue_points_: list[tuple[int, float]] = []
        steps, kernel_s = [], []
        for _, row in rows.iterrows():
            workload = Workload.from_dict(json.loads(row["params.workload_json"]), "glue")
            kernel_s.append(self._kernels_s(workload, int(row["params.batch"]), 1))
            steps.append(float(np.median(row["samples"])))
            self.glue_points_.append((int(row["params.op_calls"]), steps[-1] - kernel_s[-1]))
        self.glue_ = self._glue_fit(self.glue_points_)
        if self.glue_["intervals"] and len(steps) > 2:  # each tiny network left out in turn
            points = self.glue_points_

            def priced(i: int, glue: dict[str, Any]) -> float:
                return kernel_s[i] + glue["per_op_s"] * points[i][0] + glue["per_step_s"]

            fitted = [priced(i, self.glue_) for i in range(len(steps))]
            left_out = [
                priced(i, self._glue_fit(points[:i] + points[i + 1 :])) for i in range(len(steps))
            ]
            self.quality_["glue"] = fit_quality(steps, fitted, left_out).to_dict()

    @staticmethod
    def _glue_fit(points: list[tuple[int, float]]) -> dict[str, Any]:
        """Per op call and per step seconds by least squares on (op calls, step - kernels),
        with 95% intervals; zeros (and no intervals) from fewer than two distinct op counts."""
        if len({n for n, _ in points}) < 2:
            return {"per_op_s": 0.0, "per_step_s": 0.0, "intervals": {}}
        x, y = np.array(points, dtype=float).T
        fit = stats.linregress(x, y)
        per_op, per_step = max(float(fit.slope), 0.0), max(float(fit.intercept), 0.0)
        t = float(stats.t.ppf(0.975, max(len(x) - 2, 1)))
        slope_ci = (fit.slope - t * fit.stderr, fit.slope + t * fit.stderr)
        spread = t * fit.intercept_stderr
        icpt_ci = (fit.intercept - spread, fit.intercept + spread)

        def interval(ci: tuple[float, float], value: float) -> dict[str, float]:
            return {"low": min(max(ci[0], 0.0), value), "high": max(ci[1], value)}

        return {
            "per_op_s": per_op,
            "per_step_s": per_step,
            "intervals": {"per_op_s": interval(slope_ci, per_op),
                          "per_step_s": interval(icpt_ci, per_step)},
        }  # fmt: skip

    def _fit_spread(self) -> None:
        self.quality_["tables"] = {}
        pooled: dict[str, list[np.ndarray]] = {"gemm": [], "loops": []}
        tables = [("gemm", f"gemm_{k[0]}@{k[1]}", t) for k, t in self.gemm_.items()]
        tables += [("loops", f"{k[0]}@{k[1]}", t) for k, t in self.loops_.items()]
        for family, name, table in tables:
            r = table.neighbour_residuals()
            if r.size:
                pooled[family].append(r)
                self.quality_["tables"][name] = {
                    "points": int(r.size),
                    "median_abs_log_error": float(np.median(np.abs(r))),
                    "p90_abs_log_error": float(np.quantile(np.abs(r), 0.9)),
                }
        self.spread_ = {
            family: _robust_sigma(np.concatenate(parts)) if parts else 0.0
            for family, parts in pooled.items()
        }
        for family, parts in pooled.items():
            if parts:  # measured over each point predicted from its neighbours, without it
                ratio = np.exp(np.concatenate(parts))
                q = fit_quality(ratio, np.ones_like(ratio), np.ones_like(ratio)).to_dict()
                self.quality_[family] = {**q, "r2": None}

    def step_s(self, workload: Workload, batch: int, threads: int) -> float:
        """Seconds of one training step's compute (forward, loss, backward, update; no
        gather), glue included: what ``microbench speed`` times as ``step_compute``."""
        glue = self.glue_["per_op_s"] * len(op_calls(workload)) + self.glue_["per_step_s"]
        return self._kernels_s(workload, batch, threads) + glue

    def _kernels_s(self, workload: Workload, batch: int, threads: int) -> float:
        """The table seconds of one training step's kernel calls (no gather)."""
        calls = step_calls(workload, batch, threads, gather=False)
        return sum(self.call_s(c, threads) for c in calls)

    def _check_steps(self, speed: pd.DataFrame) -> None:
        """The calibration's whole steps against the model (module docstring), grouped by
        workload, batch and thread count."""
        if speed.empty or "params.model" not in speed:
            return
        steps = speed[(speed["name"] == "step_compute") & (speed["params.device"] == "cpu")]
        rows = []
        for (name, batch, threads), part in steps.groupby(
            ["params.model", "params.batch", "params.threads"]
        ):
            measured = float(np.median(np.concatenate([np.asarray(s) for s in part["samples"]])))
            try:
                predicted = self.step_s(load_workload(str(name)), int(batch), int(threads))
            except (UserError, KeyError):  # a workload file no longer there, a kernel not swept
                continue
            rows.append((str(name), f"b{int(batch)}", f"t{int(threads)}", measured, predicted))
        if not rows:
            return
        frame = pd.DataFrame(rows, columns=["workload", "batch", "threads", "t", "p"])
        self.quality_["steps"] = {
            by: {
                str(key): fit_quality(g["t"], g["p"], g["p"]).to_dict()
                for key, g in frame.groupby(by)
            }
            for by in ("workload", "batch", "threads")
        }

    # ----------------------------------------------------------------------------- predict
    @property
    def threads(self) -> list[int]:
        return sorted({t for _, t in self.gemm_})

    def _table(self, tables: dict[tuple[str, int], Any], key: str, threads: int) -> Any:
        have = [t for k, t in tables if k == key]
        if not have:
            raise KeyError(f"kernel {key!r} was not measured; run the kernel sweep again")
        return tables[(key, _nearest_threads(have, threads))]

    def call_s(self, call: KernelCall, threads: int) -> float:
        """Seconds of ``call`` alone at ``threads`` (a serial driver: its one-thread table)."""
        if call.kernel.startswith("gemm_"):
            m, n, k = call.dims
            return self._table(self.gemm_, call.kernel[5:], threads).time_s(m, n, k)
        elements, run = call_features(call.kernel, call.dims)
        used = threads if call.parallel else 1
        return self._table(self.loops_, call.variant, used).time_s(elements, run)

    # ----------------------------------------------------------------------------- dicts
    def quality_dict(self) -> dict[str, Any]:
        """The profile's fit quality of this model (module docstring)."""
        return dict(self.quality_)

    def to_dict(self) -> dict[str, Any]:
        gemm: dict[str, dict[str, Any]] = {}
        for (layout, threads), table in sorted(self.gemm_.items()):
            gemm.setdefault(layout, {})[str(threads)] = table.to_dict()
        loops: dict[str, dict[str, Any]] = {}
        for (variant, threads), table in sorted(self.loops_.items()):
            loops.setdefault(variant, {})[str(threads)] = table.to_dict()
        return {
            "modeler": "kernel_tables",
            "gemm": gemm,
            "loops": loops,
            "glue": {**self.glue_, "points": [list(p) for p in self.glue_points_]},
            "spread": dict(self.spread_),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> KernelModel:
        model = cls()
        model.gemm_ = {
            (layout, int(t)): GemmTable.from_dict(table)
            for layout, by_threads in doc["gemm"].items()
            for t, table in by_threads.items()
        }
        model.loops_ = {
            (variant, int(t)): LoopTable.from_dict(table)
            for variant, by_threads in doc["loops"].items()
            for t, table in by_threads.items()
        }
        glue = dict(doc.get("glue") or {})
        model.glue_points_ = [(int(n), float(s)) for n, s in glue.pop("points", [])]
        model.glue_ = {"per_op_s": 0.0, "per_step_s": 0.0, "intervals": {}, **glue}
        model.spread_ = {"gemm": 0.0, "loops": 0.0, **doc.get("spread", {})}
        model.quality_ = dict(doc.get("quality", {}))  # a profile may keep it in the section
        return model
