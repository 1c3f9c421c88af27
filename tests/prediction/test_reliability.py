"""Checkpoint cost and failures: Young's and Daly's intervals, Daly's expected time, and the
``pdlsim predict`` flags."""

from __future__ import annotations

import json
import math

import pytest
from scipy.optimize import minimize_scalar

from pdlsim.prediction.reliability import (
    CheckpointPlan,
    checkpoint_cost_s,
    daly_interval_s,
    expected_time_s,
    format_checkpoint,
    young_interval_s,
)
from tests.conftest import pdlsim_here


def test_cost_young_and_daly_closed_forms():
    assert checkpoint_cost_s(4e9, 2e9, 0.5) == pytest.approx(2.5)
    assert young_interval_s(60.0, 86400.0) == pytest.approx(math.sqrt(2 * 60 * 86400))
    x = 60.0 / (2 * 86400.0)
    daly = math.sqrt(2 * 60 * 86400) * (1 + math.sqrt(x) / 3 + x / 9) - 60
    assert daly_interval_s(60.0, 86400.0) == pytest.approx(daly)
    assert daly_interval_s(300.0, 100.0) == 100.0  # C >= 2M: checkpoint every M


@pytest.mark.parametrize(("cost_s", "mtbf_s"), [(10.0, 3600.0), (60.0, 86400.0), (5.0, 600.0)])
def test_daly_interval_minimises_the_expected_time(cost_s, mtbf_s):
    work = 1e5

    def total(tau: float) -> float:
        return expected_time_s(work, tau, cost_s, mtbf_s, restart_s=30.0)

    best = minimize_scalar(total, bounds=(1.0, 20 * mtbf_s), method="bounded").x
    assert daly_interval_s(cost_s, mtbf_s) == pytest.approx(best, rel=0.02)
    assert total(daly_interval_s(cost_s, mtbf_s)) <= total(young_interval_s(cost_s, mtbf_s)) * (
        1 + 1e-9
    )


def test_expected_time_without_failures_and_with_rare_ones():
    assert expected_time_s(1000.0, 100.0, 2.0, math.inf, 60.0) == pytest.approx(1020.0)
    rare = expected_time_s(1000.0, 100.0, 2.0, 1e12, 60.0)
    assert rare == pytest.approx(1020.0, rel=1e-6)
    assert expected_time_s(1000.0, 100.0, 2.0, 3600.0, 60.0) > 1020.0


def test_plan_report_more_nodes_fail_more_often():
    plan = CheckpointPlan(4 * 10**9, 1e9, 0.01, node_mtbf_s=5000 * 3600.0, restart_s=60.0)
    one, many = plan.report(0.1, 10_000, nodes=1), plan.report(0.1, 10_000, nodes=512)
    assert one["checkpoint_cost_s"] == pytest.approx(4.01)
    assert many["job_mtbf_s"] == pytest.approx(5000 * 3600.0 / 512)
    assert many["optimal_every_steps"] < one["optimal_every_steps"]
    assert many["overhead_fraction"] > one["overhead_fraction"] > 0
    fixed = CheckpointPlan(4 * 10**9, 1e9, 0.01, math.inf, 60.0, every_steps=100)
    doc = fixed.report(0.1, 10_000, nodes=1)
    assert doc["every_steps"] == 100 and doc["optimal_every_steps"] is None
    assert doc["overhead_fraction"] == pytest.approx(4.01 / 10.0)


def test_predict_reports_checkpoints_and_restarts():
    result = pdlsim_here(
        "predict", "--nodes", "64", "--gpus", "4", "--samples", "2", "--iterations", "10",
        "--mtbf", "5000h", "--checkpoint-every", "auto", "--checkpoint-bw", "2GB/s",
        "--checkpoint-latency", "10ms", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["checkpoint"]
    weights = 4 * 1_070_794
    assert doc["state_bytes"] == weights
    assert doc["checkpoint_cost_s"] == pytest.approx(0.01 + weights / 2e9)
    assert doc["every_steps"] == doc["optimal_every_steps"]
    assert doc["assumed"] == ["--restart-time"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint-every", "0"], "--checkpoint-every: expected a positive number"),
        (["--checkpoint-every", "auto"], "--checkpoint-every auto needs --mtbf"),
        (["--mtbf", "soon"], "--mtbf: expected a time like"),
        (["--checkpoint-bw", "fast"], "--checkpoint-bw: expected a bandwidth like"),
        (["--checkpoint-every", "100", "--mtbf", "1e-6s"], "the job would never finish"),
    ],
)
def test_bad_checkpoint_flags_are_one_line_exit_2(args, message):
    result = pdlsim_here("predict", "--nodes", "1", "--samples", "2", *args)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr


