"""The prediction band's draws: fitted values moved within their confidence intervals, and the
profile's jitter model behind the simulator's ``Jitter`` protocol.

A 95% interval of width w is read as a normal distribution of sigma = w / 3.92 around the
fitted value (:func:`draw`, :func:`moved`); draws are clipped at a floor so that rates never
reach zero.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import special

from calibration.jitter import JitterModel, frozen_family
from calibration.roofline import SCALARS, Roofline
from calibration.stats import Interval

__all__ = ["ProfileJitter", "draw", "moved", "perturbed_cost"]

_Z95 = 1.959963984540054


def draw(rng: np.random.Generator, value: float, ci: Interval | None, floor: float = 0.0):
    """A normal draw around ``value`` with the sigma of ``ci``, at least ``floor``."""
    if ci is None or not ci.high > ci.low:
        return value
    return max(float(rng.normal(value, (ci.high - ci.low) / (2 * _Z95))), floor)


def moved(value: float, ci: Interval | None, z: float, floor: float = 0.0) -> float:
    """``value`` moved by ``z`` standard deviations of ``ci`` (sigma = width / 3.92)."""
    if ci is None or not ci.high > ci.low:
        return value
    return max(value + z * (ci.high - ci.low) / (2 * _Z95), floor)


@dataclass(frozen=True, eq=False)
class ProfileJitter:
    """A fitted :class:`JitterModel` as the simulator's ``Jitter``: draws, ``ppf`` and ``isf``
    (so that the slowest of P is drawn exactly) of the model's own distribution, the one its
    expected maxima are of (the atoms and the fitted tail, :mod:`calibration.splice`), all
    scaled about the median by the model's ``scale``, an order-preserving map."""

    model: JitterModel

    def _dist(self) -> Any:
        return frozen_family(self.model.family_, self.model.params_)

    def sample(self, rng: np.random.Generator, size: Any) -> np.ndarray:
        return np.asarray(self.model.sample(rng, size), dtype=float)

    def ppf(self, q: Any) -> np.ndarray:
        return self.model.quantile(q)

    def isf(self, tail: Any) -> np.ndarray:
        return self.model.upper_quantile(tail)

    def expected_max_factor(self, ranks: int) -> float:
        return float(self.model.expected_max_factor(int(ranks)))

    def perturbed(self, rng: np.random.Generator) -> ProfileJitter:
        """Family parameters drawn in their intervals; the empirical atoms follow by quantile."""
        new = copy.copy(self.model)
        new.params_ = {
            k: draw(rng, v, self.model.intervals_.get(k), 0.01 * abs(v))
            for k, v in self.model.params_.items()
        }
        old_cdf = self._dist().cdf(self.model.atoms_)
        moved = ProfileJitter(new)._dist().ppf(np.clip(old_cdf, 1e-12, 1 - 1e-12))
        new.atoms_ = np.sort(np.asarray(moved, dtype=float))
        return ProfileJitter(new)


def _drawn_regimes(rng: np.random.Generator, regimes: Any) -> tuple[Any, ...]:
    """Collective size regimes with ``a`` and ``b`` drawn in their intervals."""
    return tuple(
        replace(
            r,
            a_s=draw(rng, r.a_s, r.intervals.get("a_s")),
            b_s_per_byte=draw(rng, r.b_s_per_byte, r.intervals.get("b_s_per_byte")),
        )
        for r in regimes
    )


