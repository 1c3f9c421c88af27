"""Thread counts beyond the sweep: Amdahl's law per kernel from the two largest counts, its
error scored where three counts were swept, and a band that widens with the distance."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from calibration.kernel_tables import GemmTable
from calibration.kernels import KernelModel
from calibration.loop_table import LoopTable
from calibration.profile_checks import FieldError
from calibration.stats import robust_rms
from calibration.thread_law import ASSUMED_SIGMA_PER_LOG, amdahl_factor, serial_share
from microbench.kernels.calls import KernelCall
from tests.conftest import pdlsim_here

PACKAGED = Path(__file__).resolve().parents[2] / "calibration" / "profiles"
DIMS = [(m, n, k) for m in (16, 256) for n in (16, 256) for k in (16, 256)]


def amdahl_s(one_s: float, share: float, threads: int) -> float:
    return one_s * (share + (1 - share) / threads)


def _model(counts: tuple[int, ...], share: float, noise_at_top: float = 1.0) -> KernelModel:
    """Tables whose every GEMM and loop follows Amdahl's law at ``share``; the largest count's
    times off the law by ``noise_at_top``."""
    model = KernelModel()
    model.gemm_, model.loops_ = {}, {}
    for t in counts:
        off = noise_at_top if t == max(counts) else 1.0
        points = {d: amdahl_s(2e-9 * math.prod(d), share, t) * off for d in DIMS}
        model.gemm_[("nn", t)] = GemmTable.from_points(points)
        model.loops_[("relu", t)] = LoopTable.from_points(
            (e, 1, amdahl_s(1e-9 * e, share, t) * off) for e in (2**12, 2**16, 2**20)
        )
    model.beyond_sigma_, model.quality_, model.steps_ = {}, {}, {}
    model._fit_thread_law()
    return model


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 1.0])
def test_the_serial_share_is_recovered_from_two_counts(share):
    for low, high in ((1, 2), (2, 4), (3, 8)):
        got = serial_share(low, amdahl_s(1.0, share, low), high, amdahl_s(1.0, share, high))
        assert got == pytest.approx(share, abs=1e-12)
    assert amdahl_factor(share, 8, 2) == pytest.approx(
        amdahl_s(1, share, 8) / amdahl_s(1, share, 2)
    )


def test_no_call_gets_slower_with_threads_nor_faster_than_linearly():
    assert serial_share(1, 1.0, 2, 1.3) == 1.0  # slower at two threads: no gain beyond
    assert serial_share(1, 1.0, 2, 0.4) == 0.0  # superlinear: held at linear


def test_a_call_beyond_the_sweep_follows_the_law_from_its_two_largest_counts():
    model = _model((1, 2), share=0.2)
    gemm = KernelCall("gemm_nn", (256, 256, 256), 0, "forward")
    one = model.call_s(gemm, 1)
    for threads in (4, 8, 16):
        assert model.call_s(gemm, threads) == pytest.approx(amdahl_s(one, 0.2, threads))
    assert model.thread_law_ == {
        "sigma_per_log": ASSUMED_SIGMA_PER_LOG, "points": 0, "source": "assumed"
    }  # fmt: skip
    # the band: nothing within the sweep, the assumed sigma per log unit beyond it
    assert model.beyond_sigma(gemm, 2) == 0.0
    assert model.beyond_sigma(gemm, 8) == pytest.approx(ASSUMED_SIGMA_PER_LOG * math.log(4))


def test_a_sweep_of_three_counts_scores_the_law_on_the_machine():
    exact = _model((1, 2, 4), share=0.3)
    assert exact.thread_law_["source"] == "scored" and exact.thread_law_["points"] == 11
    assert exact.thread_law_["sigma_per_log"] == pytest.approx(0.0, abs=1e-9)
    # the four-thread times 1.5x the law's: ln 1.5 of error over ln(4 / 2) of distance
    off = _model((1, 2, 4), share=0.3, noise_at_top=1.5)
    sigma = robust_rms([math.log(1.5) / math.log(2)])
    assert off.thread_law_["sigma_per_log"] == pytest.approx(sigma)
    relu = KernelCall("relu", (2**20,), 0, "forward", parallel=True)
    assert off.beyond_sigma(relu, 16) == pytest.approx(sigma * math.log(16 / 4))


def test_the_law_travels_through_a_profile_and_a_bad_one_is_a_field_error():
    model = _model((1, 2, 4), share=0.3, noise_at_top=1.2)
    again = KernelModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.thread_law_ == model.thread_law_
    doc = model.to_dict()
    doc["thread_law"] = {"sigma_per_log": -1}
    with pytest.raises(FieldError, match="thread_law.sigma_per_log"):
        KernelModel.from_dict(doc)
    del doc["thread_law"]  # a profile from before the law: the assumption
    assert KernelModel.from_dict(doc).thread_law_["source"] == "assumed"


def test_predict_beyond_the_profiles_threads_is_faster_wider_and_says_why():
    def step(threads: int) -> tuple[dict, str]:
        flags = ("--nodes", "1", "--model", "cnn", "--batch", "64", "--profile", "epyc-2core")
        done = pdlsim_here("predict", *flags, "--threads", str(threads), "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    (two, quiet), (eight, said) = step(2), step(8)
    assert "Amdahl" not in quiet and "beyond the 2 threads its sweep ran follows Amdahl" in said
    assert eight["step_time_s"] < two["step_time_s"]
    width = {n: p["band"]["p90_s"] / p["band"]["p10_s"] for n, p in (("2", two), ("8", eight))}
    assert width["8"] > width["2"]
