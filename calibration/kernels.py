"""The machine's compute model: what each kernel costs, fitted from the kernel sweep alone.

``KernelModel().fit(df)`` reads the "kernels" records (:mod:`microbench.kernelbench`) and
holds measured terms, each with a physical meaning and its own benchmark:

* **Kernel tables**: a GEMM's seconds over (m, n, k) per layout and thread count (the BLAS's
  small-matrix kernel and its packed one apart, where the recorded BLAS has such a kernel:
  :mod:`calibration.gemm_regimes`; a width of a costly row stride,
  :mod:`calibration.gemm_alias`), a loop's over (elements, inner run) per driver and thread
  count (:mod:`calibration.kernel_tables`).
  :meth:`KernelModel.call_s` prices any :class:`~microbench.kernels.calls.KernelCall` from them.
* **Step terms** (:attr:`KernelModel.steps_`, :mod:`calibration.step_terms`), per thread
  count: the *interplay* factor by which kernels run slower inside a step than alone, and the
  *glue*, the Python between kernels per op call and per step, fitted with 95% intervals to
  whole steps of networks no workload names against the same calls timed alone. A prediction
  takes the interplay factor fitted at the fewest threads at every thread count
  (:meth:`KernelModel.step_terms`): it is the caches' effect, and the kernel tables at more
  threads already hold what more threads cost a call alone (the wake of a sleeping worker, a
  second vCPU's neighbour), which a factor fitted there counted again (evidence:
  docs/compute-model.md, "Terms beyond the tables"); and the
  spreads of those networks' steps predicted with each left out of the fit and its kernels
  priced from the tables, one for the kernels' part and one for the glue's: the model's error
  on a network it never saw, which the prediction band draws.
* **The law beyond the grid** (:attr:`KernelModel.beyond_sigma_`): per family (GEMMs, loops),
  the log error of a table's law beyond its largest measured size per natural-log unit of
  distance, from each table's largest sizes left out and priced from the rest
  (``beyond_residuals``, at least a factor 2 beyond): a robust root mean square of error over
  distance (:func:`~calibration.stats.robust_rms`: the rare shape that crosses a cache or a
  BLAS kernel's boundary past the grid does not set the width of every band). A call priced
  ``d`` log units beyond its table carries ``beyond_sigma * d`` of log error
  (:meth:`KernelModel.beyond_sigma`), which the band adds to the step's.
* **The law beyond the swept thread counts** (:attr:`KernelModel.thread_law_`,
  :mod:`calibration.thread_law`): a call at more threads than the sweep ran follows Amdahl's
  law from its two largest counts, with a log error per log unit of threads beyond them,
  scored on the machine where the sweep ran three counts or more and assumed otherwise.

**Its own generalisation** (:attr:`KernelModel.quality_`, the profile's fit quality): the
tables' neighbour errors pooled per family (each grid point predicted from its neighbours,
without itself); the step benchmark's networks, each predicted as above; and whole training steps
(``microbench speed``'s ``step_compute``: forward, backward and update of the calibration's
workloads at its batches and thread counts) against the model's price of them, per workload,
batch and thread count. The model fits nothing to any workload or batch, so every step is a
leave-one-workload-out and leave-one-batch-out prediction: its in-sample and leave-out errors
are the same by construction.

``to_dict()`` (the profile's ``models.kernels``)::

    {"modeler": "kernel_tables",
     "gemm": {"<layout>": {"<threads>": GemmTable.to_dict()}},
     "loops": {"<variant>": {"<threads>": LoopTable.to_dict()}},
     "step_terms": {"<threads>": StepTerms.to_dict()},
     "beyond_sigma_per_log": {"gemm": float, "loops": float},
     "thread_law": {"sigma_per_log": float, "points": int, "source": "scored" | "assumed"},
     "attention_run": "block"}

``attention_run`` names the run the attention tables are laid out over: "block", a (sample,
head) block's pairs times the head width (:func:`~microbench.kernels.callspec.call_features`);
a profile without it has tables over the head width, and prices attention by that.

``quality_dict()`` (the profile's ``fit_quality.kernels``)::

    {"gemm" | "loops": FitQuality, "step_terms": {"<threads>": FitQuality},
     "steps": {"workload": {...}, "batch": {...}, "threads": {...}}: FitQuality each,
     "tables": {"<table>": {"points", "median_abs_log_error", "p90_abs_log_error"}},
     "beyond": {"gemm" | "loops": {"points", "sigma_per_log", "median_abs_log_error",
                                   "median_distance_log"}}}
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError
from microbench.kernels.calls import KernelCall, call_features, op_calls, step_calls
from microbench.workload import Workload, load_workload

from .gemm_alias import AliasLaw
from .gemm_regimes import SmallGemm, small_gemm_rules
from .kernel_tables import GemmTable
from .loop_table import LoopTable
from .profile_checks import FieldError, is_number
from .stats import fit_quality, robust_rms
from .step_terms import StepTerms, fit_step_terms
from .thread_law import ASSUMED_SIGMA_PER_LOG, extrapolate, score

__all__ = ["KernelModel"]


_BLAS_KEYS = ("name", "architecture")  # what picks the BLAS's small-GEMM rules
_GEMM_DIMS = ["params.m", "params.n", "params.k"]
# A left-out size at least this far beyond the rest (a factor of 2) scores the law beyond the
# grid; closer ones (a loop's last two sizes capped near each other) are interpolation.
_MIN_BEYOND_LOG = float(np.log(2))


def _first(rows: pd.DataFrame, column: str) -> str | None:
    """The first recorded value of ``column`` (None where no record has one)."""
    values = rows[column].dropna() if column in rows else ()
    return str(values.iloc[0]) if len(values) else None


_LOOP_POINT = ["params.variant", "params.dims"]  # what names a loop point of a sweep
# The tables' price of the calibration's own training steps off by more than this (median
# relative error) is said at calibration: a calibration's steps are typically within 15%, and
# tables from a sweep cut short priced a residual CNN's step 99% low.
_STEPS_OFF = 0.5


def _without_retimed_firsts(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``rows`` less each point its sweep timed again (``retimed``: it had stalled, see
    :func:`microbench.kernelbench.run_kernels`): the re-timing stands in for it. ``keys``: the
    columns that name a point (with the record's source and thread count)."""
    if "params.retimed" not in rows or not rows["params.retimed"].eq(True).any():
        return rows
    named = rows[["source", "params.threads", *keys]].map(
        lambda v: tuple(v) if isinstance(v, list) else v
    )
    index = pd.MultiIndex.from_frame(named)
    again = rows["params.retimed"].eq(True).to_numpy()
    return rows[again | ~index.isin(index[again])]


