"""Arguments of the wrong type from a script, names that would break a one-line error, edited
checkpoints and records, and two runs into one directory: each is one line (a UserError, or
exit status 2), never a deep internal error, a traceback or nonsense taken silently."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import pdlsim
from calibration.pipeline import load_measurements
from calibration.readers import collective_points
from microbench.argtypes import ArgumentTypeError
from microbench.errors import UserError
from microbench.records import RecordWriter
from microbench.workload import Workload
from pdlsim.prediction.config import CHECKED_ELSEWHERE, PredictConfig, checked_types
from pdlsim.train.checkpoint import latest_checkpoint
from pdlsim.train.checkpoint_header import EPOCH_FIELDS, header_problem
from pdlsim.train.loop import EpochResult
from tests.conftest import one_line, run_pdlsim

FAST = {"samples": 2, "iterations": 3}
C = pdlsim.Cluster


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: C.cpus("2"), "nodes must be an integer, got str '2'"),
        (lambda: C.cpus(2.5), "nodes must be an integer, got float 2.5"),
        (lambda: C.cpus(float("nan")), "nodes must be an integer"),
        (lambda: C.cpus(True), "nodes must be an integer, got bool"),
        (lambda: C.gpus(1, "4"), "gpus_per_node must be an integer"),
        (lambda: C.cpus(1, 1, None), "threads must be an integer"),
        (lambda: C(1, 2, speeds="ab"), "speeds must be a list of numbers"),
        (lambda: C(1, 2, speeds=("a", 1.0)), r"speeds\[0\] must be a number"),
        (lambda: pdlsim.predict("mlp", batch="32"), "batch must be an integer, got str"),
        (lambda: pdlsim.predict("mlp", batch=None), "batch must be an integer"),
        (lambda: pdlsim.predict("mlp", batch=32.5), "batch must be an integer, got float"),
        (lambda: pdlsim.predict("mlp", samples="2"), "samples must be an integer"),
        (lambda: pdlsim.predict("mlp", seed=1.5), "seed must be an integer"),
        (lambda: pdlsim.predict("mlp", overlap="no"), "overlap must be True or False"),
        (lambda: pdlsim.predict("mlp", bucket_mb="25"), "bucket_mb must be a number"),
        (lambda: pdlsim.predict("mlp", compression=16), "compression must be a string"),
        (lambda: pdlsim.predict("mlp", corrections=["all"]), "corrections must be a string"),
        (lambda: pdlsim.predict("mlp", step_time=0.06), "step_time must be a string like '60ms'"),
        (lambda: pdlsim.predict("mlp", cpu_watts=5), "cpu_watts must be a list of numbers"),
        (lambda: pdlsim.predict("mlp", gpu_watts=(1, 2, 3)), "gpu_watts must be 2 numbers"),
        (lambda: pdlsim.predict("mlp", cpu_sockets=(1.5, 2)), r"cpu_sockets\[0\] must be an"),
        (lambda: pdlsim.predict("mlp", hardware={}), "hardware must be a string"),
        (lambda: pdlsim.predict("mlp", profile={}), "profile must be a string"),
        (lambda: pdlsim.predict("mlp", trace=3), "trace must be a string"),
        (lambda: pdlsim.predict("mlp", sampels=2), "unknown option"),
        (lambda: pdlsim.load_profile(3), "profile must be a string"),
        (lambda: pdlsim.collective(3), "op must be a string"),
        (lambda: pdlsim.collective("allreduce", "1024"), "sizes must be a list of integers"),
        (lambda: pdlsim.collective("allreduce", []), "sizes must be a non-empty list"),
        (lambda: pdlsim.collective("allreduce", ["1k"]), r"sizes\[0\] must be an integer"),
        (lambda: pdlsim.collective("allreduce", 1024, nodes="2"), "nodes must be an integer"),
        (lambda: pdlsim.collective("allreduce", 1024, gpus="4"), "gpus must be an integer"),
        (lambda: pdlsim.collective("allreduce", 1024, nod="x"), "unknown option"),
        (lambda: pdlsim.sweep("mlp", nodes=[float("inf")]), r"nodes\[0\] must be an integer"),
        (lambda: pdlsim.sweep("mlp", nodes=[None]), r"nodes\[0\] must be an integer"),
        (lambda: pdlsim.sweep("mlp", nodes="12"), "nodes must be a list of integers"),
        (lambda: pdlsim.sweep("mlp", nodes=[True]), r"nodes\[0\] must be an integer, got bool"),
        (lambda: pdlsim.sweep("mlp", nodes=[1], gpus="yes"), "gpus must be True or False"),
        (lambda: pdlsim.sweep("mlp", nodes=[1], threads="2"), "threads must be an integer"),
    ],
)
def test_an_argument_of_the_wrong_type_is_one_line_naming_it(call, match):
    with pytest.raises(ArgumentTypeError, match=match) as info:
        call()
    assert isinstance(info.value, UserError) and isinstance(info.value, TypeError)
    one_line(info)


def test_numpy_integers_and_whole_floats_are_taken_as_the_integers_they_are():
    p = pdlsim.predict("mlp", C.cpus(np.int64(2)), batch=np.int32(8), seed=np.int64(1), **FAST)
    assert p["config"]["nodes"] == 2 and p["config"]["batch"] == 8
    assert type(p["config"]["nodes"]) is int
    rows = pdlsim.collective("allreduce", np.int64(2**20), nodes=np.int64(2))["rows"]
    assert rows[0]["size_bytes"] == 2**20
    table = pdlsim.sweep("mlp", nodes=2, per_node=[np.int64(1)], batches=[16.0], **FAST)
    assert list(table["nodes"]) == [2] and list(table["batch"]) == [16]
    cfg = PredictConfig(cpu_watts=[50, 150], speeds=[1, 0.5], checkpoint_every=100)
    assert cfg.cpu_watts == (50.0, 150.0) and cfg.speeds == (1.0, 0.5)
    assert cfg.checkpoint_every == "100"


def test_numpy_arrays_are_taken_as_the_lists_they_hold():
    """``np.arange`` for the node counts was "nodes must be an integer, got ndarray"."""
    rows = pdlsim.collective("allreduce", np.array([2**10, 2**20]), nodes=2)["rows"]
    assert [row["size_bytes"] for row in rows] == [2**10, 2**20]
    table = pdlsim.sweep("mlp", nodes=np.arange(1, 3), batches=np.array([16]), **FAST)
    assert list(table["nodes"]) == [1, 2] and list(table["batch"]) == [16, 16]


def test_a_negative_seed_from_a_script_is_named():
    """No flag parser has seen it: numpy's own "expected non-negative integer" named nothing."""
    with pytest.raises(UserError, match="^--seed must be at least 0, got -1$") as info:
        pdlsim.predict("mlp", seed=-1, **FAST)
    one_line(info)


