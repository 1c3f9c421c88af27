"""Collective algorithms: known closed forms by hand, MPICH's selection, NIC sharing."""

from __future__ import annotations

import math

import pytest

from calibration.formulas import coefficients
from pdlsim.sim import LinearCostModel, LinkCost, Placement
from pdlsim.sim.collectives import TimedStep, algorithm_for, schedule, total_time_s
from tests.sim.costs import example_cost

ALPHA_INTRA, BW_INTRA, RED_INTRA = 2e-6, 5e10, 2e11
ALPHA_INTER, BW_INTER, RED_INTER = 1e-5, 1e10, 1e11


@pytest.fixture
def cost() -> LinearCostModel:
    return example_cost(
        intra=LinkCost(ALPHA_INTRA, BW_INTRA, RED_INTRA),
        inter=LinkCost(ALPHA_INTER, BW_INTER, RED_INTER),
    )


def _time(cost, n, nodes, per_node, algorithm):
    placement = Placement(nodes, per_node, algorithm)
    return cost.collective_time("allreduce", n, placement.ranks, placement)


def test_two_rank_ring_allreduce_is_the_textbook_formula(cost):
    n, p = 8_000_000, 2
    want = 2 * (p - 1) * ALPHA_INTRA + 2 * n * (p - 1) / p / BW_INTRA + n * (p - 1) / p / RED_INTRA
    assert _time(cost, n, 1, 2, "ring") == pytest.approx(want, rel=1e-12)


def test_ring_across_nodes_runs_on_the_nics_in_two_groups_of_p_minus_1_steps(cost):
    n, p = 4_000_000, 16
    _, steps = schedule("allreduce", n, 16, 1, "ring")
    assert [(s.level, s.repeat, s.flows) for s in steps] == [("inter", 15, 1), ("inter", 15, 1)]
    want = 2 * (p - 1) * ALPHA_INTER + 2 * n * (p - 1) / p / BW_INTER + n * (p - 1) / p / RED_INTER
    assert _time(cost, n, 16, 1, "ring") == pytest.approx(want, rel=1e-12)
    _, big = schedule("allreduce", n, 1024, 8, "ring")  # 8,192 ranks, still two groups
    assert [s.repeat for s in big] == [8191, 8191]


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_recursive_doubling_and_rabenseifner_on_a_power_of_two(cost, p):
    n = 1_000_000
    rd = math.log2(p) * (ALPHA_INTER + n / BW_INTER + n / RED_INTER)
    assert _time(cost, n, p, 1, "recursive_doubling") == pytest.approx(rd, rel=1e-12)
    rab = (
        2 * math.log2(p) * ALPHA_INTER
        + 2 * n * (p - 1) / p / BW_INTER
        + n * (p - 1) / p / RED_INTER
    )
    assert _time(cost, n, p, 1, "rabenseifner") == pytest.approx(rab, rel=1e-12)


def test_non_power_of_two_folds_first_and_unfolds_after(cost):
    n, p = 1_000_000, 6  # pof2 = 4: a fold step, 2 exchanges, an unfold step
    fold = ALPHA_INTER + n / BW_INTER + n / RED_INTER
    unfold = ALPHA_INTER + n / BW_INTER
    rd = fold + 2 * (ALPHA_INTER + n / BW_INTER + n / RED_INTER) + unfold
    assert _time(cost, n, p, 1, "recursive_doubling") == pytest.approx(rd, rel=1e-12)


def test_binomial_allreduce_is_a_reduce_then_a_broadcast(cost):
    n, p = 1_000_000, 5  # ceil(log2 5) = 3 rounds each way
    want = 3 * (ALPHA_INTRA + n / BW_INTRA + n / RED_INTRA) + 3 * (ALPHA_INTRA + n / BW_INTRA)
    assert _time(cost, n, 1, 5, "binomial") == pytest.approx(want, rel=1e-12)
    reduce_ = cost.collective_time("reduce", n, p, Placement(1, 5))
    bcast = cost.collective_time("broadcast", n, p, Placement(1, 5))
    assert reduce_ + bcast == pytest.approx(want, rel=1e-12)