def _medians(rows: pd.DataFrame) -> np.ndarray:
    return np.array([float(np.median(s)) for s in rows["samples"]])


def _alias_law(rows: pd.DataFrame, small: SmallGemm | None) -> AliasLaw | None:
    """The stride law of one layout and thread count from its "gemm_alias" triples (shifts
    -s, 0, s, as recorded), leaving out those the small-matrix kernel computes (it packs
    nothing); None without any."""
    if rows.empty:
        return None
    keys = ["params.m", "params.base_n", "params.k"]
    medians = pd.Series(_medians(rows), index=rows.index)
    triples = []
    for (m, n, k), part in rows.groupby(keys):
        at = {int(s): float(np.median(medians[g.index])) for s, g in part.groupby("params.shift")}
        shift = max(at)
        if sorted(at) != [-shift, 0, shift] or shift == 0:
            continue
        if small is not None and any(small.takes(m, n + s, k) for s in at):
            continue
        triples.append((int(m), int(n), int(k), at[0], (at[-shift] + at[shift]) / 2))
    return AliasLaw.fit(triples) if triples else None


# A sweep of fewer than three thread counts cannot score the thread law: its stated assumption.
_ASSUMED_THREAD_LAW = {"sigma_per_log": ASSUMED_SIGMA_PER_LOG, "points": 0, "source": "assumed"}


