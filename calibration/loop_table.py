"""A loop's cost table: seconds over (elements, inner run), interpolated in log space, with a
stated law beyond the grid.

:class:`LoopTable` holds one curve of log seconds in log elements per measured run length,
linear between runs in log run (held outside them). Beyond the largest measured size **time
grows in proportion to the elements** (a streaming loop's rate is reached); below the smallest it
stays that size's. Like :class:`calibration.kernel_tables.GemmTable` it reports its
interpolation error (``neighbour_residuals``), its law's error beyond the grid
(``beyond_residuals``) and a call's distance beyond it (``beyond_log``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .kernel_tables import VECTOR_FLOATS, five_digits
from .profile_checks import FieldError, is_number

__all__ = ["LoopTable"]


def _log_count(count: float) -> float:
    """The log of a count of elements or of a run (at least 1): taken as a float, for a huge
    workload's counts are Python integers past numpy's int64, which ``np.log`` cannot take."""
    return math.log(max(float(count), 1.0))


def _median_by(keys: Iterable[Any], values: Iterable[float]) -> dict[Any, float]:
    groups: dict[Any, list[float]] = {}
    for key, value in zip(keys, values, strict=True):
        groups.setdefault(key, []).append(float(value))
    return {key: float(np.median(v)) for key, v in groups.items()}


@dataclass(frozen=True)
class LoopTable:
    """Seconds of one loop variant at one thread count over (elements, inner run)."""

    curves: Mapping[int, tuple[tuple[float, ...], tuple[float, ...]]]  # run -> (elements, s)

    @classmethod
    def from_points(cls, points: Iterable[tuple[int, int, float]]) -> LoopTable:
        """From (elements, run, median seconds); repeated (elements, run) take their median."""
        points = list(points)
        if not points:
            raise ValueError("a loop table needs at least one point")
        medians = _median_by(((e, r) for e, r, _ in points), (t for _, _, t in points))
        curves: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        for run in sorted({r for _, r in medians}):
            rows = sorted((e, t) for (e, r), t in medians.items() if r == run)
            curves[run] = (tuple(float(e) for e, _ in rows), tuple(t for _, t in rows))
        if any(t <= 0 or not np.isfinite(t) for _, ts in curves.values() for t in ts):
            raise ValueError("loop times must be positive and finite")
        return cls(curves)

    @staticmethod
    def _curve_log_s(curve: tuple[tuple[float, ...], tuple[float, ...]], elements: float) -> float:
        xs, ys = np.log(curve[0]), np.log(curve[1])
        x = _log_count(elements)
        if x > xs[-1]:
            return float(ys[-1] + x - xs[-1])
        return float(np.interp(x, xs, ys))

    def _between(self, runs: list[int], elements: float, run: float) -> float:
        """Log seconds at ``run``, linear in log run between the measured ``runs`` around it
        (held beyond them)."""
        if len(runs) == 1 or run <= runs[0]:
            return self._curve_log_s(self.curves[runs[0]], elements)
        if run >= runs[-1]:
            return self._curve_log_s(self.curves[runs[-1]], elements)
        j = int(np.searchsorted(runs, run))
        lo, hi = runs[j - 1], runs[j]
        w = (np.log(run) - np.log(lo)) / (np.log(hi) - np.log(lo))
        a = self._curve_log_s(self.curves[lo], elements)
        b = self._curve_log_s(self.curves[hi], elements)
        return float((1 - w) * a + w * b)

    def time_s(self, elements: float, run: float = 1.0) -> float:
        """Seconds of a call over ``elements`` with inner runs of ``run``.

        A run longer than one vector (:data:`VECTOR_FLOATS`) is a vector body and a scalar
        remainder of ``run % VECTOR_FLOATS`` values, which cost differently. Where the table
        measured whole-vector runs and runs with a remainder of ``VECTOR_FLOATS - 1``, a run
        is priced as whole vectors (interpolated among the whole-vector runs) plus its rows'
        remainders: the extra a row of the nearest ragged run pays over whole vectors, as many
        rows as this call has, in proportion to the remainder. Otherwise (or for a measured
        run) the time is interpolated plainly in log run."""
        runs = sorted(self.curves)
        run = float(run)
        width = VECTOR_FLOATS
        whole = [r for r in runs if r % width == 0]
        ragged = [r for r in runs if r % width == width - 1 and r > width]
        rest = run % width
        if run in self.curves or run < width or len(whole) < 2 or not ragged:
            pool = runs if rest or run < width or len(whole) < 2 else whole
            return float(np.exp(self._between(pool, elements, run)))
        base = float(np.exp(self._between(whole, elements, run)))
        if not rest:
            return base
        near = min(ragged, key=lambda r: abs(np.log(r / run)))
        same_rows = elements * near / run
        extra = np.exp(self._curve_log_s(self.curves[near], same_rows)) - np.exp(
            self._between(whole, same_rows, near)
        )
        return base + max(float(extra), 0.0) * rest / (width - 1)

    def neighbour_residuals(self) -> np.ndarray:
        """log(measured / interpolated between its two neighbours) of each interior point of
        each run's curve."""
        out = []
        for xs_raw, ts in self.curves.values():
            xs, ys = np.log(xs_raw), np.log(ts)
            for i in range(1, len(xs) - 1):
                w = (xs[i] - xs[i - 1]) / (xs[i + 1] - xs[i - 1])
                out.append(ys[i] - ((1 - w) * ys[i - 1] + w * ys[i + 1]))
        return np.array(out)

    def _nearest_run(self, run: float) -> int:
        return min(self.curves, key=lambda r: abs(np.log(r) - _log_count(run)))

    def beyond_log(self, elements: float, run: float = 1.0) -> float:
        """How far ``elements`` lies beyond the largest size measured at the nearest run, in
        natural-log units (0 inside)."""
        largest = self.curves[self._nearest_run(run)][0][-1]
        return max(float(_log_count(elements) - np.log(largest)), 0.0)

    def beyond_residuals(self) -> np.ndarray:
        """Rows of (log measured / priced, log distance): each run's largest size priced by the
        law beyond the rest of its curve (at least two points left)."""
        out = []
        for xs, ts in self.curves.values():
            if len(xs) < 3:
                continue
            predicted = self._curve_log_s((xs[:-1], ts[:-1]), xs[-1])
            out.append((np.log(ts[-1]) - predicted, np.log(xs[-1]) - np.log(xs[-2])))
        return np.array(out).reshape(-1, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curves": [
                {"run": run, "elements": list(xs), "time_s": [five_digits(t) for t in ts]}
                for run, (xs, ts) in sorted(self.curves.items())
            ]
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> LoopTable:
        """The table :meth:`to_dict` wrote. A run or a size that no loop has (zero, a fraction
        of a run) is a :class:`FieldError` naming its field (``curves[2].run``)."""
        points = []
        for i, c in enumerate(doc["curves"]):
            run = _count(c["run"], f"curves[{i}].run", "a run")
            pairs = zip(c["elements"], c["time_s"], strict=True)
            for j, (e, t) in enumerate(pairs):
                points.append((_count(e, f"curves[{i}].elements[{j}]", "a size"), run, t))
        return cls.from_points(points)


MAX_COUNT = 2**53  # elements or a run of one loop: past any array, and exact as a float


def _count(value: Any, field: str, what: str) -> int:
    """``value`` as a whole count from 1 to :data:`MAX_COUNT`, else a :class:`FieldError`."""
    if not is_number(value) or not 1 <= value <= MAX_COUNT or value != int(value):
        raise FieldError(field, f"{what} is a whole number from 1 to 2**53, got {value!r}")
    return int(value)
