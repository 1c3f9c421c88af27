"""Heterogeneous ranks: slow nodes and mixed device speeds, static and proportional balance,
the two engines agreeing on them, and the representative ranks staying exact."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from microbench.workload import load_workload
from pdlsim.cli.main import main
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.core import run_prediction
from pdlsim.sim import Cluster, ConfigError, LognormalJitter, Scenario, predict, simulate
from pdlsim.sim import simulate_factors as simulate_rows
from pdlsim.sim.cluster import build_plan, class_plans
from pdlsim.sim.ranks import rank_layout, split_batch
from tests.costmodel.test_model import write_synthetic_profile
from tests.prediction.test_whatif import _terms, compressing_cost

CNN, MLP = load_workload("cnn"), load_workload("mlp")
SLOW_NODE = (1.0,) * 6 + (0.5,) * 2  # 4 nodes x 2 ranks: the last node twice as slow


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hetero") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def test_split_batch_sums_exactly_and_follows_speed():
    assert list(split_batch(96, np.array([1, 1, 1, 0.5]))) == [28, 27, 27, 14]  # 27.4 x 3, 13.7
    assert list(split_batch(10, np.ones(4))) == [3, 3, 2, 2]  # leftovers to the lower ranks
    rng = np.random.default_rng(0)
    for _ in range(200):
        speeds = rng.uniform(0.1, 2.0, int(rng.integers(1, 40)))
        total = int(rng.integers(speeds.size, 5000))
        batches = split_batch(total, speeds)
        assert batches.sum() == total
        assert np.all(np.abs(batches - total * speeds / speeds.sum()) < 1.0)


def test_layout_groups_ranks_into_classes_rank_0_first():
    cluster = Cluster(4, 2, speeds=SLOW_NODE)
    static = rank_layout(cluster, Scenario(CNN, 32))
    assert [(c.speed, c.batch, c.count, c.first) for c in static.classes] == [
        (1.0, 32, 6, 0),
        (0.5, 32, 2, 6),
    ]
    proportional = rank_layout(cluster, Scenario(CNN, 32, balance="proportional"))
    batches = [c.batch for c in proportional.classes for _ in range(c.count)]
    assert sum(batches) == 8 * 32 and sorted({c.speed for c in proportional.classes}) == [0.5, 1]
    assert not rank_layout(Cluster(4, 2), Scenario(CNN, 32)).heterogeneous


def test_static_balance_waits_for_the_slow_rank():
    """No jitter, no overlap: the step is the slow rank's compute, then the allreduce."""
    cost = compressing_cost()
    cluster = Cluster(4, 2, speeds=SLOW_NODE)
    scenario = Scenario(CNN, 32, overlap=False, iterations=3, jitter=False)
    nominal = build_plan(Cluster(4, 2), scenario, cost)
    (bucket,) = nominal.buckets
    slow_compute = (nominal.forward_s + nominal.backward_s) / 0.5
    expected = slow_compute + bucket.collective_s + nominal.update_s
    for engine in (simulate, predict):
        result = engine(cluster, scenario, cost)
        assert result.step_time_s == pytest.approx(expected, rel=1e-12)
        b = result.breakdown  # rank 0 runs at full speed and waits for the slow node
        assert b.sync_s == pytest.approx(slow_compute / 2, rel=1e-12)
        assert b.pace_factor == pytest.approx(2.0)


