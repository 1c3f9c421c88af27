"""Records format: round trips, crash tolerance, errors, DataFrame loading."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from microbench.cli import out_dir_problem
from microbench.errors import UserError
from microbench.records import (
    SCHEMA,
    SWEEP_START,
    RecordsError,
    RecordWriter,
    TruncatedRecordWarning,
    load_dataframe,
    read_records,
    stopped_sweep_points,
)
from microbench.records_read import read_numbered
from tests.conftest import run_microbench

MACHINE = {"hostname": "node01", "cpu_model": "Test CPU", "logical_cores": 8, "gpus": []}
RUN = {"command": "pdlsim bench", "settings": {"threads": 2}}


def write_file(path: Path, records: list[dict], machine: dict = MACHINE) -> None:
    with RecordWriter(path, machine, RUN) as writer:
        for record in records:
            writer.write(record)


def measurement(name: str = "allreduce", nbytes: int = 1024) -> dict:
    return {
        "type": "measurement",
        "benchmark": "collectives",
        "name": name,
        "params": {"nbytes": nbytes, "ranks": 2},
        "unit": "s",
        "samples": [1.0e-5, 1.2e-5, 1.1e-5],
        "warmup_discarded": 2,
        "stop_reason": "ci_narrow",
    }


def test_round_trip_of_header_and_records_of_several_types(tmp_path):
    path = tmp_path / "sub" / "dir" / "rank0.jsonl"  # parent directories are created
    step = {"type": "train_step", "step": 3, "phase_s": {"forward": 0.01, "allreduce": 0.002}}
    epoch = {"type": "train_epoch", "epoch": 0, "loss": 2.3, "note": "naïve ünïcode"}
    write_file(path, [measurement(), step, epoch])

    header, records = read_records(path)
    assert header["schema"] == SCHEMA and header["schema_version"] == 1
    assert header["machine"] == MACHINE and header["run"] == RUN
    assert header["created_utc"].endswith("Z")
    assert records == [measurement(), step, epoch]
    assert len(path.read_text(encoding="utf-8").splitlines()) == 4


def test_dataframe_flattens_fields_adds_source_machine_and_filters_by_type(tmp_path):
    path = tmp_path / "run.jsonl"
    write_file(path, [measurement("allreduce"), {"type": "train_step", "step": 1}, measurement()])

    frame = load_dataframe(path)
    assert len(frame) == 3
    assert {"params.nbytes", "params.ranks", "step", "source"} <= set(frame.columns)
    assert {"machine.hostname", "machine.cpu_model", "machine.gpus"} <= set(frame.columns)
    assert (frame["machine.hostname"] == "node01").all()
    assert (frame["source"] == "run.jsonl").all()

    only = load_dataframe(path, type="measurement")
    assert list(only["type"]) == ["measurement", "measurement"]
    assert only["samples"].iloc[0] == [1.0e-5, 1.2e-5, 1.1e-5]  # raw samples stay list cells
    assert only["machine.gpus"].iloc[1] == []
    assert load_dataframe(path, type="nothing").empty


def test_a_run_directory_with_two_rank_files_loads_into_one_frame(tmp_path):
    for rank in (10, 2):
        machine = {**MACHINE, "mpi": {"rank": rank, "ranks": 2}}
        write_file(tmp_path / f"rank{rank}.jsonl", [measurement(), measurement()], machine)
    (tmp_path / "notes.txt").write_text("not a records file")

    frame = load_dataframe(tmp_path)
    assert len(frame) == 4
    assert list(frame["source"]) == ["rank2.jsonl"] * 2 + ["rank10.jsonl"] * 2  # natural order
    assert list(frame["machine.mpi.rank"]) == [2, 2, 10, 10]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        load_dataframe(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_dataframe(tmp_path / "missing")


def test_a_run_directory_loads_its_subdirectories_each_file_with_its_own_header(tmp_path):
    """pdlsim bench keeps one directory per process count: each header is true for its points."""
    for ranks in (10, 2):
        machine = {**MACHINE, "mpi": {"ranks": ranks}}
        write_file(tmp_path / f"ranks{ranks}" / "collectives.jsonl", [measurement()], machine)
    write_file(tmp_path / "compute.jsonl", [measurement("gemm")])
    frame = load_dataframe(tmp_path)
    assert list(frame["source"]) == [
        "compute.jsonl",
        "ranks2/collectives.jsonl",
        "ranks10/collectives.jsonl",
    ]
    assert list(frame["machine.mpi.ranks"].iloc[1:]) == [2, 10]


def test_numpy_values_become_plain_json(tmp_path):
    path = tmp_path / "np.jsonl"
    record = {
        "type": "measurement",
        "samples": np.array([1.5, 2.5]),
        "counts": np.arange(3, dtype=np.int32),
        "n": np.int64(7),
        "x": np.float32(0.5),
        "ok": np.bool_(True),
        "shape": (2, np.uint8(3)),
        "params": {np.int64(4): "four", "path": tmp_path},
    }
    write_file(path, [record])
    _, (back,) = read_records(path)
    assert back["samples"] == [1.5, 2.5] and back["counts"] == [0, 1, 2]
    assert back["n"] == 7 and back["x"] == 0.5 and back["ok"] is True
    assert back["shape"] == [2, 3]
    assert back["params"] == {"4": "four", "path": str(tmp_path)}
    with RecordWriter(tmp_path / "bad.jsonl", MACHINE) as writer:
        with pytest.raises(TypeError, match="complex"):
            writer.write({"type": "x", "z": np.complex128(1j)})


def test_non_finite_values_are_refused_by_default_and_null_on_request(tmp_path):
    path = tmp_path / "nan.jsonl"
    with RecordWriter(path, MACHINE) as writer:
        with pytest.raises(ValueError, match=r"samples\[1\]"):
            writer.write({"type": "measurement", "samples": [1.0, math.nan]})
        with pytest.raises(ValueError, match="params.t"):
            writer.write({"type": "measurement", "params": {"t": np.float64(np.inf)}})
        with pytest.raises(ValueError, match="samples"):
            writer.write({"type": "measurement", "samples": np.array([1.0, -np.inf])})
    assert read_records(path)[1] == []  # nothing half-written

    with RecordWriter(tmp_path / "null.jsonl", MACHINE, nonfinite="null") as writer:
        writer.write({"type": "train_epoch", "loss": 2.5})
        writer.write({"type": "train_epoch", "loss": math.nan, "samples": np.array([1.0, np.inf])})
    _, (_, back) = read_records(tmp_path / "null.jsonl")
    assert back == {"type": "train_epoch", "loss": None, "samples": [1.0, None]}
    loss = load_dataframe(tmp_path / "null.jsonl")["loss"]
    assert loss.dtype == np.float64 and np.isnan(loss.iloc[1])


def test_records_need_a_string_type(tmp_path):
    with RecordWriter(tmp_path / "t.jsonl", MACHINE) as writer:
        for bad in ({"value": 1}, {"type": 3}, {"type": "header"}):
            with pytest.raises(ValueError):
                writer.write(bad)
    with pytest.raises(ValueError, match="closed"):
        writer.write({"type": "x"})


def test_truncated_last_line_is_skipped_with_one_warning(tmp_path):
    path = tmp_path / "killed.jsonl"
    write_file(path, [measurement("a"), measurement("b")])
    full = json.dumps(measurement("c"))
    with open(path, "a", encoding="utf-8") as f:
        f.write(full[: len(full) // 2])  # the writer was killed mid-line

    with pytest.warns(TruncatedRecordWarning, match=r"killed\.jsonl:4") as caught:
        header, records = read_records(path)
    assert len(caught) == 1
    assert [r["name"] for r in records] == ["a", "b"]
    with pytest.warns(TruncatedRecordWarning):
        assert len(load_dataframe(path)) == 2


V2_HEADER = {"type": "header", "schema": SCHEMA, "schema_version": 2, "machine": {}, "run": {}}


@pytest.mark.parametrize(
    ("first_line", "problem"),
    [
        ('{"type": "header", "schema": "someone.else", "schema_version": 1}', "foreign"),
        (json.dumps(V2_HEADER), "unknown schema_version 2"),
        ('{"type": "measurement", "samples": [1]}', "no pdlsim.records header"),
        ("hello", "not JSON"),
    ],
)
def test_bad_headers_raise_naming_file_and_line(tmp_path, first_line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(first_line + '\n{"type": "x"}\n')
    with pytest.raises(RecordsError, match=problem) as caught:
        read_records(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:1: ") and "\n" not in message
    assert caught.value.line == 1 and caught.value.path == str(path)


def test_corrupt_middle_line_and_empty_file_raise(tmp_path):
    path = tmp_path / "corrupt.jsonl"
    write_file(path, [measurement("a")])
    with open(path, "a") as f:
        f.write('{"type": "measurement", "sampl\n' + json.dumps(measurement("b")) + "\n")
    with pytest.raises(RecordsError, match=r"corrupt\.jsonl:3: corrupt line"):
        read_records(path)

    deep = "[" * 100_000 + "]" * 100_000  # past the interpreter's recursion limit
    path.write_text(path.read_text().splitlines()[0] + f"\n{deep}\n" + json.dumps(measurement("b")))
    with pytest.raises(RecordsError, match=r"corrupt\.jsonl:2: corrupt line.*nested too deeply"):
        read_records(path)

    path.write_text(path.read_text().splitlines()[0] + "\n[1, 2]\n")
    with pytest.raises(RecordsError, match=r":2: record is not a JSON object"):
        read_records(path)

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RecordsError, match=r"empty\.jsonl:1: empty file"):
        read_records(empty)


def test_overwrite_is_refused_and_append_keeps_one_header(tmp_path):
    path = tmp_path / "a.jsonl"
    write_file(path, [measurement("a")])
    with pytest.raises(FileExistsError, match="append=True"):
        RecordWriter(path, MACHINE)

    with RecordWriter(path, {**MACHINE, "cpu_model": "other"}, append=True) as writer:
        assert writer.header["machine"] == MACHINE  # the existing header is kept
        writer.write(measurement("b"))
    header, records = read_records(path)
    assert header["machine"] == MACHINE
    assert [r["name"] for r in records] == ["a", "b"]
    assert sum('"header"' in line for line in path.read_text().splitlines()) == 1

    with RecordWriter(tmp_path / "new.jsonl", MACHINE, append=True) as writer:  # append creates
        writer.write(measurement())
    assert len(read_records(tmp_path / "new.jsonl")[1]) == 1

    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"type": "header", "schema": "other"}\n')
    with pytest.raises(RecordsError, match="foreign"):
        RecordWriter(foreign, MACHINE, append=True)


def test_append_after_a_killed_writer_removes_the_cut_off_line(tmp_path):
    path = tmp_path / "a.jsonl"
    write_file(path, [measurement("a")])
    with open(path, "a") as f:
        f.write('{"type": "measurement", "na')
    with pytest.warns(TruncatedRecordWarning):
        writer = RecordWriter(path, MACHINE, append=True)
    with writer:
        writer.write(measurement("b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["name"] for r in read_records(path)[1]] == ["a", "b"]


def test_each_record_is_on_disk_before_close(tmp_path):
    path = tmp_path / "live.jsonl"
    writer = RecordWriter(path, MACHINE)
    writer.write(measurement("a"))
    assert [r["name"] for r in read_records(path)[1]] == ["a"]  # flushed, not yet closed
    writer.close()
    writer.close()
    assert writer.closed


def test_write_many_writes_every_record_in_order_or_none_when_one_is_bad(tmp_path):
    path = tmp_path / "many.jsonl"
    with RecordWriter(path, MACHINE) as writer:
        writer.write(measurement("first"))
        writer.write_many([])
        with pytest.raises(ValueError, match="non-empty string 'type'"):
            writer.write_many([measurement("never"), {"value": 1}])
        writer.write_many(measurement(name) for name in ("b", "c", "d"))
        assert [r["name"] for r in read_records(path)[1]] == ["first", "b", "c", "d"]


def test_appending_to_a_file_that_is_no_records_file_is_one_line(tmp_path):
    """``--append`` onto a file whose first line is no header of this schema (or another
    version) was a RecordsError traceback from the writer, after the benchmark's work; the
    command's own check now refuses it first, and the writer in the same words."""
    path = tmp_path / "compute.jsonl"
    path.write_text('{"type": "header", "schema": "pdlsim.records", "schema_version": 9}\n')
    problem = out_dir_problem(tmp_path, "compute.jsonl", append=True)
    assert problem is not None and "unknown schema_version 9" in problem
    assert "move that file aside or give another --out" in problem
    with pytest.raises(UserError, match="cannot append to .*compute.jsonl:1: unknown schema"):
        RecordWriter(path, {"hostname": "h"}, append=True)
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    assert "a link that leads to no file" in out_dir_problem(tmp_path, "loop.jsonl", append=False)


