"""JitterModel: the step-time distribution, and E[max of P ranks] against Monte Carlo."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.jitter import JitterModel
from microbench.errors import UserError
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe

SIGMA = 0.1


def write_jitter(path, table: np.ndarray, model: str = "mlp"):
    """Records as microbench.jitter writes them: one per rank, then the max over ranks."""
    ranks = table.shape[0]
    params = {"model": model, "batch": 32, "threads": 1, "ranks": ranks, "ranks_per_node": ranks}
    rows = [(r, "per_rank", table[r]) for r in range(ranks)] + [
        (None, "max_over_ranks", table.max(axis=0))
    ]
    with RecordWriter(path / "jitter.jsonl", {"hostname": "test"}) as writer:
        for rank, statistic, samples in rows:
            p = {**params, "rank": rank, "statistic": statistic}
            writer.write(Measurement(samples, "jitter", "step_compute", p).to_record())
        writer.write(Measurement([7e-8] * 10, "timer", "overhead", {"clock": "x"}).to_record())
    return load_dataframe(path)


def lognormal_table(seed: int, ranks: int = 4, n: int = 1000) -> np.ndarray:
    """Step times of ``ranks`` ranks; each rank has its own median (stragglers are not jitter)."""
    rng = np.random.default_rng(seed)
    medians = 0.01 * (1.0 + 0.05 * np.arange(ranks))[:, None]
    return medians * rng.lognormal(0.0, SIGMA, (ranks, n))


def monte_carlo_max(ranks: int, reps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    total, left = 0.0, reps
    while left:
        chunk = min(left, max(1, 2_000_000 // ranks))
        total += rng.lognormal(0.0, SIGMA, (chunk, ranks)).max(axis=1).sum()
        left -= chunk
    return total / reps


def test_recovers_lognormal_sigma_and_chooses_the_family(tmp_path):
    model = JitterModel(n_boot=50).fit(write_jitter(tmp_path, lognormal_table(0)))
    assert model.family_ == "lognormal"
    assert model.params_["sigma"] == pytest.approx(SIGMA, rel=0.05)
    assert model.params_["scale"] == pytest.approx(1.0, rel=0.01)  # relative to the median
    assert model.candidates_["lognormal"]["aic"] < model.candidates_["normal"]["aic"]
    assert model.quality_dict()["median_rel_error"] < 0.01


def test_sigma_interval_contains_the_truth_in_most_seeds(tmp_path):
    hits = 0
    for seed in range(5):
        (tmp_path / str(seed)).mkdir()
        df = write_jitter(tmp_path / str(seed), lognormal_table(seed, ranks=2, n=400))
        model = JitterModel(families=("lognormal",), n_boot=100, seed=seed).fit(df)
        interval = model.intervals_["sigma"]
        hits += interval.low <= SIGMA <= interval.high
    assert hits >= 3


def test_gamma_data_choose_gamma():
    rng = np.random.default_rng(1)
    model = JitterModel(n_boot=0).fit_samples([rng.gamma(3.0, 1.0, 4000)])
    assert model.family_ == "gamma"
    assert model.params_["shape"] == pytest.approx(3.0, rel=0.1)


def test_expected_max_matches_monte_carlo_for_2_to_1024_ranks(tmp_path):
    model = JitterModel(n_boot=0).fit(write_jitter(tmp_path, lognormal_table(2, ranks=4, n=2000)))
    ranks = [2, 3, 8, 16, 64, 100, 256, 512, 1024]
    factors = model.expected_max_factor(ranks)
    for p, factor in zip(ranks, factors, strict=True):
        expected = monte_carlo_max(p, reps=20_000 if p < 256 else 4_000, seed=p)
        assert factor == pytest.approx(expected, rel=0.02), p
    assert np.all(np.diff(factors) > 0)
    # The sync fraction: the wait beyond the mean draw, 0 for one rank.
    assert model.sync_fraction(1) == pytest.approx(0.0, abs=1e-12)
    mean = np.exp(SIGMA**2 / 2)
    expected_sync = monte_carlo_max(64, 20_000, seed=7) - mean
    assert model.sync_fraction(64) == pytest.approx(expected_sync, rel=0.1)


def test_checks_against_the_measured_max_over_ranks(tmp_path):
    model = JitterModel(n_boot=0).fit(write_jitter(tmp_path, lognormal_table(3, ranks=4)))
    (check,) = model.checks_
    assert check["ranks"] == 4
    assert check["rel_error"] < 0.05
    assert model.quality_dict()["max_over_ranks_rel_error"] == check["rel_error"]


def test_sample_draws_relative_step_times(tmp_path):
    model = JitterModel(n_boot=0).fit(write_jitter(tmp_path, lognormal_table(4)))
    rng = np.random.default_rng(0)
    draws = model.sample(rng, 20_000)
    assert np.median(draws) == pytest.approx(1.0, rel=0.01)
    assert np.std(np.log(draws)) == pytest.approx(SIGMA, rel=0.05)
    assert set(model.sample(rng, 100, source="empirical")) <= set(model.scaled(model.atoms_))


def test_round_trip_through_json(tmp_path):
    model = JitterModel(n_boot=20).fit(write_jitter(tmp_path, lognormal_table(5, ranks=2)))
    doc = json.loads(json.dumps(model.to_dict()))
    again = JitterModel.from_dict(doc)
    assert again.to_dict() == doc
    ranks = [1, 2, 7, 100, 5000]
    np.testing.assert_allclose(again.expected_max_factor(ranks), model.expected_max_factor(ranks))


def test_no_records_is_a_user_error(tmp_path):
    with RecordWriter(tmp_path / "x.jsonl", {"hostname": "test"}) as writer:
        writer.write(Measurement([1.0, 2.0], "compute", "op", {}).to_record())
    with pytest.raises(UserError, match="no jitter records"):
        JitterModel().fit(load_dataframe(tmp_path))


def write_moments(path, tables: dict[str, np.ndarray], model: str = "cnn"):
    """Per-rank records of one 2-rank step timed at several labelled moments, as the bench's
    jitter stages at P >= 2 append them."""
    with RecordWriter(path / "jitter.jsonl", {"hostname": "test"}) as writer:
        for moment, table in tables.items():
            ranks = table.shape[0]
            params = {"model": model, "batch": 32, "threads": 1, "ranks": ranks, "moment": moment}
            for r in range(ranks):
                p = {**params, "rank": r, "statistic": "per_rank"}
                writer.write(Measurement(table[r], "jitter", "step_compute", p).to_record())
    return load_dataframe(path)


def test_the_sync_is_the_typical_moments_skew(tmp_path):
    """Two calm moments, where the ranks' noise is mostly shared (common factor of sigma 0.1,
    own noise 0.02), and one noisy moment of independent noise (0.1): every sample is
    lognormal of about 0.1 alike, so the pooled fit alone would give every moment the noisy
    moment's skew. The model's 2-rank sync is the median moment's measured skew, and its draws
    and expected maxima stay one distribution (the max of two draws averages to it)."""
    rng = np.random.default_rng(7)
    n = 400

    def calm():
        return 0.02 * rng.lognormal(0.0, 0.1, n) * rng.lognormal(0.0, 0.02, (2, n))

    noisy = 0.02 * rng.lognormal(0.0, 0.1, (2, n))
    tables = {"jitter 1 of 3": calm(), "jitter 2 of 3": noisy, "jitter 3 of 3": calm()}
    model = JitterModel(n_boot=0).fit(write_moments(tmp_path, tables))
    skews = sorted(m["measured_skew"] for m in model.moments_)
    assert [m["moment"] for m in model.moments_] == list(tables)
    assert skews[0] < 0.02 and skews[2] > 0.04  # calm moments skew a fraction of the noisy
    assert model.sync_fraction(2) == pytest.approx(skews[1], rel=1e-9)
    assert 0.1 < model.scale_ < 0.5
    draws = model.sample(np.random.default_rng(1), (200_000, 2))
    assert draws.max(axis=1).mean() == pytest.approx(model.expected_max_factor(2), rel=0.005)
    again = JitterModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.sync_fraction(8) == pytest.approx(model.sync_fraction(8), rel=1e-12)
    old = {k: v for k, v in model.to_dict().items() if k not in ("scale", "moments")}
    assert JitterModel.from_dict(old).scale_ == 1.0  # profiles from before the moments


def test_one_run_of_independent_ranks_keeps_the_iid_extrapolation(tmp_path):
    model = JitterModel(n_boot=0).fit(write_jitter(tmp_path, lognormal_table(11, ranks=2)))
    assert len(model.moments_) == 1 and model.moments_[0]["moment"] is None
    assert model.scale_ == pytest.approx(1.0, abs=0.15)
    (tmp_path / "one").mkdir()
    one_rank = write_jitter(tmp_path / "one", lognormal_table(11, ranks=1))
    single = JitterModel(n_boot=0).fit(one_rank)
    assert single.scale_ == 1.0 and single.moments_ == []


def test_an_unlabelled_run_is_a_moment_beside_labelled_records(tmp_path):
    """A 2-rank run without a moment label in a directory whose other records have one (the
    bench's speed checks): the frame has a moment column, missing on this run's rows, and the
    run still counts once, as its max-over-ranks check does."""
    table = lognormal_table(11, ranks=2)
    write_jitter(tmp_path, table)
    with RecordWriter(tmp_path / "speed.jsonl", {"hostname": "test"}) as writer:
        params = {"model": "mlp", "batch": 32, "threads": 1, "moment": "check 1 of 2"}
        writer.write(Measurement(table[0], "speed", "step", params).to_record())
    frame = load_dataframe(tmp_path)
    assert frame["params.moment"].isna().any()
    model = JitterModel(n_boot=0).fit(frame[frame["benchmark"] == "jitter"])
    assert len(model.moments_) == 1 and model.moments_[0]["moment"] is None
    assert len(model.checks_) == 1 and model.checks_[0]["ranks"] == 2


def test_span_moments_join_the_calibrations_and_move_the_sync_not_the_fit(tmp_path):
    """A calibration with one noisy moment of independent noise, then three calm moments
    from a validation's span (the ranks' noise mostly shared): the fitted distribution stays,
    the scale becomes the median over all four moments, a calm one's."""
    rng = np.random.default_rng(3)
    n = 300

    def calm():
        return 0.02 * rng.lognormal(0.0, 0.1, n) * rng.lognormal(0.0, 0.02, (2, n))

    model = JitterModel(n_boot=0).fit(
        write_moments(tmp_path, {"jitter 1 of 1": 0.02 * rng.lognormal(0.0, 0.1, (2, n))})
    )
    before = model.to_dict()
    (tmp_path / "span").mkdir()
    span = write_moments(tmp_path / "span", {f"validation {k}": calm() for k in (1, 2, 3)})
    model.add_moments(span)
    assert [m["moment"] for m in model.moments_] == [
        "jitter 1 of 1", "validation 1", "validation 2", "validation 3",
    ]  # fmt: skip
    ratios = sorted(m["measured_skew"] / m["iid_skew"] for m in model.moments_)
    assert model.scale_ == pytest.approx((ratios[1] + ratios[2]) / 2) and model.scale_ < 0.5
    assert model.family_ == before["family"] and before["scale"] > 0.8
    assert {k: model.params_[k] for k in model.params_} == {
        k: v for k, v in before["params"].items() if k in model.params_
    }
    assert model.add_moments(span.iloc[0:0]).scale_ == model.scale_  # nothing to add


