"""What sharing a node costs CPU ranks beyond the kernels: the co-location factor's source
line, and the straggler of a busy node.

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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from calibration.stats import Interval
from pdlsim.costmodel.uncertainty import moved

__all__ = ["Straggler", "colocation_source", "node_straggler"]


@dataclass(frozen=True)
class Straggler:
    """The slowest rank ``ratio`` times slower than the others (``interval``: the node fill's
    kernels' range), moved by ``z`` standard deviations of it in a band's draw."""

    ratio: float
    interval: Interval
    held_ranks_per_node: int
    ranks_per_node: int
    z: float = 0.0

    @property
    def factor(self) -> float:
        """The ratio this draw takes (at least 1: a straggler is never faster)."""
        return moved(self.ratio, self.interval, self.z, 1.0)

    def drawn(self, rng: np.random.Generator) -> Straggler:
        return replace(self, z=float(rng.standard_normal()))

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