def test_every_setting_of_a_prediction_has_its_type_checked():
    checked = {f.name for f in fields(PredictConfig)} - CHECKED_ELSEWHERE
    assert checked_types(PredictConfig()) == {}  # the defaults are canonical already
    for name in checked:  # a dict is no setting's type: each is refused, by name
        with pytest.raises(ArgumentTypeError, match=f"^{name} must be"):
            PredictConfig(**{name: {}})


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("a\nb", r"unprintable character '\\n'"),
        ("red\x1b[31m", r"unprintable character '\\x1b'"),
        ("abc\u202e", r"unprintable character '\\u202e'"),
        ("x" * 201, "201 characters long; give at most 200"),
    ],
)
def test_a_name_that_would_break_a_one_line_error_is_refused(name, match):
    layers = [{"kind": "dense", "units": 10}, {"kind": "softmax_cross_entropy"}]
    with pytest.raises(UserError, match=match) as info:
        Workload.load({"name": name, "input_shape": [8], "layers": layers})
    one_line(info)
    named = [{**layers[0], "name": name}, layers[1]]
    with pytest.raises(UserError, match=f"layer 0 \\(dense\\): 'name'.*{match}"):
        Workload.load({"name": "ok", "input_shape": [8], "layers": named})
    ok = Workload.load({"name": "сеть-1", "input_shape": [8], "layers": layers})
    assert ok.name == "сеть-1"  # unicode letters are fine


