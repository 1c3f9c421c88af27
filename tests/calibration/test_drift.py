"""Drift: the spread of repeated medians of the same step, from compute and jitter records; and
the band carrying it."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.drift import DriftModel
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe
from microbench.workload import load_workload
from tests.profiles import STEP_TABLES


def _write(writer, samples_s, benchmark, name, params):
    writer.write(Measurement(np.full(9, samples_s), benchmark, name, params).to_record())


def test_sigma_is_the_pooled_log_spread_of_the_same_steps_medians(tmp_path):
    """cnn's step measured at 10, 11 and 9 ms (compute step less its gather, jitter at one rank,
    rank 0 alone at two), mlp's at 0.5 and 0.6 ms: sigma pools their log-deviations."""
    step = {"device": "cpu", "threads": 1, "batch": 32, "kind": "step", "phase": "step"}
    with RecordWriter(tmp_path / "r.jsonl", {"hostname": "synthetic"}) as writer:
        _write(writer, 10.2e-3, "compute", "op", {**step, "model": "cnn", "op": "data+step"})
        data = {**step, "model": "cnn", "op": "data", "kind": "gather", "phase": "data"}
        _write(writer, 0.2e-3, "compute", "op", data)
        _write(writer, 0.5e-3, "compute", "op", {**step, "model": "mlp", "op": "step"})
        for model, ranks, statistic, value in (
            ("cnn", 1, "per_rank", 11e-3),
            ("cnn", 2, "alone", 9e-3),
            ("cnn", 2, "per_rank", 30e-3),  # all ranks busy: co-location, not drift
            ("mlp", 1, "per_rank", 0.6e-3),
        ):
            params = {"model": model, "batch": 32, "threads": 1, "ranks": ranks,
                      "ranks_per_node": ranks, "rank": 0, "statistic": statistic}  # fmt: skip
            _write(writer, value, "jitter", "step_compute", params)
    drift = DriftModel().fit(load_dataframe(tmp_path, type="measurement"))
    logs = {"cnn": np.log([10e-3, 11e-3, 9e-3]), "mlp": np.log([0.5e-3, 0.6e-3])}
    ss = sum(np.sum((v - v.mean()) ** 2) for v in logs.values())
    assert drift.sigma_ == pytest.approx(np.sqrt(ss / (5 - 2)))
    assert drift.interval_.low < drift.sigma_ < drift.interval_.high
    assert set(drift.medians_["cnn-b32-t1"]) == {"compute step", "jitter at 1", "jitter alone at 2"}
    again = DriftModel.from_dict(drift.to_dict())
    assert again.sigma_ == drift.sigma_


def test_one_measurement_per_step_is_no_drift(tmp_path):
    step = {"device": "cpu", "threads": 1, "batch": 32, "kind": "step", "phase": "step"}
    with RecordWriter(tmp_path / "r.jsonl", {"hostname": "synthetic"}) as writer:
        _write(writer, 1e-3, "compute", "op", {**step, "model": "cnn", "op": "step"})
    assert DriftModel().fit(load_dataframe(tmp_path, type="measurement")).sigma_ == 0.0


def test_the_band_widens_with_the_drift(tmp_path):
    from dataclasses import replace

    from microbench.workload import load_workload
    from pdlsim.costmodel.model import ProfileCostModel
    from tests.costmodel.test_model import write_synthetic_profile

    cost = ProfileCostModel.from_profile(write_synthetic_profile(tmp_path / "p.json"))
    layer = load_workload("mlp").layers[0]
    rng = np.random.default_rng(0)

    def spread(model):
        draws = [
            model.perturbed(rng).compute_time(layer, "forward", 32, 1, "cpu") for _ in range(200)
        ]
        return np.std(np.log(draws))

    assert spread(replace(cost, drift_sigma=0.1)) > spread(cost) + 0.05


