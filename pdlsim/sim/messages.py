"""Point-to-point messages and allgathers, timed through the cost interface.

The cost interface (:class:`pdlsim.sim.CostModel`) times the collectives of
:mod:`pdlsim.sim.collectives`: allreduce, reduce and broadcast. Model and pipeline parallelism
also need a single message between two ranks and an allgather. Both are built here from the one
collective that *is* a single message: a broadcast between two ranks (binomial tree, one step:
``alpha + n beta`` of the link level the pair crosses). A cost model answers it from the same
links it times every other collective with, so nothing new has to be calibrated.

**Allgather** (every rank contributes ``nbytes / P`` and ends with all ``nbytes``): the
algorithm MPICH 3.3 picks (``MPIR_Allgather_intra_auto``, src/mpi/coll/allgather/allgather.c):
recursive doubling when the total is below ``MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE`` = 512 KiB and
P is a power of two (step k exchanges ``2^k n / P`` with rank ``r xor 2^k``); Bruck's algorithm
when the total is below ``MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE`` = 80 KiB (step k sends
``min(2^k, P - 2^k) n / P`` to rank ``r - 2^k``); the ring otherwise (P - 1 steps of ``n / P``
to rank ``r + 1``). Steps are classified as in :mod:`pdlsim.sim.collectives`: inter-node when
any pair crosses nodes (node-major ranks), ``flows`` the sends through the busiest NIC. A step
is timed as a two-rank broadcast of ``flows x nbytes`` on its level, which is exactly
``LinkCost.step_time_s`` of the step (``alpha + flows nbytes beta``; an allgather reduces
nothing). Uneven slices (an ``MPI_Allgatherv``) are timed as the even split of the same total.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .collectives import Step, TimedStep, total_time_s
from .cost import CostModel, Placement

__all__ = [
    "ALLGATHER_LONG_MSG_BYTES",
    "ALLGATHER_SHORT_MSG_BYTES",
    "allgather_algorithm",
    "allgather_schedule",
    "allgather_steps",
    "allgather_time",
    "message_time",
]

ALLGATHER_LONG_MSG_BYTES = 524_288  # MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE
ALLGATHER_SHORT_MSG_BYTES = 81_920  # MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE


def message_time(cost: CostModel, nbytes: float, crosses_nodes: bool) -> float:
    """Seconds for one message of ``nbytes`` from one rank to another (inside a node or not)."""
    if nbytes <= 0:
        return 0.0
    placement = Placement(2, 1) if crosses_nodes else Placement(1, 2)
    # Not rounded to whole bytes: chunk sizes are real numbers, as in collectives.schedule.
    return cost.collective_time("broadcast", nbytes, 2, placement)  # type: ignore[arg-type]


def allgather_algorithm(nbytes: float, ranks: int) -> str:
    """The allgather MPICH runs for a total of ``nbytes`` over ``ranks`` (module docstring)."""
    power_of_two = ranks & (ranks - 1) == 0
    if nbytes < ALLGATHER_LONG_MSG_BYTES and power_of_two:
        return "recursive_doubling"
    if nbytes < ALLGATHER_SHORT_MSG_BYTES:
        return "bruck"
    return "ring"


@lru_cache(maxsize=1024)
def _pattern(name: str, ranks: int) -> tuple[tuple[float, np.ndarray, int], ...]:
    """Per run of identical steps: the fraction of the total each rank sends, each rank's
    partner, and how many steps in a row do so. The ring's P - 1 steps are one run: a step
    per rank, each classified over all P ranks, would take P^2 operations (hours for a
    million ranks)."""
    src = np.arange(ranks)
    if name == "ring":
        return ((1.0 / ranks, _frozen((src + 1) % ranks), ranks - 1),)
    steps = []
    distance = 1
    while distance < ranks:
        if name == "recursive_doubling":
            steps.append((distance / ranks, _frozen(src ^ distance), 1))
        else:  # bruck
            blocks = min(distance, ranks - distance)
            steps.append((blocks / ranks, _frozen((src - distance) % ranks), 1))
        distance <<= 1
    return tuple(steps)


def _frozen(array: np.ndarray) -> np.ndarray:
    """``array``, read-only: :func:`_pattern`'s cache hands the same one to every caller."""
    array.flags.writeable = False
    return array


@lru_cache(maxsize=256)
def allgather_steps(nbytes: float, nodes: int, ranks_per_node: int) -> tuple[str, tuple[Step, ...]]:
    """The algorithm and its steps (identical consecutive steps merged into repeats); kept for
    the next layer, band sample or step of the same size (each call looks at every rank)."""
    ranks = nodes * ranks_per_node
    name = allgather_algorithm(nbytes, ranks)
    if ranks == 1 or nbytes <= 0:
        return name, ()
    node_of = np.arange(ranks) // ranks_per_node
    steps: list[Step] = []
    for fraction, dst, repeat in _pattern(name, ranks):
        cross = node_of != node_of[dst]
        level = "inter" if cross.any() else "intra"
        flows = int(np.bincount(node_of[cross], minlength=nodes).max()) if cross.any() else 1
        step = Step(fraction * nbytes, level, 0.0, flows, repeat, f"allgather {name}")
        last = steps[-1] if steps else None
        if last is not None and (last.nbytes, last.level, last.flows) == (
            step.nbytes,
            step.level,
            step.flows,
        ):
            steps[-1] = Step(
                last.nbytes, last.level, 0.0, last.flows, last.repeat + repeat, last.phase
            )
        else:
            steps.append(step)
    return name, tuple(steps)


def allgather_schedule(
    cost: CostModel, nbytes: float, placement: Placement
) -> tuple[str, tuple[TimedStep, ...]]:
    """The allgather's steps, each timed through the cost model (module docstring); the cost
    model's own allgather where it has one (:meth:`pdlsim.sim.cost.CostHooks.native_allgather`)."""
    native = cost.native_allgather(int(nbytes), placement)
    if native is not None:
        return native
    name, steps = allgather_steps(nbytes, placement.nodes, placement.ranks_per_node)
    timed = tuple(
        TimedStep(s, message_time(cost, s.flows * s.nbytes, s.level == "inter")) for s in steps
    )
    return name, timed


def allgather_time(cost: CostModel, nbytes: float, placement: Placement) -> float:
    """Seconds for an allgather of ``nbytes`` in total over ``placement``'s ranks."""
    return total_time_s(allgather_schedule(cost, nbytes, placement)[1])
