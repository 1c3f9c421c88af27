"""Every command at the edges: each failure the user can fix is one line on stderr and exit
status 2, never a traceback, and nothing already written is damaged on the way out."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.profile import load_profile, packaged_profile_names
from microbench import fileio
from microbench.boundary import describe_failure
from microbench.fileio import atomic_write_text, loads_strict, new_run_dir
from microbench.records import RecordWriter
from pdlsim.cli import progress
from pdlsim.cli.main import main
from tests.conftest import REPO, run_pdlsim
from tests.profiles import STEP_TABLES

PROFILE = STEP_TABLES
LONG_NAME = "a" * 300  # over NAME_MAX (255) on every common file system


@pytest.fixture(autouse=True)
def no_progress_lines(monkeypatch):
    """A command run in-process here prints no progress, however slow the machine: progress on
    stderr is a feature of its own (tests/cli/test_refusals.py); here stderr is the error."""
    monkeypatch.setattr(progress, "FIRST_AFTER_S", math.inf)


def _one_line_error(result: subprocess.CompletedProcess, *parts: str, prog: str = "pdlsim") -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]


def _main_error(capsys, argv: list[str], *parts: str) -> str:
    """``pdlsim.cli.main(argv)`` in-process: exit 2 and one line on stderr holding ``parts``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def disk_full(monkeypatch):
    """Every write and fsync refused as on a full disk (ENOSPC), in this process."""

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", refuse)
    monkeypatch.setattr(os, "fsync", refuse)


# --- one error boundary at the top of each command line ------------------------------------


def test_numpy_running_out_of_memory_is_one_line(monkeypatch, capsys):
    def huge(*args, **kwargs):
        return np.empty(2**50, dtype=np.float64)  # numpy's _ArrayMemoryError, a MemoryError

    monkeypatch.setattr("pdlsim.cli.predict.run_prediction", huge)
    line = _main_error(capsys, ["predict", "--nodes", "2"], "not enough memory", "smaller sizes")
    assert "PiB" in line  # numpy's own words on what it could not allocate


def test_numpy_sizes_too_big_to_describe_are_one_line(monkeypatch, capsys):
    def too_big(*args, **kwargs):
        return np.empty((2**40, 2**40))  # ValueError: array is too big

    monkeypatch.setattr("pdlsim.cli.predict.run_prediction", too_big)
    _main_error(capsys, ["predict", "--nodes", "2"], "not enough memory", "array is too big")


def test_a_bug_keeps_its_traceback(monkeypatch):
    def bug(*args, **kwargs):
        raise ValueError("an internal inconsistency")

    monkeypatch.setattr("pdlsim.cli.predict.run_prediction", bug)
    with pytest.raises(ValueError, match="internal inconsistency"):
        main(["predict", "--nodes", "2"])
    assert describe_failure(KeyError("x")) is None
    assert describe_failure(OSError(errno.ENOENT, "No such file", "x")) is None


def test_a_long_path_keeps_the_file_name_that_failed():
    deep = "/scratch/" + "nested/" * 30 + "sweep.csv"
    line = describe_failure(OSError(errno.ENOSPC, "No space left on device", deep))
    assert line.startswith("/scratch/nested/") and "sweep.csv: the disk is full" in line
    assert len(line) < 240


def test_a_real_allocation_failure_in_training_is_one_line(tmp_path):
    workload = tmp_path / "huge.json"
    layers = [{"kind": "dense", "units": 2**31 - 1}, {"kind": "softmax_cross_entropy"}]
    workload.write_text(json.dumps({"input_shape": [2**20], "layers": layers}))
    # the samples and the batch fit; the class means and the weights do not
    small = ("--samples", "16", "--test-samples", "4", "--batch", "8")
    result = run_pdlsim("train", "--model", str(workload), *small, "--out", str(tmp_path / "r"),
                        timeout=60)  # fmt: skip
    _one_line_error(result, "not enough memory")
    # With the default epoch of samples, the data alone would not fit: refused before any.
    result = run_pdlsim("train", "--model", str(workload), "--out", str(tmp_path / "r"), timeout=60)
    _one_line_error(result, "50000 synthetic samples", "GiB of memory available", "--samples")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["predict", "--nodes", "2", "--trace", LONG_NAME],
        ["predict", "--nodes", "2", "--model", LONG_NAME],
        ["workload", "show", LONG_NAME + ".json"],
        ["sweep", "--nodes", "1", "--out", LONG_NAME],
    ],
)
def test_a_file_name_too_long_is_one_line(args, tmp_path):
    result = run_pdlsim(*args, cwd=tmp_path, timeout=60)
    _one_line_error(result, "too long")