def _two_speed_machine(tmp_path):
    """cnn's step: 12 ms in the compute stage (a slow moment), then speed checks at 9, 9, 12, 9
    ms: a machine that is typically at 9 ms and sometimes 4/3 slower."""
    step = {"device": "cpu", "threads": 1, "batch": 32, "kind": "step", "phase": "step"}
    with RecordWriter(tmp_path / "r.jsonl", {"hostname": "synthetic"}) as writer:
        _write(writer, 12e-3, "compute", "op", {**step, "model": "cnn", "op": "step"})
        for k, value in enumerate((9e-3, 9e-3, 12e-3, 9e-3), start=1):
            params = {"model": "cnn", "batch": 32, "threads": 1, "moment": f"check {k} of 4"}
            _write(writer, value, "speed", "step_compute", params)
    return DriftModel().fit(load_dataframe(tmp_path, type="measurement"))


def test_speed_checks_give_the_typical_speed_and_the_compute_stages_offset(tmp_path):
    drift = _two_speed_machine(tmp_path)
    assert len(drift.medians_["cnn-b32-t1"]) == 5
    # typical: the median of 12, 9, 9, 12, 9 ms is 9 ms; the compute stage ran 12/9 slower
    assert drift.compute_log_offset_ == pytest.approx(np.log(12 / 9))
    assert np.exp(drift.log_deviations_) == pytest.approx([1, 1, 1, 12 / 9, 12 / 9])
    # a profile keeps the medians; what derives from them comes back the same, also from a
    # document written before the derived fields existed
    doc = drift.to_dict()
    for old in (doc, {k: v for k, v in doc.items() if k in ("sigma", "intervals", "medians_s")}):
        again = DriftModel.from_dict(old)
        assert again.compute_log_offset_ == drift.compute_log_offset_
        assert list(again.log_deviations_) == list(drift.log_deviations_)


def test_predictions_describe_the_typical_speed_and_the_band_the_slow_moments(tmp_path):
    """Compute is divided by the compute stage's offset (12 -> 9 ms here); the band draws the
    measured deviations, so its P50 stays at typical and its P90 reaches the slow speed."""
    from dataclasses import replace

    from microbench.workload import load_workload
    from pdlsim.costmodel.model import ProfileCostModel
    from tests.costmodel.test_model import write_synthetic_profile

    drift = _two_speed_machine(tmp_path)
    cost = ProfileCostModel.from_profile(write_synthetic_profile(tmp_path / "p.json"))
    layer = load_workload("mlp").layers[0]
    base = cost.compute_time(layer, "forward", 32, 1, "cpu")
    drifting = replace(
        cost,
        drift_level=float(np.exp(-drift.compute_log_offset_)),
        drift_log_deviations=tuple(drift.log_deviations_),
    )
    assert drifting.compute_time(layer, "forward", 32, 1, "cpu") == pytest.approx(base * 9 / 12)
    rng = np.random.default_rng(1)
    factors = [drifting.perturbed(rng).drift_factor for _ in range(400)]
    assert set(np.round(factors, 9)) == {1.0, round(12 / 9, 9)}
    assert np.mean(np.isclose(factors, 1.0)) == pytest.approx(0.6, abs=0.08)


def test_stratified_draws_cover_the_speeds_evenly_and_hold_the_band_at_typical(tmp_path):
    """Two speeds, 60% at typical and 40% 4/3 slower: K stratified draws take each in its
    share, every time; the band's P50 is then the typical step whatever the seed (plain draws
    of 20 put it at either speed: the median of 20 fair coin-like draws)."""
    from dataclasses import replace

    from microbench.workload import load_workload
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.prediction.document import band_step_times
    from pdlsim.sim import Cluster, Scenario, predict
    from tests.costmodel.test_model import write_synthetic_profile

    drift = _two_speed_machine(tmp_path)
    cost = replace(
        ProfileCostModel.from_profile(write_synthetic_profile(tmp_path / "p.json")),
        drift_log_deviations=tuple(drift.log_deviations_),
    )
    for seed in range(5):
        rng = np.random.default_rng(seed)
        factors = [cost.perturbed(rng, stratum=(i, 20)).drift_factor for i in range(20)]
        assert sorted(np.round(factors, 9)) == [1.0] * 12 + [round(12 / 9, 9)] * 8
    cluster, scenario = Cluster.cpus(1), Scenario(load_workload("mlp"), 32, jitter=False)
    typical = predict(cluster, scenario, cost).step_time_s
    for seed in range(5):
        band = band_step_times(predict, cluster, scenario, cost, 20, seed, 3)
        assert np.median(band) / typical == pytest.approx(1.0, abs=0.1)


