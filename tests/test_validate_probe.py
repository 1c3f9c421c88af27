"""``pdlsim validate``'s inputs, probed: each refusal found is one line, exit status 2, before
any calibration or launch, and an ``--out`` folder already there is left as it was; a
user-given published table (:func:`pdlsim.validate.published.score_published`) refuses a row
that cannot be scored, naming the row and the field. No training runs here.

Found by a fault probe, each before its fix:

* ``--modes 2x2`` on 2 cores: every mode refused as oversubscribed, the validation calibrated,
  launched nothing and failed drawing an empty report (a numpy traceback, ``validation.csv``
  written without its ``validation.json``);
* ``--models`` a chain with a dropout or a one-neuron dense layer: accepted, then the first
  model-parallel launch failed, after the calibration;
* ``--seed`` of hundreds of digits: the held-out draw looped forever (every name too long);
* ``--batches`` holding all but one of the held-out batches: numpy's ValueError from the draw;
* ``--parallel data,data`` and ``data,,model`` accepted, unlike every other list flag;
* ``--modes 999x999`` answered "use fewer --procs or --threads", flags validate does not have;
* an interrupted validation with no finished launch said "validate again", and the same
  command was then refused (its ``--out`` held the held-out workloads);
* a published row of figure 0 was a ZeroDivisionError, a negative or NaN one scored, a
  mistyped field ignored, a duplicate id scored twice, a row that is no object an
  AttributeError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from microbench.errors import UserError
from pdlsim.cli.main import main
from pdlsim.validate import checks
from pdlsim.validate.plan import ValidateConfig
from pdlsim.validate.published import PUBLISHED, score_published
from tests.profiles import STEP_TABLES
from tests.validate.refusals import SMALL, refused, snapshot


def _with(flags: list[str], **changed: str) -> list[str]:
    """``flags`` with the value after each ``--name`` in ``changed`` replaced."""
    out = list(flags)
    for name, value in changed.items():
        out[out.index(f"--{name}") + 1] = value
    return out


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """An --out folder that already holds the user's own file: a refusal leaves it as it was."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    return folder


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any calibration or launch fails the test: the refusals come first."""

    def boom(*args, **kwargs):
        raise AssertionError("calibrated or launched before refusing")

    # checkpoint binds launch_train when it is imported: patched first, it is imported (if it
    # was not) while measure's is the real one, and the real one comes back after the test
    monkeypatch.setattr("pdlsim.validate.checkpoint.launch_train", boom)
    monkeypatch.setattr("pdlsim.validate.calibrate.calibrate_now", boom)
    monkeypatch.setattr("pdlsim.validate.measure.launch_train", boom)


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize("modes", ["2x2", "2x2,4x1"])
def test_modes_of_which_none_fits_the_cores_are_refused_before_any_work(
    modes, out, capsys, monkeypatch
):
    monkeypatch.setattr(checks, "available_cores", lambda: 2)
    before = snapshot(out)
    err = refused(capsys, *_with(SMALL, modes=modes), "--out", str(out))
    assert f"--modes {modes}: no mode fits this machine's 2 core(s)" in err
    assert "like 1x1" in err
    assert snapshot(out) == before


def test_modes_of_which_one_fits_pass_the_check(monkeypatch):
    monkeypatch.setattr(checks, "available_cores", lambda: 2)
    checks.check_fits(ValidateConfig(out=Path("x"), modes=((1, 1), (2, 2)), parallel=("data",)))
    # without data-parallel rows, the modes are not run: nothing to fit
    checks.check_fits(ValidateConfig(out=Path("x"), modes=((2, 2),), parallel=("model",)))


def test_an_empty_matrix_is_one_line_before_any_launch(tmp_path, monkeypatch):
    """The run's own guard, past the checks: nothing fits, nothing is predicted or launched."""
    from pdlsim.validate import run

    monkeypatch.setattr(run, "check_before_work", lambda cfg: None)
    monkeypatch.setattr("microbench.threads.available_cores", lambda: 1)
    monkeypatch.setattr(run, "predict_spec", lambda *a, **k: pytest.fail("predicted"))
    cfg = ValidateConfig(out=tmp_path / "o", profile=str(STEP_TABLES), models=("mlp",),
                         batches=(16,), modes=((2, 1),), parallel=("data",), gpu="off")  # fmt: skip
    with pytest.raises(UserError, match="no configuration fits this machine's 1 core") as info:
        run.run_validation(cfg, log=lambda line: None)
    assert "\n" not in str(info.value) and "list --modes that fit" in str(info.value)


