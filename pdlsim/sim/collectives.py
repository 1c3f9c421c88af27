"""Collective algorithms as lists of steps on the links of a cluster, and how MPICH picks one.

Each algorithm is written as the sequence of communication steps that its critical path goes
through. A :class:`Step` says how many bytes each sending rank sends (``nbytes``), which link
level times it (``"intra"`` inside a node, ``"inter"`` through the NICs), how many bytes the
receiver then reduces (``reduce_bytes``), how many flows share the busiest NIC in that step
(``flows``: in a flat recursive doubling across nodes with q ranks per node, all q ranks of a
node send through its NIC at once) and how often it repeats in a row (``repeat``: a ring on
8,192 ranks is two groups of 8,191 identical steps, not 16,382 steps). A cost model times one
step as ``alpha + flows * nbytes * beta + reduce_bytes * gamma`` of its level
(:meth:`pdlsim.sim.cost.LinkCost.step_time_s`); the closed form of a collective is the sum of
its steps, and the simulator plays the same steps on its link resources.

Ranks are laid out node-major (rank r on node r // ranks_per_node), as ``mpiexec`` fills nodes
by default. Which pairs talk in each step is the algorithm's pattern, written once in
:mod:`microbench.collective_steps` (MPICH's implementations), the same steps the calibration
sums into the closed forms it fits. A step is timed on the
inter-node link when any of its pairs crosses nodes: the intra-node transfers that run beside
them are assumed to be faster. Intra-node links are per rank (NVLink/NVSwitch ports, or a
core's share of memory bandwidth folded into the measured intra-node beta): only the NIC is
counted as shared.

"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from microbench.collective_steps import pattern, pof2

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "ELEMENT_BYTES",
    "OPS",
    "SHORT_MESSAGE_BYTES",
    "Level",
    "Step",
    "TimedStep",
    "algorithm_for",
    "schedule",
    "total_time_s",
]

Level = Literal["intra", "inter"]

OPS = ("allreduce", "reduce", "broadcast")
ALLREDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "binomial", "two_level")
_OP_ALGORITHMS = {
    "allreduce": ALLREDUCE_ALGORITHMS,
    "reduce": ("binomial",),
    "broadcast": ("binomial",),
}

# MPICH's default MPI_Allreduce selection, MPIR_Allreduce_intra_auto in pmodels/mpich
# src/mpi/coll/allreduce/allreduce.c (MPICH 3.3): the SMP-aware algorithm (reduce inside each
# node, allreduce among the node leaders, broadcast inside each node: MPIR_Allreduce_intra_smp)
# whenever the communicator is node aware (several nodes, several ranks on a node) and the op
# commutative, for every size (MPIR_CVAR_MAX_SMP_ALLREDUCE_MSG_SIZE = 0 means no limit);
# otherwise recursive doubling when the message is at most MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE
# = 2048 bytes or has fewer elements than the largest power of two <= ranks, and Rabenseifner's
# reduce-scatter (recursive halving) + allgather (recursive doubling) above. MPICH 4's
# documentation of MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (doc/mpich/tuning_parameters.md) states
# the same rule for its schedule-based selection. The node-local reduce and broadcast of the
# SMP algorithm are modelled as binomial trees, MPICH's choice for short messages (for long
# ones MPICH switches to reduce-scatter + gather and scatter + allgather, not modelled here).
SHORT_MESSAGE_BYTES = 2048
ELEMENT_BYTES = 4  # float32 gradients


@dataclass(frozen=True)
class Step:
    """One communication step of a collective's critical path (see the module docstring)."""

    nbytes: float
    level: Level
    reduce_bytes: float = 0.0
    flows: int = 1
    repeat: int = 1
    phase: str = ""


@dataclass(frozen=True)
class TimedStep:
    """A step with the time one instance of it takes; the group lasts ``repeat * time_s``."""

    step: Step
    time_s: float

    @property
    def duration_s(self) -> float:
        return self.step.repeat * self.time_s


def total_time_s(steps: tuple[TimedStep, ...]) -> float:
    """The closed form of a collective: the sum of its steps, in order."""
    total = 0.0
    for timed in steps:
        total += timed.duration_s
    return total


def algorithm_for(
    op: str, nbytes: float, nodes: int, ranks_per_node: int, forced: str | None
) -> str:
    """The algorithm MPICH would run (see the comment above), or the forced one, checked."""
    if op not in _OP_ALGORITHMS:
        raise ValueError(f"unknown collective '{op}'; known: {', '.join(OPS)}")
    if forced is not None:
        if forced not in _OP_ALGORITHMS[op]:
            raise ValueError(
                f"unknown {op} algorithm '{forced}'; known: {', '.join(_OP_ALGORITHMS[op])}"
            )
        return forced
    if op != "allreduce":
        return "binomial"
    if nodes > 1 and ranks_per_node > 1:
        return "two_level"
    return _flat_allreduce(nbytes, nodes * ranks_per_node)


