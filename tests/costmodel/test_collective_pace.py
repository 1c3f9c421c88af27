"""The pace of a busy node's collectives: above the ranks per node the collectives benchmark
ran, each intra-node step of a CPU collective takes the node fill's slowest process (slowdown
times straggler) over its pace at those ranks; steps between nodes, GPU ranks and the measured
ranks keep the fit's times."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from calibration.nodefill import NodeFill
from calibration.profile import load_profile
from pdlsim.costmodel.model import ProfileCostModel
from pdlsim.costmodel.node_sharing import collective_pace, paced
from pdlsim.costmodel.profile_links import collective_ranks_per_node
from pdlsim.sim import Placement, Step, TimedStep

LEVELS = (1, 2, 4, 8, 16)
SLOWDOWN = (1.0, 1.1, 1.2, 1.3, 1.5)
STRAGGLER = (1.0, 1.05, 1.1, 1.2, 1.3)


def _fill(stragglers: bool = True) -> NodeFill:
    lows = tuple(s * 0.95 for s in SLOWDOWN)
    highs = tuple(s * 1.05 for s in SLOWDOWN)
    spread = (STRAGGLER, STRAGGLER, STRAGGLER) if stragglers else None
    return NodeFill(LEVELS, SLOWDOWN, lows, highs, {}, spread)


def _colocation(fill: NodeFill | None) -> SimpleNamespace:
    return SimpleNamespace(node_fill_=fill)


@pytest.fixture(scope="module")
def profile():
    return load_profile("h200-16core")  # collectives measured at 2 ranks on one node


def test_the_slowest_busy_process_over_its_pace_where_the_collectives_ran(profile):
    assert collective_ranks_per_node(profile) == 2
    for i, ranks in enumerate(LEVELS[2:], start=2):
        pace = collective_pace(_colocation(_fill()), ranks, profile)
        expected = SLOWDOWN[i] * STRAGGLER[i] / (SLOWDOWN[1] * STRAGGLER[1])
        assert pace.ratio == pytest.approx(expected)
        assert pace.interval.low <= pace.ratio <= pace.interval.high
        assert (pace.held_ranks_per_node, pace.ranks_per_node) == (2, ranks)
    without = collective_pace(_colocation(_fill(stragglers=False)), 16, profile)
    assert without.ratio == pytest.approx(SLOWDOWN[4] / SLOWDOWN[1])  # the slowdown alone


def test_nothing_at_or_below_the_measured_ranks_or_without_a_node_fill(profile):
    assert collective_pace(_colocation(_fill()), 2, profile) is None
    assert collective_pace(_colocation(_fill()), 1, profile) is None
    assert collective_pace(_colocation(None), 16, profile) is None
    assert collective_pace(None, 16, profile) is None
    two_cores = NodeFill((1, 2), (1.0, 1.2), (1.0, 1.1), (1.0, 1.3), {}, None)
    assert collective_pace(_colocation(two_cores), 4, profile) is None  # nothing above 2


def test_only_intra_node_steps_of_those_ranks_are_paced(profile):
    pace = collective_pace(_colocation(_fill()), 16, profile)
    steps = (TimedStep(Step(1e6, "intra"), 1e-3), TimedStep(Step(1e6, "inter"), 2e-3))
    intra, inter = paced(steps, pace, 16)
    assert intra.time_s == pytest.approx(1e-3 * pace.ratio)
    assert inter.time_s == 2e-3
    assert paced(steps, pace, 8) == steps  # another placement: not this pace
    assert paced(steps, None, 16) == steps


def test_a_prediction_paces_cpu_collectives_above_the_measured_ranks(profile):
    def allreduce_s(ranks: int, corrections: frozenset[str]) -> float:
        cost = ProfileCostModel.from_profile(
            profile, workload="mlp", ranks_per_node=ranks, corrections=corrections
        )
        return cost.collective_time("allreduce", 2**20, ranks, Placement(1, ranks))

    on, off = frozenset({"pace"}), frozenset()
    pace = collective_pace(profile.model("colocation"), 16, profile)
    assert pace is not None and pace.ratio > 1.0  # the packaged host's node fill
    assert allreduce_s(16, on) == pytest.approx(allreduce_s(16, off) * pace.ratio)
    assert allreduce_s(2, on) == allreduce_s(2, off)  # where the collectives were measured
    gpu = ProfileCostModel.from_profile(profile, device="gpu", workload="mlp", ranks_per_node=8)
    assert gpu.pace is None  # GPU ranks' collectives are NCCL's, not the host's MPI
