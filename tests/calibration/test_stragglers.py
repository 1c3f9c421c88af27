"""The straggler of a busy node: the node-fill benchmark's slowest process over its median one,
recovered from synthetic records, carried above the jitter's ranks per node, and applied by a
prediction as one rank that the others wait for."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.colocation import ColocationModel
from calibration.nodefill import NodeFill, fit_node_fill
from microbench.errors import UserError
from microbench.measurement import Measurement
from pdlsim.prediction.config import PredictConfig, resolve_profile
from pdlsim.prediction.core import run_prediction
from tests.calibration.test_nodefill import fill_and_jitter

BASE_S = {"gemm": 2e-3, "stream": 60e-3, "calls": 0.08e-3}
LEVELS = (1, 4, 8)
SLOWEST = {  # made-up slowest-over-median ratios at 1, 4 and 8 busy cores
    "gemm": (1.0, 1.2, 1.6),
    "stream": (1.0, 1.1, 1.3),
    "calls": (1.0, 1.3, 1.9),
}


def _write_fill(writer, rng) -> None:
    """Three launches per level; in each, the last process is its kernel's ratio slower than
    the others (no slowdown of the level as a whole: only the straggler)."""
    for i, k in enumerate(LEVELS):
        for launch in range(3):
            for process in range(k):
                for kernel, base in BASE_S.items():
                    slower = SLOWEST[kernel][i] if process == k - 1 else 1.0
                    samples = base * slower * rng.lognormal(0.0, 0.01, 51)
                    params = {"kernel": kernel, "procs": k, "launch": launch, "process": process}
                    writer.write(Measurement(samples, "nodefill", kernel, params).to_record())


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    run = tmp_path_factory.mktemp("stragglers")
    return fill_and_jitter(run, np.random.default_rng(5), _write_fill, 1.1)


def test_recovers_the_slowest_process_over_the_median_one(records):
    fill = fit_node_fill(records)
    value, low, high = fill.stragglers
    table = np.array(list(SLOWEST.values()))
    assert value == pytest.approx(np.exp(np.log(table).mean(axis=0)), rel=0.02)
    assert low == pytest.approx(table.min(axis=0), rel=0.02)
    assert high == pytest.approx(table.max(axis=0), rel=0.02)
    assert fill.slowdowns == pytest.approx((1.0, 1.0, 1.0), abs=0.02)  # the median process
    assert NodeFill.from_dict(fill.to_dict()) == fill


def test_carried_above_the_jitters_ranks_and_nothing_at_or_below(records):
    model = ColocationModel(n_boot=50).fit(records)
    fill = model.node_fill_
    assert model.straggler(2) is None  # the jitter's own ranks: nothing added
    for k in (4, 8, 16):
        expected = fill.straggler(k)[0] / fill.straggler(2)[0]
        ratio, low, high = model.straggler(k)
        assert ratio == pytest.approx(expected)
        assert low <= ratio <= high
    assert model.straggler(16) == model.straggler(8)  # held above the largest level
    again = ColocationModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.straggler(8) == model.straggler(8)


def test_a_node_fill_without_stragglers_gives_none(records):
    model = ColocationModel(n_boot=50).fit(records)
    doc = model.node_fill_.to_dict()
    del doc["straggler"]
    model.node_fill_ = NodeFill.from_dict(doc)
    assert model.node_fill_.stragglers is None and model.straggler(8) is None


def _profile_with(tmp_path, stragglers) -> str:
    """The packaged profile with a node fill (no slowdown beyond its jitter's 2 ranks, so
    only the straggler differs), as a file."""
    doc = resolve_profile("xeon-2core")[0].to_dict()
    ones = (1.0, 1.0, 1.0, 1.0)
    fill = NodeFill((1, 2, 4, 8), ones, ones, ones, {}, stragglers)
    doc["models"]["colocation"]["node_fill"] = fill.to_dict()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _predict(profile: str, procs_per_node: int, **options) -> dict:
    """``pdlsim predict --json`` of the CNN preset on one node, in this process."""
    cfg = PredictConfig(model="cnn", nodes=1, procs_per_node=procs_per_node, profile=profile,
                        samples=4, iterations=20, **options)  # fmt: skip
    return run_prediction(cfg)


WITHOUT = {"corrections": "glue,interplay,colocation"}
WITH = {"corrections": "glue,interplay,colocation,stragglers"}  # not the collectives' pace


def test_predict_slows_one_rank_and_the_others_wait(tmp_path):
    """At 8 ranks per node, the straggler T(8) / T(2) = 1.5 is exactly one rank 1.5 times
    slower (``--slow-ranks 1 --slow-factor 1.5`` without it); the wait shows as sync, the
    sources say where it came from; at the jitter's 2 ranks, nothing changes."""
    stragglers = ((1.0, 1.2, 1.5, 1.8), (1.0, 1.1, 1.3, 1.5), (1.0, 1.3, 1.7, 2.2))
    profile = _profile_with(tmp_path, stragglers)
    with_it = _predict(profile, 8, **WITH)
    without = _predict(profile, 8, **WITHOUT)
    by_hand = _predict(profile, 8, **WITHOUT, slow_ranks=1, slow_factor=1.5)
    assert with_it["step_time_s"] == pytest.approx(by_hand["step_time_s"], rel=1e-9)
    assert with_it["step_time_s"] > 1.2 * without["step_time_s"]
    assert with_it["breakdown"]["sync_s"] > without["breakdown"]["sync_s"]
    line = with_it["provenance"]["stragglers"]
    assert "the slowest of 8 ranks per node x1.500 [1.250, 1.833]" in line
    assert "stragglers" not in without["provenance"]
    band = with_it["band"]
    assert band["p10_s"] < band["p90_s"]
    at_two = _predict(profile, 2)
    assert "stragglers" not in at_two["provenance"]
    assert at_two["band"] == _predict(profile, 2, **WITHOUT)["band"]


