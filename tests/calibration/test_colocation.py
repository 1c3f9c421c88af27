"""The co-location model: step slowdown of R busy ranks per node against one, from jitter
records; known factors recovered from synthetic samples, lookups as documented."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.colocation import ColocationModel
from calibration.profile import Profile, load_profile
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe
from tests.profiles import refused_edit

ALONE_S = {"mlp": 0.5e-3, "cnn": 16e-3}
FACTOR = {"mlp": 1.05, "cnn": 1.25}  # made-up slowdowns at 2 ranks per node


def _write_jitter(writer, rng, model: str, per_node: int, median_s: float, n: int = 400) -> None:
    base = {"model": model, "batch": 32, "threads": 1, "ranks": per_node}
    table = median_s * rng.lognormal(0.0, 0.05, (per_node, n))
    for rank in range(per_node):
        params = {**base, "ranks_per_node": per_node, "rank": rank, "statistic": "per_rank"}
        writer.write(Measurement(table[rank], "jitter", "step_compute", params).to_record())
    params = {**base, "ranks_per_node": per_node, "rank": None, "statistic": "max_over_ranks"}
    writer.write(Measurement(table.max(axis=0), "jitter", "step_compute", params).to_record())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> ColocationModel:
    run = tmp_path_factory.mktemp("jitter")
    rng = np.random.default_rng(1)
    with RecordWriter(run / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        for model, alone in ALONE_S.items():
            _write_jitter(writer, rng, model, 1, alone)
            _write_jitter(writer, rng, model, 2, alone * FACTOR[model])
    return ColocationModel(n_boot=100).fit(load_dataframe(run, type="measurement"))


def test_recovers_the_slowdown_with_an_interval_around_it(fitted):
    assert len(fitted.points_) == 2
    for point in fitted.points_:
        assert point.ranks_per_node == 2
        assert point.factor == pytest.approx(FACTOR[point.model], rel=0.02)
        ci = point.factor_interval
        assert ci.low <= FACTOR[point.model] <= ci.high
        assert ci.high - ci.low < 0.05


def test_lookups_interpolate_hold_and_fall_back(fitted):
    cnn, _ = fitted.factor("cnn", 1, 2)
    assert fitted.factor("cnn", 1, 1)[0] == 1.0
    assert fitted.factor("cnn", 1, 4)[0] == cnn  # held above the largest measured R
    # a model that was not measured: the median of the measured ones at that R
    median = np.median([p.factor for p in fitted.points_])
    assert fitted.factor("resnet", 1, 2)[0] == pytest.approx(median)
    # an unmeasured thread count: the model's points at any thread count
    assert fitted.factor("cnn", 4, 2)[0] == cnn


def test_between_measured_counts_linear_from_one(fitted):
    model = ColocationModel.from_dict(fitted.to_dict())
    point = next(p for p in model.points_ if p.model == "cnn")
    model.points_ = [point, type(point)(**{**point.__dict__, "ranks_per_node": 4, "factor": 2.0})]
    model.points_[1] = type(point)(
        **{**model.points_[1].__dict__, "factor_interval": point.factor_interval.including(2.0)}
    )
    assert model.factor("cnn", 1, 3)[0] == pytest.approx((point.factor + 2.0) / 2)


def test_round_trips_through_a_profile(fitted):
    doc = Profile(machine={}, models={"colocation": fitted.to_dict()}).to_dict()
    again = ColocationModel.from_dict(doc["models"]["colocation"])
    assert again.factor("mlp", 1, 2) == fitted.factor("mlp", 1, 2)


def test_no_single_rank_baseline_gives_no_points(tmp_path):
    rng = np.random.default_rng(0)
    with RecordWriter(tmp_path / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        _write_jitter(writer, rng, "mlp", 2, 1e-3)
    model = ColocationModel(n_boot=10).fit(load_dataframe(tmp_path, type="measurement"))
    assert model.points_ == []
    assert model.factor("mlp", 1, 2)[0] == 1.0


def test_alone_samples_of_the_same_run_are_preferred_to_the_one_rank_run(tmp_path):
    """The one-rank run was taken while the machine was busy (twice as slow); the interleaved
    alone samples of the two-rank run give the true slowdown."""
    rng = np.random.default_rng(2)
    with RecordWriter(tmp_path / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        _write_jitter(writer, rng, "cnn", 1, 2 * 16e-3)
        _write_jitter(writer, rng, "cnn", 2, 1.2 * 16e-3)
        params = {"model": "cnn", "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
        alone = 16e-3 * rng.lognormal(0.0, 0.05, 400)
        record = Measurement(
            alone, "jitter", "step_compute", {**params, "rank": 0, "statistic": "alone"}
        ).to_record()
        writer.write(record)
    model = ColocationModel(n_boot=50).fit(load_dataframe(tmp_path, type="measurement"))
    assert model.factor("cnn", 1, 2)[0] == pytest.approx(1.2, rel=0.02)


def _write_moment(writer, rng, model: str, moment: str, alone_s: float, factor: float) -> None:
    """One span check: 2 ranks together and rank 0 alone, in the same moment."""
    base = {"model": model, "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
    base["moment"] = moment
    for rank in (0, 1):
        steps = alone_s * factor * rng.lognormal(0.0, 0.02, 33)
        params = {**base, "rank": rank, "statistic": "per_rank"}
        writer.write(Measurement(steps, "jitter", "step_compute", params).to_record())
    alone = alone_s * rng.lognormal(0.0, 0.02, 17)
    params = {**base, "rank": 0, "statistic": "alone"}
    writer.write(Measurement(alone, "jitter", "step_compute", params).to_record())


def test_a_span_of_moments_replaces_the_calibrations_factor(fitted, tmp_path):
    """Nine span moments whose speed switches between two levels 1.4x apart, each with
    the cnn 1.10x slower at 2 ranks: the point takes 1.10 from the moments' ratios, its
    interval theirs; the mlp, with two moments (fewer than MIN_MOMENTS), keeps 1.05."""
    rng = np.random.default_rng(3)
    with RecordWriter(tmp_path / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        for k in range(9):
            level = 1.4 if k % 3 else 1.0
            _write_moment(writer, rng, "cnn", f"validation {k}", level * ALONE_S["cnn"], 1.10)
        for k in range(2):
            _write_moment(writer, rng, "mlp", f"validation {k}", ALONE_S["mlp"], 1.30)
    model = ColocationModel.from_dict(fitted.to_dict())
    model.add_moments(load_dataframe(tmp_path, type="measurement"))
    cnn = next(p for p in model.points_ if p.model == "cnn")
    assert cnn.factor == pytest.approx(1.10, rel=0.01)
    assert cnn.factor_interval.low <= cnn.factor <= cnn.factor_interval.high
    assert cnn.factor_interval.high - cnn.factor_interval.low < 0.03
    assert (cnn.span_moments, cnn.samples_alone, cnn.samples_together) == (9, 9 * 17, 9 * 66)
    assert model.factor("mlp", 1, 2) == fitted.factor("mlp", 1, 2)
    again = ColocationModel.from_dict(model.to_dict())
    assert next(p for p in again.points_ if p.model == "cnn").span_moments == 9
    older = fitted.to_dict()  # a profile written before span moments were kept
    for point in older["points"].values():
        point.pop("span_moments")
    assert all(p.span_moments == 0 for p in ColocationModel.from_dict(older).points_)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("ranks_per_node", 0, "must be a whole number >= 2, got 0"),
        ("ranks_per_node", -2, "must be a whole number >= 2, got -2"),
        ("ranks_per_node", 1, "must be a whole number >= 2, got 1"),
        ("ranks_per_node", 2.5, "must be a whole number >= 2, got 2.5"),
        ("threads", 0, "must be a whole number >= 1, got 0"),
        ("batch", None, "must be a whole number >= 1, got null"),
    ],
)
def test_a_damaged_point_in_a_profile_is_named_in_one_line(tmp_path, capsys, key, value, problem):
    """A point's ranks per node is what its factor is interpolated or carried from: a hand
    edit that makes it nonsense is exit 2 and one line naming the point's field, never a
    prediction that silently takes it as measured."""
    label = sorted(load_profile("h200-16core").to_dict()["models"]["colocation"]["points"])[0]
    path, err = refused_edit(tmp_path, capsys, ("colocation", "points", label),
                             lambda point: point.update({key: value}))  # fmt: skip
    assert f"{path}: models.colocation.points.{label}.{key}: {problem}" in err, err
