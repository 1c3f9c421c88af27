"""Cost tables of single kernels, interpolated in log space, with a stated law beyond the grid.

* :class:`GemmTable`: a GEMM's seconds over (m, n, k) on the sweep's grid
  (:mod:`microbench.kernelbench`), interpolated trilinearly in (log m, log n, log k) on log
  seconds, as Calculon interpolates its efficiency tables. Grid points the sweep skipped (too
  many FLOPs or too large an operand) take the time of the nearest measured point with their
  largest dimensions reduced, scaled by the ratio of FLOPs: past the largest measured sizes
  **a GEMM keeps the efficiency it reached**, so its time grows in proportion to each
  dimension beyond the grid. Below the smallest size, time stays that size's (a call's fixed
  cost). Where the BLAS computes small GEMMs with a kernel of its own (``small``,
  :mod:`calibration.gemm_regimes`), its points and the packed kernel's make two grids, each
  filling the points it lacks from its own kernel's (:func:`_filled`), and a shape is priced
  from the grid of the kernel that computes it: time jumps at the line between them.
  **A dimension of m or n that is not a multiple of the vector width** (:data:`VECTOR_FLOATS`)
  is computed as whole vector tiles plus edge tiles of 4, 2 and 1 columns, which run far below
  the GEMM's rate (a 47-wide GEMM can cost more than a 48-wide one). The table is interpolated
  among whole dimensions only, and a ragged dimension is priced as if it were wider by the
  columns its edge tiles cost (the set bits of its remainder: tiles of 4, 2 and 1), each
  tile's width in columns fitted per axis, without negative widths, to ragged shapes the sweep
  times for it (a BLAS whose register tile along an axis is 4 pays nothing for a 4-column
  edge on that axis, and the fit says so).
  **A width whose row stride is a multiple of a large power of two** costs the extra of
  :class:`~calibration.gemm_alias.AliasLaw` where the table has one: it is taken off every
  measured point before interpolating (the grid's widths are such strides) and added to the
  shape priced. Shapes the small-matrix kernel computes, which packs nothing, have none.
* :class:`~calibration.loop_table.LoopTable`: a loop's seconds over (elements, inner run).

Each table reports its own interpolation error: every interior point predicted from its
neighbours alone (``neighbour_residuals``), which is what a shape between grid points is
exposed to; a GEMM table adds its ragged points' errors under the edge law. It also reports
**how wrong its law beyond the grid is**: the largest measured size along each axis left out,
the table rebuilt without it and those points priced by the law from the rest
(``beyond_residuals``: pairs of log error and log distance beyond the reduced grid), and how far
beyond its grid a call lies (``beyond_log``, in natural-log units summed over the axes), so that
a prediction's band can widen with the distance from what was measured
(:class:`pdlsim.costmodel.kernels.KernelCompute`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
from scipy.interpolate import RegularGridInterpolator
from scipy.optimize import brentq, nnls
from scipy.spatial import cKDTree

from .gemm_alias import AliasLaw
from .gemm_regimes import SmallGemm

__all__ = ["VECTOR_FLOATS", "GemmTable", "edge_tiles", "five_digits"]

# float32 values in one SIMD register of the loops' target (AVX2: 256 bits). The sweep's
# channel-like runs are laid out around it (microbench.kernelbench.CHANNEL_RUNS).
VECTOR_FLOATS = 8


def edge_tiles(dim: float) -> np.ndarray:
    """Which edge tiles (of 4, 2 and 1 columns) a GEMM dimension needs past its whole vectors:
    the set bits of its remainder, as 0/1; none for a whole dimension or one within a single
    vector (the sweep measures those exactly)."""
    dim = int(round(dim))
    rest = 0 if dim <= VECTOR_FLOATS else dim % VECTOR_FLOATS
    return np.array([(rest >> b) & 1 for b in (2, 1, 0)], dtype=float)


def five_digits(seconds: float) -> float:
    """Five significant digits: far below the noise of any timing, and a profile a fifth the
    size."""
    return float(f"{seconds:.5g}")


@dataclass(frozen=True)
class _Grid:
    """One kernel's whole-dimension grid: log dims per axis (m, n, k), the log seconds with
    points it did not measure filled, and their interpolator (None for a single point)."""

    logs: tuple[np.ndarray, np.ndarray, np.ndarray]
    filled: np.ndarray
    interp: Any

    @cached_property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The smallest and largest log dim of each axis."""
        return np.array([a[0] for a in self.logs]), np.array([a[-1] for a in self.logs])


