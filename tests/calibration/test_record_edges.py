"""Records folders that ``pdlsim calibrate --from`` must refuse in one line naming the file, the
line and the field, or fit with the damaged part left out and said: a records file whose header
was cut off or lost (it was skipped with a note, and its benchmark silently missing from the
profile), samples that are text or longer than a day, counts no machine has, a collective no
cost formula knows (a traceback), and node-fill launches whose process records disagree with
their process count."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from calibration.nodefill import fit_node_fill
from calibration.pipeline import load_measurements
from microbench.errors import UserError
from microbench.measurement import Measurement
from microbench.records import RecordsError, RecordWriter, read_records
from tests.conftest import one_line, run_pdlsim

MACHINE = {"cpu_model": "AMD EPYC", "logical_cores": 2, "arch": "x86_64"}
GOOD = {"type": "measurement", "benchmark": "compute", "name": "gemm", "unit": "s",
        "params": {"m": 64, "threads": 1}, "samples": [0.1, 0.2]}  # fmt: skip
COLLECTIVE = {"type": "measurement", "benchmark": "collectives", "name": "allreduce", "unit": "s",
              "params": {"op": "allreduce", "bytes": 8, "ranks": 2}, "samples": [1e-5]}  # fmt: skip


def _records(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with RecordWriter(path, machine=MACHINE) as writer:
        for record in records:
            writer.write(record)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda lines: [lines[0][:40], *lines[1:]], "damaged pdlsim.records header"),
        (lambda lines: lines[1:], "line 1 is a 'measurement' record: the header was lost"),
    ],
)
def test_a_records_file_with_a_damaged_header_is_refused_not_skipped(tmp_path, damage, problem):
    """It was skipped with a note on stdout, and the profile written without its benchmark."""
    _records(tmp_path / "run" / "ranks1" / "compute.jsonl", [GOOD])
    storage = tmp_path / "run" / "ranks1" / "storage.jsonl"
    _records(storage, [{**GOOD, "benchmark": "storage", "name": "atomic_write"}] * 2)
    lines = storage.read_text().splitlines()
    storage.write_text("\n".join(damage(lines)) + "\n")
    profile = tmp_path / "profile.json"
    profile.write_bytes(b"the profile of an earlier calibration")
    result = run_pdlsim("calibrate", "--from", str(tmp_path / "run"), "--out", str(profile),
                        "--bootstrap", "1", timeout=120)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "ranks1/storage.jsonl:1: " in result.stderr and problem in result.stderr
    assert profile.read_bytes() == b"the profile of an earlier calibration"


def test_other_json_lines_files_are_still_skipped_with_a_note(tmp_path):
    _records(tmp_path / "compute.jsonl", [GOOD])
    (tmp_path / "extrap.jsonl").write_text('{"params": {"p": 2}, "callpath": "a", "value": 1}\n')
    (tmp_path / "notes.jsonl").write_bytes(b"\xff\xfe not json at all\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = load_measurements(tmp_path)
    assert list(frame["source"]) == ["compute.jsonl"]
    assert sum("not a pdlsim.records file, skipped" in str(w.message) for w in caught) == 2


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"samples": [0.1, "0.2"]}, "'samples[1]'", "holds '0.2', not a number"),
        ({"samples": {"a": 0.1}}, "'samples'", "must be a non-empty list of times, got an object"),
        ({"samples": [0.1, 1e300]}, "'samples[1]'", "no timed sample lasts more than a day"),
        ({"params": {"m": 64, "threads": 0}}, "'params.threads'", "from 1 to 65,536, got 0"),
        ({"params": {"m": 64, "threads": 10**17}}, "'params.threads'", "from 1 to 65,536"),
        ({"params": {"m": 64, "threads": 1, "batch": 0}}, "'params.batch'", "from 1 to"),
        ({"samples": [0.0, 0.0, 1e-3]}, "'samples'", "have a median of 0 s, but a timed"),
    ],
)
def test_measurement_values_no_machine_has_are_named_by_file_line_and_field(
    tmp_path, change, field, problem
):
    """Text samples were read as numbers; a sample of 1e300 s failed in the profile check with
    no file named; a count of 0 or 10**17 threads was fitted, or allocated petabytes."""
    _records(tmp_path / "ranks1" / "compute.jsonl", [GOOD, {**GOOD, **change}])
    with pytest.raises(UserError) as info:
        load_measurements(tmp_path)
    message = one_line(info)
    assert "ranks1/compute.jsonl:3: measurement record 2 (compute gemm): " in message
    assert f"{field} " in message and problem in message


def test_a_gemm_timed_at_0_s_is_refused_before_the_fits_not_a_traceback(tmp_path):
    """Its peak rate came out infinite and the profile's write failed with a traceback; the
    clock's own overhead, which a coarse clock reads as 0 s, is still accepted."""
    timer = {**GOOD, "benchmark": "timer", "name": "overhead", "params": {}, "samples": [0.0]}
    assert len(load_measurements(_write_run(tmp_path / "ok", [GOOD, timer]))) == 2
    run = _write_run(tmp_path / "run", [GOOD, {**GOOD, "samples": [0.0] * 5}])
    stderr = _calibrate_refused(run, tmp_path / "profile.json")
    assert (
        "ranks1/compute.jsonl:3: measurement record 2 (compute gemm): 'samples' have a "
        "median of 0 s" in stderr
    )


