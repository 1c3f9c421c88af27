"""The BLAS's small-matrix GEMM kernel: its rules as data, and kernel tables that price each
side of its line from that side's points alone."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from calibration.gemm_regimes import RULES_FILE, SmallGemm, small_gemm_rules
from calibration.kernel_tables import GemmTable

DIMS = (1, 4, 16, 64, 256, 1024, 4096)
SMALL = SmallGemm(max_mnk=1e6)


def two_kernels(m, n, k):
    """A BLAS whose small kernel runs at 2 GFLOP/s and whose packed one at 1 GFLOP/s after a
    2 us call: time jumps up where a shape leaves the small kernel."""
    flops = 2 * m * n * k
    return flops / 2e9 if SMALL.takes(m, n, k) else 2e-6 + flops / 1e9


def table(small: SmallGemm | None) -> GemmTable:
    points = {key: two_kernels(*key) for key in itertools.product(DIMS, repeat=3)}
    return GemmTable.from_points(points, small=small)


# pairs either side of the line, off the grid
NEAR_THE_LINE = [(4096, 5, 48), (4096, 5, 49), (1500, 30, 20), (1500, 30, 23), (200, 200, 24),
                 (200, 200, 26)]  # fmt: skip


@pytest.mark.parametrize("shape", NEAR_THE_LINE)
def test_shapes_either_side_of_the_line_are_priced_from_their_own_kernel(shape):
    truth = two_kernels(*shape)
    assert table(SMALL).time_s(*shape) == pytest.approx(truth, rel=0.02)


@pytest.mark.parametrize("shape", NEAR_THE_LINE)
def test_one_table_across_the_line_misprices_shapes_near_it(shape):
    """Without the rule, a shape near the line is priced partly from the other kernel's
    points: the error the split removes (small-kernel shapes too slow, packed ones too fast)."""
    ratio = table(None).time_s(*shape) / two_kernels(*shape)
    assert ratio > 1.5 if SMALL.takes(*shape) else ratio < 0.9


def test_the_rule_travels_with_the_table():
    before = table(SMALL)
    after = GemmTable.from_dict(json.loads(json.dumps(before.to_dict())))
    assert after.small == SMALL
    for shape in [(4096, 5, 49), (100, 100, 99), (3, 3, 3)]:
        assert after.time_s(*shape) == pytest.approx(before.time_s(*shape), rel=1e-4)


def test_a_table_without_points_on_one_side_is_one_grid():
    points = {
        key: two_kernels(*key)
        for key in itertools.product(DIMS, repeat=3)
        if np.prod(key) > SMALL.max_mnk
    }
    lone = GemmTable.from_points(points, small=SMALL)
    assert lone.time_s(4096, 4096, 4096) == pytest.approx(two_kernels(4096, 4096, 4096))
    assert np.isfinite(lone.time_s(4, 4, 4))


def test_the_rule_reads_all_three_limits():
    rule = SmallGemm(max_mnk=1e6, max_mn=1200, min_k=32)
    assert rule.takes(30, 40, 32)
    assert not rule.takes(30, 40, 31)  # k too short
    assert not rule.takes(40, 40, 32)  # output too large
    assert not rule.takes(30, 40, 834)  # too many multiply-adds
    assert SmallGemm.from_dict(rule.to_dict()) == rule


@pytest.mark.parametrize(
    "bad, why",
    [({"max_mnk": 0}, "positive limits"), ({"max_mnk": 1e6, "min_k": -1}, "positive limits"),
     ([1, 2], "an object with max_mnk"), ({"min_k": 32}, "an object with max_mnk")],
)  # fmt: skip
def test_a_rule_that_is_not_one_is_refused_with_what_it_needs(bad, why):
    with pytest.raises(ValueError, match=why):
        SmallGemm.from_dict(bad)


def test_rules_are_matched_to_the_recorded_blas():
    rules = small_gemm_rules("OpenBLAS", "skylakex")
    assert set(rules) == {"nn", "tn", "nt"}
    assert rules["nt"] == SmallGemm(max_mnk=1e6, max_mn=1200, min_k=32)
    assert small_gemm_rules("openblas", "Haswell") == {}
    assert small_gemm_rules("mkl", "SkylakeX") == {}
    assert small_gemm_rules(None, None) == {}


def test_every_build_in_the_rules_file_is_well_formed():
    for build in json.loads(RULES_FILE.read_text())["builds"]:
        assert build["source"] and build["architectures"]
        for rule in build["layouts"].values():
            SmallGemm.from_dict(rule)