@pytest.mark.parametrize(
    "command",
    [
        ["pdlsim", "predict", "--nodes", "2", "--json"],
        ["pdlsim", "--help"],  # argparse's own printer would swallow the failure
        ["pdlsim", "predict", "--help"],
        ["pdlsim", "--version"],
        ["microbench", "storage", "--help"],
    ],
)
def test_a_full_stdout_is_one_line_on_stderr(command):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", *command],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    prog = "pdlsim" if command[0] == "pdlsim" else f"python -m {command[0]}"
    _one_line_error(result, "cannot write the output", "disk is full", prog=prog)


def test_a_reader_going_away_stays_quiet():
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdlsim", "workload", "show", "cnn"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # as `| head -0` does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b""


def test_microbench_has_the_same_boundary(monkeypatch, capsys):
    import microbench.__main__ as entry
    from microbench.commands import storage

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/storage.jsonl")

    monkeypatch.setattr(storage, "run", full)
    assert entry.main(["storage", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "python -m microbench storage: error: runs/x/storage.jsonl: the disk is full; "
        "free space or write somewhere else"
    ]


# --- messages that name the file and the field, and the right cause -------------------------


def _damaged_profile(tmp_path: Path, damage) -> Path:
    doc = json.loads(PROFILE.read_text())
    damage(doc["models"])
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    return path


def _set_sigma(models, value):
    models["jitter"]["params"]["sigma"] = value


@pytest.mark.parametrize(
    ("damage", "field", "problem"),
    [
        (
            lambda m: _set_sigma(m, "abc"),
            "models.jitter.params.sigma",
            'expected a number, got "abc"',
        ),
        (lambda m: _set_sigma(m, [1.0]), "models.jitter.params.sigma", "expected a number"),
        (lambda m: m["jitter"]["params"].pop("sigma"), "models.jitter.params.sigma", "missing"),
        (lambda m: m["compute"]["table"][0].clear(), "models.compute.table[0].", "missing"),
        (
            lambda m: m["collectives"]["collectives"]["allgather"]["regimes"][0].update(a_s=None),
            "models.collectives.collectives.allgather.regimes[0].a_s",
            "null where a value belongs",
        ),
        (lambda m: m.update(kernels=[1]), "models.kernels", "must be an object or null"),
    ],
)
def test_a_damaged_profile_names_its_file_and_field(tmp_path, capsys, damage, field, problem):
    path = _damaged_profile(tmp_path, damage)
    _main_error(
        capsys, ["predict", "--nodes", "2", "--profile", str(path)], str(path), field, problem
    )


def test_every_section_of_the_packaged_profiles_still_builds():
    for name in packaged_profile_names():
        profile = load_profile(name)
        for section in profile.models:
            profile.model(section)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--nodes", "2", "--model", ""], "--model is given an empty value"),
        (["predict", "--nodes", "2", "--profile", ""], "--profile is given an empty value"),
        (["sweep", "--nodes", "1", "--out", ""], "the path is empty"),
        (["predict", "--nodes", "2", "--trace", ""], "the path is empty"),
        (["train", "--out", ""], "the path is empty"),
    ],
)
def test_an_empty_name_says_it_is_empty(args, message):
    result = run_pdlsim(*args, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "is a directory" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- duplicate keys ---------------------------------------------------------------------------


def test_a_workload_with_a_key_twice_is_refused(tmp_path, capsys):
    path = tmp_path / "twice.json"
    path.write_text(
        '{"input_shape": [8], "layers": [{"kind": "dense", "units": 4, "units": 40},'
        ' {"kind": "softmax_cross_entropy"}]}'
    )
    _main_error(capsys, ["workload", "show", str(path)], str(path), "'units' is given twice")


def test_a_profile_with_a_key_twice_is_refused(tmp_path, capsys):
    text = PROFILE.read_text()
    path = tmp_path / "twice.json"
    path.write_text(text.replace('"schema": ', '"schema": "pdlsim.profile", "schema": ', 1))
    args = ["predict", "--nodes", "2", "--profile", str(path)]
    _main_error(capsys, args, str(path), "'schema' is given twice")


def test_strict_json_keeps_everything_else_as_json_does():
    text = '{"a": [1, {"b": 2}], "c": {"a": 3}}'
    assert loads_strict(text) == json.loads(text)
    with pytest.raises(fileio.DuplicateKeyError, match="'b'"):
        loads_strict('{"a": {"b": 1, "b": 2}}')


# --- outputs: only regular files or new names, written whole ---------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_a_trace_onto_a_fifo_is_refused_and_the_fifo_kept(tmp_path):
    fifo = _fifo(tmp_path / "trace.json")
    result = run_pdlsim("predict", "--nodes", "2", "--trace", str(fifo), timeout=60)
    _one_line_error(result, "--trace", "FIFO")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_sweep_outputs_onto_a_fifo_are_refused_before_any_work(tmp_path):
    _fifo(tmp_path / "sweep.csv")
    result = run_pdlsim("sweep", "--nodes", "1", "--out", str(tmp_path), timeout=60)
    _one_line_error(result, "--out", "sweep.csv", "FIFO")
    assert stat.S_ISFIFO(os.stat(tmp_path / "sweep.csv").st_mode)


def test_calibrate_refuses_a_fifo_for_the_profile(tmp_path):
    fifo = _fifo(tmp_path / "profile.json")
    result = run_pdlsim("calibrate", "--from", str(tmp_path), "--out", str(fifo), timeout=60)
    _one_line_error(result, "--out", "FIFO")


@pytest.mark.parametrize(
    ("flag", "message"), [("--model", "is a FIFO; give the path"), ("--profile", "is a FIFO, not")]
)
def test_an_input_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, flag, message):
    fifo = _fifo(tmp_path / "input.json")
    result = run_pdlsim("predict", "--nodes", "2", flag, str(fifo), timeout=60)
    _one_line_error(result, message)


