"""Drift: the spread of repeated medians of the same step, from compute and jitter records; and
the band carrying it."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.drift import DriftModel
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe


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
    from pdlsim.costmodel import ProfileCostModel
    from tests.test_costmodel import write_synthetic_profile

    cost = ProfileCostModel.from_profile(write_synthetic_profile(tmp_path / "p.json"))
    layer = load_workload("mlp").layers[0]
    rng = np.random.default_rng(0)

    def spread(model):
        draws = [
            model.perturbed(rng).compute_time(layer, "forward", 32, 1, "cpu") for _ in range(200)
        ]
        return np.std(np.log(draws))

    assert spread(replace(cost, drift_sigma=0.1)) > spread(cost) + 0.05
