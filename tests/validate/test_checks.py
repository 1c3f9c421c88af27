"""``pdlsim validate`` before any work (:mod:`pdlsim.validate.checks`) and when stopped: every
refusal is one line, exit status 2, nothing written, nothing already there changed; an
interrupted validation says what it left; the report's JSON is strict JSON; rows that cannot
run are listed. No training runs here: the refusals come before the first launch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from microbench.errors import UserError
from pdlsim.cli.main import main
from pdlsim.validate import checks
from pdlsim.validate.plan import RunSpec, ValidateConfig, draw_heldout, heldout_matrix
from pdlsim.validate.run import _refused_rows, predict_spec
from tests.profiles import STEP_TABLES
from tests.validate.refusals import PROFILE, SMALL, refused, snapshot


@pytest.mark.parametrize("name", ["workloads", "runs", "calibration"])
def test_a_file_where_out_needs_a_folder_is_refused_before_any_work(
    name: str, tmp_path: Path, capsys
) -> None:
    """Was a traceback (NotADirectoryError, FileExistsError), after the calibration where no
    --profile was given."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine\n")
    before = snapshot(out)
    err = refused(capsys, *SMALL, "--out", str(out))
    assert f"{out / name} is a file" in err and "--out" in err
    assert snapshot(out) == before


@pytest.mark.parametrize("previous", ["validation.json", "workloads/mlp-s0-0.json"])
def test_a_previous_validation_in_out_is_refused_and_kept(
    previous: str, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    (out / previous).parent.mkdir(parents=True)
    (out / previous).write_text('{"mine": true}\n')
    before = snapshot(out)
    err = refused(capsys, *SMALL, "--out", str(out))
    assert "already holds a validation" in err and previous.split("/")[0] in err
    assert snapshot(out) == before


def test_a_folder_where_a_plot_goes_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    (out / "speedup-mlp.png").mkdir(parents=True)
    err = refused(capsys, *SMALL, "--out", str(out))
    assert "speedup-mlp.png is a directory" in err


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--repeats", "5000", "--repeats must be between 1 and 1,000"),
     ("--steps", "1", "--steps must be at least 2")],
)  # fmt: skip
def test_counts_out_of_bounds_are_refused(flag, value, said, tmp_path: Path, capsys) -> None:
    argv = [*SMALL[:-4], flag, value]
    err = refused(capsys, *argv, "--out", str(tmp_path / "o"))
    assert said in err
    assert not (tmp_path / "o").exists()


