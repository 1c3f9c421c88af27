"""Communication what-ifs: compression on the wire and on the critical path, local SGD, a
faster or slower network, and ``pdlsim sweep --vary`` ranking the knobs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pytest

from microbench.workload import load_workload
from pdlsim.cli.knobs import format_report, rank_knobs, vary
from pdlsim.cli.main import main
from pdlsim.costmodel.model import ProfileCostModel
from pdlsim.costmodel.presets import network_preset
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.core import run_prediction
from pdlsim.prediction.whatif import apply_to_cost
from pdlsim.sim import (
    Cluster,
    ConfigError,
    LinearCostModel,
    LinkCost,
    LognormalJitter,
    Placement,
    Scenario,
    build_plan,
    predict,
    simulate,
    simulate_factors,
)
from pdlsim.sim.collectives import total_time_s
from tests.conftest import pdlsim_here
from tests.costmodel.test_model import write_synthetic_profile
from tests.sim.costs import EXAMPLE

CNN, MLP = load_workload("cnn"), load_workload("mlp")
SLOW_NET = LinkCost(1e-5, 1e9, 1e11)
COMPRESS_BYTES_PER_S, EXPAND_BYTES_PER_S = 2e9, 4e9  # made-up rates, not measurements


@dataclass(frozen=True)
class CompressingCost(LinearCostModel):
    """The example machine plus compression at round made-up rates: compress n / 2 GB/s;
    expand n / 4 GB/s per contribution received (top-k: one per rank)."""

    def compression_time(self, method, nbytes, phase="round_trip", ranks=1):
        contributions = ranks if method.startswith("topk") else 1
        times = {
            "compress": nbytes / COMPRESS_BYTES_PER_S,
            "decompress": contributions * nbytes / EXPAND_BYTES_PER_S,
        }
        return times[phase] if phase in times else sum(times.values())


def compressing_cost(**overrides) -> CompressingCost:
    return CompressingCost(**{**EXAMPLE, "inter": SLOW_NET, **overrides})


def _terms(prediction) -> np.ndarray:
    return np.array(
        [(s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s) for s in prediction.steps]
    )


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("whatif") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_fp16_halves_the_allreduce_bytes(algorithm):
    cost, cluster = compressing_cost(), Cluster.cpus(4, 2)
    scenario = Scenario(CNN, 32, bucket_bytes=2**18, algorithm=algorithm, compression="fp16")
    half = build_plan(cluster, scenario, cost)
    full = build_plan(cluster, replace(scenario, compression=None), cost)
    assert len(half.buckets) == len(full.buckets) >= 2
    for h, f in zip(half.buckets, full.buckets, strict=True):
        assert h.nbytes == f.nbytes == 2 * h.wire_bytes and f.wire_bytes == f.nbytes
        assert [s.step.nbytes for s in h.schedule] == [s.step.nbytes / 2 for s in f.schedule]
        assert h.collective_s < f.collective_s
        assert h.compress_s == pytest.approx(h.nbytes / COMPRESS_BYTES_PER_S)
        assert h.decompress_s == pytest.approx(h.nbytes / EXPAND_BYTES_PER_S)


def test_topk_is_an_allgather_of_value_index_pairs():
    cost = compressing_cost()
    scenario = Scenario(CNN, 32, bucket_bytes=25 * 2**20, compression="topk:0.01")
    ring = build_plan(Cluster.cpus(6, 1), scenario, cost).buckets[0]  # 6 ranks: the ring
    k = int(np.ceil(0.01 * CNN.gradient_bytes / 4))
    assert ring.wire_bytes == 8 * k and "ring allgather" in ring.algorithm
    (step,) = ring.schedule
    assert step.step.nbytes == pytest.approx(8 * k) and step.step.repeat == 5
    assert ring.collective_s == pytest.approx(5 * SLOW_NET.step_time_s(step.step))
    assert ring.decompress_s == pytest.approx(6 * CNN.gradient_bytes / EXPAND_BYTES_PER_S)
    sparse = replace(scenario, compression="topk:0.001")  # 8 x 8 k bytes under 512 KiB
    doubling = build_plan(Cluster.cpus(8, 1), sparse, cost).buckets[0]  # 2^3: doubling
    k = int(np.ceil(0.001 * CNN.gradient_bytes / 4))
    assert "recursive doubling allgather" in doubling.algorithm
    assert [s.step.nbytes for s in doubling.schedule] == pytest.approx([8 * k, 16 * k, 32 * k])
    assert doubling.collective_s == total_time_s(doubling.schedule)


def test_compression_sits_on_the_buckets_critical_path():
    cost, cluster = compressing_cost(), Cluster.cpus(4, 1)
    base = Scenario(MLP, 64, overlap=False, iterations=3, algorithm="ring")
    plain = build_plan(cluster, base, cost)
    fp16 = replace(base, compression="fp16")
    (bucket,) = build_plan(cluster, fp16, cost).buckets  # one bucket: everything in series
    expected = (
        plain.forward_s + plain.backward_s + bucket.compress_s + bucket.collective_s
        + bucket.decompress_s + plain.update_s
    )  # fmt: skip
    for engine in (simulate, predict):
        result = engine(cluster, fp16, cost)
        assert result.step_time_s == pytest.approx(expected, rel=1e-12)
        assert result.breakdown.comm_s == pytest.approx(bucket.collective_s, rel=1e-12)
        assert result.breakdown.compute_s == pytest.approx(expected - bucket.collective_s)
        assert result.buckets[0].wire_bytes == MLP.gradient_bytes // 2


def test_compressed_runs_agree_between_the_engines_with_overlap_and_prefetch():
    cost = compressing_cost(overlap_efficiency=0.6)
    for cluster in (Cluster.gpus(3, 4), Cluster.cpus(4, 2, 2)):
        for compression in ("fp16", "topk:0.05"):
            for overlap in (False, True):
                scenario = Scenario(
                    CNN, 32, bucket_bytes=2**17, overlap=overlap, prefetch=True, iterations=4,
                    jitter=False, compression=compression,
                )  # fmt: skip
                sim, closed = simulate(cluster, scenario, cost), predict(cluster, scenario, cost)
                np.testing.assert_allclose(_terms(sim), _terms(closed), rtol=1e-9, atol=1e-15)


def test_a_cost_model_that_cannot_time_compression_is_a_config_error():
    plain = LinearCostModel(**EXAMPLE)
    with pytest.raises(ConfigError, match="fp16. needs a cost model that times it; LinearCost"):
        build_plan(Cluster.cpus(2), Scenario(MLP, 8, compression="fp16"), plain)
    with pytest.raises(ConfigError, match="unknown compression"):
        Scenario(MLP, 8, compression="zip")
    with pytest.raises(ConfigError, match="top-k density"):
        Scenario(MLP, 8, compression="topk:2")
    with pytest.raises(ConfigError, match="top-k density must be a number in .0, 1., got ''"):
        Scenario(MLP, 8, compression="topk:")  # a colon and no number: not the default
    with pytest.raises(ConfigError, match="unknown compression 'fp16:'"):
        Scenario(MLP, 8, compression="fp16:")
    with pytest.raises(ConfigError, match="top-k density must be at least 1e-06"):
        Scenario(MLP, 8, compression="topk:1e-300")  # kept one element a bucket, silently


def test_local_sgd_without_jitter_is_k_minus_1_compute_steps_and_one_full_step():
    cost, cluster = compressing_cost(), Cluster.cpus(4, 2)
    base = Scenario(CNN, 32, bucket_bytes=2**18, overlap=True, iterations=12, jitter=False)
    plan = build_plan(cluster, base, cost)
    compute_only = plan.forward_s + plan.backward_s + plan.update_s
    full = simulate(cluster, base, cost).step_time_s
    for k in (2, 3, 4):
        local = replace(base, sync_every=k)
        for engine in (simulate, predict):
            result = engine(cluster, local, cost)
            assert result.step_time_s == pytest.approx(((k - 1) * compute_only + full) / k)
            comm = [s.comm_s > 0 for s in result.steps]
            assert comm == [(i + 1) % k == 0 for i in range(12)]
            assert all(s.sync_s == 0 for s in result.steps)
    assert Scenario(CNN, 32, iterations=10, sync_every=4).iterations == 12  # whole periods


def test_local_sgd_waits_for_the_rank_behind_over_the_whole_period():
    """Overlap off: a sync step waits for the rank whose period's factors sum highest, so the
    shortcut (rank 0 and that rank) gives exactly what every rank simulated gives."""
    cost, cluster = compressing_cost(), Cluster.cpus(3, 2)
    scenario = Scenario(CNN, 16, bucket_bytes=2**18, iterations=9, sync_every=3)
    rng = np.random.default_rng(5)
    factors = np.exp(0.2 * rng.standard_normal((cluster.ranks, scenario.total_steps)))
    every_rank = simulate_factors(cluster, scenario, cost, factors)
    behind = np.empty(scenario.total_steps)
    for period in (slice(0, 1), slice(1, 4), slice(4, 7), slice(7, 10)):
        others = factors[1:, period]
        behind[period] = others[int(np.argmax(others.sum(axis=1)))]
    shortcut = simulate_factors(cluster, scenario, cost, np.vstack([factors[0], behind]))
    np.testing.assert_allclose(_terms(shortcut), _terms(every_rank), rtol=1e-12, atol=1e-15)
    assert every_rank.breakdown.sync_s > 0


def test_local_sgd_averages_jitter_over_the_period():
    """Per step, the wait for the slowest shrinks like 1 / sqrt(k) (a sum of k factors spreads
    as sqrt(k)); the closed form says the same."""
    cost = compressing_cost(jitter=LognormalJitter(0.1))
    cluster = Cluster.cpus(64)
    syncs = {}
    for k in (1, 4):
        scenario = Scenario(MLP, 64, iterations=800, sync_every=k, seed=3)
        syncs[k] = simulate(cluster, scenario, cost).breakdown.sync_s
        closed = predict(cluster, scenario, cost).breakdown.sync_s
        assert syncs[k] == pytest.approx(closed, rel=0.1), k
    assert syncs[4] / syncs[1] == pytest.approx(0.5, rel=0.15)


def test_network_scale_multiplies_bandwidth_and_latency(profile_path):
    from calibration.profile import load_profile

    cost = ProfileCostModel.from_profile(load_profile(profile_path), network_preset("eth-25g"))
    cfg = PredictConfig(network_scale=4.0, latency_scale=0.5)
    scaled = apply_to_cost(cfg, cost)
    assert scaled.inter.bandwidth_bytes_per_s == pytest.approx(4 * cost.inter.bandwidth_bytes_per_s)
    assert scaled.inter.latency_s == pytest.approx(0.5 * cost.inter.latency_s)
    assert "bandwidth x4, latency x0.5" in scaled.provenance["inter-node links"]
    placement = Placement(8, 1, "ring")
    assert scaled.collective_time("allreduce", 2**24, 8, placement) < cost.collective_time(
        "allreduce", 2**24, 8, placement
    )
    base = PredictConfig(nodes=8, gpus=4, profile=profile_path, network="eth-25g", samples=1,
                         iterations=5)  # fmt: skip
    slow, fast = run_prediction(base), run_prediction(replace(base, network_scale=4.0))
    assert fast["breakdown"]["comm_s"] < 0.5 * slow["breakdown"]["comm_s"]
    assert fast["step_time_s"] < slow["step_time_s"]


def _status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code)


def _fake_prediction(cfg: PredictConfig) -> dict:
    """A made-up machine where only the network and fp16 matter (numbers for the test)."""
    comm = 2e-3 / cfg.network_scale * (0.5 if cfg.compression == "fp16" else 1.0)
    step = 1e-3 + comm / cfg.sync_every
    devices = cfg.nodes * cfg.gpus
    return {
        "step_time_s": step,
        "throughput_samples_per_s": devices * cfg.batch / step,
        "config": {"devices": devices},
        "comm_overhead_pct": 100 * comm / step,
        "breakdown": {"sync_s": 0.0},
        "band": {"p10_s": 0.99 * step, "p90_s": 1.01 * step},
    }


def test_vary_ranks_the_knobs_by_what_their_best_value_buys():
    base = PredictConfig(nodes=4, gpus=2, batch=8)
    knobs = [
        ("compression", (None, "fp16"), ("none", "fp16")),
        ("network-scale", (0.5, 4.0), ("0.5", "4")),
        ("sync-every", (1, 2), ("1", "2")),
        ("overlap", (True, False), ("on", "off")),
    ]
    frame = vary(base, knobs, _fake_prediction)
    ranking = rank_knobs(frame, base)
    assert list(ranking["knob"]) == ["network-scale", "compression", "sync-every", "overlap"]
    assert list(ranking["best_value"]) == ["4", "fp16", "2", "on"]
    # network x4: step 1 + 0.5 ms against 3 ms, so throughput x2.
    assert ranking["throughput_gain_pct"][0] == pytest.approx(100.0)
    assert ranking["throughput_gain_pct"][1] == pytest.approx(100 * (3 / 2 - 1))
    assert ranking["step_change_pct"][2] == pytest.approx(100 * (2 / 3 - 1))
    assert bool(ranking["baseline_is_best"][3]) and not ranking["outside_band"][3]
    report = format_report(frame, ranking)
    assert "which knob buys the most" in report and "the baseline's value is best" in report
    assert report.index("network-scale") < report.index("sync-every")


def test_sweep_vary_on_the_command_line(profile_path, tmp_path):
    out = tmp_path / "knobs"
    run = pdlsim_here("sweep", "--nodes", "8", "--gpus", "4", "--profile", profile_path,
                      "--network", "eth-25g", "--iterations", "4", "--samples", "1",
                      "--vary", "network-scale=0.5,2", "--vary", "sync-every=1,4",
                      "--vary", "overlap=on,off", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    ranking = pd.read_csv(out / "knob_ranking.csv")
    assert set(ranking["knob"]) == {"network-scale", "sync-every", "overlap"}
    assert ranking["throughput_gain_pct"].is_monotonic_decreasing
    assert len(pd.read_csv(out / "knobs.csv")) == 1 + 6
    assert "which knob buys the most" in run.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--vary", "colour=red"],
        ["--vary", "sync-every=0"],
        ["--vary", "overlap=maybe"],
        ["--vary", "compression=zip"],
        ["--vary", "bucket-mb"],
        ["--vary", "network-scale=1,1"],
        ["--vary", "sync-every=1,2", "--vary", "sync-every=4"],
        ["--vary", "nodes=2,4", "--batch", "16,32"],
    ],
)
def test_bad_knobs_are_one_line_and_exit_2(profile_path, tmp_path, args, capsys):
    argv = ["sweep", "--nodes", "2", "--profile", profile_path, "--samples", "1",
            "--iterations", "2", *args, "--out", str(tmp_path / "o")]  # fmt: skip
    assert _status(argv) == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "args",
    [
        ["--compression", "fp8"],
        ["--compression", "topk:0"],
        ["--sync-every", "0"],
        ["--network-scale", "0"],
        ["--latency-scale", "fast"],
        ["--compression", "fp16"],  # the synthetic profile measured no compression
    ],
)
def test_bad_whatifs_are_one_line_and_exit_2(profile_path, args, capsys):
    argv = ["predict", "--nodes", "2", "--profile", profile_path, "--samples", "1", *args]
    assert _status(argv) == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
