"""calibration.stats: fit quality, bootstrap intervals, leave-out predictions, the relative fit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.stats import (
    FitError,
    FitQuality,
    Interval,
    bootstrap_intervals,
    bootstrap_params,
    fit_quality,
    leave_group_out,
    leave_one_out,
    median_relative_se,
    nonneg_relative_fit,
    percentile_intervals,
    robust_rms,
)
from microbench.errors import UserError


def test_fit_quality_of_a_perfect_fit():
    y = np.array([1e-6, 1e-3, 1.0])
    q = fit_quality(y, y, leave_out_pred=y)
    assert q == FitQuality(1.0, 0.0, 0.0, 0.0, 3)


def test_fit_quality_relative_errors_and_r2():
    y = np.array([1.0, 2.0, 4.0, 8.0])
    pred = y * np.array([1.1, 0.8, 1.0, 1.05])  # relative errors 10%, 20%, 0%, 5%
    q = fit_quality(y, pred, leave_out_pred=y * 1.5)
    assert q.median_rel_error == pytest.approx(0.075)
    assert q.max_rel_error == pytest.approx(0.2)
    assert q.leave_out_rel_error == pytest.approx(0.5)
    ss_res = np.sum((y - pred) ** 2)
    assert q.r2 == pytest.approx(1 - ss_res / np.sum((y - y.mean()) ** 2))
    assert q.n_points == 4 and fit_quality(y, pred).leave_out_rel_error is None


def test_fit_quality_constant_truth_and_bad_input():
    assert fit_quality([2.0, 2.0], [2.0, 2.0]).r2 == 1.0
    assert fit_quality([2.0, 2.0], [2.0, 3.0]).r2 == 0.0  # not NaN: profiles hold no NaN
    with pytest.raises(ValueError, match="positive"):
        fit_quality([0.0, 1.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="shapes"):
        fit_quality([1.0, 2.0], [1.0])


def test_quality_and_interval_round_trip_through_json():
    q = FitQuality(0.99, 0.01, 0.2, None, 12)
    assert FitQuality.from_dict(json.loads(json.dumps(q.to_dict()))) == q
    ci = Interval(1.0, 2.0)
    assert Interval.from_dict(json.loads(json.dumps(ci.to_dict()))) == ci
    assert ci.contains(1.5) and not ci.contains(2.5)
    assert ci.including(2.5) == Interval(1.0, 2.5) and ci.including(1.5) == ci


def test_fit_error_is_a_user_error_and_a_value_error():
    assert issubclass(FitError, UserError) and issubclass(FitError, ValueError)


def test_bootstrap_interval_of_a_median_covers_the_truth():
    """Refit = the medians themselves: the interval of each is the median's interval."""
    rng = np.random.default_rng(1)
    samples = [rng.normal(10.0, 1.0, 400), rng.normal(-3.0, 0.5, 400)]
    intervals = bootstrap_intervals(lambda m: m, samples, n_boot=300, seed=2)
    assert intervals[0].contains(10.0) and intervals[1].contains(-3.0)
    # The half-width is near 1.96 * 1.2533 sigma / sqrt(n) (the median's standard error).
    half = (intervals[0].high - intervals[0].low) / 2
    assert half == pytest.approx(1.96 * 1.2533 / np.sqrt(400), rel=0.35)


def test_bootstrap_is_reproducible_and_checks_input():
    samples = [np.arange(10.0), np.arange(5.0)]
    a = bootstrap_params(lambda m: m, samples, n_boot=20, seed=3)
    assert a.shape == (20, 2) and np.array_equal(a, bootstrap_params(lambda m: m, samples, 20, 3))
    with pytest.raises(ValueError):
        bootstrap_params(lambda m: m, [np.array([])])
    with pytest.raises(ValueError):
        bootstrap_params(lambda m: m, samples, n_boot=0)


def test_percentile_intervals():
    rows = np.column_stack([np.arange(1001.0), -np.arange(1001.0)])
    lo, hi = percentile_intervals(rows, 0.9)
    assert (lo.low, lo.high) == pytest.approx((50.0, 950.0))
    assert (hi.low, hi.high) == pytest.approx((-950.0, -50.0))
    assert lo.confidence == 0.9


def _line_fit_predict(x, y, x_test):
    slope, intercept = np.polyfit(x, y, 1)
    return slope * x_test + intercept


def test_leave_one_out_on_exact_and_noisy_lines():
    x = np.arange(8.0)
    assert np.allclose(leave_one_out(_line_fit_predict, x, 3 * x + 1), 3 * x + 1)
    y = 3 * x + 1
    y[4] += 10  # an outlier is predicted from the others, so it stays far off
    pred = leave_one_out(_line_fit_predict, x, y)
    assert abs(pred[4] - 13.0) < 2.0


def test_leave_group_out_fits_without_the_whole_group():
    seen = []

    def fit_predict(x, y, x_test):
        seen.append(sorted(set(x.tolist())))
        return np.full(len(x_test), y.mean())

    x = np.array([1, 1, 2, 2, 3])
    pred = leave_group_out(fit_predict, x, np.array([1.0, 1.0, 2.0, 2.0, 6.0]), groups=x)
    assert seen == [[2, 3], [1, 3], [1, 2]]
    assert pred == pytest.approx([10 / 3, 10 / 3, 8 / 3, 8 / 3, 1.5])
    with pytest.raises(ValueError, match="two groups"):
        leave_group_out(fit_predict, x, x, groups=np.zeros(5))


def test_median_relative_se_of_normal_samples():
    rng = np.random.default_rng(5)
    se = median_relative_se([rng.normal(100.0, 5.0, 2000)])
    assert se[0] == pytest.approx(1.2533 * 5.0 / np.sqrt(2000) / 100.0, rel=0.15)


def test_nonneg_relative_fit_recovers_and_bounds():
    m = np.logspace(0, 7, 15)
    t = 2e-6 + 1e-9 * m  # six orders of magnitude
    x, rss = nonneg_relative_fit(np.column_stack([np.ones_like(m), m]), t)
    assert x == pytest.approx([2e-6, 1e-9], rel=1e-6) and rss < 1e-16
    # A true negative intercept is clipped at 0, not returned.
    big = np.logspace(3, 7, 9)
    x, rss = nonneg_relative_fit(np.column_stack([np.ones_like(big), big]), 1e-9 * big - 5e-7)
    assert x[0] == 0.0 and x[1] > 0 and rss > 0
    # A known offset is taken off before fitting.
    x, _ = nonneg_relative_fit(np.column_stack([m]), 5e-6 + 1e-9 * m, offset=np.full(15, 5e-6))
    assert x == pytest.approx([1e-9], rel=1e-6)


def test_robust_rms_recovers_sigma_past_wild_points_and_keeps_a_bias():
    rng = np.random.default_rng(5)
    errors = rng.normal(0.0, 0.2, 4000)
    errors[:100] = 30.0  # 2.5% wild: the plain root mean square is 4.7
    assert robust_rms(errors) == pytest.approx(0.2, rel=0.05)
    assert np.sqrt(np.mean(errors**2)) > 4
    assert robust_rms(np.full(50, -0.1)) > 0.1  # a bias counts (scaled as a sigma would be)
    assert robust_rms([]) == 0.0