def test_steps_whose_launch_would_not_fit_memory_are_refused_up_front(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pdlsim train refuses a synthetic set over half the memory; the first launch did, after
    the calibration. 1 GiB available: 100,000 steps of an MLP at batch 16 do not fit."""
    monkeypatch.setattr("pdlsim.train.data.available_memory_bytes", lambda: 2**30)
    argv = [*SMALL[:-2], "--steps", "100000", "--out", str(tmp_path / "o")]
    err = refused(capsys, *argv)
    assert "--steps 100000" in err and "memory" in err and "fewer --steps" in err
    assert not (tmp_path / "o").exists()
    checks.check_memory(ValidateConfig(out=tmp_path, steps=40), [])  # the default fits
    # a batch of which not even one step fits: fewer steps would not help, a smaller batch does
    huge = ValidateConfig(out=tmp_path, steps=1, models=("mlp",), batches=(2_000_000,))
    with pytest.raises(UserError, match="smaller --batches"):
        checks.check_memory(huge, [])


def test_two_workloads_of_one_name_are_refused(tmp_path: Path, capsys) -> None:
    """Their configurations share a label, so the second launch met the first one's records
    in its run folder and failed mid-run."""
    twin = tmp_path / "mlp.json"
    twin.write_text(json.dumps({"name": "other", "input_shape": [8], "layers": [
        {"kind": "dense", "units": 4}, {"kind": "softmax_cross_entropy"}]}))  # fmt: skip
    argv = [a if a != "mlp" else f"mlp,{twin}" for a in SMALL]
    err = refused(capsys, *argv, "--out", str(tmp_path / "o"))
    assert "both named 'mlp'" in err
    drawn = draw_heldout(ValidateConfig(out=tmp_path, seed=0))[0][0]
    (tmp_path / "a").mkdir()
    copy = tmp_path / "a" / f"{drawn.name}.json"
    copy.write_text(json.dumps(drawn.to_dict()))
    argv = [a if a != "mlp" else str(copy) for a in SMALL]
    err = refused(capsys, *argv, "--out", str(tmp_path / "o"))
    assert f"held-out workload '{drawn.name}'" in err and "--seed" in err
    assert not (tmp_path / "o").exists()


def test_a_profile_section_that_cannot_be_built_is_refused_before_any_file(
    tmp_path: Path, capsys
) -> None:
    """It read and passed the loader's checks, and failed when first priced, after the
    held-out workloads were written into --out."""
    doc = json.loads(STEP_TABLES.read_text())
    doc["models"]["compute"]["devices"] = "cpu"
    bad = tmp_path / "profile.json"
    bad.write_text(json.dumps(doc))
    argv = [a if a != PROFILE else str(bad) for a in SMALL]
    err = refused(capsys, *argv, "--out", str(tmp_path / "o"))
    assert err.startswith(f"pdlsim: error: --profile: {bad}: models.compute.devices")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("stop", [KeyboardInterrupt, "Stopped"])
def test_an_interrupted_validation_says_what_it_left(
    stop, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished launches keep their records (summary.json last); the report is not written."""
    import signal

    from microbench.boundary import Stopped

    out = tmp_path / "o"

    def stopped(cfg, log):
        for name in ("a", "b"):
            (out / "runs" / name / "r0").mkdir(parents=True)
            (out / "runs" / name / "r0" / "rank0.jsonl").write_text("{}\n")
        (out / "runs" / "a" / "r0" / "summary.json").write_text("{}\n")
        raise KeyboardInterrupt if stop is KeyboardInterrupt else Stopped(signal.SIGTERM)

    monkeypatch.setattr("pdlsim.validate.run.run_validation", stopped)
    status = main(["validate", *SMALL, "--out", str(out)])
    assert status == (130 if stop is KeyboardInterrupt else 128 + signal.SIGTERM)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no report was written" in err
    assert f"the 1 launch(es) that finished are in {out / 'runs'}" in err
    assert not (out / "validation.json").exists()


def test_the_report_json_is_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A speedup without a serial row is NaN: the file said NaN, which is not JSON."""
    from pdlsim.validate import report as report_module

    monkeypatch.setattr("pdlsim.plots.validation.plot_validation", lambda rows, out: [])
    row = {name: 1.0 for name in report_module.COLUMNS}
    row.update(model="mlp", parallel="data", inference=False)
    row.update(measured_speedup=math.nan, rel_error=math.inf)
    report_module.write_outputs({"rows": [row], "x": [math.nan]}, tmp_path)

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in validation.json")

    doc = json.loads((tmp_path / "validation.json").read_text(), parse_constant=refuse)
    assert doc["rows"][0]["measured_speedup"] is None and doc["x"] == [None]


def test_rows_that_cannot_run_on_the_cores_are_listed(tmp_path: Path) -> None:
    """On one core the model-parallel rows (P = 2) were dropped without a word."""
    planned = [RunSpec("mlp", 1, 1, 16), RunSpec("mlp", 2, 1, 16, "model")]
    assert _refused_rows(planned, 1, ((1, 1),)) == ["mlp-p2t1-b16-model (P x T = 2 threads on "
                                                    "1 cores)"]  # fmt: skip
    assert _refused_rows([RunSpec("mlp", 1, 2, 16)], 1, ((1, 2),)) == []  # its mode's line
    cfg = ValidateConfig(out=tmp_path, modes=((1, 1),), heldout_workloads=2, heldout_batches=1)
    specs, refused = heldout_matrix(cfg, cores=1)
    assert not any(s.parallel == "model" for s in specs)
    assert len([line for line in refused if "model-parallel (P=2)" in line]) == 2


def test_cpu_and_model_parallel_rows_predict_with_only_the_settings_that_apply(
    tmp_path: Path,
) -> None:
    """A GPU setting (pinned) on CPU ranks and no-overlap on model-parallel rows are refused
    by the prediction, as their flags are: validate must not pass them."""
    cfg = ValidateConfig(out=tmp_path, profile=PROFILE)
    for spec in (RunSpec("mlp", 1, 1, 16), RunSpec("mlp", 2, 1, 16, "model", inference=True)):
        assert predict_spec(spec, cfg, samples=2)["band"]["p50_s"] > 0