def perturbed_cost(
    cost: Any, rng: np.random.Generator, stratum: tuple[int, int] | None = None
) -> Any:
    """A :class:`~pdlsim.costmodel.model.ProfileCostModel` with every fitted parameter drawn in its
    interval, every assumption (:data:`pdlsim.costmodel.presets.ASSUMPTIONS`) in its range, and new
    draws of the measured steps, co-location, a straggler and drift (see
    :mod:`pdlsim.costmodel.model`); ``stratum`` (i, K): the drift from stratum i of K
    (:func:`drift_draw`), the kernel tables' errors from a Latin hypercube over the K
    (:meth:`pdlsim.costmodel.kernels.KernelCompute.drawn`)."""
    compute = copy.copy(cost.compute)
    compute.curves_ = {}
    for key, roof in cost.compute.curves_.items():
        found = cost.compute.intervals_.get(key, {})
        scalars = {k: Interval.from_dict(v) for k, v in found.get("scalars", {}).items()}
        values = {}
        for k in SCALARS:
            value = getattr(roof, k)
            floor = 0.0 if k == "overhead_s" else 0.01 * value
            values[k] = draw(rng, value, scalars.get(k), floor)
        classes = {}
        for name, (e, h) in roof.classes.items():
            ci = found.get("classes", {}).get(name, {})
            e_ci, h_ci = (
                Interval.from_dict(ci[k]) if k in ci else None
                for k in ("efficiency_max", "half_efficiency_flops")
            )
            classes[name] = (draw(rng, e, e_ci, 0.01 * e), draw(rng, h, h_ci))
        compute.curves_[key] = Roofline(**values, classes=classes)
    regimes = _drawn_regimes(rng, cost.intra_regimes)
    gather = None
    if cost.allgather_fit is not None:
        gather = copy.copy(cost.allgather_fit)
        gather.regimes_ = list(_drawn_regimes(rng, gather.regimes_))
    transfer = None
    if cost.transfer is not None:
        transfer = copy.copy(cost.transfer)
        transfer.curves_ = {}
        for key, curve in cost.transfer.curves_.items():
            new = copy.copy(curve)
            new.regimes_ = [
                replace(
                    r,
                    alpha_s=draw(rng, r.alpha_s, r.alpha_ci),
                    beta_s_per_byte=draw(rng, r.beta_s_per_byte, r.beta_ci),
                )
                for r in curve.regimes_
            ]
            transfer.curves_[key] = new
    efficiency = min(1.0, draw(rng, cost.overlap_efficiency, cost.overlap_interval))
    assumptions = {
        name: replace(a, value=min(max(draw(rng, a.value, Interval(a.low, a.high)), a.low), a.high))
        for name, a in cost.assumptions.items()
    }
    jitter = None if cost.jitter is None else cost.jitter.perturbed(rng)
    drawn = replace(
        cost,
        compute=compute,
        intra_regimes=regimes,
        allgather_fit=gather,
        transfer=transfer,
        jitter=jitter,
        overlap_efficiency=efficiency,
        assumptions=assumptions,
        step_z=float(rng.standard_normal()),
        colocation_z=float(rng.standard_normal()),
        kernels=None if cost.kernels is None else cost.kernels.drawn(rng, stratum),
        drift_factor=drift_draw(cost, rng, stratum),
        _ops_cache={},
        _pin_cache={},
    )
    # drawn last, each: the other draws stay as they were without them
    if cost.straggler is not None:
        drawn = replace(drawn, straggler=cost.straggler.drawn(rng))
    if cost.pace is not None:
        drawn = replace(drawn, pace=cost.pace.drawn(rng))
    return drawn


def drift_draw(
    cost: Any, rng: np.random.Generator, stratum: tuple[int, int] | None = None
) -> float:
    """One sample of the machine's speed relative to typical: one of the profile's measured
    log-deviations (:mod:`calibration.drift`); a lognormal of its sigma when it kept none.

    ``stratum`` (i, K): the draw at a uniform quantile inside [i/K, (i+1)/K) instead of
    anywhere, so that K draws cover the deviations evenly (stratified sampling). A speed with
    two levels makes a plain draw's median over K = 20 samples land on either level from one
    seed to the next (a band's P50 well above or below the typical step; evidence:
    docs/evidence.md, "Drift"); stratified, it stays at the deviations' median, which is the
    typical speed."""
    u = rng.random() if stratum is None else (stratum[0] + rng.random()) / stratum[1]
    if cost.drift_log_deviations:
        ordered = np.sort(np.asarray(cost.drift_log_deviations, dtype=float))
        return float(np.exp(ordered[min(int(u * ordered.size), ordered.size - 1)]))
    return float(np.exp(cost.drift_sigma * special.ndtri(min(max(u, 1e-12), 1 - 1e-12))))
