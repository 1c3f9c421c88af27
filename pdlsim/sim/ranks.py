"""Which rank does how much: device speeds, how the global batch is split, when ranks sync.

**Speeds.** A rank of speed s runs its forward and backward passes in 1/s of the time a speed-1
rank (the cost model's device) needs at the same batch: a slow node, an older GPU in the mix.
The update, the mini-batch copy and gradient (de)compression are taken at their nominal cost
on every rank (they are per parameter or per byte, small, and keeping them common keeps the
step boundary common to all ranks, as the engines assume).

**Balance.** ``static``: every rank gets ``batch_per_rank`` samples, so the slowest rank sets
the pace. ``proportional``: the same global batch (``batch_per_rank`` x P) split in proportion
to speed, by largest remainders so that the integer batches sum exactly (:func:`split_batch`);
each rank's compute is then the cost model's at its own batch, divided by its speed.

**Stragglers.** ``Cluster.straggler = x`` runs the last rank x times slower than its speed:
the slowest process of a busy node, which the others wait for. The proportional split does not
see it (no one can tell in advance which process will lag), only the compute does.

**Classes.** Ranks with the same (speed, batch) behave alike; the engines simulate one
representative per class (:class:`RankLayout`), rank 0's class first: rank 0 is the rank whose
breakdown is reported, so put slow ranks last (``--slow-ranks`` does) to see what they cost a
full-speed rank.

**Local SGD.** With ``sync_every = k`` the gradients are allreduced on every k-th step only
(:func:`sync_steps`); the steps between are compute only and ranks do not wait for each other
in them. Warm-up steps all synchronise, so the measured steps are whole periods of k steps that
start together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import ConfigError

__all__ = [
    "BALANCES",
    "RankClass",
    "RankLayout",
    "period_lengths",
    "rank_layout",
    "split_batch",
    "sync_steps",
]

BALANCES = ("static", "proportional")


class _ClusterLike(Protocol):
    """What the layout reads of a :class:`pdlsim.sim.cluster.Cluster`."""

    @property
    def ranks(self) -> int: ...

    @property
    def speeds(self) -> tuple[float, ...] | None: ...

    @property
    def straggler(self) -> float: ...


class _ScenarioLike(Protocol):
    """What the layout and the sync schedule read of a :class:`pdlsim.sim.cluster.Scenario`."""

    @property
    def batch_per_rank(self) -> int: ...

    @property
    def balance(self) -> str: ...

    @property
    def sync_every(self) -> int: ...

    @property
    def iterations(self) -> int: ...

    @property
    def warmup_iterations(self) -> int: ...


def split_batch(global_batch: int, speeds: np.ndarray) -> np.ndarray:
    """Integer batches proportional to ``speeds`` that sum to ``global_batch`` exactly: each
    rank gets the floor of its quota, and the samples left over go one each to the largest
    remainders (ties to the lower rank)."""
    speeds = np.asarray(speeds, dtype=float)
    quotas = global_batch * speeds / speeds.sum()
    batches = np.floor(quotas).astype(np.int64)
    left = int(global_batch - batches.sum())
    order = np.argsort(-(quotas - batches), kind="stable")
    batches[order[:left]] += 1
    return batches


@dataclass(frozen=True)
class RankClass:
    """Ranks that run alike: ``count`` of them at ``speed`` with ``batch`` samples each;
    ``first`` is the lowest of them."""

    speed: float
    batch: int
    count: int
    first: int


@dataclass(frozen=True, eq=False)
class RankLayout:
    """The classes (rank 0's first) and the class of every rank."""

    classes: tuple[RankClass, ...]
    of_rank: np.ndarray

    @property
    def heterogeneous(self) -> bool:
        return len(self.classes) > 1 or self.classes[0].speed != 1.0


def rank_layout(cluster: _ClusterLike, scenario: _ScenarioLike) -> RankLayout:
    """Speeds and batches of every rank, grouped into classes (see the module docstring)."""
    p = cluster.ranks
    speeds = np.ones(p) if cluster.speeds is None else np.asarray(cluster.speeds, dtype=float)
    if scenario.balance == "proportional":
        batches = split_batch(scenario.batch_per_rank * p, speeds)
        if batches.min() < 1:
            r = int(np.argmin(batches))
            raise ConfigError(
                f"proportional balance leaves rank {r} (speed {speeds[r]:g}) no sample of the "
                f"global batch of {scenario.batch_per_rank * p}; use a larger batch"
            )
    else:
        batches = np.full(p, scenario.batch_per_rank, dtype=np.int64)
    if cluster.speeds is None and scenario.balance == "static" and cluster.straggler == 1.0:
        return RankLayout((RankClass(1.0, scenario.batch_per_rank, p, 0),), np.zeros(p, int))
    speeds = speeds.copy()
    speeds[-1] /= cluster.straggler
    keys: dict[tuple[float, int], int] = {}
    of_rank = np.empty(p, dtype=int)
    for r, key in enumerate(zip(speeds.tolist(), batches.tolist(), strict=True)):
        of_rank[r] = keys.setdefault(key, len(keys))
    counts = np.bincount(of_rank, minlength=len(keys))
    firsts = [int(np.argmax(of_rank == c)) for c in range(len(keys))]
    classes = tuple(
        RankClass(float(s), int(b), int(counts[c]), firsts[c]) for (s, b), c in keys.items()
    )
    return RankLayout(classes, of_rank)


def sync_steps(scenario: _ScenarioLike) -> np.ndarray:
    """Per simulated step, whether it allreduces: every warm-up step, then every
    ``sync_every``-th measured step (the last of each period)."""
    k = scenario.sync_every
    measured = (np.arange(scenario.iterations) + 1) % k == 0
    return np.concatenate([np.ones(scenario.warmup_iterations, bool), measured])


def period_lengths(scenario: _ScenarioLike) -> np.ndarray:
    """Per simulated step, the length of the sync period it belongs to (1 in warm-up)."""
    return np.concatenate(
        [
            np.ones(scenario.warmup_iterations, int),
            np.full(scenario.iterations, scenario.sync_every, int),
        ]
    )