def test_microbench_speed_records_each_models_step_with_its_moment(tmp_path):
    from tests.conftest import run_microbench

    out = tmp_path / "run"
    for k in (1, 2):
        result = run_microbench(
            "speed", "--model", "mlp", "--batch", "8,4", "--samples", "4", "--warmup", "1",
            "--moment", f"check {k}", "--out", str(out), *(["--append"] if k > 1 else []),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"speed (check {k}): mlp batch 8" in result.stdout
    frame = load_dataframe(out, type="measurement")
    assert list(frame["params.moment"]) == ["check 1"] * 4 + ["check 2"] * 4
    assert list(frame["params.batch"]) == [8, 8, 4, 4] * 2
    assert list(frame["name"]) == ["step_compute", "forward_compute"] * 4
    assert set(frame["benchmark"]) == {"speed"} and all(len(s) == 4 for s in frame["samples"])
    drift = DriftModel().fit(frame)
    for medians in (drift.medians_, drift.forward_medians_):
        assert set(medians["mlp-b8-t1"]) == set(medians["mlp-b4-t1"]) == {"check 1", "check 2"}
    assert 0.1 < drift.forward_fraction("mlp", 8, 1) < 1.0  # a forward pass is part of a step
    again = run_microbench("speed", "--model", "mlp", "--out", str(out))  # no --append
    assert again.returncode == 2 and "--append" in again.stderr
    bad = run_microbench("speed", "--model", "nosuch", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "nosuch" in bad.stderr and "Traceback" not in bad.stderr


def test_each_step_gets_its_own_level_when_timed_often_enough():
    """cnn b32: compute 12 ms, checks 9, 9, 12, 9 -> x0.75; cnn b16: compute 5, checks 6, 6, 6
    -> x1.2; cnn b64, only the compute stage: the pooled offset, the median (here the mean) of
    the two steps' compute log-deviations."""
    drift = DriftModel()
    drift.medians_ = {
        "cnn-b32-t1": {"compute step": 12.0, **{f"c{k}": v for k, v in enumerate((9, 9, 12, 9))}},
        "cnn-b16-t1": {"compute step": 5.0, "c1": 6.0, "c2": 6.0, "c3": 6.0},
        "cnn-b64-t1": {"compute step": 40.0},
    }
    drift._derive()
    assert drift.step_level("cnn", 32, 1) == pytest.approx(0.75)
    assert drift.step_level("cnn", 16, 1) == pytest.approx(1.2)
    pooled = np.exp(-np.mean([np.log(12 / 9), np.log(5 / 6)]))
    assert drift.step_level("cnn", 64, 1) == pytest.approx(pooled)
    assert drift.step_level("mlp", 32, 2) == pytest.approx(pooled)


def test_a_span_takes_the_typical_time_from_its_own_moments(tmp_path):
    """cnn b32: the calibration times the step at 12 ms (compute stage and five checks, the
    forward-only share 1/2); a validation's span then at 9, 9, 10, 9 ms (share 1/3). Pooled,
    the typical time is the median of all ten (12 ms) and the share 1/2; as a span, the median
    of its four (9 ms), its deviations and its share 1/3. mlp has two span moments, fewer than
    MIN_MOMENTS: its typical time stays the pooled one. The span survives a round trip."""
    base = {"device": "cpu", "threads": 1, "batch": 32, "kind": "step", "phase": "step"}
    with RecordWriter(tmp_path / "cal" / "r.jsonl", {"hostname": "synthetic"}) as writer:
        for model, seconds in (("cnn", 12e-3), ("mlp", 1e-3)):
            _write(writer, seconds, "compute", "op", {**base, "model": model, "op": "step"})
        for k in range(5):
            params = {"model": "cnn", "batch": 32, "threads": 1, "moment": f"check {k}"}
            _write(writer, 12e-3, "speed", "step_compute", params)
            _write(writer, 6e-3, "speed", "forward_compute", params)  # share 1/2
        _write(writer, 1e-3, "speed", "step_compute", {**params, "model": "mlp"})
    with RecordWriter(tmp_path / "span" / "r.jsonl", {"hostname": "synthetic"}) as writer:
        for k, step in enumerate((9e-3, 9e-3, 10e-3, 9e-3)):
            params = {"model": "cnn", "batch": 32, "threads": 1, "moment": f"validation {k}"}
            _write(writer, step, "speed", "step_compute", params)
            _write(writer, step / 3, "speed", "forward_compute", params)  # share 1/3
        for k in range(2):
            params = {"model": "mlp", "batch": 32, "threads": 1, "moment": f"validation {k}"}
            _write(writer, 0.8e-3, "speed", "step_compute", params)
    calibrated = DriftModel().fit(load_dataframe(tmp_path / "cal", type="measurement"))
    span = load_dataframe(tmp_path / "span", type="measurement")
    pooled = DriftModel.from_dict(calibrated.to_dict()).add_moments(span)
    spanned = DriftModel.from_dict(calibrated.to_dict()).add_moments(span, span=True)
    assert pooled.step_level("cnn", 32, 1) == pytest.approx(1.0)
    assert spanned.step_level("cnn", 32, 1) == pytest.approx(9 / 12)
    assert spanned.forward_fraction("cnn", 32, 1) == pytest.approx(1 / 3)
    assert pooled.forward_fraction("cnn", 32, 1) == pytest.approx(1 / 2)
    logs = np.log([9, 9, 10, 9])
    assert spanned.typical_log_sigma("cnn", 32, 1) == pytest.approx(
        1.2533 * np.std(logs, ddof=1) / 2
    )
    for drift in (pooled, spanned):  # mlp: 1 (compute), 1 (check), 0.8, 0.8: sqrt(0.8)
        assert drift.step_level("mlp", 32, 1) == pytest.approx(np.sqrt(0.8))
    cnn_deviations = np.log([9, 9, 10, 9]) - np.log(9)
    assert all(np.isclose(spanned.log_deviations_, d).any() for d in cnn_deviations)
    assert not np.isclose(spanned.log_deviations_, np.log(12 / 9)).any()  # the calibration's
    again = DriftModel.from_dict(spanned.to_dict())
    assert again.span_moments_ == {f"validation {k}" for k in range(4)}
    assert again.step_level("cnn", 32, 1) == pytest.approx(9 / 12)


def test_the_typical_times_standard_error_comes_from_its_moments():
    """cnn b32's four checks and the compute stage: 1.2533 sd / sqrt(5) of their logs; a step
    with only the compute stage has none (its level is the pooled offset)."""
    drift = DriftModel()
    times = {"compute step": 12.0, "c0": 9.0, "c1": 9.5, "c2": 12.0, "c3": 9.0}
    drift.medians_ = {"cnn-b32-t1": times, "cnn-b64-t1": {"compute step": 40.0}}
    drift._derive()
    logs = np.log(list(times.values()))
    expected = 1.2533 * np.std(logs, ddof=1) / np.sqrt(5)
    assert drift.typical_log_sigma("cnn", 32, 1) == pytest.approx(expected)
    assert drift.typical_log_sigma("cnn", 64, 1) is None


def test_the_cost_model_scales_the_measured_steps_to_their_typical_time():
    from calibration.profile import load_profile
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.costmodel.stepscale import StepScale

    profile = load_profile(STEP_TABLES)
    drift = profile.model("drift")
    measured = StepScale.from_table(profile.model("compute").table_)
    scaled = ProfileCostModel.from_profile(profile, workload="cnn").scale
    assert len(scaled.steps) == len(measured.steps) > 0
    levels = set()
    for before, after in zip(measured.steps, scaled.steps, strict=True):
        level = drift.step_level(before.model, before.batch, before.threads)
        assert after.time_s == pytest.approx(before.time_s * level)
        levels.add(round(level, 9))
        sigma = drift.typical_log_sigma(before.model, before.batch, before.threads)
        if sigma is not None:  # the band moves the typical time by how well it is known
            assert after.sigma_s == pytest.approx(after.time_s * sigma)
    assert len(levels) > 1  # steps timed at several moments have levels of their own


def test_the_forward_only_share_is_the_median_ratio_of_the_moments_that_timed_both(tmp_path):
    """cnn b32: the compute stage times the step at 12 ms and the forward-only step at 6 ms (a
    slow moment for the forward pass only); three speed checks time both side by side, 9 and
    3, 12 and 4, 9 and 3 ms: the share is 1/3 (median of 1/2, 1/3, 1/3, 1/3), whatever the
    speed. A step timed without its forward-only step (mlp) has no share."""
    base = {"device": "cpu", "threads": 1, "batch": 32, "kind": "step"}
    with RecordWriter(tmp_path / "r.jsonl", {"hostname": "synthetic"}) as writer:
        _write(writer, 12e-3, "compute", "op", {**base, "model": "cnn", "op": "step",
                                                 "phase": "step"})  # fmt: skip
        _write(writer, 6e-3, "compute", "op", {**base, "model": "cnn", "op": "inference",
                                                "phase": "inference"})  # fmt: skip
        _write(writer, 1e-3, "compute", "op", {**base, "model": "mlp", "op": "step",
                                                "phase": "step"})  # fmt: skip
        for k, (step, forward) in enumerate(((9e-3, 3e-3), (12e-3, 4e-3), (9e-3, 3e-3))):
            params = {"model": "cnn", "batch": 32, "threads": 1, "moment": f"check {k}"}
            _write(writer, step, "speed", "step_compute", params)
            _write(writer, forward, "speed", "forward_compute", params)
    drift = DriftModel().fit(load_dataframe(tmp_path, type="measurement"))
    assert drift.forward_fraction("cnn", 32, 1) == pytest.approx(1 / 3)
    assert len(drift.medians_["cnn-b32-t1"]) == 4  # forward-only moments are not speeds
    assert drift.forward_fraction("mlp", 32, 1) is None
    assert drift.forward_fraction("cnn", 64, 1) is None
    again = DriftModel.from_dict(drift.to_dict())
    assert again.forward_fraction("cnn", 32, 1) == pytest.approx(1 / 3)
    old = {k: v for k, v in drift.to_dict().items() if k != "forward_medians_s"}
    assert DriftModel.from_dict(old).forward_fraction("cnn", 32, 1) is None


def test_forward_only_predictions_are_the_typical_step_times_its_measured_share():
    """The packaged profile with forward-only moments added: a forward-only cost model's
    compute for the measured workload and batch is the typical step times the share (plus
    the mini-batch gather, priced apart); the
    training model is unchanged, and so is a forward-only one without shares."""
    from calibration.profile import Profile, load_profile
    from microbench.op_records import LABEL_BYTES
    from pdlsim.costmodel.model import ProfileCostModel

    doc = load_profile(STEP_TABLES).to_dict()

    def with_shares(shares: dict) -> Profile:
        drift_doc = {**doc["models"]["drift"], "forward_medians_s": shares}
        return Profile.from_dict({**doc, "models": {**doc["models"], "drift": drift_doc}})

    medians = doc["models"]["drift"]["medians_s"]["cnn-b32-t1"]
    shared = with_shares({"cnn-b32-t1": {m: 0.3 * v for m, v in medians.items()}})
    profile = with_shares({})
    layers = load_workload("cnn").layers

    def forward_s(cost):
        return sum(cost.compute_time(layer, "forward", 32, 1, "cpu") for layer in layers)

    train = ProfileCostModel.from_profile(shared, workload="cnn")
    forward = ProfileCostModel.from_profile(shared, workload="cnn", inference=True)
    typical = next(r for r in train.scale.steps if (r.model, r.batch, r.threads) == ("cnn", 32, 1))
    gather = forward.scale.data_time_s("cnn", 32, layers[0].input_bytes_per_sample + LABEL_BYTES)
    assert forward_s(forward) == pytest.approx(0.3 * typical.time_s + gather, rel=1e-6)
    assert "forward-only share" in forward.provenance["compute"]
    plain = ProfileCostModel.from_profile(profile, workload="cnn", inference=True)
    assert forward_s(plain) == pytest.approx(forward_s(train), rel=1e-9)
    assert forward_s(train) == pytest.approx(
        forward_s(ProfileCostModel.from_profile(profile, workload="cnn")), rel=1e-9
    )
