"""``pdlsim predict --layer-times FILE`` checks the whole file before using any of it: a field of
the wrong type, a time that is NaN, infinite or negative, a row without a name or a time is one
line naming the file and the field's path (``layers[0].forward_s``), exit status 2, never a
traceback nor a prediction priced from it."""

from __future__ import annotations

import json

import pytest

from microbench.workload import Workload
from pdlsim.cli.main import main
from tests.conftest import run_pdlsim

NAN, INF = float("nan"), float("inf")
DROP = object()  # a key left out


def _write(tmp_path, row: dict | None = None, **change) -> str:
    """A valid layer-times file for cnn at batch 32 on a GPU, with ``change`` to the document
    and ``row`` to its first layer (``DROP`` removes a key)."""
    layers = [{"name": info.name, "forward_s": 1e-3, "backward_s": 2e-3}
              for info in Workload.load("cnn").layers]  # fmt: skip
    layers[0].update(row or {})
    doc = {
        "workload": "cnn", "batch": 32, "precision": "fp32", "optimizer": "sgd",
        "device": "cuda:0", "device_name": "A GPU", "torch_version": "2.13.0",
        "layers": layers, "step_s": 0.040, "update_s": 0.004, **change,
    }  # fmt: skip
    for where in (doc, layers[0]):
        for key in [k for k, v in where.items() if v is DROP]:
            del where[key]
    path = tmp_path / "layer_times.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python writes them, which JSON reads
    return str(path)


def _predict(path: str) -> list[str]:
    return ["predict", "--nodes", "2", "--gpus", "8", "--samples", "2", "--iterations", "2",
            "--layer-times", path]  # fmt: skip


BAD = [
    ({"layers": None}, None, "layers is null, expected a list"),
    ({"layers": {"a": 1}}, None, 'layers is {"a": 1}, expected a list'),
    ({"layers": [1, 2]}, None, "layers[0] is 1, expected an object"),
    ({}, {"name": DROP}, "layers[0] has no name"),
    ({}, {"forward_s": DROP}, "layers[0] has no forward_s"),
    ({}, {"backward_s": DROP}, "layers[0] has no backward_s"),
    ({}, {"forward_s": None}, "layers[0].forward_s is null, expected a finite JSON number"),
    ({}, {"forward_s": "1e-5"}, 'layers[0].forward_s is "1e-5", expected a finite JSON number'),
    ({}, {"forward_s": True}, "layers[0].forward_s is true, expected a finite JSON number"),
    ({}, {"forward_s": -1.0}, "layers[0].forward_s is -1.0, expected a finite JSON number of"),
    ({}, {"forward_s": NAN}, "layers[0].forward_s is NaN"),
    ({}, {"forward_s": INF}, "layers[0].forward_s is Infinity"),
    ({}, {"backward_s": 10**400}, "a whole number of 401 digits (at most 18)"),  # past any float
    ({}, {"name": ["a"]}, 'layers[0].name is ["a"], expected a string'),
    ({}, {"name": "relu1"}, "layers[1].name 'relu1' is timed twice"),
    ({"step_s": None}, None, "step_s is null, expected a finite JSON number of seconds > 0"),
    ({"step_s": [1]}, None, "step_s is [1], expected a finite JSON number"),
    ({"step_s": "abc"}, None, 'step_s is "abc", expected a finite JSON number'),
    ({"step_s": INF}, None, "step_s is Infinity"),
    ({"step_s": 0}, None, "step_s is 0, expected a finite JSON number of seconds > 0"),
    # was a 300-digit step time printed, exit 0: capped as --step-time is
    ({"step_s": 1e300}, None, "step_s is 1e+300, expected a finite JSON number of seconds"),
    (
        {},
        {"backward_s": 2e10},
        "backward_s is 20000000000.0, expected a finite JSON number of "
        "seconds >= 0 and at most 1e+10",
    ),
    ({"update_s": -0.1}, None, "update_s is -0.1, expected a finite JSON number of seconds >= 0"),
    ({"batch": "32"}, None, 'batch is "32", expected a whole number >= 1'),
    ({"device": None}, None, "device is null, expected a string"),
    ({"device_name": 3}, None, "device_name is 3, expected a string"),
]


@pytest.mark.parametrize("change, row, message", BAD)
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, change, row,
                                                               message):  # fmt: skip
    path = _write(tmp_path, row, **change)
    assert main(_predict(path)) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and not captured.out
    assert f"--layer-times {path}: " in captured.err and message in captured.err


def test_layers_that_add_up_to_nothing_are_blamed_not_the_step(tmp_path, capsys):
    """All-zero layers leave nothing to scale to the step: the message says so, instead of
    calling a step longer than its update too short."""
    zero = [{"name": i.name, "forward_s": 0, "backward_s": 0} for i in Workload.load("cnn").layers]
    assert main(_predict(_write(tmp_path, layers=zero))) == 2
    err = capsys.readouterr().err
    assert "layers' forward and backward times add up to 0 s" in err and "update" not in err


def test_the_valid_file_still_predicts(tmp_path, capsys):
    assert main(_predict(_write(tmp_path))) == 0
    assert "step time" in capsys.readouterr().out


def test_from_the_shell_a_bad_time_is_status_2_without_a_traceback(tmp_path):
    result = run_pdlsim(*_predict(_write(tmp_path, step_s="abc")), timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and 'step_s is "abc"' in result.stderr