def test_appending_to_another_commands_records_is_refused_before_any_work(tmp_path):
    """A jitter records file under nodefill's name took nodefill's records without a word;
    the header's command must be the one appending (a file with no command in its header,
    written by another tool, is not judged)."""
    out = tmp_path / "run"
    args = ("nodefill", "--procs", "1", "--launches", "1", "--seconds", "0.02", "--out", str(out))
    with RecordWriter(out / "nodefill.jsonl", {"hostname": "h"}, {"command": "microbench jitter"}):
        pass
    before = (out / "nodefill.jsonl").read_bytes()
    proc = run_microbench(*args, "--append", timeout=120)
    assert proc.returncode == 2
    assert "holds the records of 'microbench jitter', not of 'microbench nodefill'" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert (out / "nodefill.jsonl").read_bytes() == before
    with RecordWriter(tmp_path / "other.jsonl", {"hostname": "h"}):
        pass
    assert out_dir_problem(tmp_path, "other.jsonl", True, "microbench nodefill") is None


def test_marks_keep_a_file_that_holds_no_measurement_bare(tmp_path):
    """A sweep's start mark alone is no record: a writer that fails before its first point
    removes its file (a retry needs no append); after a point the file stays, start and all."""
    bare = tmp_path / "bare.jsonl"
    with pytest.raises(RuntimeError), RecordWriter(bare, {"hostname": "h"}) as writer:
        writer.write_mark(SWEEP_START)
        raise RuntimeError("stopped before the first point")
    assert not bare.exists()
    kept = tmp_path / "kept.jsonl"
    with pytest.raises(RuntimeError), RecordWriter(kept, {"hostname": "h"}) as writer:
        writer.write_mark(SWEEP_START)
        writer.write({"type": "measurement", "x": 1})
        raise RuntimeError("stopped after a point")
    assert [r["type"] for _, r in read_numbered(kept)[1]] == [SWEEP_START, "measurement"]
    with RecordWriter(tmp_path / "x.jsonl", {"hostname": "h"}) as writer:
        with pytest.raises(ValueError, match="unknown mark"):
            writer.write_mark("measurement")