def _write_run(run: Path, records: list[dict]) -> Path:
    _records(run / "ranks1" / "compute.jsonl", records)
    return run


def _calibrate_refused(run: Path, profile: Path) -> str:
    """``pdlsim calibrate --from RUN --out PROFILE`` over a profile already there: exit 2,
    one line on stderr (returned), no traceback, the profile as it was."""
    profile.write_bytes(b"kept")
    result = run_pdlsim("calibrate", "--from", str(run), "--out", str(profile),
                        "--bootstrap", "1", timeout=120)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert profile.read_bytes() == b"kept"
    return result.stderr


def test_a_failed_calibration_still_shows_the_notes_that_say_why(tmp_path):
    """An emptied compute.jsonl was skipped with a note that a failed fit never printed: the
    one line said only that there were no compute records."""
    run = tmp_path / "run"
    _records(run / "ranks2" / "collectives.jsonl", [COLLECTIVE])
    (run / "ranks1").mkdir()
    (run / "ranks1" / "compute.jsonl").write_bytes(b"")
    result = run_pdlsim("calibrate", "--from", str(run), "--bootstrap", "1", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "has no compute records" in result.stderr
    assert "ranks1/compute.jsonl: an empty file (no pdlsim.records header), skipped" in (
        result.stdout
    )
    assert not (run / "profile.json").exists()


def test_power_records_in_watts_are_not_held_to_the_bound_on_times(tmp_path):
    watts = {**GOOD, "benchmark": "power", "name": "busy", "unit": "W", "samples": [1.5e5]}
    _records(tmp_path / "power.jsonl", [GOOD, watts])
    assert len(load_measurements(tmp_path)) == 2


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"op": "alltoall"}, "'params.op' must be one of allreduce, bcast"),
        ({"ranks": 0}, "'params.ranks' must be a whole number from 1 to 16,777,216, got 0"),
        ({"ranks": 10**17}, "'params.ranks' must be a whole number from 1 to 16,777,216"),
        ({"bytes": 2**55}, "'params.bytes' must be a whole number from 0 to"),
    ],
)
def test_collective_records_no_machine_measures_areone_line(tmp_path, params, problem):
    """An unknown op was a ValueError traceback in the algorithm fit; 10**17 ranks a numpy
    allocation of 355 PiB; 0 ranks was fitted."""
    bad = {**COLLECTIVE, "params": {**COLLECTIVE["params"], **params}}
    _records(tmp_path / "ranks2" / "collectives.jsonl", [COLLECTIVE, bad])
    stderr = _calibrate_refused(tmp_path, tmp_path / "profile.json")
    assert "ranks2/collectives.jsonl:3: measurement record 2 (collectives allreduce)" in stderr
    assert problem in stderr


BASE_S = {"gemm": 2e-3, "stream": 60e-3}
SLOWDOWN = {"gemm": (1.0, 1.1, 1.2), "stream": (1.0, 1.2, 1.6)}


