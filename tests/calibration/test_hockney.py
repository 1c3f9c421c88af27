"""calibration.hockney: regimes found from the data, parameters and intervals recovered."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.hockney import HockneyModel, Regime
from calibration.stats import FitError, Interval
from tests.train.synthetic_comm import SIZES, noisy_samples

BREAK = 64 << 10
TRUE = [(2e-6, 5e-10), (20e-6, 1.25e-10)]  # below 64 KiB: 2 us, 2 GB/s; from 64 KiB: 20 us, 8 GB/s


def two_regimes(seed: int, noise: float = 0.03, count: int = 30):
    rng = np.random.default_rng(seed)
    sizes = np.array(SIZES, dtype=float)
    alpha = np.where(sizes < BREAK, TRUE[0][0], TRUE[1][0])
    beta = np.where(sizes < BREAK, TRUE[0][1], TRUE[1][1])
    samples = [noisy_samples(t, rng, noise, count) for t in alpha + beta * sizes]
    return sizes, np.array([np.median(s) for s in samples]), samples, alpha + beta * sizes


@pytest.fixture(scope="module")
def fits():
    out = []
    for seed in range(5):
        sizes, medians, samples, truth = two_regimes(seed)
        out.append((HockneyModel(n_boot=100, seed=seed).fit(sizes, medians, samples), truth))
    return out


def test_two_regimes_found_at_the_true_breakpoint(fits):
    for model, _ in fits:
        assert len(model.regimes_) == 2
        assert model.regimes_[0].max_bytes == BREAK // 2 and model.regimes_[1].min_bytes == BREAK
        assert model.selection_["chosen_regimes"] == 2


def test_parameters_recovered_within_tolerance(fits):
    for model, _ in fits:
        for regime, (alpha, beta) in zip(model.regimes_, TRUE, strict=True):
            assert regime.alpha_s == pytest.approx(alpha, rel=0.05)
            assert regime.beta_s_per_byte == pytest.approx(beta, rel=0.03)


def test_true_values_inside_the_bootstrap_intervals_in_most_seeds(fits):
    for r, (alpha, beta) in enumerate(TRUE):
        alpha_hits = sum(m.regimes_[r].alpha_ci.contains(alpha) for m, _ in fits)
        beta_hits = sum(m.regimes_[r].beta_ci.contains(beta) for m, _ in fits)
        assert alpha_hits >= 3 and beta_hits >= 3, (r, alpha_hits, beta_hits)
    for model, _ in fits:  # every interval contains its own estimate (profiles require it)
        for regime in model.regimes_:
            assert regime.alpha_ci.contains(regime.alpha_s)
            assert regime.beta_ci.contains(regime.beta_s_per_byte)


def test_no_size_range_left_far_off_unlike_one_line(fits):
    sizes, medians, _, _ = two_regimes(0)
    model, truth = fits[0]
    assert np.max(np.abs(model.predict(sizes) - truth) / truth) < 0.03
    one = HockneyModel(max_regimes=1).fit(sizes, medians)
    assert np.max(np.abs(one.predict(sizes) - truth) / truth) > 0.3
    assert model.quality_.max_rel_error < 0.05 < one.quality_.max_rel_error
    assert model.quality_.leave_out_rel_error < 0.03


def test_a_straight_line_stays_one_regime():
    rng = np.random.default_rng(7)
    sizes = np.array(SIZES, dtype=float)
    samples = [noisy_samples(t, rng, 0.03, 30) for t in 5e-6 + 1e-10 * sizes]
    model = HockneyModel(n_boot=20).fit(sizes, [np.median(s) for s in samples], samples)
    assert len(model.regimes_) == 1
    assert model.regimes_[0].alpha_s == pytest.approx(5e-6, rel=0.05)
    assert model.regimes_[0].beta_s_per_byte == pytest.approx(1e-10, rel=0.03)


def test_bic_criterion_also_finds_the_two_regimes():
    sizes, medians, _, _ = two_regimes(1)
    model = HockneyModel(criterion="bic").fit(sizes, medians)
    assert [r.min_bytes for r in model.regimes_] == [8, BREAK]


def test_prediction_between_and_beyond_regimes():
    regimes = [Regime(8, 1024, 1e-6, 1e-9), Regime(4096, 1 << 20, 5e-6, 1e-10)]
    model = HockneyModel.from_dict(
        {
            "regimes": [r.to_dict() for r in regimes],
            "quality": {"r2": 1, "median_rel_error": 0, "max_rel_error": 0, "n_points": 6},
        }
    )
    # Switch at the geometric mean of 1024 and 4096 = 2048; the last regime beyond 1 MiB.
    assert model.breakpoints_bytes_ == [2048.0]
    assert model.predict([2047, 2048]) == pytest.approx([1e-6 + 2047e-9, 5e-6 + 2048e-10])
    assert model.predict(1 << 30) == pytest.approx(5e-6 + (1 << 30) * 1e-10)
    assert model.predict(1) == pytest.approx(1e-6 + 1e-9)
    assert model.regime_of(1 << 30) is model.regimes_[-1]


def test_unsorted_input_and_samples_stay_paired():
    sizes, medians, samples, _ = two_regimes(2)
    order = np.random.default_rng(0).permutation(len(sizes))
    a = HockneyModel(n_boot=30).fit(sizes, medians, samples)
    b = HockneyModel(n_boot=30).fit(sizes[order], medians[order], [samples[i] for i in order])
    assert a.to_dict() == b.to_dict()


def test_round_trip_through_json():
    sizes, medians, samples, _ = two_regimes(3)
    model = HockneyModel(n_boot=30).fit(sizes, medians, samples)
    doc = json.loads(json.dumps(model.to_dict(), allow_nan=False))
    back = HockneyModel.from_dict(doc)
    assert back.regimes_ == model.regimes_ and back.quality_ == model.quality_
    assert np.array_equal(back.predict(sizes), model.predict(sizes))
    assert set(doc["regimes"][0]) == {
        "min_bytes",
        "max_bytes",
        "alpha_s",
        "beta_s_per_byte",
        "alpha_ci",
        "beta_ci",
    }
    assert isinstance(back.regimes_[0].alpha_ci, Interval)


def test_without_samples_there_are_no_intervals():
    sizes, medians, _, _ = two_regimes(4)
    model = HockneyModel().fit(sizes, medians)
    assert model.regimes_[0].alpha_ci is None and model.to_dict()["regimes"][0]["beta_ci"] is None


@pytest.mark.parametrize(
    "sizes, times, match",
    [
        ([8, 8, 8], [1e-6, 1e-6, 1e-6], "two different"),
        ([8, 16, 32], [1e-6, 0.0, 1e-6], "positive"),
        ([8, 16], [1e-6], "sizes but"),
    ],
)
def test_bad_input_is_a_fit_error(sizes, times, match):
    with pytest.raises(FitError, match=match):
        HockneyModel().fit(sizes, times)


def test_few_points_fit_one_line():
    model = HockneyModel().fit([8, 1024], [1e-6, 2e-6])
    assert len(model.regimes_) == 1
    assert model.predict([8, 1024]) == pytest.approx([1e-6, 2e-6])
