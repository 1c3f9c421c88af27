"""Thread scaling: Amdahl's law and the Universal Scalability Law fitted to measured speedups.

Amdahl: S(n) = 1 / (s + (1 - s) / n), a serial fraction s. The Universal Scalability Law
(Gunther): S(n) = n / (1 + sigma (n - 1) + kappa n (n - 1)) adds kappa, a coherency cost that
makes speedup fall past a peak, which memory-bound kernels on shared caches and bandwidth show
and Amdahl cannot. Both are fitted to speedups relative to the smallest measured thread count
n0 (S(n) / S(n0), so a run without 1 thread still fits) by least squares on log speedup, i.e.
in relative error. USL needs three distinct thread counts to say anything Amdahl does not; the
choice between them is by leave-one-out error where there are enough points for it, else by
in-sample error, and Amdahl wins ties (fewer parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from .optable import NON_OP_PHASES
from .profile_checks import FieldError
from .stats import (
    Interval,
    bootstrap_params,
    fit_quality,
    leave_one_out,
    percentile_intervals,
)

__all__ = [
    "ALL",
    "LAWS",
    "ScalingFit",
    "amdahl_speedup",
    "fit_scaling",
    "phase_scaling",
    "usl_speedup",
]

ALL = "all"  # the scaling class of every non-step op together


def amdahl_speedup(threads: Any, serial_fraction: float) -> np.ndarray:
    n = np.asarray(threads, dtype=float)
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def usl_speedup(threads: Any, sigma: float, kappa: float) -> np.ndarray:
    n = np.asarray(threads, dtype=float)
    return n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


# name -> (speedup function, parameter names, start, lower bounds, upper bounds)
LAWS: dict[str, tuple[Callable[..., np.ndarray], tuple[str, ...], list, list, list]] = {
    "amdahl": (amdahl_speedup, ("serial_fraction",), [0.1], [0.0], [1.0]),
    "usl": (usl_speedup, ("sigma", "kappa"), [0.1, 0.01], [0.0, 0.0], [1.0, 10.0]),
}


def _fit_law(law: str, threads: np.ndarray, ratio: np.ndarray, base: int) -> np.ndarray:
    fn, _, start, lower, upper = LAWS[law]

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.log(fn(threads, *p) / fn(base, *p)) - np.log(ratio)

    return least_squares(residuals, start, bounds=(lower, upper)).x


@dataclass(frozen=True)
class ScalingFit:
    """One phase's (or op class's) fitted thread scaling; ``chosen`` names the law to use."""

    base_threads: int
    threads: tuple[int, ...]
    speedup: tuple[float, ...]  # measured T(base) / T(n), one per point
    chosen: str
    params: dict[str, dict[str, float]]  # law -> parameter -> value
    intervals: dict[str, dict[str, Interval]]
    rel_error: dict[str, float]  # law -> median relative error of the speedup (in-sample)
    leave_out_rel_error: dict[str, float | None]

    def speedup_at(self, threads: Any, law: str | None = None) -> np.ndarray:
        """Speedup over one thread (the law extrapolated to n = 1 when 1 was not measured)."""
        law = law or self.chosen
        fn = LAWS[law][0]
        return fn(threads, *self.params[law].values())

    def to_dict(self) -> dict[str, Any]:
        laws = {}
        for law, params in self.params.items():
            laws[law] = {
                **params,
                "intervals": {k: v.to_dict() for k, v in self.intervals.get(law, {}).items()},
                "rel_error": self.rel_error[law],
                "leave_out_rel_error": self.leave_out_rel_error[law],
            }
        return {
            "chosen": self.chosen,
            "base_threads": self.base_threads,
            "threads": list(self.threads),
            "speedup": list(self.speedup),
            "laws": laws,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ScalingFit:
        params, intervals, rel, leave = {}, {}, {}, {}
        for law, entry in doc["laws"].items():
            names = LAWS[law][1]
            params[law] = {k: float(entry[k]) for k in names}
            intervals[law] = {k: Interval.from_dict(v) for k, v in entry["intervals"].items()}
            rel[law] = float(entry["rel_error"])
            leave[law] = entry.get("leave_out_rel_error")
        if doc["chosen"] not in params:  # read when threads go past the measured ones
            raise FieldError(
                "chosen", f"names no fitted law ({', '.join(params) or 'none is fitted'}), got "
                f"{doc['chosen']!r}"
            )  # fmt: skip
        return cls(
            int(doc["base_threads"]),
            tuple(int(t) for t in doc["threads"]),
            tuple(float(s) for s in doc["speedup"]),
            doc["chosen"],
            params,
            intervals,
            rel,
            leave,
        )


def fit_scaling(
    threads: Any,
    ratio: Any,
    base_threads: int,
    boot_ratios: np.ndarray | None = None,
    confidence: float = 0.95,
) -> ScalingFit:
    """Fit both laws to ``ratio[i] = T(base) / T(threads[i])``, points with n > base only.

    ``boot_ratios``: bootstrap replicates of ``ratio`` (rows), from resampled raw samples;
    their refits give the percentile intervals. USL is fitted only with at least two distinct
    thread counts above ``base_threads`` (three with the base).
    """
    n = np.asarray(threads, dtype=float)
    r = np.asarray(ratio, dtype=float)
    distinct = np.unique(n).size
    laws = ["amdahl"] + (["usl"] if distinct >= 2 else [])
    params, intervals, rel, leave = {}, {}, {}, {}
    for law in laws:
        fn, names = LAWS[law][0], LAWS[law][1]
        p = _fit_law(law, n, r, base_threads)
        params[law] = dict(zip(names, p.tolist(), strict=True))
        pred = fn(n, *p) / fn(base_threads, *p)
        quality = None
        if n.size >= 3 and distinct >= len(names) + 1:

            def fit_predict(x_tr, y_tr, x_te, law=law):
                q = _fit_law(law, x_tr, y_tr, base_threads)
                return LAWS[law][0](x_te, *q) / LAWS[law][0](base_threads, *q)

            quality = fit_quality(r, pred, leave_one_out(fit_predict, n, r))
        rel[law] = float(np.median(np.abs(pred - r) / r))
        leave[law] = None if quality is None else quality.leave_out_rel_error
        if boot_ratios is not None and len(boot_ratios) > 1:
            rows = np.array([_fit_law(law, n, b, base_threads) for b in boot_ratios])
            found = percentile_intervals(rows, confidence)
            intervals[law] = {
                k: i.including(params[law][k]) for k, i in zip(names, found, strict=True)
            }
    score = leave if all(leave[law] is not None for law in laws) else rel
    chosen = min(laws, key=lambda law: (score[law], law != "amdahl"))
    if chosen == "usl" and score["usl"] >= score["amdahl"] * 0.95:
        chosen = "amdahl"
    return ScalingFit(
        base_threads,
        tuple(int(t) for t in n),
        tuple(float(x) for x in r),
        chosen,
        params,
        intervals,
        rel,
        leave,
    )


def phase_scaling(
    entries: Sequence[Any], n_boot: int = 200, seed: int = 0, confidence: float = 0.95
) -> dict[str, ScalingFit]:
    """Thread scaling of each phase, and of all non-step ops together (:data:`ALL`).

    ``entries``: measured ops of one device (``model``, ``batch``, ``op``, ``phase``,
    ``threads``, ``time_s``, raw ``samples``), e.g. :class:`calibration.optable.OpTime`. A
    point is one (model, batch): the summed medians of the phase's ops at the smallest thread
    count over the same sum at n threads, counted only where the same ops were measured at
    both, so that the speedup weighs ops by their time as a training step does. Bootstrap
    replicates resample every op's raw samples. Empty with fewer than two thread counts.
    """
    threads = sorted({e.threads for e in entries})
    if len(threads) < 2:
        return {}
    base = threads[0]
    fits = {}
    for phase in sorted({e.phase for e in entries}) + [ALL]:
        chosen = [
            e
            for e in entries
            if e.phase == phase or (phase == ALL and e.phase not in NON_OP_PHASES)
        ]
        groups: dict[tuple[str, int], dict[int, list[int]]] = {}
        for i, e in enumerate(chosen):
            groups.setdefault((e.model, e.batch), {}).setdefault(e.threads, []).append(i)
        counts, sums = [], []  # thread count; (indices at base, indices at that count)
        for by_threads in groups.values():
            at_base = {(chosen[i].op, chosen[i].phase) for i in by_threads.get(base, [])}
            for n, idx in by_threads.items():
                if (
                    n != base
                    and at_base
                    and {(chosen[i].op, chosen[i].phase) for i in idx} == at_base
                ):
                    counts.append(n)
                    sums.append((by_threads[base], idx))
        if not counts:
            continue

        def ratios(medians: np.ndarray, sums: list = sums) -> np.ndarray:
            return np.array([medians[a].sum() / medians[c].sum() for a, c in sums])

        boot = None
        if n_boot >= 2:
            samples = [np.asarray(e.samples, dtype=float) for e in chosen]
            boot = bootstrap_params(ratios, samples, n_boot, seed)
        medians = np.array([e.time_s for e in chosen])
        fits[phase] = fit_scaling(counts, ratios(medians), base, boot, confidence)
    return fits