def test_layer_wise_ranks_take_no_straggler_and_say_so(tmp_path):
    stragglers = ((1.0, 1.2, 1.5, 1.8), (1.0, 1.1, 1.3, 1.5), (1.0, 1.3, 1.7, 2.2))
    out = _predict(_profile_with(tmp_path, stragglers), 4, parallel="model")
    assert out["provenance"]["stragglers"].startswith("not applied: ")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([1.0, 0.9, 1.5, 1.8], "straggler.value[1]: 0.9 must be at least 1"),
        ([1.0, 1.2, 1.9, 1.8], "straggler.value[2]: 1.9 must be at least 1 and inside"),
        ([1.0, 1.2], "straggler.value: holds 2 values for the 4 levels"),
    ],
)
def test_a_damaged_straggler_in_a_profile_is_named_in_one_line(tmp_path, value, problem):
    """As predict loads the profile (the command line prints this one line, exit 2, as for
    the node fill's other fields in test_nodefill)."""
    stragglers = ((1.0, 1.2, 1.5, 1.8), (1.0, 1.0, 1.3, 1.5), (1.0, 1.3, 1.7, 2.2))
    path = _profile_with(tmp_path, stragglers)
    doc = json.loads(open(path).read())
    doc["models"]["colocation"]["node_fill"]["straggler"]["value"] = value
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(UserError) as caught:
        _predict(path, 8)
    assert f"models.colocation.node_fill.{problem}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_calibration_report_lists_the_node_fill_per_level(records):
    """calibrate's parameter table shows S(k) and T(k) above one process, with the kernels'
    range (not a confidence interval, and it says so)."""
    from calibration.report import parameter_rows

    model = ColocationModel(n_boot=20).fit(records)
    rows = {r["parameter"]: r for r in parameter_rows({"colocation": model.to_dict()})}
    fill = model.node_fill_
    assert set(rows) >= {"slowdown[4 procs]", "slowdown[8 procs]", "straggler[8 procs]"}
    assert "slowdown[1 procs]" not in rows
    eight = rows["straggler[8 procs]"]
    assert (eight["value"], eight["low"], eight["high"]) == tuple(fill.straggler(8))
    assert eight["unit"] == "x (the kernels' range)"
