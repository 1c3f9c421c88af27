"""What sharing a node costs CPU ranks beyond the kernels: the co-location factor's source
line, the straggler of a busy node, and the pace of its collectives.

**Co-location** (:class:`calibration.colocation.ColocationModel`) slows every rank's compute;
:func:`colocation_source` says where its factor comes from for a prediction.

**The straggler**: one rank slower than the others, which a synchronous step waits for. Above
the ranks per node the jitter benchmark ran, the node-fill benchmark's processes show how much
slower the slowest of R busy cores runs than the median one
(:meth:`calibration.colocation.ColocationModel.straggler`, carried from the jitter's ranks as
the co-location factor is). A prediction of data-parallel ranks slows its last rank by that
much (:attr:`pdlsim.sim.Cluster.straggler`); every other rank then waits for it at each
gradient allreduce, which the breakdown shows as sync. At or below the jitter's ranks per node
nothing is added: the jitter and co-location steps measured there hold whatever two ranks
straggle.

**The pace of collectives** (:func:`collective_pace`): a collective among the ranks of one
node is their CPUs copying and reducing through shared memory, every rank busy and each step
of the algorithm waiting for its partner, so it runs at the pace of the slowest busy process:
the node fill's slowdown times its straggler, S(R) T(R). The collectives benchmark ran at some
ranks per node R_c (2 on a calibration at 1-2 ranks), whose pace its fit already holds; above
them, each intra-node step of a CPU collective takes S(R) T(R) / (S(R_c) T(R_c)) times the
fitted time (at least 1). Steps between nodes keep theirs: the network sets their pace.
Evidence: docs/evidence.md, "Co-location beyond the calibrated ranks".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from calibration.stats import Interval
from pdlsim.costmodel.profile_links import collective_ranks_per_node
from pdlsim.costmodel.uncertainty import moved
from pdlsim.sim import TimedStep

__all__ = [
    "CollectivePace", "Straggler", "collective_pace", "colocation_source", "node_straggler",
    "paced",
]  # fmt: skip


_C = TypeVar("_C", bound="_Carried")


@dataclass(frozen=True)
class _Carried:
    """A ratio carried from measured ranks per node to ``ranks_per_node`` (``interval``: the
    node fill's kernels' range), moved by ``z`` standard deviations of it in a band's draw."""

    ratio: float
    interval: Interval
    held_ranks_per_node: int
    ranks_per_node: int
    z: float = 0.0

    @property
    def factor(self) -> float:
        """The ratio this draw takes (at least 1: a busier node is never faster)."""
        return moved(self.ratio, self.interval, self.z, 1.0)

    def drawn(self: _C, rng: np.random.Generator) -> _C:
        return replace(self, z=float(rng.standard_normal()))


@dataclass(frozen=True)
class CollectivePace(_Carried):
    """Each intra-node step of a CPU collective ``ratio`` times slower than the collectives'
    fit at ``held_ranks_per_node`` (module docstring)."""

    def source(self) -> str:
        return (
            f"profile's node fill: the slowest of {self.ranks_per_node} busy cores "
            f"x{self.ratio:.3f} [{self.interval.low:.3f}, {self.interval.high:.3f}] the pace "
            f"of {self.held_ranks_per_node}, where the collectives were measured; on each "
            "intra-node step of a collective"
        )


@dataclass(frozen=True)
class Straggler(_Carried):
    """The slowest rank ``ratio`` times slower than the others (module docstring)."""

    def source(self, applied: bool = True) -> str:
        """The provenance line of a prediction, which applies it or (layer-wise models, which
        take identical ranks) does not."""
        measured = (
            f"profile's node fill: the slowest of {self.ranks_per_node} ranks per node "
            f"x{self.ratio:.3f} [{self.interval.low:.3f}, {self.interval.high:.3f}] over the "
            f"others (carried from {self.held_ranks_per_node} to {self.ranks_per_node} busy "
            "cores)"
        )
        if not applied:
            return f"not applied: {measured}; the layer-wise models take ranks alike"
        return f"{measured}; one rank runs that much slower"


def node_straggler(colocation: Any, ranks_per_node: int) -> Straggler | None:
    """The straggler of ``ranks_per_node`` CPU ranks per node from a profile's co-location
    model (None: no model, no node fill with stragglers, or not above its measured ranks)."""
    if colocation is None:
        return None
    carried = colocation.straggler(ranks_per_node)
    if carried is None:
        return None
    ratio, low, high = carried
    return Straggler(ratio, Interval(low, high), colocation.max_ranks_per_node, ranks_per_node)


def collective_pace(colocation: Any, ranks_per_node: int, profile: Any) -> CollectivePace | None:
    """The pace of the intra-node steps of ``ranks_per_node`` CPU ranks' collectives, from a
    profile's co-location model (its node fill) and the ranks per node its collectives were
    measured at; None where nothing is carried: no node fill, not above those ranks, or a fill
    that measured nothing above them."""
    fill = None if colocation is None else colocation.node_fill_
    held = collective_ranks_per_node(profile)
    if fill is None or ranks_per_node <= held or fill.levels[-1] <= held:
        return None

    def slowest(k: int) -> tuple[float, float, float]:
        s, t = fill.slowdown(k), fill.straggler(k) or (1.0, 1.0, 1.0)
        return s[0] * t[0], s[1] * t[1], s[2] * t[2]

    base = slowest(held)[0]
    value, low, high = slowest(ranks_per_node)
    ratio = max(1.0, value / base)
    interval = Interval(min(ratio, max(1.0, low / base)), max(ratio, high / base))
    return CollectivePace(ratio, interval, held, ranks_per_node)


def paced(
    steps: tuple[TimedStep, ...], pace: CollectivePace | None, ranks_per_node: int
) -> tuple[TimedStep, ...]:
    """A CPU collective's ``steps`` with each intra-node one at ``pace``, where it is that of
    these ``ranks_per_node`` (the steps as they are otherwise)."""
    if pace is None or ranks_per_node != pace.ranks_per_node:
        return steps
    factor = pace.factor
    return tuple(
        TimedStep(s.step, s.time_s * factor) if s.step.level == "intra" else s for s in steps
    )


def colocation_source(colocation: Any, workload: str, ranks_per_node: int) -> str:
    """The provenance line of the co-location factor at ``ranks_per_node`` CPU ranks per node
    (``colocation``: the profile's model, None where not measured or switched off)."""
    if colocation is None or not colocation.points_:
        return "not measured: ranks of a node assumed not to slow each other"
    factor, _ = colocation.factor(workload, 1, ranks_per_node)
    held = colocation.max_ranks_per_node
    moments = colocation.span_moments(workload, 1)
    source = f"{moments} span moments of " if moments else ""
    carried = colocation.carried_by_node_fill(ranks_per_node)
    above = f", held above {held}" if ranks_per_node > held else ""
    if carried is not None:
        above = (
            f", carried above {held} by the node-fill slowdown "
            f"(x{carried[0]:.3f} from {held} to {ranks_per_node} busy cores)"
        )
    return (
        f"profile ({source}jitter at 1 and {held} ranks per node): x{factor:.3f} at "
        f"{ranks_per_node} per node{above}"
    )