def _predict_mlp(profile: str, **checkpoint: str) -> dict:
    from pdlsim.prediction.config import PredictConfig
    from pdlsim.prediction.core import run_prediction

    cfg = PredictConfig(nodes=1, model="mlp", profile=profile, iterations=10, samples=2,
                        **checkpoint)  # fmt: skip
    return run_prediction(cfg)


def test_the_profiles_storage_model_prices_checkpoints_when_no_flags_say(tmp_path):
    """latency + bytes / bandwidth from the profile's storage fit; a flag still wins."""
    from calibration.profile import Profile, load_profile
    from calibration.storage import StorageModel
    from microbench.records import load_dataframe
    from tests.calibration.test_storage import profile_with_storage, write_synthetic_records

    write_synthetic_records(tmp_path / "storage.jsonl")
    model = StorageModel(n_boot=0).fit(load_dataframe(tmp_path, type="measurement"))
    profile = str(profile_with_storage(tmp_path, model))
    weights = 4 * 235_146  # the MLP's float32 weights; plain SGD keeps no optimizer state
    latency_s, bandwidth = model.cost(weights)
    out = _predict_mlp(profile, checkpoint_every="100")
    doc = out["checkpoint"]
    assert doc["state_bytes"] == weights
    assert doc["checkpoint_cost_s"] == pytest.approx(latency_s + weights / bandwidth, rel=1e-12)
    assert doc["checkpoint_cost_s"] == pytest.approx(2e-3 + weights / 400e6, rel=0.05)  # truth
    assert doc["cost_source"] == out["provenance"]["checkpoint cost"] == "profile (storage)"
    assert doc["assumed"] == ["--restart-time"]
    given = _predict_mlp(profile, checkpoint_every="100", checkpoint_bw="2GB/s")["checkpoint"]
    assert given["checkpoint_cost_s"] == pytest.approx(model.latency_s + weights / 2e9, rel=1e-12)
    assert given["cost_source"] == "bandwidth --checkpoint-bw; latency profile (storage)"
    # a profile without a storage model: the assumptions, and the report says so
    base = load_profile(profile)
    models = {k: v for k, v in base.models.items() if k != "storage"}
    without = Profile.from_models(models, base.machine).save(tmp_path / "without.json")
    bare = _predict_mlp(str(without), checkpoint_every="100")["checkpoint"]
    assert bare["checkpoint_cost_s"] == pytest.approx(0.01 + weights / 1e9)
    assert bare["assumed"] == ["--checkpoint-bw", "--checkpoint-latency", "--restart-time"]
    assert "assumed: --checkpoint-bw" in format_checkpoint(bare)
    assert "profile (storage)" in format_checkpoint(doc)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        ("parse_time", "1e400s", "out of range"),  # reads as infinity
        ("parse_time", "1e300h", "out of range"),
        ("parse_rate", "1e400GB/s", "out of range"),
        ("parse_rate", "1e-300GB/s", "out of range"),  # a 300-digit step time
        ("parse_rate", "0GB/s", "a bandwidth must be above 0, got '0GB/s'"),
        ("parse_rate", "1..2GB/s", "expected a bandwidth like"),  # no number float() reads
        ("parse_time", "1.2.3ms", "expected a time like"),
    ],
)
def test_times_and_bandwidths_out_of_any_machines_range_are_refused(parse, text, message):
    from microbench.errors import UserError
    from pdlsim.prediction import config

    with pytest.raises(UserError, match=f"^--flag: .*{message}"):
        getattr(config, parse)(text, "--flag")


def test_the_range_holds_what_machines_have():
    from pdlsim.prediction.config import parse_rate, parse_time

    assert parse_time("1000000h") == 3.6e9  # a component MTBF of a million hours
    assert parse_rate("1B/s") == 1.0 and parse_rate("900TB/s") == 9e14


def test_a_job_that_can_never_finish_is_said_so_not_overflowed():
    from microbench.errors import UserError
    from pdlsim.prediction.reliability import expected_time_s

    assert expected_time_s(100.0, 10.0, 1.0, 1e6, 60.0) > 100.0
    with pytest.raises(UserError, match="would never finish"):
        expected_time_s(100.0, 10.0, 1.0, 1e-6, 60.0)  # exp(6e7) overflows