def _flat_allreduce(nbytes: float, ranks: int) -> str:
    count = int(nbytes) // ELEMENT_BYTES
    if nbytes <= SHORT_MESSAGE_BYTES or count < pof2(ranks):
        return "recursive_doubling"
    return "rabenseifner"


@lru_cache(maxsize=4096)
def _classified(
    name: str, ranks: int, nodes: int, ranks_per_node: int
) -> tuple[tuple[float, Level, bool, int, str, int], ...]:
    """Per group of identical steps of a flat pattern: fraction of n, level, reduces, flows
    through the busiest NIC, phase, repeat."""
    node_of = np.arange(ranks) // ranks_per_node
    out: list[list] = []
    last_pairs: tuple[np.ndarray, np.ndarray] | None = None
    for fraction, src, dst, reduces, phase in pattern(name, ranks):
        if last_pairs is None or src is not last_pairs[0] or dst is not last_pairs[1]:
            cross = node_of[src] != node_of[dst]  # a ring reuses one pair array: classify once
            level: Level = "inter" if cross.any() else "intra"
            flows = (
                int(np.bincount(node_of[src[cross]], minlength=nodes).max()) if cross.any() else 1
            )
            last_pairs = (src, dst)
        key = [fraction, level, reduces, flows, phase]
        if out and out[-1][:5] == key:
            out[-1][5] += 1
        else:
            out.append([*key, 1])
    return tuple(tuple(group) for group in out)


def _steps(
    name: str, nbytes: float, ranks: int, nodes: int, ranks_per_node: int, prefix: str = ""
) -> list[Step]:
    return [
        Step(
            nbytes=fraction * nbytes,
            level=level,
            reduce_bytes=fraction * nbytes if reduces else 0.0,
            flows=flows,
            repeat=repeat,
            phase=prefix + phase,
        )
        for fraction, level, reduces, flows, phase, repeat in _classified(
            name, ranks, nodes, ranks_per_node
        )
    ]


def _merge(steps: list[Step]) -> tuple[Step, ...]:
    """Consecutive identical steps become one step with a repeat count."""
    merged: list[Step] = []
    for step in steps:
        if merged:
            last = merged[-1]
            if (last.nbytes, last.level, last.reduce_bytes, last.flows, last.phase) == (
                step.nbytes,
                step.level,
                step.reduce_bytes,
                step.flows,
                step.phase,
            ):
                merged[-1] = Step(
                    last.nbytes,
                    last.level,
                    last.reduce_bytes,
                    last.flows,
                    last.repeat + step.repeat,
                    last.phase,
                )
                continue
        merged.append(step)
    return tuple(merged)


@lru_cache(maxsize=4096)
def schedule(
    op: str, nbytes: float, nodes: int, ranks_per_node: int, algorithm: str | None = None
) -> tuple[str, tuple[Step, ...]]:
    """The algorithm (chosen like MPICH, or ``algorithm`` if given) and its steps.

    ``op`` is ``"allreduce"``, ``"reduce"`` or ``"broadcast"`` (root 0) of ``nbytes`` bytes over
    ``nodes * ranks_per_node`` ranks. One rank: no steps."""
    if nodes < 1 or ranks_per_node < 1:
        raise ValueError(f"need nodes >= 1 and ranks_per_node >= 1, got {nodes}, {ranks_per_node}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    name = algorithm_for(op, nbytes, nodes, ranks_per_node, algorithm)
    ranks = nodes * ranks_per_node
    if ranks == 1 or nbytes == 0:
        return name, ()
    if op != "allreduce":
        return name, _merge(_steps(op, nbytes, ranks, nodes, ranks_per_node))
    if name != "two_level":
        return name, _merge(_steps(name, nbytes, ranks, nodes, ranks_per_node))
    # Two-level (MPICH's SMP allreduce): every node at once, so one node's steps stand for all.
    steps: list[Step] = []
    if ranks_per_node > 1:
        steps += _steps("reduce", nbytes, ranks_per_node, 1, ranks_per_node, "node ")
    if nodes > 1:
        inner = _flat_allreduce(nbytes, nodes)
        steps += _steps(inner, nbytes, nodes, nodes, 1, "leaders ")
    if ranks_per_node > 1:
        steps += _steps("broadcast", nbytes, ranks_per_node, 1, ranks_per_node, "node ")
    return name, _merge(steps)