def _records(path: Path, records: list[dict], cpu: str = "AMD EPYC") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with RecordWriter(path, machine={"cpu_model": cpu, "logical_cores": 2, "arch": "x86_64"}) as w:
        for record in records:
            w.write(record)


GOOD = {"type": "measurement", "benchmark": "compute", "name": "gemm", "unit": "s",
        "params": {"m": 64}, "samples": [0.1, 0.2]}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"benchmark": None}, "'benchmark' must be a non-empty string, it has none"),
        ({"benchmark": 3}, "record 2 .*'benchmark' must be a non-empty string"),
        ({"samples": "abc"}, "'samples' must be a non-empty list of times"),
        ({"samples": []}, "'samples' must be a non-empty list of times"),
        ({"samples": [1.0, -2.0]}, "'samples\\[1\\]' holds -2.0: times must be finite and >= 0"),
        ({"samples": [1.0, [2.0]]}, "'samples\\[1\\]' holds '\\[2.0\\]', not a number"),
        ({"samples": [1.0, True]}, "'samples\\[1\\]' holds 'True', not a number"),
        ({"params": 5}, "'params' must be an object"),
        # a params field of the wrong kind was a traceback in a fitter's astype(int)
        ({"params": {"m": "64"}}, "'params.m' must be a whole number from 0 to .*, got '64'"),
        ({"params": {"m": 64, "threads": True}}, "'params.threads' must be a whole number"),
        ({"params": {"m": 64.5}}, "'params.m' must be a whole number from 0 to .*, got 64.5"),
        ({"params": {"m": 64, "device": 3}}, "'params.device' must be a non-empty string"),
        ({"params": {"m": 64, "pinned": "yes"}}, "'params.pinned' must be true or false"),
    ],
)
def test_calibrate_refuses_measurement_records_of_the_wrong_shape(tmp_path, change, match):
    bad = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    _records(tmp_path / "ranks1" / "compute.jsonl", [GOOD, bad])
    with pytest.raises(UserError, match=match) as info:
        load_measurements(tmp_path)
    one_line(info)
    assert "ranks1/compute.jsonl:3: measurement record 2 (" in str(info.value)


def test_a_collective_record_without_a_field_the_others_have_isone_line(tmp_path):
    """A record that left out (or nulled) ``ranks`` was an IntCastingNaNError traceback."""
    good = {"type": "measurement", "benchmark": "collectives", "name": "allreduce", "unit": "s",
            "params": {"op": "allreduce", "bytes": 8, "ranks": 2}, "samples": [1e-5]}  # fmt: skip
    bad = {**good, "params": {"op": "allreduce", "bytes": 16, "ranks": None}}
    _records(tmp_path / "ranks2" / "collectives.jsonl", [good, bad])
    with pytest.raises(UserError, match="lack params.ranks in ranks2/collectives.jsonl") as info:
        collective_points(load_measurements(tmp_path))
    one_line(info)