def test_a_mode_past_what_the_machine_runs_names_validates_flag(out, capsys):
    err = refused(capsys, *_with(SMALL, modes="999x999"), "--out", str(out))
    assert "list smaller --modes" in err and "--procs" not in err


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    "layers, why",
    [
        ([{"kind": "dense", "units": 16}, {"kind": "dropout", "rate": 0.1}], "dropout"),
        ([{"kind": "dense", "units": 1}, {"kind": "relu"}], "1 output neurons"),
    ],
    ids=["dropout", "one-neuron"],
)
def test_a_workload_model_parallel_training_cannot_split_is_refused_first(
    layers, why, tmp_path, out, capsys
):
    path = tmp_path / "net.json"
    tail = [{"kind": "dense", "units": 4}, {"kind": "softmax_cross_entropy"}]
    path.write_text(json.dumps({"name": "net", "input_shape": [8], "layers": layers + tail}))
    before = snapshot(out)
    flags = _with(SMALL, models=str(path), parallel="data,model")
    err = refused(capsys, *flags, "--out", str(out))
    assert f"--models {path} is not split layer-wise over 2 ranks" in err and why in err
    assert err.rstrip().endswith("give --parallel data")
    assert snapshot(out) == before
    # data-parallel alone trains it: the check passes
    checks.check_models(ValidateConfig(out=out, models=(str(path),), parallel=("data",)))


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    "batches, left", [("8,12,24,48,96,128,256", "leaves none"), ("8,12,24,48,96,128", "leaves 256")]
)
def test_batches_that_leave_too_few_held_out_ones_are_refused(batches, left, out, capsys):
    """Was numpy's ValueError from the draw (a cannot be empty; a larger sample than the
    population)."""
    before = snapshot(out)
    err = refused(capsys, *_with(SMALL, batches=batches), "--out", str(out))
    assert f"--batches {batches} {left} of the held-out batches" in err
    assert "list fewer of them in --batches" in err
    assert snapshot(out) == before


def test_a_workload_that_does_not_load_names_the_flag(out, capsys):
    err = refused(capsys, *_with(SMALL, models="no-such-net"), "--out", str(out))
    assert err.startswith("pdlsim: error: --models: no workload preset or file named")


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize("seed", [str(checks.MAX_SEED + 1), "9" * 300])
def test_a_seed_past_the_bound_is_refused_before_the_draw(seed, out, capsys):
    """A seed of 300 digits made every drawn name too long; the draw retried forever."""
    before = snapshot(out)
    err = refused(capsys, *SMALL, "--seed", seed, "--out", str(out))
    assert f"--seed must be between 0 and {checks.MAX_SEED:,}" in err
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "parallel, said",
    [("data,data", "'data' is listed twice"), ("data,,model", "none empty"),
     ("gpu", "'gpu' is not one of data, model"), (",", "none empty")],
)  # fmt: skip
def test_a_parallel_list_is_checked_as_every_list_flag(parallel, said, out, capsys):
    before = snapshot(out)
    err = refused(capsys, *_with(SMALL, parallel=parallel), "--out", str(out))
    assert "argument --parallel" in err and said in err
    assert snapshot(out) == before


def test_a_bad_correction_list_names_the_flag(out, capsys):
    err = refused(capsys, *SMALL, "--corrections", "glue,magic", "--out", str(out))
    assert err.startswith("pdlsim: error: --corrections: unknown correction(s) magic")


@pytest.mark.parametrize(
    "given, kept", [(" glue , pace ", "glue,pace"), (" all ", "all"), ("none", "none")]
)
def test_a_correction_list_reaches_the_report_as_its_names(given, kept, tmp_path, monkeypatch):
    """Spaces around the names dropped, so the report's sets are not named twice."""
    seen = {}

    def capture(cfg, log):
        seen["corrections"] = cfg.corrections
        raise KeyboardInterrupt

    monkeypatch.setattr("pdlsim.validate.run.run_validation", capture)
    main(["validate", *SMALL, "--corrections", given, "--out", str(tmp_path / "o")])
    assert seen["corrections"] == kept


