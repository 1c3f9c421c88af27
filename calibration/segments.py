"""Segmented least squares in relative error: the best cut of sorted points into k lines.

For points sorted by size, ``segment_costs`` fits one non-negative line to every run of at
least ``min_points`` consecutive points (never splitting equal sizes) and
``best_segmentations`` finds, by dynamic programming over those costs (Bellman 1961; Kleinberg
& Tardos, ch. 6.3), the cut into k segments of least total relative RSS for every k at once.
:mod:`calibration.hockney` chooses k among them.
"""

from __future__ import annotations

import math

import numpy as np

from .stats import nonneg_relative_fit

__all__ = ["best_segmentations", "bic", "line_design", "segment_costs"]

TINY_RSS = 1e-16  # per point: relative errors below 1e-8 are indistinguishable from exact


def line_design(sizes: np.ndarray) -> np.ndarray:
    """Columns ``(1, m)`` of ``alpha + beta m``."""
    return np.column_stack([np.ones(len(sizes)), sizes.astype(float)])


def segment_costs(sizes: np.ndarray, times: np.ndarray, min_points: int) -> np.ndarray:
    """``cost[i, j]``: relative RSS of one line through points ``i..j-1`` (inf if not allowed).

    A segment needs ``min_points`` points and may not split equal sizes.
    """
    n = len(sizes)
    cost = np.full((n + 1, n + 1), np.inf)
    design = line_design(sizes)
    for i in range(n):
        if i > 0 and sizes[i - 1] == sizes[i]:
            continue
        for j in range(i + min_points, n + 1):
            if j < n and sizes[j - 1] == sizes[j]:
                continue
            cost[i, j] = nonneg_relative_fit(design[i:j], times[i:j])[1]
    return cost


def best_segmentations(cost: np.ndarray, max_segments: int) -> dict[int, tuple[float, list[int]]]:
    """For each k <= max_segments: ``(rss, starts)`` of the best cut into k segments."""
    n = cost.shape[0] - 1
    best = np.full((max_segments + 1, n + 1), np.inf)
    back = np.zeros((max_segments + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, max_segments + 1):
        for j in range(1, n + 1):
            totals = best[k - 1, :j] + cost[:j, j]
            i = int(np.argmin(totals))
            best[k, j], back[k, j] = totals[i], i
    result = {}
    for k in range(1, max_segments + 1):
        if np.isfinite(best[k, n]):
            starts, j = [], n
            for level in range(k, 0, -1):
                j = back[level, j]
                starts.append(j)
            result[k] = (float(best[k, n]), starts[::-1])
    return result


def bic(rss: float, n: int, k: int) -> float:
    """BIC of k segments (2 parameters each, k - 1 breakpoints) in relative-error space."""
    return n * math.log(max(rss / n, TINY_RSS)) + (3 * k - 1) * math.log(n)