def _fill(tmp_path: Path, skip=lambda kernel, k, launch, process: False, extra=()) -> Path:
    """Two launches at 1, 2 and 4 processes; ``skip`` leaves records out, ``extra`` adds
    (kernel, procs, launch, process) records."""
    rng = np.random.default_rng(5)
    with RecordWriter(tmp_path / "nodefill.jsonl", MACHINE) as writer:
        rows = [(n, k, launch, p) for i, k in enumerate((1, 2, 4)) for launch in range(2)
                for p in range(k) for n in BASE_S]  # fmt: skip
        for kernel, k, launch, process in [*rows, *extra]:
            if skip(kernel, k, launch, process):
                continue
            median = BASE_S[kernel] * SLOWDOWN[kernel][(1, 2, 4).index(k)]
            params = {"kernel": kernel, "procs": k, "launch": launch, "process": process}
            samples = median * rng.lognormal(0.0, 0.01, 21)
            writer.write(Measurement(samples, "nodefill", kernel, params).to_record())
    return tmp_path


def test_a_fill_launch_missing_a_process_is_left_out_with_one_warning(tmp_path):
    """procs 4 with records of three processes: that launch alone is left out, and said."""
    run = _fill(tmp_path, skip=lambda n, k, launch, p: (n, k, launch, p) == ("stream", 4, 1, 3))
    with pytest.warns(UserWarning) as caught:
        fill = fit_node_fill(load_measurements(run))
    (warning,) = [str(w.message) for w in caught if "nodefill" in str(w.message)]
    assert "\n" not in warning
    assert re.search(r"in nodefill.jsonl: kernel stream at procs 4, launch 1 holds records of 3 "
                     r"process\(es\) \(0, 1, 2\), not of processes 0 to 3; that launch is left "
                     "out", warning)  # fmt: skip
    assert fill is not None and fill.levels == (1, 2, 4)
    assert fill.kernels["stream"] == pytest.approx(SLOWDOWN["stream"], rel=0.02)


def test_a_fill_level_whose_process_records_all_disagree_is_dropped(tmp_path):
    """Processes 4 and 5 at procs 2 (records of another count mixed in) in both launches: the
    level has no whole launch of gemm, so it is left out as a level missing a kernel is."""
    extra = [("gemm", 2, launch, p) for launch in range(2) for p in (4, 5)]
    run = _fill(tmp_path, extra=extra)
    with pytest.warns(UserWarning) as caught:
        fill = fit_node_fill(load_measurements(run))
    said = " | ".join(str(w.message) for w in caught)
    for launch in (0, 1):  # each launch said once, none re-emitted past the test
        assert f"kernel gemm at procs 2, launch {launch} holds records of 4" in said
    assert fill is not None and fill.levels == (1, 4)


def test_from_s_default_profile_place_is_probed_before_the_fits(tmp_path):
    """Without --out the profile goes into the run directory: a place there that cannot take it
    failed after every fit, and a FIFO where extrap.jsonl goes failed after the old profile
    had been replaced."""
    _records(tmp_path / "ranks1" / "compute.jsonl", [GOOD])
    (tmp_path / "profile.json").mkdir()
    result = run_pdlsim("calibrate", "--from", str(tmp_path), "--bootstrap", "1", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"pdlsim: error: --from {tmp_path}/profile.json is a dir")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "fitting" not in result.stdout
    (tmp_path / "profile.json").rmdir()
    (tmp_path / "profile.json").write_bytes(b"an earlier profile")
    os.mkfifo(tmp_path / "extrap.jsonl")
    result = run_pdlsim("calibrate", "--from", str(tmp_path), "--bootstrap", "1", timeout=120)
    assert result.returncode == 2 and "extrap.jsonl is a FIFO" in result.stderr, result.stderr
    assert (tmp_path / "profile.json").read_bytes() == b"an earlier profile"


def test_a_records_file_saved_with_a_byte_order_mark_is_named_as_such(tmp_path):
    """An editor's UTF-8 BOM before the header was reported as "line 1 is not JSON", though
    the line is the header, whole: the fix is to save the file without the mark."""
    path = tmp_path / "compute.jsonl"
    _records(path, [GOOD])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    with pytest.raises(RecordsError, match=r"compute.jsonl:1: starts with a UTF-8 byte-order mark"):
        read_records(path)