def test_a_sweep_writer_marks_its_start_and_a_clean_end_only(tmp_path):
    """A benchmark's writer brackets its records; one that stops on an error leaves its start
    without an end, which stopped_sweep_points counts; an appended run brackets its own."""
    path = tmp_path / "bench.jsonl"
    with RecordWriter(path, MACHINE, RUN, sweep=True) as writer:
        writer.write(measurement())
    assert [r["type"] for _, r in read_numbered(path)[1]] == ["sweep_start", "measurement",
                                                              "sweep_end"]  # fmt: skip
    assert [r["type"] for r in read_records(path)[1]] == ["measurement"]  # framing hidden
    assert stopped_sweep_points(path) is None
    with pytest.raises(RuntimeError), RecordWriter(path, MACHINE, RUN, append=True,
                                                   sweep=True) as writer:  # fmt: skip
        writer.write(measurement())
        writer.write(measurement(nbytes=2048))
        raise RuntimeError("killed part-way")
    assert stopped_sweep_points(path) == 2
    with RecordWriter(path, MACHINE, RUN, append=True, sweep=True) as writer:
        writer.write(measurement())
    assert stopped_sweep_points(path) is None  # the last run ended
    plain = tmp_path / "train.jsonl"
    write_file(plain, [measurement()])
    assert stopped_sweep_points(plain) is None  # no marks: not a benchmark's run
