"""Jitter per workload: each model's own fit from its own records, and the cost model taking
the predicted workload's fit (the pooled one otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.jitter import JitterModel
from calibration.jitter_models import JitterModels
from calibration.profile import Profile
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe

SIGMA = {"short": 0.20, "long": 0.02}  # made-up relative jitter of a short and a long step


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    run = tmp_path_factory.mktemp("jitter")
    rng = np.random.default_rng(3)
    with RecordWriter(run / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        for model, sigma in SIGMA.items():
            table = rng.lognormal(np.log(1e-3), sigma, (2, 400))
            base = {"model": model, "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
            for rank in range(2):
                params = {**base, "rank": rank, "statistic": "per_rank"}
                writer.write(Measurement(table[rank], "jitter", "step", params).to_record())
            params = {**base, "rank": None, "statistic": "max_over_ranks"}
            writer.write(Measurement(table.max(axis=0), "jitter", "step", params).to_record())
    return load_dataframe(run, type="measurement")


def test_each_workload_gets_its_own_spread(frame):
    models = JitterModels(n_boot=20).fit(frame)
    assert set(models.models_) == {"short", "long"}
    for name, sigma in SIGMA.items():
        spread = np.std(np.log(models.get(name).atoms_))  # the step times, relative
        assert spread == pytest.approx(sigma, rel=0.15)
    # the slowest of 2 costs the short step far more, relatively, than the long one
    short, long = (models.get(n).sync_fraction(2) for n in ("short", "long"))
    assert short > 5 * long > 0
    pooled = JitterModel(n_boot=20).fit(frame)
    assert short > pooled.sync_fraction(2) > long
    again = JitterModels.from_dict(Profile({}, {"j": models.to_dict()}).to_dict()["models"]["j"])
    assert again.get("long").params_ == models.get("long").params_
    assert models.get("unknown") is None and models.get(None) is None


def test_cost_model_takes_the_workloads_own_jitter(frame, tmp_path):
    from dataclasses import replace

    from pdlsim.costmodel.model import ProfileCostModel
    from tests.test_costmodel import write_synthetic_profile

    base = write_synthetic_profile(tmp_path / "profile.json")
    models = JitterModels(n_boot=20).fit(frame)
    profile = replace(base, models={**base.models, "jitter_models": models.to_dict()})
    own = ProfileCostModel.from_profile(profile, workload="long")
    assert own.jitter.model.params_ == models.get("long").params_
    assert own.provenance["jitter"] == "profile (long's own steps)"
    other = ProfileCostModel.from_profile(profile, workload="mlp")
    assert other.jitter.model.params_ == profile.model("jitter").params_
    assert "pooled" in other.provenance["jitter"]
