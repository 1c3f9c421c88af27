"""One step-time distribution for both the expected maxima and the simulator's draws.

The jitter model (:mod:`calibration.jitter`) keeps the measured step times as sorted atoms and
fits a parametric family to them. The atoms describe the body of the distribution best (a shared
VM's steps have a narrow core and a heavy tail, which no family fits both of: a lognormal fitted
to the steps spreads their core several times as wide as measured; evidence: docs/evidence.md,
"Jitter"); the family extrapolates the tail beyond the largest samples, which the slowest of
many ranks reaches. :class:`Spliced` is the distribution with the atoms' quantile function below
quantile level ``switch`` and the family's above it, shifted to meet the atoms there, so that it
stays monotone.

Everything that prices the slowest rank uses it: E[max of P draws] (:meth:`Spliced.expected_max`,
the analytic model's sync) and the draws, quantiles and tail quantiles of the simulator
(:meth:`Spliced.sample`, :meth:`Spliced.quantile`, :meth:`Spliced.upper_quantile`). With the
expected maxima from the atoms and the draws from the family alone, the simulator's sync would
sit well above the analytic model's, which the measured skew is fitted to (evidence:
docs/evidence.md, "Jitter").

E[max of P] = the integral over v in (0, 1) of Q(v^(1/P)) dv (u = F(x), v = u^P): exact over
the atoms' steps below v = switch^P, and by tanh-sinh quadrature over the family's tail above
(smooth however large P is, with 1 - u kept accurate next to 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Spliced", "tanh_sinh_nodes"]


def tanh_sinh_nodes(step: float = 1 / 16, half_width: float = 3.5) -> tuple[np.ndarray, ...]:
    """log w and weights of tanh-sinh quadrature on w in (0, 1) (Takahasi & Mori): exact to
    ~1e-12 for the integrands here, endpoint singularities included, with w's logarithm kept
    accurate next to 1 (w = 1 / (1 + exp(-2s)), s = pi/2 sinh t)."""
    t = np.arange(-half_width, half_width + step / 2, step)
    s = np.pi / 2 * np.sinh(t)
    decay = np.exp(-2 * np.abs(s))
    weights = step * np.pi * np.cosh(t) * decay / (1 + decay) ** 2
    return -np.log1p(np.exp(-2 * s)), weights


_LOG_W, _WEIGHTS = tanh_sinh_nodes()


@dataclass(frozen=True, eq=False)
class Spliced:
    """Equally weighted sorted ``atoms`` up to quantile level ``switch`` (in [0, 1)), the frozen
    scipy distribution ``family`` above it, shifted to meet the atoms at ``switch``. With
    ``switch`` 0 (too few samples for a body) it is the family shifted to the atoms' mean."""

    atoms: np.ndarray
    family: Any
    switch: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.switch < 1.0:
            raise ValueError(f"switch must be in [0, 1), got {self.switch}")
        if self.atoms.size < 1 or np.any(np.diff(self.atoms) < 0):
            raise ValueError("atoms must be a non-empty sorted array")

    @property
    def shift(self) -> float:
        """What the family's quantiles move by to meet the atoms at ``switch``."""
        if self.switch == 0.0:
            return float(np.mean(self.atoms) - self.family.mean())
        return float(self._atom(np.asarray(self.switch)) - self.family.ppf(self.switch))

    def _atom(self, u: np.ndarray) -> np.ndarray:
        """The atoms' quantile function (a step function, right-continuous in the index)."""
        n = self.atoms.size
        index = np.clip(np.ceil(np.asarray(u, dtype=float) * n).astype(np.int64) - 1, 0, n - 1)
        return self.atoms[index]

    def _tail(self, tail: np.ndarray) -> np.ndarray:
        """The shifted family at upper-tail probability ``tail`` (= 1 - u), accurate when tiny."""
        tail = np.asarray(tail, dtype=float)
        upper = self.family.isf(np.clip(tail, 0.0, 0.5))
        lower = self.family.ppf(np.clip(1.0 - tail, 0.0, 1.0))
        return np.where(tail < 0.5, upper, lower) + self.shift

    def quantile(self, u: Any) -> np.ndarray:
        """Q(u) for u in [0, 1]."""
        u = np.asarray(u, dtype=float)
        return np.where(u <= self.switch, self._atom(u), self._tail(1.0 - u))

    def upper_quantile(self, tail: Any) -> np.ndarray:
        """Q(1 - ``tail``), accurate for the tiny tails that the slowest of many ranks takes."""
        tail = np.asarray(tail, dtype=float)
        return np.where(1.0 - tail <= self.switch, self._atom(1.0 - tail), self._tail(tail))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return self.quantile(rng.random(size))

    def expected_max(self, ranks: Any) -> np.ndarray:
        """E[max of P iid draws] for each P in ``ranks`` (module docstring)."""
        p = np.atleast_1d(np.asarray(ranks, dtype=float))
        v_switch = self.switch**p  # where the atoms end, on the v scale
        n = self.atoms.size
        levels = np.arange(n + 1) / n
        with np.errstate(divide="ignore"):
            steps = np.exp(p[:, np.newaxis] * np.log(levels[np.newaxis, :]))  # (i/n)^P
        steps = np.minimum(steps, v_switch[:, np.newaxis])
        body = np.diff(steps, axis=1) @ self.atoms
        # v = v_s + (1 - v_s) w over the tail; 1 - v = (1 - v_s)(1 - w), kept accurate
        width = 1.0 - v_switch
        one_minus_v = width[:, np.newaxis] * -np.expm1(_LOG_W)[np.newaxis, :]
        one_minus_v = np.minimum(one_minus_v, 1.0 - np.finfo(float).eps)  # v > 0: u > 0
        log_u = np.log1p(-one_minus_v) / p[:, np.newaxis]
        tail = self._tail(-np.expm1(log_u))
        return body + width * (tail @ _WEIGHTS)