def test_proportional_balance_is_faster_and_reaches_the_mean_speed_bound():
    cost = compressing_cost(cpu_layer_overhead_s=0.0)  # compute exactly linear in the batch
    cluster = Cluster(4, 2, speeds=SLOW_NODE)
    static = Scenario(CNN, 70, overlap=False, iterations=2, jitter=False)
    proportional = replace(static, balance="proportional")
    (bucket,) = build_plan(cluster, static, cost).buckets
    nominal = build_plan(Cluster(4, 2), static, cost)
    per_sample = (nominal.forward_s + nominal.backward_s) / 70
    mean_speed = float(np.mean(SLOW_NODE))
    bound = 70 * per_sample / mean_speed + bucket.collective_s + nominal.update_s
    layout = rank_layout(cluster, proportional)
    slowest = max(c.batch / c.speed for c in layout.classes)  # integer batches: a little above
    exact = slowest * per_sample + bucket.collective_s + nominal.update_s
    for engine in (simulate, predict):
        t_static = engine(cluster, static, cost).step_time_s
        t_prop = engine(cluster, proportional, cost).step_time_s
        assert t_prop < t_static
        assert t_prop == pytest.approx(exact, rel=1e-9)
        assert bound <= t_prop < bound * 1.01
    uniform = Scenario(CNN, 70, overlap=False, iterations=2, jitter=False, balance="proportional")
    assert simulate(Cluster(4, 2), uniform, cost).step_time_s == pytest.approx(
        simulate(Cluster(4, 2), replace(uniform, balance="static"), cost).step_time_s
    )


def test_engines_agree_on_random_heterogeneous_clusters():
    cost = compressing_cost(overlap_efficiency=0.7)
    rng = np.random.default_rng(11)
    for seed in range(24):
        nodes, per_node = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        if nodes * per_node == 1:
            nodes = 2
        speeds = tuple(float(s) for s in rng.choice([0.25, 0.5, 1.0, 1.5], nodes * per_node))
        device = "gpu" if seed % 2 else "cpu"
        cluster = Cluster(nodes, per_node, 1, device, speeds)
        scenario = Scenario(
            [CNN, MLP][seed % 2 == 0], int(rng.choice([8, 33, 64])),
            bucket_bytes=int(rng.choice([2**14, 2**18, 2**26])), overlap=bool(rng.random() < 0.6),
            prefetch=bool(rng.random() < 0.5), iterations=4, jitter=False,
            balance=str(rng.choice(["static", "proportional"])),
            sync_every=int(rng.choice([1, 2])), compression=rng.choice([None, "fp16", "topk:0.1"]),
        )  # fmt: skip
        sim, closed = simulate(cluster, scenario, cost), predict(cluster, scenario, cost)
        np.testing.assert_allclose(_terms(sim), _terms(closed), rtol=1e-9, atol=1e-15)


def test_one_slowest_rank_per_class_gives_what_every_rank_gives():
    """With jitter: rank 0, and per class the max of the others' factors, step by step."""
    cost = compressing_cost(overlap_efficiency=0.5)
    cluster = Cluster(3, 2, speeds=(1.0, 1.0, 1.0, 0.6, 1.0, 0.6))
    scenario = Scenario(
        CNN, 32, bucket_bytes=2**18, overlap=True, iterations=10, balance="proportional"
    )
    layout = rank_layout(cluster, scenario)
    rng = np.random.default_rng(4)
    factors = np.exp(0.15 * rng.standard_normal((cluster.ranks, scenario.total_steps)))
    every_rank = simulate_rows(cluster, scenario, cost, factors)
    rows, classes = [factors[0]], [0]
    for c in range(len(layout.classes)):
        members = [r for r in range(1, cluster.ranks) if layout.of_rank[r] == c]
        if members:
            rows.append(factors[members].max(axis=0))
            classes.append(c)
    shortcut = simulate_rows(cluster, scenario, cost, np.vstack(rows), row_classes=classes)
    np.testing.assert_allclose(_terms(shortcut), _terms(every_rank), rtol=1e-12, atol=1e-15)
    assert every_rank.breakdown.sync_s > 0
    with pytest.raises(ValueError, match="row_classes"):
        simulate_rows(cluster, scenario, cost, np.vstack(rows))


def test_jittered_heterogeneous_run_matches_every_rank_simulated_on_average():
    cost = compressing_cost(jitter=LognormalJitter(0.05))
    cluster = Cluster(4, 2, speeds=SLOW_NODE)
    scenario = Scenario(MLP, 64, iterations=300, seed=2)
    fast = simulate(cluster, scenario, cost).step_time_s
    slow = simulate(cluster, scenario, cost, representation="all_ranks").step_time_s
    assert fast == pytest.approx(slow, rel=0.01)
    assert predict(cluster, scenario, cost).step_time_s == pytest.approx(fast, rel=0.02)
    plans = class_plans(cluster, scenario, cost)
    assert [p.speed for p in plans] == [1.0, 0.5]