def _thread_law(doc: Any) -> dict[str, Any]:
    """A profile's ``thread_law`` (a profile from before it: the assumption)."""
    if doc is None:
        return dict(_ASSUMED_THREAD_LAW)
    sigma = doc.get("sigma_per_log") if isinstance(doc, dict) else None
    if not is_number(sigma) or not math.isfinite(sigma) or sigma < 0:
        raise FieldError("thread_law.sigma_per_log", "must be a number >= 0")
    return {**_ASSUMED_THREAD_LAW, **doc, "sigma_per_log": float(sigma)}


def _at_counts(
    tables: dict[tuple[str, int], Any], key: str, coordinates: Sequence[float]
) -> Callable[[int], float]:
    """``price(count)``: the seconds of ``key``'s table at that thread count at
    ``coordinates``."""
    return lambda threads: tables[(key, threads)].time_s(*coordinates)


def _head_width_features(dims: Sequence[int]) -> tuple[int, int]:
    """An attention call's (elements, run) as a profile without ``attention_run`` laid its
    tables out: the run is the head width."""
    n, t, d, heads, causal = dims
    pairs = t * (t + 1) // 2 if causal else t * t
    return n * pairs * d, d // heads


def _nearest_threads(have: Sequence[int], threads: int) -> int:
    below = [t for t in have if t <= threads]
    return max(below) if below else min(have)


