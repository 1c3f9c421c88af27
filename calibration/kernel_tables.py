"""Cost tables of single kernels, interpolated in log space, with a stated law beyond the grid.

* :class:`GemmTable`: a GEMM's seconds over (m, n, k) on the sweep's grid
  (:mod:`microbench.kernelbench`), interpolated trilinearly in (log m, log n, log k) on log
  seconds, as Calculon interpolates its efficiency tables. Grid points the sweep skipped (too
  many FLOPs or too large an operand) take the time of the nearest measured point with their
  largest dimensions reduced, scaled by the ratio of FLOPs: past the largest measured sizes
  **a GEMM keeps the efficiency it reached**, so its time grows in proportion to each
  dimension beyond the grid. Below the smallest size, time stays that size's (a call's fixed
  cost).
* :class:`LoopTable`: a loop's seconds over (elements, inner run), one curve of log seconds in
  log elements per measured run length, linear between runs in log run (held outside them).
  Beyond the largest measured size **time grows in proportion to the elements** (a streaming
  loop's rate is reached); below the smallest it stays that size's.

Each table reports its own interpolation error: every interior point predicted from its
neighbours alone (:meth:`GemmTable.neighbour_residuals`, :meth:`LoopTable.neighbour_residuals`),
which is what a shape between grid points is exposed to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.interpolate import RegularGridInterpolator

__all__ = ["VECTOR_FLOATS", "GemmTable", "LoopTable"]

# float32 values in one SIMD register of the loops' target (AVX2: 256 bits). The sweep's
# channel-like runs are laid out around it (microbench.kernelbench.CHANNEL_RUNS).
VECTOR_FLOATS = 8


def _sig(seconds: float) -> float:
    """Five significant digits: far below the noise of any timing, and a profile a fifth the
    size."""
    return float(f"{seconds:.5g}")


def _median_by(keys: Iterable[Any], values: Iterable[float]) -> dict[Any, float]:
    groups: dict[Any, list[float]] = {}
    for key, value in zip(keys, values, strict=True):
        groups.setdefault(key, []).append(float(value))
    return {key: float(np.median(v)) for key, v in groups.items()}


@dataclass(frozen=True, eq=False)
class GemmTable:
    """Seconds of one GEMM layout at one thread count over the sweep's (m, n, k) grid."""

    points: Mapping[tuple[int, int, int], float]  # measured medians
    # (interpolator or None for a one-point grid, log dims, filled log-seconds grid), built once
    _grid_cache: tuple[Any, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def from_points(cls, points: Mapping[tuple[int, int, int], float]) -> GemmTable:
        if not points:
            raise ValueError("a GEMM table needs at least one point")
        if any(not np.isfinite(t) or t <= 0 for t in points.values()):
            raise ValueError("GEMM times must be positive and finite")
        return cls(dict(points))

    @property
    def dims(self) -> np.ndarray:
        return np.array(sorted({d for key in self.points for d in key}), dtype=float)

    def _grid(self) -> tuple[Any, np.ndarray, np.ndarray]:
        if self._grid_cache is not None:
            return self._grid_cache
        dims = self.dims
        logs = np.log(dims)
        index = {d: i for i, d in enumerate(dims)}
        n = len(dims)
        measured = np.full((n, n, n), np.nan)
        for (m, nn, k), t in self.points.items():
            measured[index[m], index[nn], index[k]] = np.log(t)
        filled = measured.copy()
        for ijk in zip(*np.nonzero(np.isnan(measured)), strict=True):
            filled[ijk] = _filled(measured, logs, list(ijk))
        interp = RegularGridInterpolator((logs, logs, logs), filled) if n > 1 else None
        object.__setattr__(self, "_grid_cache", (interp, logs, filled))
        return (interp, logs, filled)

    def time_s(self, m: float, n: float, k: float) -> float:
        """Seconds of ``(m x k) @ (k x n)`` (module docstring for the law off the grid)."""
        interp, logs, filled = self._grid()
        q = np.log(np.maximum([m, n, k], 1.0))
        if interp is None:
            return float(np.exp(filled.ravel()[0] + np.sum(np.maximum(q - logs[0], 0.0))))
        inside = np.clip(q, logs[0], logs[-1])
        beyond = float(np.sum(np.maximum(q - logs[-1], 0.0)))
        return float(np.exp(interp(inside)[0] + beyond))

    def neighbour_residuals(self) -> np.ndarray:
        """log(measured / predicted from neighbours) at every measured point that has a measured
        neighbour on both sides along some axis: the prediction is the log-linear interpolation
        between them, the median over such axes."""
        _, logs, filled = self._grid()
        index = {d: i for i, d in enumerate(self.dims)}
        out = []
        n = len(logs)
        for (m, nn, k), t in self.points.items():
            ijk = [index[m], index[nn], index[k]]
            guesses = []
            for axis in range(3):
                i = ijk[axis]
                if 0 < i < n - 1:
                    lo, hi = list(ijk), list(ijk)
                    lo[axis], hi[axis] = i - 1, i + 1
                    w = (logs[i] - logs[i - 1]) / (logs[i + 1] - logs[i - 1])
                    guesses.append((1 - w) * filled[tuple(lo)] + w * filled[tuple(hi)])
            if guesses:
                out.append(np.log(t) - float(np.median(guesses)))
        return np.array(out)

    def to_dict(self) -> dict[str, Any]:
        rows = sorted(self.points.items())
        return {"points_m_n_k_s": [[m, n, k, _sig(t)] for (m, n, k), t in rows]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> GemmTable:
        rows = doc["points_m_n_k_s"]
        return cls.from_points({(int(m), int(n), int(k)): float(t) for m, n, k, t in rows})


def _filled(measured: np.ndarray, logs: np.ndarray, ijk: list[int]) -> float:
    """A skipped grid point: the nearest measured point below it along its largest dimensions,
    scaled by the ratio of the dimensions given up (constant efficiency)."""
    idx, add = list(ijk), 0.0
    while np.isnan(measured[tuple(idx)]):
        if max(idx) == 0:
            found = measured[~np.isnan(measured)]
            return float(found.min()) + add
        axis = int(np.argmax([logs[i] for i in idx]))
        add += logs[idx[axis]] - logs[idx[axis] - 1]
        idx[axis] -= 1
    return float(measured[tuple(idx)]) + add


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
        x = np.log(max(elements, 1.0))
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "curves": [
                {"run": run, "elements": list(xs), "time_s": [_sig(t) for t in ts]}
                for run, (xs, ts) in sorted(self.curves.items())
            ]
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> LoopTable:
        points = [
            (e, int(c["run"]), t)
            for c in doc["curves"]
            for e, t in zip(c["elements"], c["time_s"], strict=True)
        ]
        return cls.from_points(points)