def test_an_interrupt_before_any_launch_says_to_use_a_new_out(tmp_path, capsys, monkeypatch):
    """The held-out workloads are in the given --out, so the same command again is refused:
    the line says where to go instead, and names a finished calibration's profile."""
    out = tmp_path / "o"

    def interrupted(cfg, log):
        (out / "workloads").mkdir(parents=True)
        (out / "workloads" / "mlp-s0-0.json").write_text("{}\n")
        (out / "calibration").mkdir()
        (out / "calibration" / "profile.json").write_text("{}\n")
        raise KeyboardInterrupt

    monkeypatch.setattr("pdlsim.validate.run.run_validation", interrupted)
    assert main(["validate", *SMALL, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no launch had finished" in err
    assert "validate again into a new --out" in err
    assert f"--profile {out / 'calibration' / 'profile.json'} skips the calibration" in err
    monkeypatch.undo()
    assert "already holds a validation" in refused(capsys, *SMALL, "--out", str(out))


# ---------------------------------------------------------------- a published table of one's own
def _rows(kind: str) -> dict:
    return next(r for r in json.loads(PUBLISHED.read_text())["rows"] if r["kind"] == kind)


BUSBW = _rows("allreduce_busbw")
TRAINING = _rows("training_throughput")


@pytest.mark.parametrize(
    "row, match",
    [
        ({**BUSBW, "published": 0}, "'published': it must be above 0, got 0"),
        ({**BUSBW, "published": -5.0}, "'published': it must be above 0"),
        ({**BUSBW, "published": math.inf}, "'published': it must be above 0, got inf"),
        ({**BUSBW, "published": "480 GB/s"}, "'published': it must be a number"),
        ({**BUSBW, "published": True}, "'published': it must be a number, got True"),
        ({**BUSBW, "nodes": 0}, "'nodes': it must be at least 1"),
        ({**BUSBW, "nodes": 1.5}, "'nodes': it must be a whole number"),
        ({**BUSBW, "nodes": "2"}, "'nodes': it must be a whole number"),
        ({**BUSBW, "nodes": 10**9}, "'nodes': it must be at most 1,000,000"),
        ({**BUSBW, "size_bytes": 0}, "'size_bytes': it must be at least 1"),
        ({**BUSBW, "node": None}, "'node': it must be text"),
        ({**BUSBW, "sizes_bytes": 8}, "unknown field(s) sizes_bytes for kind allreduce_busbw"),
        ({k: v for k, v in BUSBW.items() if k != "size_bytes"}, "missing field 'size_bytes'"),
        ({**BUSBW, "node": "no-such-node"}, "unknown node preset 'no-such-node'"),
        ({**TRAINING, "single_gpu_samples_per_s": 0}, "'single_gpu_samples_per_s': it must be"),
        ({**TRAINING, "batch": 0}, "'batch': it must be at least 1"),
        ({**TRAINING, "grad_acum": 2}, "unknown field(s) grad_acum"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None,
)
def test_a_row_that_cannot_be_scored_is_one_line_naming_it(row, match, tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"rows": [row]}, allow_nan=True))
    with pytest.raises(UserError) as info:
        score_published(path)
    message = str(info.value)
    assert "\n" not in message and f"row {row['id']}" in message and match in message, message


def test_a_nan_figure_written_as_json_text_is_refused(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"rows": [{**BUSBW, "published": 1.5}]}).replace("1.5", "NaN"))
    with pytest.raises(UserError, match="'published'"):
        score_published(path)


@pytest.mark.parametrize(
    "rows, match",
    [
        ([], "the 'rows' list is empty"),
        ([BUSBW, 1], "row #2 is int, not an object"),
        ([BUSBW, BUSBW], f"row {BUSBW['id']}: the id is used twice"),
    ],
)
def test_a_table_of_no_rows_or_repeated_ones_is_one_line(rows, match, tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"rows": rows}))
    with pytest.raises(UserError, match=match) as info:
        score_published(path)
    assert "\n" not in str(info.value)


def test_the_shipped_table_passes_its_own_checks():
    from pdlsim.validate.published import _check_row

    ids: set[str] = set()
    for number, row in enumerate(json.loads(PUBLISHED.read_text())["rows"], 1):
        _check_row(row, PUBLISHED, ids, number)