def test_calibrate_refuses_records_without_a_benchmark_field_at_all(tmp_path):
    _records(tmp_path / "compute.jsonl", [{k: v for k, v in GOOD.items() if k != "benchmark"}])
    result = run_pdlsim("calibrate", "--from", str(tmp_path), "--bootstrap", "1", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "measurement records without a 'benchmark' field" in result.stderr


def test_calibrate_refuses_a_directory_of_two_machines_records(tmp_path):
    _records(tmp_path / "ranks1" / "compute.jsonl", [GOOD])
    _records(tmp_path / "ranks2" / "compute.jsonl", [GOOD], cpu="Intel Xeon")
    result = run_pdlsim("calibrate", "--from", str(tmp_path), "--bootstrap", "1", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "records of two machines (cpu_model 'AMD EPYC' in ranks1/compute.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "profile.json").exists()


def test_a_second_writer_of_one_records_file_is_one_line_not_an_overwrite(tmp_path):
    path = tmp_path / "rank0.jsonl"
    _records(path, [GOOD])
    before = path.read_bytes()
    with pytest.raises(UserError, match="another run may be writing there") as info:
        RecordWriter(path, machine={})
    assert isinstance(info.value, FileExistsError)
    assert path.read_bytes() == before


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    result = run_pdlsim("train", *TRAIN, "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    return out


TRAIN = ["--samples", "64", "--test-samples", "16", "--batch", "16", "--max-steps", "4",
         "--checkpoint-every", "2"]  # fmt: skip


def _edit_newest(run: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "copy"
    copy.mkdir()
    newest = latest_checkpoint(run)
    members = dict(np.load(newest))
    header = json.loads(str(members["header"]))
    edit(header, members)
    members["header"] = np.array(json.dumps(header))
    with open(copy / newest.name, "wb") as handle:
        np.savez(handle, **members)
    return copy


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h, m: h.update(position=[1, 0, 4]), "position is not an object"),
        (lambda h, m: h["position"].update(step=-3), "position.step must be a whole number >= 0"),
        (lambda h, m: h["position"].update(step=10**6), "position.step 1000000 is past"),
        # fields past what the run can have been: a global_step of 10**17 was resumed (Adam's
        # step count, dropout's seeds), negative times and accuracies past 1 were carried on
        (
            lambda h, m: h["position"].update(global_step=10**17),
            r"position.global_step must be the 4 steps done \(1 finished epoch\(s\) and step 0\), "
            "got 100000000000000000",
        ),
        (lambda h, m: h["position"].update(global_step=3), "position.global_step must be the 4"),
        (lambda h, m: h["epochs"][0].update(steps=10**17), "position.global_step must be the 10"),
        (lambda h, m: h["epochs"][0].update(epoch=5), r"epochs\[0\] must be epoch 0"),
        (
            lambda h, m: h["epochs"][0].update(test_accuracy=1.5),
            r"epochs\[0\].test_accuracy must be from 0 to 1, got 1.5",
        ),
        (lambda h, m: h["epochs"][0].update(time_s=-1.0), r"epochs\[0\].time_s must be >= 0"),
        (lambda h, m: h["epoch_sums"].update(elapsed_s=-2.0), "epoch_sums.elapsed_s must be >= 0"),
        (lambda h, m: h["epoch_sums"].update(correct=1e300), "epoch_sums must be 0 at step 0"),
        (lambda h, m: h["position"].update(epoch=10**6), "1 finished epoch"),
        (lambda h, m: h.update(config=[1]), "config is not an object"),
        (lambda h, m: h["epoch_sums"].pop("loss"), "epoch_sums needs finite numbers"),
        (lambda h, m: h["epoch_sums"]["phases_s"].pop("data"), "phases_s lacks data"),
        (lambda h, m: h.update(epochs={}), "epochs is not a list"),
        (lambda h, m: h.update(epochs=[{"epoch": 0}]), r"epochs\[0\] needs the fields"),
        (lambda h, m: h["config"].update(procs="1"), "--procs '1', not --procs 1"),
        (lambda h, m: m["params"].__setitem__(0, np.nan), "params hold values that are not"),
    ],
)
def test_a_resume_from_an_edited_checkpoint_isone_line(trained, tmp_path, edit, match):
    copy = _edit_newest(trained, tmp_path, edit)
    result = run_pdlsim("train", *TRAIN, "--epochs", "3", "--resume", "--out", str(copy),
                        timeout=60)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert re.search(match, result.stderr), result.stderr


def test_the_checkpoint_header_check_knows_every_epoch_result_field(trained):
    assert EPOCH_FIELDS == tuple(f.name for f in fields(EpochResult))
    header = json.loads(str(np.load(latest_checkpoint(trained))["header"]))
    assert header_problem(header) is None
