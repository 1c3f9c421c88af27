"""Gradient compression: the microbenchmark's kernels and records, the fitted model recovering
known parameters, and the cost model's answers from it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.compression import CompressionModel, compression_points
from calibration.profile import Profile
from calibration.stats import FitError
from microbench.compression import METHODS, PHASES, Codec, run_compression
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe
from microbench.sampling import SamplingPolicy
from pdlsim.costmodel.compression import compression_seconds
from pdlsim.costmodel.model import ProfileCostModel
from pdlsim.costmodel.presets import ASSUMPTIONS, GPU_PRESETS, network_preset
from pdlsim.sim import ConfigError
from tests.conftest import run_microbench
from tests.synthetic_comm import noisy_samples
from tests.test_costmodel import write_synthetic_profile

SIZES = tuple(64 << 10 << i for i in range(11))  # 64 KiB .. 64 MiB
# Made-up lines (test data, not measurements): (alpha s, beta s/byte) per (method, phase).
TRUE = {
    ("fp16", "compress"): (3e-6, 1.0e-9),
    ("fp16", "decompress"): (2e-6, 0.5e-9),
    ("topk", "compress"): (5e-6, 2.0e-9),
    ("topk", "decompress"): (1e-6, 0.25e-9),
    ("topk", "scatter"): (1e-6, 0.05e-9),
}
DENSITY = 0.01


def write_synthetic_records(path, seed: int = 0, density: float = DENSITY) -> None:
    """Records shaped like ``python -m microbench compression``'s, with known true lines."""
    rng = np.random.default_rng(seed)
    with RecordWriter(path, {"hostname": "synthetic"}) as writer:
        for (method, phase), (alpha, beta) in TRUE.items():
            for nbytes in SIZES:
                samples = noisy_samples(alpha + beta * nbytes, rng, 0.03, 20)
                params = {
                    "method": method,
                    "phase": phase,
                    "bytes": nbytes,
                    "density": density if method == "topk" else None,
                }
                m = Measurement(list(samples), benchmark="compression", name=method, params=params)
                writer.write(m.to_record())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> CompressionModel:
    run = tmp_path_factory.mktemp("compression")
    write_synthetic_records(run / "compression.jsonl")
    return CompressionModel(n_boot=50).fit(load_dataframe(run, type="measurement"))


@pytest.fixture(scope="module")
def profile_with_compression(tmp_path_factory, fitted) -> Profile:
    base = write_synthetic_profile(tmp_path_factory.mktemp("profile") / "profile.json")
    models = {**base.models, "compression": fitted}
    return Profile.from_models(models, base.machine)


def test_codecs_compress_and_expand_correctly():
    fp16 = Codec("fp16", 1 << 20)
    fp16.check()
    assert fp16.wire_bytes == (1 << 20) // 2
    np.testing.assert_allclose(fp16.dense, fp16.grad, rtol=1e-3, atol=1e-4)
    topk = Codec("topk", 1 << 20, density=0.01)
    topk.check()
    n = (1 << 20) // 4
    assert topk.k == round(0.01 * n) and topk.wire_bytes == 8 * topk.k
    kept = np.sort(np.abs(topk.grad))[-topk.k :]
    np.testing.assert_array_equal(np.sort(np.abs(topk.values)), kept)
    assert np.count_nonzero(topk.dense) == topk.k
    topk.scatter()  # a second contribution at the same places doubles them
    np.testing.assert_allclose(topk.dense[topk.indices], 2 * topk.grad[topk.indices])


def test_run_writes_one_record_per_method_phase_and_size(tmp_path):
    policy = SamplingPolicy(warmup=1, min_samples=3, max_samples=3, time_cap_s=0.01)
    sizes = (64 << 10, 256 << 10)
    with RecordWriter(tmp_path / "c.jsonl", {"hostname": "test"}) as writer:
        results = run_compression(sizes, policy, writer)
    assert len(results) == len(sizes) * sum(len(PHASES[m]) for m in METHODS)
    frame = load_dataframe(tmp_path, type="measurement")
    assert set(frame["name"]) == {f"{m}:{p}" for m in METHODS for p in PHASES[m]}
    topk = frame[frame["params.method"] == "topk"]
    assert (topk["params.wire_bytes"] == 8 * np.round(0.01 * topk["params.bytes"] / 4)).all()
    assert frame["samples"].map(len).min() == 3 and (frame["warmup_discarded"] == 1).all()
    points = compression_points(frame)
    assert len(points) == len(frame)


