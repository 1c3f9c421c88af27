"""What a profile's measured collectives and overlap give the cost model
(:class:`pdlsim.costmodel.model.ProfileCostModel`): the collective whose fitted alpha and
beta the links take, its size regimes, the fitted inter-node link, and the interval of the
overlap efficiency at a bucket size."""

from __future__ import annotations

import numpy as np

from calibration.collective_regimes import CollectiveRegime
from calibration.overlap import OverlapModel
from calibration.profile import Profile
from calibration.stats import Interval

__all__ = [
    "collective_ranks_per_node", "fitted_inter", "intra_regimes", "link_op", "overlap_interval",
]  # fmt: skip

_COLLECTIVE_OPS = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "pingpong")


def link_op(profile: Profile) -> str:
    """The collective whose fitted alpha/beta the links take: the first of
    :data:`_COLLECTIVE_OPS` the profile measured (allreduce where it did)."""
    models = profile.model("collectives").models_
    return next((o for o in _COLLECTIVE_OPS if o in models), None) or next(iter(models))


def collective_ranks_per_node(profile: Profile) -> int:
    """The most ranks per node :func:`link_op`'s collective was measured at (2 where its fit
    names none): the pace its fitted steps hold."""
    fitted = profile.model("collectives").models_[link_op(profile)]
    return max((q for _, q in fitted.hockney_), default=2)


def intra_regimes(profile: Profile) -> tuple[CollectiveRegime, ...]:
    """The size regimes of :func:`link_op`'s fit, smallest messages first."""
    return tuple(profile.model("collectives").models_[link_op(profile)].regimes_)


def fitted_inter(profile: Profile) -> CollectiveRegime | None:
    """The profile's fitted inter-node link (a regime's ``inter``: ``a_s``, ``b_s_per_byte``),
    the one the cost model takes when no network is given; None without one."""
    return next((r.inter for r in intra_regimes(profile) if r.inter is not None), None)


def overlap_interval(model: OverlapModel, nbytes: int, method: str) -> Interval | None:
    """The interval of the hidden fraction measured by ``method`` at the size nearest
    ``nbytes`` in log (the median of its points' bounds); None where none was measured."""
    points = [p for p in model.points_ if p.method == method and "overlap_fraction" in p.intervals]
    if not points:
        return None
    size = min({p.bytes for p in points}, key=lambda b: abs(np.log(max(b, 1) / max(nbytes, 1))))
    near = [p.intervals["overlap_fraction"] for p in points if p.bytes == size]
    return Interval(
        float(np.median([i.low for i in near])), float(np.median([i.high for i in near]))
    )
