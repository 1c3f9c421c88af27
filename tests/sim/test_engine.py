"""The simulator: the breakdown identity, jitter and the slowest rank, symmetry, contention,
prefetch, buckets with overlap, seeds and traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simpy

from microbench.workload import load_workload
from pdlsim.sim import (
    Cluster,
    ConfigError,
    LinkCost,
    LognormalJitter,
    Scenario,
    predict,
    simulate,
    simulate_factors,
    write_chrome_trace,
)
from pdlsim.sim.collectives import Step, TimedStep
from pdlsim.sim.engine import Link
from tests.sim.costs import example_cost

CNN, MLP = load_workload("cnn"), load_workload("mlp")
SLOW_NET = LinkCost(1e-5, 1e9, 1e11)  # 1 GB/s: communication matters


def _terms(prediction) -> np.ndarray:
    return np.array(
        [
            (s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s, s.h2d_exposed_s)
            for s in prediction.steps
        ]
    )


@pytest.fixture
def env() -> simpy.Environment:
    return simpy.Environment()


def test_breakdown_identity_holds_every_step_with_everything_switched_on():
    cost = example_cost(inter=SLOW_NET, jitter=LognormalJitter(0.1), overlap_efficiency=0.6)
    for cluster in (Cluster.gpus(4, 4), Cluster.cpus(4, 4, 2)):
        for streams in (1, 3):
            scenario = Scenario(
                CNN,
                64,
                bucket_bytes=2**16,
                overlap=True,
                prefetch=True,
                iterations=30,
                comm_streams=streams,
            )
            result = simulate(cluster, scenario, cost)
            for step in result.steps:
                assert abs(step.residual_s) <= 1e-12 * step.step_s
                assert min(step.compute_s, step.comm_s, step.sync_s, step.overlap_s) >= 0
            assert abs(result.breakdown.residual_s) <= 1e-12 * result.step_time_s
            assert result.breakdown.overlap_s > 0
    assert result.breakdown.sync_s > 0  # CPU ranks: compute long enough for stragglers to show


def test_same_seed_same_result_and_another_seed_another():
    cost = example_cost(jitter=LognormalJitter(0.05))
    scenario = Scenario(MLP, 32, iterations=20, seed=7)
    cluster = Cluster.cpus(8, 2, 4)
    first, again = simulate(cluster, scenario, cost), simulate(cluster, scenario, cost)
    assert np.array_equal(_terms(first), _terms(again))
    other = simulate(cluster, Scenario(MLP, 32, iterations=20, seed=8), cost)
    assert not np.array_equal(_terms(first), _terms(other))


def test_representative_ranks_give_exactly_what_every_rank_simulated_gives():
    """The symmetry shortcut: rank 0 plus the max of the other P - 1 factors, step by step."""
    cost = example_cost(overlap_efficiency=0.5)
    cluster = Cluster.cpus(3, 4, 2)
    scenario = Scenario(CNN, 32, bucket_bytes=2**18, overlap=True, iterations=12)
    rng = np.random.default_rng(3)
    factors = np.exp(0.15 * rng.standard_normal((cluster.ranks, scenario.total_steps)))
    every_rank = simulate_factors(cluster, scenario, cost, factors)
    shortcut = simulate_factors(
        cluster, scenario, cost, np.vstack([factors[0], factors[1:].max(axis=0)])
    )
    np.testing.assert_allclose(_terms(shortcut), _terms(every_rank), rtol=1e-12, atol=1e-15)
    assert every_rank.breakdown.sync_s > 0
    gpus = Cluster.gpus(3, 4)  # and with copies prefetched on copy engines
    prefetched = Scenario(CNN, 32, bucket_bytes=2**18, overlap=True, prefetch=True, iterations=12)
    every_rank = simulate_factors(gpus, prefetched, cost, factors)
    shortcut = simulate_factors(
        gpus, prefetched, cost, np.vstack([factors[0], factors[1:].max(axis=0)])
    )
    np.testing.assert_allclose(_terms(shortcut), _terms(every_rank), rtol=1e-12, atol=1e-15)


def test_all_ranks_representation_runs_one_process_per_rank():
    cost = example_cost(jitter=LognormalJitter(0.05))
    scenario = Scenario(MLP, 16, iterations=5)
    result = simulate(Cluster.cpus(2, 3), scenario, cost, trace=True, representation="all_ranks")
    assert {f"rank {r}" for r in range(6)} <= set(result.timeline.tracks())


def test_jitter_makes_the_typical_rank_wait_like_the_expected_max_of_p_draws():
    sigma = 0.05
    cost = example_cost(jitter=LognormalJitter(sigma))
    jitter = cost.jitter
    compute = sum(
        cost.compute_time(layer, phase, 32, 1, "cpu")
        for layer in MLP.layers
        for phase in ("forward", "backward")
    )
    syncs = []
    for ranks in (2, 8, 64, 512):
        cluster = Cluster.cpus(ranks)
        scenario = Scenario(MLP, 32, iterations=1500, seed=ranks)
        result = simulate(cluster, scenario, cost)
        # Exact per step: the typical rank idles (pace - its factor) x its forward + backward.
        for step in result.steps[:50]:
            assert step.sync_s >= 0
        expected = jitter.expected_max_factor(ranks) - jitter.expected_max_factor(1)
        sync_fraction = result.breakdown.sync_s / compute
        assert sync_fraction == pytest.approx(expected, rel=0.06)
        assert result.breakdown.pace_factor == pytest.approx(
            jitter.expected_max_factor(ranks), rel=0.01
        )
        # The closed form, with expected factors, is exact in expectation here (linear step).
        closed = predict(cluster, scenario, cost)
        assert closed.breakdown.sync_s == pytest.approx(expected * compute, rel=1e-9)
        assert result.step_time_s == pytest.approx(closed.step_time_s, rel=0.01)
        syncs.append(result.breakdown.sync_s)
    assert syncs[0] > 0 and all(a < b for a, b in zip(syncs, syncs[1:], strict=False))


def test_without_jitter_nobody_waits():
    result = simulate(Cluster.cpus(4, 4), Scenario(CNN, 8, iterations=3), example_cost())
    assert result.breakdown.sync_s == 0.0


def test_two_collectives_on_one_link_take_longer_than_one(env):
    link = Link(env, "nic")
    timed = TimedStep(Step(1e6, "inter", repeat=4), 1e-3)
    ends: dict[str, float] = {}

    def collective(name: str):
        yield from link.carry(timed)
        ends[name] = env.now

    env.process(collective("a"))
    env.process(collective("b"))
    env.run()
    assert sorted(ends.values()) == pytest.approx([4e-3, 8e-3])  # alone: 4e-3 each
    assert link.busy_s == pytest.approx(8e-3)


def test_buckets_in_flight_together_queue_on_the_links():
    cost = example_cost(inter=SLOW_NET)
    cluster = Cluster.cpus(8, 1)  # a flat ring: every step on the NICs
    base = dict(workload=CNN, batch_per_rank=16, bucket_bytes=2**12, algorithm="ring", iterations=3)
    one = simulate(cluster, Scenario(**base, comm_streams=1), cost)
    many = simulate(cluster, Scenario(**base, comm_streams=4), cost, trace=True)
    solo = {b.index: b.collective_s for b in many.buckets}
    spans = [e for e in many.timeline.events if e.track == "collectives (all ranks)"]
    stretched = [e for e in spans if e.duration_s > 1.01 * solo[e.args["bucket"]]]
    assert len(many.buckets) >= 3 and stretched  # in-flight collectives slowed each other down
    # One link, always busy: the total work is conserved, so the step takes as long as serialized.
    assert many.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)
    # The closed form leaves contention out and so underestimates several streams.
    assert predict(cluster, Scenario(**base, comm_streams=4), cost).step_time_s < many.step_time_s


def test_gpu_prefetch_hides_the_copy_of_the_mini_batch():
    cost = example_cost()
    cluster = Cluster.gpus(1, 1)
    plain = simulate(cluster, Scenario(CNN, 256, prefetch=False, iterations=5), cost)
    hidden = simulate(cluster, Scenario(CNN, 256, prefetch=True, iterations=5), cost)
    copy = cost.transfer_time("h2d", 256 * (CNN.layers[0].input_bytes_per_sample + 8), True)
    assert plain.breakdown.h2d_exposed_s == pytest.approx(copy)
    assert hidden.breakdown.h2d_exposed_s == 0.0
    assert plain.step_time_s - hidden.step_time_s == pytest.approx(copy, rel=1e-9)
    # A copy longer than the step cannot hide entirely: the step becomes the copy.
    slow = example_cost(pageable_bandwidth_bytes_per_s=1e8)
    bound = simulate(cluster, Scenario(CNN, 256, prefetch=True, pinned=False, iterations=5), slow)
    slow_copy = slow.transfer_time("h2d", 256 * (CNN.layers[0].input_bytes_per_sample + 8), False)
    assert bound.step_time_s == pytest.approx(slow_copy, rel=1e-9)
    assert 0 < bound.breakdown.h2d_exposed_s < slow_copy


def test_more_buckets_with_overlap_lower_the_step_when_communication_matters():
    cost = example_cost(inter=SLOW_NET)
    cluster = Cluster.gpus(16, 4)
    times = {}
    for overlap in (False, True):
        for bucket in (25 * 2**20, 2**19, 2**16):
            scenario = Scenario(CNN, 64, bucket_bytes=bucket, overlap=overlap, iterations=3)
            result = simulate(cluster, scenario, cost)
            times[overlap, bucket] = result.step_time_s
            assert result.breakdown.comm_s > 0.3 * result.step_time_s
    assert times[True, 2**19] < times[True, 25 * 2**20]
    assert times[True, 2**19] < times[False, 2**19]  # overlap hides what buckets expose
    assert times[False, 2**16] > times[False, 25 * 2**20]  # without overlap, only latencies


def test_one_rank_modes_have_no_communication():
    for cluster in (Cluster.cpus(1), Cluster.cpus(1, 1, 8), Cluster.gpus(1, 1)):
        result = simulate(cluster, Scenario(CNN, 32, overlap=True, iterations=2), example_cost())
        b = result.breakdown
        assert b.comm_s == b.sync_s == b.overlap_s == 0.0
        assert b.compute_s == pytest.approx(b.step_s)


def test_threads_speed_up_the_cpu_compute():
    cost = example_cost(cpu_serial_fraction=0.1)
    serial = simulate(Cluster.cpus(1), Scenario(CNN, 32, iterations=2), cost).step_time_s
    threads = simulate(Cluster.cpus(1, 1, 8), Scenario(CNN, 32, iterations=2), cost).step_time_s
    assert serial / threads == pytest.approx(1 / (0.1 + 0.9 / 8), rel=1e-9)


def test_trace_is_chrome_json_with_a_track_per_rank_and_per_link(tmp_path):
    cost = example_cost(jitter=LognormalJitter(0.05))
    scenario = Scenario(CNN, 32, bucket_bytes=2**18, overlap=True, prefetch=True, iterations=3)
    result = simulate(Cluster.gpus(2, 4), scenario, cost, trace=True)
    path = write_chrome_trace(tmp_path / "trace.json", result.timeline)
    doc = json.loads(path.read_text())
    names = {
        e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert {
        "typical rank",
        "typical rank copy engine",
        "slowest of the other 7 ranks",
        "node 0 NIC",
        "node 0 intra-node link",
    } <= names
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert complete and all(e["dur"] > 0 and e["ts"] >= 0 for e in complete)
    assert any(e["name"].startswith("backward") for e in complete)
    assert any(e["name"].startswith("allreduce bucket") for e in complete)


def test_nonsense_configurations_are_one_line_errors():
    with pytest.raises(ConfigError, match="at least 1 node"):
        Cluster(0)
    with pytest.raises(ConfigError, match="batch per rank"):
        Scenario(CNN, -1)
    with pytest.raises(ConfigError, match="iterations"):
        Scenario(CNN, 8, iterations=0)
    with pytest.raises(ValueError, match="representation"):
        simulate(Cluster(1), Scenario(CNN, 8), example_cost(), representation="some")


def test_gradient_accumulation_runs_k_micro_batches_and_one_allreduce():
    """k micro-batches per optimizer step: k - 1 more forwards, backwards and copies ahead of
    the last, the same allreduces as one micro-batch (once per step, not per micro-batch)."""
    from dataclasses import replace

    from pdlsim.sim.cluster import build_plan

    cost = example_cost()
    cluster = Cluster.gpus(2, 4)
    one = Scenario(load_workload("cnn"), 32, overlap=True, jitter=False, iterations=3)
    four = replace(one, accumulation=4)
    plan = build_plan(cluster, one, cost)
    a, b = simulate(cluster, one, cost), simulate(cluster, four, cost)
    micro = plan.forward_s + plan.backward_s + plan.h2d_s
    assert b.step_time_s == pytest.approx(a.step_time_s + 3 * micro, rel=1e-9)
    assert b.breakdown.comm_s == pytest.approx(a.breakdown.comm_s, rel=1e-9)
    with pytest.raises(ConfigError, match="gradient accumulation must be >= 1"):
        replace(one, accumulation=0)


def test_a_trace_changes_nothing_but_the_detail_of_its_spans():
    """Without a timeline the layers between two bucket closes run as one simulator event;
    with one, layer by layer: every step's terms agree, jitter, buckets and overlap on."""
    cost = example_cost(inter=SLOW_NET, jitter=LognormalJitter(0.1), overlap_efficiency=0.6)
    for cluster in (Cluster.gpus(2, 4), Cluster.cpus(4, 1, 2)):
        scenario = Scenario(CNN, 32, bucket_bytes=2**16, overlap=True, iterations=6, seed=3)
        plain = simulate(cluster, scenario, cost)
        traced = simulate(cluster, scenario, cost, trace=True)
        np.testing.assert_allclose(_terms(plain), _terms(traced), rtol=1e-12, atol=1e-15)
        assert len(plain.buckets) >= 2
        layers = {e.name for e in traced.timeline.events if e.name.startswith("backward ")}
        assert len(layers) > len(plain.buckets)  # the trace still names each layer