def test_command_line_runs_and_rejects_nonsense_in_one_line(tmp_path, no_inherited_rank):
    out = tmp_path / "run"
    run = run_microbench(
        "compression", "--sizes", "64KiB", "--time-cap", "0.01", "--quick", "--out", str(out)
    )
    assert run.returncode == 0, run.stderr
    assert (out / "compression.jsonl").exists() and "throughput" in run.stdout
    for bad in (["--methods", "fp8"], ["--density", "2"], ["--sizes", "1001"]):
        result = run_microbench("compression", *bad, "--out", str(tmp_path / "x"))
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, bad


def test_fit_recovers_the_known_lines_with_intervals(fitted):
    assert fitted.density_ == {"topk": DENSITY}
    for key, (alpha, beta) in TRUE.items():
        (regime,) = fitted.curves_[key].regimes_  # one straight line: one regime
        assert regime.beta_s_per_byte == pytest.approx(beta, rel=0.03), key
        assert regime.alpha_s == pytest.approx(alpha, abs=0.3 * alpha + 2e-7), key
        assert regime.beta_ci.low <= regime.beta_s_per_byte <= regime.beta_ci.high
        assert fitted.curves_[key].quality_.median_rel_error < 0.03
    assert fitted.predict("fp16", "compress", 1 << 20) == pytest.approx(3e-6 + 1e-9 * 2**20, 0.03)


def test_model_round_trips_through_a_profile(fitted, profile_with_compression):
    again = profile_with_compression.model("compression")
    assert isinstance(again, CompressionModel)
    for key in TRUE:
        assert again.predict(*key, 12345678) == fitted.predict(*key, 12345678)
    assert "topk_scatter" in profile_with_compression.fit_quality["compression"]
    doc = json.loads(json.dumps(fitted.to_dict()))
    doc["density"]["topk"] = 1.5
    with pytest.raises(ValueError, match="density"):
        CompressionModel.from_dict(doc)


def test_two_densities_in_one_fit_are_refused(tmp_path):
    write_synthetic_records(tmp_path / "a.jsonl", density=0.01)
    write_synthetic_records(tmp_path / "b.jsonl", seed=1, density=0.05)
    with pytest.raises(FitError, match="densities"):
        CompressionModel(n_boot=0).fit(load_dataframe(tmp_path, type="measurement"))


def test_cost_model_answers_from_the_profile(profile_with_compression, fitted):
    cost = ProfileCostModel.from_profile(profile_with_compression, network_preset("ib-hdr"))
    n = 4 << 20
    for phase in ("compress", "decompress"):
        assert cost.compression_time("fp16", n, phase) == fitted.predict("fp16", phase, n)
    round_trip = fitted.predict("fp16", "compress", n) + fitted.predict("fp16", "decompress", n)
    assert cost.compression_time("fp16", n) == pytest.approx(round_trip)
    expand = fitted.predict("topk", "decompress", n)
    scatter = fitted.predict("topk", "scatter", n)
    # Each further rank's contribution adds one scatter; at 5x the density, 5x the scatter.
    assert cost.compression_time("topk:0.01", n, "decompress", 8) == pytest.approx(
        expand + 7 * scatter
    )
    assert cost.compression_time("topk:0.05", n, "decompress", 8) == pytest.approx(
        expand + 39 * scatter
    )
    assert cost.compression_time("topk", n, "compress", 8) == fitted.predict("topk", "compress", n)


def test_gpu_ranks_use_a_memory_bound_estimate(profile_with_compression):
    gpu = GPU_PRESETS["h100-sxm"]
    cost = ProfileCostModel.from_profile(profile_with_compression, None, gpu, "gpu")
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * ASSUMPTIONS["gpu_memory_efficiency"].value
    launch_s = ASSUMPTIONS["gpu_kernel_launch_s"].value
    n = 8 << 20
    assert cost.compression_time("fp16", n, "compress") == pytest.approx(
        launch_s + 1.5 * n / bandwidth
    )
    kept = 0.01 * n / 4
    assert cost.compression_time("topk:0.01", n, "decompress", 4) == pytest.approx(
        launch_s + (n + 16 * kept * 4) / bandwidth
    )


def test_a_profile_without_compression_is_a_clear_config_error(tmp_path):
    profile = write_synthetic_profile(tmp_path / "profile.json")
    cost = ProfileCostModel.from_profile(profile, network_preset("ib-hdr"))
    assert cost.compression is None
    with pytest.raises(ConfigError, match="no compression model.*microbench compression"):
        cost.compression_time("fp16", 1 << 20)
    with pytest.raises(ValueError, match="unknown compression"):
        compression_seconds(None, "zip", 1 << 20)
