"""The node-fill slowdown: known per-kernel slowdowns recovered from synthetic records, its
law between and beyond the measured levels, and the co-location factor it carries above the
ranks per node the jitter benchmark measured."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from calibration.colocation import ColocationModel
from calibration.nodefill import NodeFill, fit_node_fill
from calibration.pipeline import load_measurements
from calibration.profile import Profile
from microbench.errors import UserError
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe
from pdlsim.prediction.config import PredictConfig, resolve_profile
from pdlsim.prediction.core import run_prediction
from tests.calibration.test_colocation import _write_jitter

BASE_S = {"gemm": 2e-3, "stream": 60e-3, "calls": 0.08e-3}
SLOWDOWN = {  # made-up slowdowns at 1, 2, 4 and 8 busy cores
    "gemm": (1.0, 1.1, 1.2, 1.5),
    "stream": (1.0, 1.2, 1.6, 2.4),
    "calls": (1.0, 1.0, 1.1, 1.3),
}
LEVELS = (1, 2, 4, 8)


def _write_fill(writer, rng, slowdown=SLOWDOWN, levels=LEVELS, outlier: float = 3.0) -> None:
    """Three launches per level; the last launch of every level is ``outlier`` times slower
    (a launch whose processes shared cores), which the median over launches must shrug off."""
    for i, k in enumerate(levels):
        for launch in range(3):
            slower = outlier if launch == 2 and k > 1 else 1.0
            for process in range(k):
                for kernel, base in BASE_S.items():
                    median = base * slowdown[kernel][i] * slower
                    samples = median * rng.lognormal(0.0, 0.02, 51)
                    params = {"kernel": kernel, "procs": k, "launch": launch, "process": process}
                    writer.write(Measurement(samples, "nodefill", kernel, params).to_record())


def fill_and_jitter(run, rng, write_fill, factor_at_2: float):
    """Measurements of a node fill (``write_fill(writer, rng)``) and of the jitter step of the
    CNN at 1 and 2 ranks per node, 2 being ``factor_at_2`` times slower, written in ``run``."""
    with RecordWriter(run / "nodefill.jsonl", {"hostname": "synthetic"}) as writer:
        write_fill(writer, rng)
    with RecordWriter(run / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        _write_jitter(writer, rng, "cnn", 1, 16e-3)
        _write_jitter(writer, rng, "cnn", 2, 16e-3 * factor_at_2)
    return load_dataframe(run, type="measurement")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    run = tmp_path_factory.mktemp("nodefill")
    return fill_and_jitter(run, np.random.default_rng(2), _write_fill, 1.25)


def test_recovers_each_kernels_slowdown_and_their_geometric_mean(records):
    fill = fit_node_fill(records)
    assert fill.levels == LEVELS
    for kernel, expected in SLOWDOWN.items():
        assert fill.kernels[kernel] == pytest.approx(expected, rel=0.02)
    table = np.array(list(SLOWDOWN.values()))
    assert fill.slowdowns == pytest.approx(np.exp(np.log(table).mean(axis=0)), rel=0.02)
    assert fill.lows == pytest.approx(table.min(axis=0), rel=0.02)
    assert fill.highs == pytest.approx(table.max(axis=0), rel=0.02)


def test_interpolates_in_log_k_and_holds_above_the_largest_level():
    fill = NodeFill((1, 2, 8), (1.0, 1.2, 1.8), (1.0, 1.1, 1.5), (1.0, 1.3, 2.0), {})
    assert fill.slowdown(1) == (1.0, 1.0, 1.0)
    assert fill.slowdown(4)[0] == pytest.approx(1.5)  # in log k, 4 is halfway from 2 to 8
    assert fill.slowdown(64) == fill.slowdown(8) == (1.8, 1.5, 2.0)
    assert NodeFill.from_dict(fill.to_dict()) == fill


def test_no_one_process_level_gives_no_node_fill(tmp_path):
    with RecordWriter(tmp_path / "nodefill.jsonl", {"hostname": "synthetic"}) as writer:
        _write_fill(writer, np.random.default_rng(0), levels=(2, 4))
    assert fit_node_fill(load_dataframe(tmp_path, type="measurement")) is None


def test_the_colocation_factor_is_carried_above_the_jitters_ranks(records):
    model = ColocationModel(n_boot=50).fit(records)
    at_2, ci_2 = model.factor("cnn", 1, 2)
    assert at_2 == pytest.approx(1.25, rel=0.02)
    fill = model.node_fill_
    for k in (4, 8, 16):
        ratio = fill.slowdown(k)[0] / fill.slowdown(2)[0]
        value, ci = model.factor("cnn", 1, k)
        assert value == pytest.approx(at_2 * ratio)
        assert ci.low <= value <= ci.high
        assert ci.high > ci_2.high  # the kernels' range widens the interval
    assert model.factor("cnn", 1, 16) == model.factor("cnn", 1, 8)  # the node has 8 cores
    assert model.carried_by_node_fill(2) is None
    doc = Profile(machine={}, models={"colocation": model.to_dict()}).to_dict()
    again = ColocationModel.from_dict(doc["models"]["colocation"])
    assert again.factor("cnn", 1, 8) == model.factor("cnn", 1, 8)


def test_a_level_below_the_jitters_carries_nothing(records):
    """A node-fill level that came out faster than the one below (a noisy launch set) does not
    make more busy cores speed a core up: the factor is held."""
    model = ColocationModel(n_boot=50).fit(records)
    model.node_fill_ = NodeFill((1, 2, 4), (1.0, 1.5, 1.2), (1.0, 1.4, 1.1), (1.0, 1.6, 1.3), {})
    assert model.factor("cnn", 1, 4)[0] == model.factor("cnn", 1, 2)[0]


def test_a_node_fill_no_larger_than_the_jitters_ranks_carries_nothing(records):
    """A 2-core node's fill ends where its jitter does: above it the factor is held, and the
    source line says so, not "carried by x1.000"."""
    model = ColocationModel(n_boot=50).fit(records)
    model.node_fill_ = NodeFill((1, 2), (1.0, 1.3), (1.0, 1.2), (1.0, 1.4), {})
    assert model.carried_by_node_fill(4) is None
    assert model.factor("cnn", 1, 4) == model.factor("cnn", 1, 2)


def test_without_node_fill_the_factor_is_held(records):
    model = ColocationModel(n_boot=50).fit(records[records["benchmark"] == "jitter"])
    assert model.node_fill_ is None
    assert model.factor("cnn", 1, 8) == model.factor("cnn", 1, 2)
    assert "node_fill" not in model.to_dict()


def test_predict_carries_the_compute_and_says_so(tmp_path):
    """Above the jitter's 2 ranks per node, a profile with a node fill multiplies every
    rank's compute by S(R) / S(2) over the same profile without one, and its sources say so."""
    doc = resolve_profile("xeon-2core")[0].to_dict()
    held, carried = tmp_path / "held.json", tmp_path / "carried.json"
    held.write_text(json.dumps(doc))
    fill = NodeFill((1, 2, 4, 8), (1.0, 1.1, 1.3, 1.6), (1.0, 1.05, 1.2, 1.4),
                    (1.0, 1.2, 1.5, 1.9), {})  # fmt: skip
    doc["models"]["colocation"]["node_fill"] = fill.to_dict()
    carried.write_text(json.dumps(doc))
    out = {}
    for path in (held, carried):  # as predict --json prints it, in this process
        cfg = PredictConfig(model="cnn", nodes=1, procs_per_node=8, profile=str(path), samples=4)
        out[path] = run_prediction(cfg)
    ratio = out[carried]["breakdown"]["compute_s"] / out[held]["breakdown"]["compute_s"]
    assert ratio == pytest.approx(1.6 / 1.1, rel=1e-9)
    assert "held above 2" in out[held]["provenance"]["co-location"]
    line = out[carried]["provenance"]["co-location"]
    assert "carried above 2 by the node-fill slowdown (x1.455 from 2 to 8 busy cores)" in line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"procs": "two"}, "'params.procs' must be a whole number from 1 to 16,777,216, got 'two'"),
        ({"launch": None}, "a nodefill record in nodefill.jsonl has no 'params.launch'"),
    ],
)
def test_a_damaged_nodefill_record_is_named_in_one_line(tmp_path, change, message):
    """As ``calibrate --from`` reads and fits them: a one-line UserError naming the field."""
    with RecordWriter(tmp_path / "nodefill.jsonl", {"hostname": "synthetic"}) as writer:
        _write_fill(writer, np.random.default_rng(3), levels=(1, 2))
    lines = (tmp_path / "nodefill.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    record["params"].update(change)
    lines[1] = json.dumps(record)
    (tmp_path / "nodefill.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=re.escape(message)):
        ColocationModel(n_boot=10).fit(load_measurements(tmp_path))


def _edited_profile(tmp_path, edit) -> str:
    """The packaged profile with a node fill, ``edit`` applied to that section, as a file."""
    doc = resolve_profile("xeon-2core")[0].to_dict()
    fill = NodeFill((1, 2, 4), (1.0, 1.1, 1.3), (1.0, 1.05, 1.2), (1.0, 1.2, 1.5),
                    {"gemm": (1.0, 1.1, 1.2)}).to_dict()  # fmt: skip
    edit(fill)
    doc["models"]["colocation"]["node_fill"] = fill
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        (lambda d: d.update(levels=[1, 4, 2]), "levels", "must ascend"),
        (lambda d: d.update(levels=[2, 4, 8]), "levels", "must start at 1"),
        (lambda d: d.update(levels=[1, 2.5, 4]), "levels[1]", "must be a whole number"),
        (lambda d: d.update(levels=["1", "2", "4"]), "levels[0]", 'expected a number, got "1"'),
        (lambda d: d.update(levels=[]), "levels", "must start at 1 and hold at least two"),
        (lambda d: d.update(slowdown=[1.0, 1.1]), "slowdown", "holds 2 values for the 3 levels"),
        (lambda d: d["slowdown"].__setitem__(1, 0.0), "slowdown[1]", "a slowdown must be > 0"),
        (lambda d: d["slowdown"].__setitem__(2, -1.3), "slowdown[2]", "a slowdown must be > 0"),
        (lambda d: d["interval"].update(low=[1.0, 1.5, 1.2]), "slowdown[1]", "1.1 is outside"),
        (lambda d: d["kernels"].update(gemm=[1.0]), "kernels.gemm", "holds 1 values"),
        (lambda d: d.update(interval=[1, 2]), "interval", "must be an object"),
    ],
)
def test_a_damaged_node_fill_in_a_profile_is_named_in_one_line(
    tmp_path, pdlsim_cli, edit, field, problem
):
    """Levels out of order, lists of unequal length, a slowdown of zero or below: exit 2 and
    one line naming the profile and the field, never a traceback or a silent wrong factor."""
    path = _edited_profile(tmp_path, edit)
    result = pdlsim_cli("predict", "--nodes", "1", "--procs-per-node", "8", "--model", "cnn",
                        "--profile", path)  # fmt: skip
    assert result.returncode == 2, result.stdout
    errors = [line for line in result.stderr.splitlines() if "warning" not in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{path}: models.colocation.node_fill.{field}: {problem}" in errors[0]


def _edited_records(tmp_path, edit) -> None:
    with RecordWriter(tmp_path / "nodefill.jsonl", {"hostname": "synthetic"}) as writer:
        _write_fill(writer, np.random.default_rng(4), levels=(1, 2, 4, 8))
    lines = (tmp_path / "nodefill.jsonl").read_text().splitlines()
    kept = [lines[0]]
    for line in lines[1:]:
        record = edit(json.loads(line))
        if record is not None:
            kept.append(json.dumps(record))
    (tmp_path / "nodefill.jsonl").write_text("\n".join(kept) + "\n")


def test_a_level_missing_a_kernel_is_left_out_not_the_whole_fill(tmp_path):
    """A run stopped while writing level 4 leaves it without its stream records: levels 1, 2
    and 8 still give the node fill (it was None, and the factor held, before)."""

    def drop(record):
        params = record["params"]
        return None if (params["kernel"], params["procs"]) == ("stream", 4) else record

    _edited_records(tmp_path, drop)
    fill = fit_node_fill(load_measurements(tmp_path))
    assert fill is not None and fill.levels == (1, 2, 8)
    assert fill.kernels["stream"] == pytest.approx((1.0, 1.2, 2.4), rel=0.02)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r["params"].update(procs=0) if r["params"]["procs"] == 2 else None,
         "nodefill.jsonl:11: measurement record 10 (nodefill gemm): 'params.procs' must be a "
         "whole number from 1 to"),
        (lambda r: r.update(samples=[0.0] * 5) if r["params"]["procs"] == 1 else None,
         "(nodefill gemm): 'samples' have a median of 0 s, but a timed operation takes "
         "some time"),
    ],
)  # fmt: skip
def test_nodefill_records_no_fill_can_come_from_are_refused_in_one_line(tmp_path, edit, message):
    """A level of 0 processes (was: no node fill, silently) and a median call time of 0 (was:
    a slowdown of 0, inf or NaN in the profile) are refused, naming the file."""
    _edited_records(tmp_path, lambda record: (edit(record), record)[1])
    with pytest.raises(UserError, match=re.escape(message)):
        ColocationModel(n_boot=10).fit(load_measurements(tmp_path))