def heavy_tailed(seed: int, n: int = 4000) -> np.ndarray:
    """Steps as a shared VM times them: a narrow core and 5% slow steps up to 1.5x."""
    rng = np.random.default_rng(seed)
    steps = rng.lognormal(0.0, 0.02, n)
    slow = rng.random(n) < 0.05
    steps[slow] *= rng.uniform(1.05, 1.5, int(slow.sum()))
    return steps


def test_the_simulators_draws_have_the_maxima_the_model_prices():
    """The analytic model prices the slowest of P ranks with expected_max_factor, the simulator
    draws ranks (every one, or the slowest by its tail quantile): one distribution for both,
    where the fitted family alone would have drawn a core too wide for this machine's steps."""
    from pdlsim.costmodel.uncertainty import ProfileJitter
    from pdlsim.sim.cost import max_of_draws

    model = JitterModel(n_boot=0).fit_samples([heavy_tailed(0)])
    model.scale_ = 0.6  # as a typical moment's skew sets it
    jitter, rng = ProfileJitter(model), np.random.default_rng(1)
    for ranks in (1, 2, 4, 16, 64, 512):
        drawn = max_of_draws(jitter, rng, ranks, 200_000).mean()
        assert drawn == pytest.approx(model.expected_max_factor(ranks), rel=2e-3), ranks
    every = jitter.sample(rng, (200_000, 2))
    sync = every.max(axis=1).mean() - every.mean()
    assert sync == pytest.approx(model.sync_fraction(2), rel=0.03)
    family = model.sample(rng, (200_000, 2), source="fitted")
    assert family.max(axis=1).mean() - family.mean() > 1.3 * model.sync_fraction(2)


def test_the_spliced_distribution_is_the_atoms_below_the_switch_and_the_tail_above():
    model = JitterModel(n_boot=0).fit_samples([heavy_tailed(2)])
    spliced = model.spliced()
    assert spliced.switch == pytest.approx(1 - 20 / 4000)
    u = np.linspace(0.0, 1.0 - 1e-9, 20_001)
    q = spliced.quantile(u)
    assert np.all(np.diff(q) >= 0)  # monotone across the switch
    below = u <= spliced.switch
    assert set(q[below]) <= set(model.atoms_)
    assert spliced.quantile(spliced.switch + 1e-12) == pytest.approx(
        spliced.quantile(spliced.switch), rel=1e-6
    )  # the tail meets the atoms
    tails = np.array([0.3, 1e-3, 1e-6, 1e-12])
    np.testing.assert_allclose(spliced.upper_quantile(tails[:2]), spliced.quantile(1 - tails[:2]))
    assert np.all(np.diff(spliced.upper_quantile(tails)) > 0)  # tiny tails stay resolved
    # E[max of one draw] is the mean of the atoms, but for the top 1/200 taken from the tail
    assert spliced.expected_max(1)[0] == pytest.approx(np.mean(model.atoms_), rel=2e-3)
