"""Measurement: statistics, the record round trip and the median's confidence interval."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from scipy.stats import binom

from microbench.measurement import Measurement, median_ci_ranks, relative_ci_width
from microbench.records import RecordWriter, read_records

MACHINE = {"hostname": "node01", "cpu_model": "Test CPU", "logical_cores": 8, "gpus": []}


def test_measurement_statistics_and_record_round_trip(tmp_path):
    m = Measurement([3.0, 1.0, 2.0, 5.0], benchmark="kernels", name="gemm", params={"n": 64})
    assert (m.n, m.median, m.mean, m.minimum, m.maximum) == (4, 2.5, 2.75, 1.0, 5.0)
    assert m.std == pytest.approx(np.std([3, 1, 2, 5], ddof=1))
    assert not m.samples.flags.writeable
    assert math.isnan(Measurement([1.0]).std)

    record = m.to_record(rank=0)
    assert record["type"] == "measurement" and record["rank"] == 0
    assert record["summary"]["median"] == 2.5 and record["summary"]["median_ci_too_few_samples"]
    with RecordWriter(tmp_path / "m.jsonl", MACHINE) as writer:
        writer.write(record)
    back = Measurement.from_record(read_records(tmp_path / "m.jsonl")[1][0])
    assert np.array_equal(back.samples, m.samples)
    assert (back.benchmark, back.name, back.params, back.unit) == (
        "kernels",
        "gemm",
        {"n": 64},
        "s",
    )
    with pytest.raises(ValueError, match="replace"):
        m.to_record(samples=[])
    for bad in ([], [1.0, math.nan], [[1.0, 2.0]]):
        with pytest.raises(ValueError):
            Measurement(bad)
    with pytest.raises(ValueError):
        Measurement.from_record({"type": "train_step", "samples": [1.0]})


def test_median_ci_ranks_match_hand_computed_values():
    # n=10: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2) = 56/1024, so j=2, k=9.
    assert median_ci_ranks(10, 0.95) == (2, 9, 1 - 22 / 1024, True)
    # n=6: P(B <= 0) = 1/64, so (X_(1), X_(6)) covers with 62/64.
    assert median_ci_ranks(6, 0.95) == (1, 6, 62 / 64, True)
    # n=5: even the full range covers only 1 - 2/32 < 0.95.
    assert median_ci_ranks(5, 0.95) == (1, 5, 1 - 2 / 32, False)
    assert median_ci_ranks(2, 0.5) == (1, 2, 0.5, True)  # exact at a dyadic boundary

    samples = np.arange(10.0, 0.0, -1.0)  # 10, 9, ..., 1
    ci = Measurement(samples).median_ci()
    low, high = ci
    assert (low, high) == (2.0, 9.0) and not ci.too_few_samples and ci.achieved > 0.95
    small = Measurement([4.0, 1.0, 3.0]).median_ci()
    assert tuple(small) == (1.0, 4.0) and small.too_few_samples
    assert Measurement([4.0, 1.0, 3.0]).relative_ci_width() == math.inf
    assert Measurement(samples).relative_ci_width() == pytest.approx(7 / 5.5)
    assert pickle.loads(pickle.dumps(ci)).achieved == ci.achieved


@pytest.mark.parametrize("n", [6, 7, 20, 50, 101, 1000, 20_000, 20_001, 100_000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_median_ci_ranks_agree_with_scipy(n, confidence):
    cdf = binom.cdf(np.arange(n // 2 + 1), n, 0.5)
    j_ref = int((cdf <= (1 - confidence) / 2).sum())
    j, k, achieved, enough = median_ci_ranks(n, confidence)
    if j_ref == 0:
        assert (j, k, enough) == (1, n, False)
    else:
        assert (j, k, enough) == (j_ref, n + 1 - j_ref, True)
        assert achieved == pytest.approx(1 - 2 * cdf[j_ref - 1], rel=1e-9)
        assert achieved >= confidence


@pytest.mark.parametrize(
    ("draw", "true_median"),
    [
        (lambda rng, size: rng.normal(3.0, 2.0, size), 3.0),
        (lambda rng, size: rng.lognormal(0.5, 1.0, size), math.exp(0.5)),
        (lambda rng, size: rng.exponential(2.0, size), 2.0 * math.log(2.0)),
    ],
    ids=["normal", "lognormal", "exponential"],
)
@pytest.mark.parametrize("n", [20, 50])
def test_median_ci_covers_the_true_median_at_the_promised_rate(draw, true_median, n):
    rng = np.random.default_rng(20240531 + n)
    repetitions = 600
    hits = 0
    for sample in draw(rng, (repetitions, n)):
        low, high = Measurement(sample).median_ci(0.95)
        hits += low <= true_median <= high
    assert 0.93 <= hits / repetitions <= 0.99


def test_relative_ci_width_on_a_sorted_list_is_the_measurement_method():
    rng = np.random.default_rng(7)
    for n in (1, 5, 6, 7, 30, 31):
        samples = rng.lognormal(0.0, 0.5, n)
        assert (
            relative_ci_width(sorted(samples.tolist())) == Measurement(samples).relative_ci_width()
        )
    assert relative_ci_width([2.0] * 10) == 0.0  # a zero-width interval
    assert relative_ci_width([-1.0] * 4 + [0.0] * 3 + [1.0] * 4) == math.inf  # median 0