def test_two_level_is_node_reduce_plus_leaders_allreduce_plus_node_broadcast(cost):
    n, nodes, q = 2_000_000, 4, 4
    node_reduce = cost.collective_time("reduce", n, q, Placement(1, q))
    node_bcast = cost.collective_time("broadcast", n, q, Placement(1, q))
    leaders = cost.collective_time("allreduce", n, nodes, Placement(nodes, 1))  # rabenseifner
    got = _time(cost, n, nodes, q, None)
    assert got == pytest.approx(node_reduce + leaders + node_bcast, rel=1e-12)
    assert got == pytest.approx(_time(cost, n, nodes, q, "two_level"), rel=1e-15)


def test_flat_recursive_doubling_shares_the_nic_among_the_ranks_of_a_node(cost):
    n = 1_000_000
    _, steps = schedule("allreduce", n, 2, 4, "recursive_doubling")
    assert [(s.level, s.flows, s.repeat) for s in steps] == [("intra", 1, 2), ("inter", 4, 1)]
    want = 2 * (ALPHA_INTRA + n / BW_INTRA + n / RED_INTRA) + (
        ALPHA_INTER + 4 * n / BW_INTER + n / RED_INTER
    )
    assert _time(cost, n, 2, 4, "recursive_doubling") == pytest.approx(want, rel=1e-12)


def test_algorithm_selection_follows_mpich_defaults():
    assert algorithm_for("allreduce", 2048, 1, 8, None) == "recursive_doubling"  # short
    assert algorithm_for("allreduce", 2049, 1, 8, None) == "rabenseifner"  # long
    assert algorithm_for("allreduce", 4092, 1024, 1, None) == "recursive_doubling"  # 1023 < 1024
    assert algorithm_for("allreduce", 4096, 1024, 1, None) == "rabenseifner"
    assert algorithm_for("allreduce", 2**20, 16, 1, None) == "rabenseifner"
    assert algorithm_for("allreduce", 16, 2, 4, None) == "two_level"  # SMP-aware, every size
    assert algorithm_for("allreduce", 2**30, 2, 4, None) == "two_level"
    assert algorithm_for("allreduce", 2**20, 2, 4, "ring") == "ring"  # forced
    assert algorithm_for("broadcast", 2**20, 2, 4, None) == "binomial"


def test_unknown_algorithm_or_collective_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'"):
        schedule("allreduce", 100, 2, 2, "tree")
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        schedule("alltoall", 100, 2, 2)


def test_one_rank_costs_nothing_and_the_schedule_sums_to_the_closed_form(cost):
    assert _time(cost, 10**6, 1, 1, None) == 0.0
    for args in [(1, 6, None), (3, 5, None), (8, 1, "ring"), (2, 4, "binomial")]:
        placement = Placement(*args)
        timed = cost.collective_schedule("allreduce", 123_456, placement.ranks, placement)
        assert all(isinstance(t, TimedStep) for t in timed)
        assert total_time_s(timed) == cost.collective_time(
            "allreduce", 123_456, placement.ranks, placement
        )


def test_ranks_must_match_the_placement(cost):
    with pytest.raises(ValueError, match="ranks 3"):
        cost.collective_time("allreduce", 100, 3, Placement(2, 2))


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "binomial"])
@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 6, 7, 8, 12, 16, 33])
def test_the_simulators_steps_are_the_calibrations_formulas(algorithm, ranks):
    """The calibration fits each algorithm's closed form (messages, bytes moved, bytes
    reduced), the simulator plays its steps after classifying and merging them: on one flat
    level they must add up to the very columns the fit used, so that a fitted alpha, beta,
    gamma mean the same in both."""
    nbytes = 3 << 20
    _, steps = schedule("allreduce", nbytes, 1, ranks, algorithm)
    summed = (
        sum(s.repeat for s in steps),
        sum(s.repeat * s.flows * s.nbytes for s in steps),
        sum(s.repeat * s.reduce_bytes for s in steps),
    )
    assert summed == pytest.approx(tuple(coefficients("allreduce", algorithm, ranks, nbytes)[0]))


@pytest.mark.parametrize("ranks", [2, 3, 5, 8, 13])
def test_the_simulators_broadcast_is_the_calibrations_binomial_bcast(ranks):
    _, steps = schedule("broadcast", 1 << 16, 1, ranks, "binomial")
    summed = (sum(s.repeat for s in steps), sum(s.repeat * s.nbytes for s in steps), 0.0)
    assert summed == pytest.approx(tuple(coefficients("bcast", "binomial", ranks, 1 << 16)[0]))
