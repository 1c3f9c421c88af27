"""The fitted values of a collective model, regimes and inter-node parameters, and their times.

Frozen dataclasses with ``to_dict``/``from_dict`` and :func:`regime_times`, which evaluates
them; the fitting is in :mod:`calibration.algorithms`. Interval dictionaries are keyed by the
parameter's name (``{"a_s": {"low", "high", "confidence"}}``), the shape the profile checks
read, and every interval contains its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .formulas import coefficients, two_level_coefficients
from .stats import Interval

__all__ = ["CollectiveRegime", "InterNode", "regime_indices", "regime_times"]


def _intervals_to_dict(intervals: dict[str, Interval]) -> dict[str, Any]:
    return {name: ci.to_dict() for name, ci in intervals.items()}


def _intervals_from_dict(data: dict[str, Any] | None) -> dict[str, Interval]:
    return {name: Interval.from_dict(ci) for name, ci in (data or {}).items()}


@dataclass(frozen=True)
class InterNode:
    """Inter-node link parameters of the two-level model and the algorithm across nodes.

    ``source``: "fitted" (from multi-node records) or where they came from (a preset's name).
    """

    a_s: float
    b_s_per_byte: float
    algorithm: str
    source: str = "given"
    intervals: dict[str, Interval] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "a_s": float(self.a_s),
            "b_s_per_byte": float(self.b_s_per_byte),
            "source": self.source,
            "intervals": _intervals_to_dict(self.intervals),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InterNode:
        return cls(
            float(data["a_s"]),
            float(data["b_s_per_byte"]),
            str(data["algorithm"]),
            str(data.get("source", "given")),
            _intervals_from_dict(data.get("intervals")),
        )


@dataclass(frozen=True)
class CollectiveRegime:
    """One message-size range: its algorithm, parameters, intervals and selection scores.

    ``candidates``: cross-validated mean relative error of each algorithm tried (None when
    nothing could be cross-validated); ``inter``: fitted inter-node parameters, if any.
    """

    min_bytes: int
    max_bytes: int
    algorithm: str
    a_s: float
    b_s_per_byte: float
    g_s_per_byte: float
    intervals: dict[str, Interval] = field(default_factory=dict)
    cv_rel_error: float | None = None
    candidates: dict[str, float | None] = field(default_factory=dict)
    inter: InterNode | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_bytes": int(self.min_bytes),
            "max_bytes": int(self.max_bytes),
            "algorithm": self.algorithm,
            "a_s": float(self.a_s),
            "b_s_per_byte": float(self.b_s_per_byte),
            "g_s_per_byte": float(self.g_s_per_byte),
            "intervals": _intervals_to_dict(self.intervals),
            "cv_rel_error": self.cv_rel_error,
            "candidates": dict(self.candidates),
            "inter": None if self.inter is None else self.inter.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectiveRegime:
        cv = data.get("cv_rel_error")
        return cls(
            int(data["min_bytes"]),
            int(data["max_bytes"]),
            str(data["algorithm"]),
            float(data["a_s"]),
            float(data["b_s_per_byte"]),
            float(data.get("g_s_per_byte", 0.0)),
            _intervals_from_dict(data.get("intervals")),
            None if cv is None else float(cv),
            dict(data.get("candidates") or {}),
            None if data.get("inter") is None else InterNode.from_dict(data["inter"]),
        )


def regime_indices(regimes: Sequence[CollectiveRegime], n: Any) -> np.ndarray:
    """The index of the regime each size ``n`` falls in: regimes switch at the geometric mean
    of neighbouring regimes' end sizes."""
    ends = zip(regimes[:-1], regimes[1:], strict=True)
    switches = np.array([np.sqrt(a.max_bytes * b.min_bytes) for a, b in ends])
    return np.searchsorted(switches, n, side="right")


def regime_times(
    op: str,
    regimes: Sequence[CollectiveRegime],
    inter_node: InterNode | None,
    n: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
) -> np.ndarray:
    """Seconds of ``op`` at sizes ``n``, ``p`` ranks, ``q`` ranks per node (1-D arrays).

    Each size takes the regime it falls in (switches at the geometric mean of neighbouring
    regimes' end sizes); one node (``q >= p``) uses the regime's algorithm, several the
    two-level formulas with the regime's fitted inter-node parameters or else ``inter_node``.
    """
    which = regime_indices(regimes, n)
    out = np.zeros(n.shape)
    for r, regime in enumerate(regimes):
        flat, multi = (which == r) & (q >= p), (which == r) & (q < p)
        if np.any(flat):
            cols = coefficients(op, regime.algorithm, p[flat], n[flat])
            out[flat] = cols @ [regime.a_s, regime.b_s_per_byte, regime.g_s_per_byte]
        if np.any(multi):
            inter = regime.inter or inter_node
            if inter is None:
                raise ValueError(
                    f"{op}: no inter-node parameters (the records came from one node); "
                    "give inter_node= (a network preset) to predict across nodes"
                )
            cols = two_level_coefficients(op, inter.algorithm, p[multi], q[multi], n[multi])
            params = [regime.a_s, regime.b_s_per_byte, inter.a_s, inter.b_s_per_byte]
            out[multi] = cols @ [*params, regime.g_s_per_byte]
    return out