def test_predict_flags_build_the_slow_node(profile_path):
    base = PredictConfig(nodes=4, procs_per_node=2, profile=profile_path, samples=1,
                         iterations=4, inter_bw="10GB/s", inter_lat="5us")  # fmt: skip
    even = run_prediction(base)
    slow = run_prediction(replace(base, slow_ranks=2, slow_factor=2.0))
    same = run_prediction(replace(base, speeds=(1.0,) * 6 + (0.5,) * 2))
    balanced = run_prediction(replace(base, slow_ranks=2, slow_factor=2.0, balance="proportional"))
    assert slow["step_time_s"] > 1.5 * even["step_time_s"]
    assert same["step_time_s"] == pytest.approx(slow["step_time_s"])
    assert even["step_time_s"] < balanced["step_time_s"] < slow["step_time_s"]
    assert balanced["config"]["balance"] == "proportional"


def test_nonsense_speeds_are_errors():
    with pytest.raises(ConfigError, match="speeds give 3 ranks"):
        Cluster(2, 2, speeds=(1.0, 1.0, 1.0))
    with pytest.raises(ConfigError, match="finite and > 0"):
        Cluster(1, 2, speeds=(1.0, 0.0))
    with pytest.raises(ConfigError, match="balance"):
        Scenario(CNN, 8, balance="fair")
    with pytest.raises(ConfigError, match="no sample"):
        simulate(Cluster(1, 2, speeds=(1.0, 0.01)), Scenario(CNN, 1, balance="proportional"),
                 compressing_cost())  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["--slow-ranks", "1"],
        ["--slow-factor", "2"],
        ["--slow-ranks", "9", "--slow-factor", "2"],
        ["--speeds", "1,1,1"],
        ["--speeds", "1,0"],
        ["--speeds", "1,1", "--slow-ranks", "1", "--slow-factor", "2"],
        ["--balance", "fair"],
    ],
)
def test_bad_heterogeneity_flags_are_one_line_and_exit_2(profile_path, args, capsys):
    argv = ["predict", "--nodes", "2", "--profile", profile_path, "--samples", "1", *args]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = int(exc.code)
    assert status == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err


def test_a_straggler_is_its_last_rank_slowed_but_not_planned_for():
    """``Cluster.straggler = x`` computes as ``speeds`` with the last rank at 1/x in either
    engine; a proportional split follows the given speeds only (no one knows in advance which
    rank will lag), so the straggler keeps its full batch."""
    cost = compressing_cost()
    scenario = Scenario(CNN, 32, overlap=False, iterations=3, jitter=False)
    straggling = Cluster(4, 2, straggler=1.6)
    by_speed = Cluster(4, 2, speeds=(1.0,) * 7 + (1 / 1.6,))
    for engine in (simulate, predict):
        assert engine(straggling, scenario, cost).step_time_s == pytest.approx(
            engine(by_speed, scenario, cost).step_time_s, rel=1e-12
        )
    slow_node = Cluster(4, 2, speeds=SLOW_NODE, straggler=1.6)
    split = rank_layout(slow_node, Scenario(CNN, 32, balance="proportional"))
    planned = rank_layout(
        Cluster(4, 2, speeds=SLOW_NODE), Scenario(CNN, 32, balance="proportional")
    )
    batches = [split.classes[c].batch for c in split.of_rank]
    assert batches == [planned.classes[c].batch for c in planned.of_rank]
    assert split.classes[split.of_rank[-1]].speed == pytest.approx(0.5 / 1.6)
    assert not rank_layout(Cluster(4, 2, straggler=1.0), scenario).heterogeneous


@pytest.mark.parametrize("bad", [0.5, float("nan"), float("inf"), "2"])
def test_a_straggler_below_one_or_not_a_number_is_refused(bad):
    with pytest.raises((ConfigError, TypeError), match="straggler"):
        Cluster(2, 2, straggler=bad)