@dataclass(frozen=True)
class _Built:
    """A GEMM table's grids, keyed on whether the small-matrix kernel computes a shape (one grid
    under both keys where the table is not split), and per axis (m, n) the columns each edge
    tile (4, 2, 1) costs."""

    grids: dict[bool, _Grid]
    edge: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class GemmTable:
    """Seconds of one GEMM layout at one thread count over the sweep's (m, n, k) grid; with
    ``small``, the BLAS's small-matrix kernel's points and the packed kernel's are two grids
    (:mod:`calibration.gemm_regimes`)."""

    points: Mapping[tuple[int, int, int], float]  # measured medians
    # per axis (m, n), columns each edge tile costs: fitted from the ragged points when None
    edge_columns: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    small: SmallGemm | None = None
    alias: AliasLaw | None = None  # the extra cost of a width with a costly row stride
    _built: _Built | None = field(default=None, repr=False)  # built once

    @classmethod
    def from_points(
        cls,
        points: Mapping[tuple[int, int, int], float],
        edge_columns: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
        small: SmallGemm | None = None,
        alias: AliasLaw | None = None,
    ) -> GemmTable:
        if not points:
            raise ValueError("a GEMM table needs at least one point")
        if any(not np.isfinite(t) or t <= 0 for t in points.values()):
            raise ValueError("GEMM times must be positive and finite")
        if edge_columns is not None and (
            np.shape(edge_columns) != (2, 3) or not np.all(np.asarray(edge_columns) >= 0)
        ):
            raise ValueError("edge columns must be two rows of three non-negative widths")
        return cls(dict(points), edge_columns, small, alias)

    @staticmethod
    def _whole(key: tuple[int, int, int]) -> bool:
        return not edge_tiles(key[0]).any() and not edge_tiles(key[1]).any()

    @property
    def dims(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The grid's dims per axis: m and n whole (module docstring), k any."""
        whole = [key for key in self.points if self._whole(key)] or list(self.points)
        return tuple(  # type: ignore[return-value]
            np.array(sorted({key[a] for key in whole}), dtype=float) for a in range(3)
        )

    def _takes_small(self, key: Sequence[float]) -> bool:
        return self.small is not None and self.small.takes(*key)

    def _alias_s(self, m: float, n: float, k: float, small: bool | None = None) -> float:
        """The shape's extra for its width's row stride (module docstring); 0 without a law or
        where the small-matrix kernel computes it (``small``, when the caller knows)."""
        if self.alias is None:
            return 0.0
        if small is None:
            small = self._takes_small((m, n, k))
        return 0.0 if small else self.alias.extra_s(n, k)

    def _smooth_s(self, key: tuple[int, int, int]) -> float:
        """A measured point's seconds without its stride's extra (at least half of them)."""
        t = self.points[key]
        return max(t - self._alias_s(*key), 0.5 * t)

    def _build(self) -> _Built:
        if self._built is not None:
            return self._built
        dims = self.dims
        logs = tuple(np.log(d) for d in dims)
        index = [{d: i for i, d in enumerate(axis)} for axis in dims]
        on_grid = [key for key in self.points if all(key[a] in index[a] for a in range(3))]
        split = len({self._takes_small(key) for key in on_grid}) > 1

        def grid(keys: list[tuple[int, int, int]]) -> _Grid:
            measured = np.full(tuple(len(d) for d in dims), np.nan)
            for key in keys:
                measured[tuple(index[a][key[a]] for a in range(3))] = np.log(self._smooth_s(key))
            filled = _filled(measured, logs)
            interp = (
                RegularGridInterpolator(logs, filled, bounds_error=False, fill_value=None)
                if min(len(d) for d in dims) > 1
                else None
            )
            return _Grid(logs, filled, interp)

        if split:  # keyed on whether the small kernel computes a shape
            grids = {side: grid([k for k in on_grid if self._takes_small(k) == side])
                     for side in (False, True)}  # fmt: skip
        else:  # one grid, whichever kernel computes a shape
            grids = dict.fromkeys((False, True), grid(on_grid))
        built = _Built(grids, (np.zeros(3), np.zeros(3)))  # the whole grids alone
        if self.edge_columns is not None:
            edge = (np.array(self.edge_columns[0]), np.array(self.edge_columns[1]))
        else:
            edge = (self._edge_width(built, 0), self._edge_width(built, 1))
        built = replace(built, edge=edge)
        object.__setattr__(self, "_built", built)
        return built

    @staticmethod
    def _whole_s(grid: _Grid, m: float, n: float, k: float) -> float:
        """Seconds at whole dims (m, n, k), interpolated, with the law beyond the grid."""
        q = np.log(np.maximum([m, n, k], 1.0))
        lo, hi = grid.bounds
        beyond = float(np.sum(np.maximum(q - hi, 0.0)))
        if grid.interp is None:
            pairs = zip(grid.logs, q, strict=True)
            at = tuple(int(np.argmin(np.abs(axis - x))) for axis, x in pairs)
            return float(np.exp(grid.filled[at] + beyond))
        return float(np.exp(grid.interp(np.clip(q, lo, hi))[0] + beyond))

    def _ragged(self, axis: int) -> list[tuple[tuple[int, int, int], float]]:
        """Measured points ragged along ``axis`` (0: m, 1: n) only."""
        other = 1 - axis
        return [
            (key, t)
            for key, t in self.points.items()
            if edge_tiles(key[axis]).any() and not edge_tiles(key[other]).any()
        ]

    def _edge_width(self, built: _Built, axis: int) -> np.ndarray:
        """Columns each edge tile costs along ``axis``: for each ragged point, the extra width
        at which its kernel's whole grid takes its measured time; the non-negative
        least-squares split of those over the tiles each point needs (0 for a tile nothing
        measured)."""
        tiles, widths = [], []
        for key, _ in self._ragged(axis):
            dim, t = key[axis], self._smooth_s(key)
            grid = built.grids[self._takes_small(key)]

            def gap(
                extra: float, key: tuple[int, int, int] = key, t: float = t, grid: _Grid = grid
            ) -> float:
                wider = list(key)
                wider[axis] += extra
                return np.log(self._whole_s(grid, *wider)) - np.log(t)

            if gap(0.0) >= 0:
                extra = 0.0
            elif gap(float(dim)) <= 0:
                extra = float(dim)
            else:
                extra = brentq(gap, 0.0, float(dim), xtol=0.01)
            tiles.append(edge_tiles(dim))
            widths.append(extra)
        if not widths:
            return np.zeros(3)
        return nnls(np.array(tiles), np.array(widths))[0]

    @property
    def edge_width(self) -> tuple[np.ndarray, np.ndarray]:
        """Per axis (m, n): the columns each edge tile (4, 2, 1) costs (module docstring)."""
        return self._build().edge

    def time_s(self, m: float, n: float, k: float) -> float:
        """Seconds of ``(m x k) @ (k x n)`` (module docstring for the edge law and the law off
        the grid), from the grid of the kernel that computes it."""
        built = self._build()
        m_eff = m + float(built.edge[0] @ edge_tiles(m))
        n_eff = n + float(built.edge[1] @ edge_tiles(n))
        small = self._takes_small((m, n, k))
        return self._whole_s(built.grids[small], m_eff, n_eff, k) + self._alias_s(m, n, k, small)

    def neighbour_residuals(self) -> np.ndarray:
        """log(measured / predicted from neighbours) at every whole point that has a measured
        neighbour on both sides along some axis (the prediction is the log-linear interpolation
        between them, the median over such axes), and log(measured / priced) at every ragged
        point under the edge law."""
        built = self._build()
        index = [{d: i for i, d in enumerate(axis)} for axis in self.dims]
        out = []
        for key, t in self.points.items():
            if not all(key[a] in index[a] for a in range(3)):
                out.append(np.log(t) - np.log(self.time_s(*key)))
                continue
            grid = built.grids[self._takes_small(key)]
            ijk = [index[a][key[a]] for a in range(3)]
            guesses = []
            for axis in range(3):
                i, logs = ijk[axis], grid.logs[axis]
                if 0 < i < len(logs) - 1:
                    lo, hi = list(ijk), list(ijk)
                    lo[axis], hi[axis] = i - 1, i + 1
                    w = (logs[i] - logs[i - 1]) / (logs[i + 1] - logs[i - 1])
                    guesses.append((1 - w) * grid.filled[tuple(lo)] + w * grid.filled[tuple(hi)])
            if guesses:
                out.append(np.log(self._smooth_s(key)) - float(np.median(guesses)))
        return np.array(out)

    def beyond_log(self, m: float, n: float, k: float) -> float:
        """How far (m, n, k) lies beyond the grid its kernel is priced from: the natural-log
        excess over the largest size, summed over the axes (0 inside)."""
        built = self._build()
        grid = built.grids[self._takes_small((m, n, k))]
        m_eff = m + float(built.edge[0] @ edge_tiles(m))
        n_eff = n + float(built.edge[1] @ edge_tiles(n))
        q = np.log(np.maximum([m_eff, n_eff, k], 1.0))
        return float(np.sum(np.maximum(q - grid.bounds[1], 0.0)))

    def beyond_residuals(self) -> np.ndarray:
        """Rows of (log measured / priced, log distance): per axis with at least three whole
        sizes, the measured points at its largest size priced by a table without them, at their
        distance beyond that table's grid (module docstring). Empty where no axis qualifies."""
        dims = self.dims
        out = []
        for axis in range(3):
            if len(dims[axis]) < 3:
                continue
            top = dims[axis][-1]
            kept = {key: t for key, t in self.points.items() if key[axis] < top}
            held = {key: t for key, t in self.points.items() if key[axis] == top}
            if not held or not kept:
                continue
            edge = (tuple(self.edge_width[0]), tuple(self.edge_width[1]))
            reduced = GemmTable.from_points(kept, edge, self.small, self.alias)
            for key, t in held.items():
                distance = reduced.beyond_log(*key)
                if distance > 0:
                    out.append((np.log(t) - np.log(reduced.time_s(*key)), distance))
        return np.array(out).reshape(-1, 2)

    def to_dict(self) -> dict[str, Any]:
        rows = sorted(self.points.items())
        edge = [[round(float(w), 3) for w in axis] for axis in self.edge_width]
        return {
            "points_m_n_k_s": [[m, n, k, five_digits(t)] for (m, n, k), t in rows],
            "edge_columns_m_n": edge,  # per axis, the columns edge tiles of 4, 2, 1 cost
            **({"small_kernel": self.small.to_dict()} if self.small else {}),
            **({"alias_s_per_element": self.alias.to_dict()} if self.alias else {}),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> GemmTable:
        rows = doc["points_m_n_k_s"]
        edge = doc.get("edge_columns_m_n")
        small = doc.get("small_kernel")
        alias = doc.get("alias_s_per_element")
        return cls.from_points(
            {(int(m), int(n), int(k)): float(t) for m, n, k, t in rows},
            None if edge is None else (tuple(edge[0]), tuple(edge[1])),
            None if small is None else SmallGemm.from_dict(small),
            None if alias is None else AliasLaw.from_dict(alias),
        )


def _walked(measured: np.ndarray, logs: Sequence[np.ndarray], step: int) -> np.ndarray:
    """Each grid point's log seconds from the measured point a walk reaches: one index at a time
    along the largest dimension with room (``step`` -1, down) or the smallest (+1, up), to the
    first measured point, scaled by the ratio of the dimensions walked (constant efficiency);
    NaN where the walk leaves the grid first. Each point's walk continues its next point's, so
    the points are resolved a layer of equal index sum at a time, from the walks' end."""
    shape = np.array(measured.shape)
    idx = np.indices(measured.shape).reshape(3, -1).T
    at = np.stack([logs[a][idx[:, a]] for a in range(3)], axis=1)
    room = (idx + step >= 0) & (idx + step < shape)
    if step < 0:
        axis = np.where(room, at, -np.inf).argmax(axis=1)
    else:
        axis = np.where(room, at, np.inf).argmin(axis=1)
    rows = np.arange(len(idx))
    nxt = idx.copy()
    nxt[rows, axis] += np.where(room.any(axis=1), step, 0)
    nxt_at = np.array([logs[a][i] for a, i in zip(axis, nxt[rows, axis], strict=True)])
    add = at[rows, axis] - nxt_at
    target = np.ravel_multi_index(nxt.T, measured.shape)
    out = measured.reshape(-1).copy()
    todo = np.isnan(out) & room.any(axis=1)
    sums = idx.sum(axis=1)
    for layer in sorted(set(sums[todo].tolist()), reverse=step > 0):
        sel = todo & (sums == layer)
        out[sel] = out[target[sel]] + add[sel]
    return out.reshape(measured.shape)


def _filled(measured: np.ndarray, logs: Sequence[np.ndarray]) -> np.ndarray:
    """The grid with the points its kernel did not measure filled at the efficiency of a
    measured neighbour: the nearest measured point below along the largest dimensions (a point
    the sweep skipped as too large), else above along the smallest (a small shape that only the
    other kernel of the BLAS computes), else the nearest in log dims; scaled by the ratio of
    their sizes."""
    filled = _walked(measured, logs, -1)
    gaps = np.isnan(filled)
    if gaps.any():
        filled[gaps] = _walked(measured, logs, 1)[gaps]
    gaps = np.isnan(filled)
    if gaps.any():
        coords = np.stack(np.meshgrid(*logs, indexing="ij"), axis=-1)
        known = ~np.isnan(measured)
        _, near = cKDTree(coords[known]).query(coords[gaps], p=1)
        filled[gaps] = measured[known][near] + (coords[gaps] - coords[known][near]).sum(axis=1)
    return filled