class KernelModel:
    """Kernel tables and the step terms (module docstring)."""

    # the run its attention tables are laid out over (module docstring): a fit's, unless a
    # profile says otherwise
    attention_run_ = "block"

    def fit(self, df: pd.DataFrame) -> KernelModel:
        """Fit to ``df``'s "kernels" records; its "speed" records, if any, are the steps the
        model is checked on (module docstring), never fitted."""
        measured = df[df["type"] == "measurement"]
        rows = measured[measured["benchmark"] == "kernels"]
        if rows.empty:
            raise UserError("no kernel sweep records to fit the kernel model from")
        gemm = _without_retimed_firsts(rows[rows["name"] == "gemm"], ["params.layout", *_GEMM_DIMS])
        small = small_gemm_rules(*(_first(gemm, f"machine.blas.{k}") for k in _BLAS_KEYS))
        self.gemm_: dict[tuple[str, int], GemmTable] = {}
        triples = rows[rows["name"] == "gemm_alias"]
        for (layout, threads), part in gemm.groupby(["params.layout", "params.threads"]):
            # a shape timed in several pooled sweeps takes the median of their medians
            shapes = part.assign(median=_medians(part)).groupby(_GEMM_DIMS)["median"].median()
            points = {tuple(int(v) for v in key): float(t) for key, t in shapes.items()}
            rule = small.get(str(layout))
            mine = (triples["params.layout"] == layout) & (triples["params.threads"] == threads)
            alias = _alias_law(triples[mine], rule)
            table = GemmTable.from_points(points, small=rule, alias=alias)
            self.gemm_[(str(layout), int(threads))] = table
        loops = _without_retimed_firsts(rows[rows["name"] == "loop"], _LOOP_POINT)
        self.loops_: dict[tuple[str, int], LoopTable] = {}
        for (variant, threads), part in loops.groupby(["params.variant", "params.threads"]):
            # features from the dimensions, as the model prices a call (not as recorded: a
            # record keeps what the sweep counted when it ran)
            calls = zip(part["params.kernel"], part["params.dims"], strict=True)
            features = [call_features(kernel, dims) for kernel, dims in calls]
            points = zip(features, _medians(part), strict=True)
            self.loops_[(str(variant), int(threads))] = LoopTable.from_points(
                (int(e), int(r), t) for (e, r), t in points
            )
        if not self.gemm_ or not self.loops_:
            raise UserError("the kernel sweep records hold no GEMM or no loop points")
        self.quality_: dict[str, Any] = {}
        self.legacy_spread_: dict[str, float] | None = None
        self._score_tables()
        self._fit_beyond()
        self._fit_thread_law()
        steps = rows[rows["name"].isin(["step", "step_alone"])]
        self.steps_, step_quality = fit_step_terms(steps, self._priced)
        if step_quality:
            self.quality_["step_terms"] = step_quality
        self._check_steps(measured[measured["benchmark"] == "speed"])
        return self

    def _priced(self, workload_json: str, batch: int, threads: int) -> float:
        """The table seconds of a step benchmark network's kernels."""
        workload = Workload.from_dict(json.loads(workload_json), "step benchmark network")
        return self._kernels_s(workload, batch, threads)

    def _score_tables(self) -> None:
        """Each table's neighbour errors, and per family pooled (module docstring)."""
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
        for family, parts in pooled.items():
            if parts:  # measured over each point predicted from its neighbours, without it
                ratio = np.exp(np.concatenate(parts))
                q = fit_quality(ratio, np.ones_like(ratio), np.ones_like(ratio)).to_dict()
                self.quality_[family] = {**q, "r2": None}

    def _fit_beyond(self) -> None:
        """:attr:`beyond_sigma_` from every table's left-out largest sizes (module docstring)."""
        self.beyond_sigma_: dict[str, float] = {}
        self.quality_["beyond"] = {}
        for family, tables in (("gemm", self.gemm_), ("loops", self.loops_)):
            pairs = np.concatenate([t.beyond_residuals() for t in tables.values()])
            pairs = pairs[pairs[:, 1] >= _MIN_BEYOND_LOG]
            if not len(pairs):
                continue
            sigma = robust_rms(pairs[:, 0] / pairs[:, 1])
            self.beyond_sigma_[family] = sigma
            self.quality_["beyond"][family] = {
                "points": len(pairs),
                "sigma_per_log": sigma,
                "median_abs_log_error": float(np.median(np.abs(pairs[:, 0]))),
                "median_distance_log": float(np.median(pairs[:, 1])),
            }

    def _fit_thread_law(self) -> None:
        """:attr:`thread_law_`: every table's points at its largest thread count priced from
        the two counts below it, where the sweep ran three or more (module docstring)."""
        cases = []
        for tables in (self.gemm_, self.loops_):
            for key in {k for k, _ in tables}:
                counts = self._counts(tables, key)
                top = tables[(key, max(counts))]
                points = (
                    top.points
                    if isinstance(top, GemmTable)
                    else [(e, run) for run, (elements, _) in top.curves.items() for e in elements]
                )
                cases += [(counts, _at_counts(tables, key, p)) for p in points]
        sigma, points = score(cases)
        self.thread_law_ = (
            {"sigma_per_log": sigma, "points": points, "source": "scored"}
            if points
            else dict(_ASSUMED_THREAD_LAW)
        )

    def _call_table(
        self, call: KernelCall, threads: int
    ) -> tuple[dict[tuple[str, int], Any], str, tuple[float, ...], int]:
        """The tables, key, table coordinates and thread count that price ``call`` (a serial
        driver: one thread)."""
        if call.kernel.startswith("gemm_"):
            return self.gemm_, call.kernel[5:], tuple(call.dims), threads
        used = threads if call.parallel else 1
        features = call_features(call.kernel, call.dims)
        if call.kernel.startswith("attention") and self.attention_run_ != "block":
            features = _head_width_features(call.dims)
        return self.loops_, call.variant, features, used

    def beyond_sigma(self, call: KernelCall, threads: int) -> float:
        """The log error ``call`` carries for being priced beyond what was measured: its
        family's :attr:`beyond_sigma_` times its distance beyond its table's grid (0 inside
        it, or for a profile without the figure), and the thread law's sigma times its
        distance beyond the swept thread counts, added in quadrature."""
        tables, key, coordinates, used = self._call_table(call, threads)
        have = self._counts(tables, key)  # a kernel not measured: KeyError, as call_s
        table = tables[(key, _nearest_threads(have, used))]
        sigma = self.beyond_sigma_.get("gemm" if tables is self.gemm_ else "loops", 0.0)
        shape = sigma * table.beyond_log(*coordinates) if sigma else 0.0
        top = max(have)
        over = self.thread_law_["sigma_per_log"] * math.log(used / top) if used > top else 0.0
        return float(math.hypot(shape, over))

    def step_terms(self, threads: int) -> StepTerms:
        """The step terms at ``threads`` (those of the nearest measured count below; none
        measured: kernels as alone, no glue), with the interplay factor of the fewest threads
        where that fit separated it from the glue (module docstring)."""
        if not self.steps_:
            return StepTerms()
        terms = self.steps_[_nearest_threads(list(self.steps_), threads)]
        fewest = self.steps_[min(self.steps_)]
        if fewest is terms or "factor" not in fewest.intervals:
            return terms
        factor = {"factor": fewest.intervals["factor"]}
        return replace(terms, factor=fewest.factor, intervals={**terms.intervals, **factor})

    def step_s(self, workload: Workload, batch: int, threads: int) -> float:
        """Seconds of one training step's compute (forward, loss, backward, update; no
        gather), step terms included: what ``microbench speed`` times as ``step_compute``."""
        kernels = self._kernels_s(workload, batch, threads)
        return self.step_terms(threads).step_s(kernels, len(op_calls(workload)))

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
        off = float(((frame["p"] - frame["t"]).abs() / frame["t"]).median())
        if off > _STEPS_OFF:
            warnings.warn(
                f"the kernel tables price this calibration's own training steps {off:.0%} off "
                f"(median of {len(frame)}), as a sweep cut short or a machine that changed "
                "speed mid-sweep would: time the kernel sweep again before trusting the profile",
                stacklevel=2,
            )
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

    @staticmethod
    def _counts(tables: dict[tuple[str, int], Any], key: str) -> list[int]:
        """The thread counts ``key`` was swept at (KeyError: never)."""
        have = [t for k, t in tables if k == key]
        if not have:
            raise KeyError(f"kernel {key!r} was not measured; run the kernel sweep again")
        return have

    def _table(self, tables: dict[tuple[str, int], Any], key: str, threads: int) -> Any:
        return tables[(key, _nearest_threads(self._counts(tables, key), threads))]

    def call_s(self, call: KernelCall, threads: int) -> float:
        """Seconds of ``call`` alone at ``threads`` (a serial driver: its one-thread table);
        above the swept thread counts, by Amdahl's law from the two largest
        (:mod:`calibration.thread_law`)."""
        tables, key, coordinates, used = self._call_table(call, threads)
        have = self._counts(tables, key)
        if len(have) >= 2 and used > max(have):
            return extrapolate(_at_counts(tables, key, coordinates), have, used)
        return tables[(key, _nearest_threads(have, used))].time_s(*coordinates)

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
            "step_terms": {str(t): terms.to_dict() for t, terms in sorted(self.steps_.items())},
            "beyond_sigma_per_log": dict(self.beyond_sigma_),
            "thread_law": dict(self.thread_law_),
            "attention_run": self.attention_run_,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> KernelModel:
        model = cls()
        model.gemm_ = {
            (layout, int(t)): GemmTable.from_dict(table)
            for layout, by_threads in doc["gemm"].items()
            for t, table in by_threads.items()
        }
        model.attention_run_ = doc.get("attention_run", "head_width")
        if model.attention_run_ not in ("block", "head_width"):
            raise FieldError("attention_run", f"must be 'block', got {model.attention_run_!r}")
        model.loops_ = {}
        for variant, by_threads in doc["loops"].items():
            for t, table in by_threads.items():
                try:
                    model.loops_[(variant, int(t))] = LoopTable.from_dict(table)
                except FieldError as exc:  # its field, as the profile's kernels section has it
                    raise exc.within(f"loops.{variant}.{t}") from None
        model.steps_ = {
            int(t): StepTerms.from_dict(terms) for t, terms in doc.get("step_terms", {}).items()
        }
        model.beyond_sigma_ = {k: float(v) for k, v in doc.get("beyond_sigma_per_log", {}).items()}
        model.thread_law_ = _thread_law(doc.get("thread_law"))
        glue = doc.get("glue")
        model.legacy_spread_ = None
        if glue and not model.steps_:  # a profile from before the step benchmark: its glue,
            # and its tables' neighbour spreads for the band (KernelCompute)
            per_op, per_step = (float(glue.get(k, 0.0)) for k in ("per_op_s", "per_step_s"))
            model.steps_ = {1: StepTerms(per_op_s=per_op, per_step_s=per_step)}
            model.legacy_spread_ = {k: float(v) for k, v in doc.get("spread", {}).items()}
        model.quality_ = dict(doc.get("quality", {}))  # a profile may keep it in the section
        return model