def test_a_fifo_among_records_is_skipped_without_waiting(tmp_path):
    from microbench.records import is_records_file

    with pytest.warns(UserWarning, match="not a regular file"):
        assert not is_records_file(_fifo(tmp_path / "rank0.jsonl"))


def test_microbench_refuses_a_run_folder_name_too_long(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "microbench", "storage", "--quick", "--out", LONG_NAME],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "too long" in result.stderr


def test_the_atomic_writers_refuse_a_fifo_and_leave_it(tmp_path):
    fifo = _fifo(tmp_path / "out")
    with pytest.raises(fileio.UserError, match="is a FIFO"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_sweep_on_a_full_disk_keeps_the_old_table(tmp_path, disk_full, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.csv").write_bytes(b"the old table\n")
    _main_error(capsys, ["sweep", "--nodes", "1", "--out", str(out)], "sweep.csv", "disk is full")
    assert (out / "sweep.csv").read_bytes() == b"the old table\n"
    assert sorted(p.name for p in out.iterdir()) == ["sweep.csv"]  # no temporary left


def test_a_failed_write_names_the_file_and_keeps_the_old_one(tmp_path, disk_full):
    target = tmp_path / "profile.json"
    target.write_text("old")
    with pytest.raises(OSError) as caught:
        atomic_write_text(target, "new")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_calibrate_on_a_full_disk_keeps_the_old_profile(tmp_path, monkeypatch, capsys):
    from calibration import pipeline

    profile = load_profile(PROFILE)

    def fitted(run_dir, n_boot, seed, kernel_runs=(), frame=None):
        return profile, {"compute": SimpleNamespace(table_=None)}

    monkeypatch.setattr(pipeline, "fit_profile", fitted)
    # the fit, its Extra-P file and plots stand in: the profile, written last, meets the disk
    monkeypatch.setattr(pipeline, "load_measurements", lambda run_dir: pd.DataFrame(
        {"benchmark": []}))  # fmt: skip
    monkeypatch.setattr("calibration.extrap.export_extrap", lambda frame, path: 0)
    monkeypatch.setattr("pdlsim.plots.plot_calibration", lambda models, frame, out: [])
    monkeypatch.setattr("calibration.optable.inconsistent_steps", lambda table: [])
    target = tmp_path / "profile.json"
    target.write_bytes(PROFILE.read_bytes()[:100])
    old = target.read_bytes()

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", refuse)
    args = ["calibrate", "--from", str(tmp_path), "--out", str(target)]
    _main_error(capsys, args, str(target), "disk is full")
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]


def test_training_on_a_full_disk_leaves_no_empty_records(tmp_path, disk_full, capsys):
    out = tmp_path / "run"
    args = ["train", "--samples", "256", "--test-samples", "32", "--max-steps", "2"]
    _main_error(capsys, [*args, "--out", str(out)], "rank0.jsonl", "disk is full")
    assert not out.exists() or [p for p in out.rglob("*") if p.is_file()] == []


def test_records_cut_a_refused_line_and_keep_whole_ones(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path, machine={"hostname": "h"}) as writer:
        writer.write({"type": "point", "value": 1})
        whole = path.read_bytes()
        real_write = os.write

        def half_then_full(fd, data):
            if len(data) > 4:
                real_write(fd, bytes(data[:4]))
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", half_then_full)
        with pytest.raises(OSError) as caught:
            writer.write({"type": "point", "value": 2})
        monkeypatch.undo()
        assert caught.value.filename == str(path)
        assert path.read_bytes() == whole


def test_a_records_file_whose_header_cannot_be_written_is_removed(tmp_path, disk_full):
    path = tmp_path / "r.jsonl"
    with pytest.raises(OSError):
        RecordWriter(path, machine={})
    assert not path.exists()


# --- run folders: one per run, even when two start in the same second -------------------------


def test_run_folders_started_in_the_same_second_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio.time, "strftime", lambda *args: "20261125-174417")
    made: list[Path] = []
    threads = [
        threading.Thread(target=lambda: made.append(new_run_dir(tmp_path / "runs", "c-")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)
    assert tmp_path / "runs" / "c-20261125-174417" in made
    assert tmp_path / "runs" / "c-20261125-174417-2" in made


def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    a_file = tmp_path / "runs"
    a_file.write_text("not a directory")
    with pytest.raises(fileio.UserError, match="cannot create a run directory"):
        new_run_dir(a_file / "bench")


def test_microbench_default_run_folders_differ(tmp_path, monkeypatch):
    from microbench.cli import default_out_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fileio.time, "strftime", lambda *args: "20261125-174417")
    first, second = default_out_dir(), default_out_dir()
    assert first != second and first.is_dir() and second.is_dir()


def test_no_command_names_a_run_folder_by_the_clock_alone():
    """Every timestamped run folder comes from new_run_dir (which makes it, uniquely)."""
    for path in [*REPO.glob("pdlsim/**/*.py"), *REPO.glob("microbench/**/*.py")]:
        text = path.read_text()
        assert '"%Y%m%d-%H%M%S"' not in text or path.name == "fileio.py", path


# --- sizes that would stop the machine -------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--threads", "1000000000"],
        ["train", "--procs", "100000", "--samples", "10000000", "--batch", "1"],
        ["bench", "--procs", "1,100000"],
        ["calibrate", "--threads", "1,1000000"],
    ],
)
def test_process_and_thread_counts_past_the_machine_are_refused_up_front(args, tmp_path):
    result = run_pdlsim(*args, cwd=tmp_path, timeout=60)
    _one_line_error(result, "more than this machine can run")
    assert list(tmp_path.iterdir()) == []  # no run folder for a run that never started


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "1" + "0" * 30],
        ["--nodes", "2", "--gpus", "4", "--batch", "1" + "0" * 20],
        ["--nodes", "100000", "--gpus", "8000"],
        ["--nodes", "2", "--iterations", "1" + "0" * 20],
    ],
)
def test_prediction_sizes_past_the_simulator_are_refused_up_front(args, capsys):
    _main_error(capsys, ["predict", *args], "must be at most")


def test_a_validation_refused_after_its_folder_was_made_leaves_none(tmp_path):
    result = run_pdlsim("validate", "--quick", "--gpu", "on", cwd=tmp_path, timeout=120)
    _one_line_error(result, "--gpu on")
    assert not any((tmp_path / "runs" / "validate").iterdir())
