"""Damaged records files, read and appended to: bytes that are not UTF-8 were decoded with
replacement (a record's ``type`` or name silently changed, the record dropped from a fit), and
``--append`` to a file with a damaged line, or a bad last line that ends in a newline, wrote the
new run's records into a file that every reader then refused."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from microbench.cli import out_dir_problem
from microbench.records import (
    RecordsAppendError,
    RecordsError,
    RecordWriter,
    TruncatedRecordWarning,
    is_records_file,
    read_records,
)
from tests.conftest import run_microbench

MACHINE = {"hostname": "node01", "cpu_model": "Test CPU", "logical_cores": 8, "gpus": []}
RECORD = {"type": "measurement", "benchmark": "storage", "name": "atomic_write", "unit": "s",
          "params": {"bytes": 65536}, "samples": [0.001, 0.002]}  # fmt: skip


def _file(path: Path, n: int = 3) -> Path:
    with RecordWriter(path, MACHINE, {"command": "microbench storage"}) as writer:
        for _ in range(n):
            writer.write(RECORD)
    return path


def test_a_line_that_is_not_utf8_is_named_not_read_as_another_record(tmp_path):
    path = _file(tmp_path / "storage.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"measurement"', b'"measur\xff\xfeement"')
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(RecordsError) as info:
        read_records(path)
    assert str(info.value) == (f"{path}:3: corrupt line: not UTF-8 text (byte b'\\xff', column 16)")


def test_a_last_line_cut_inside_a_utf8_character_is_skipped_as_truncated(tmp_path):
    path = _file(tmp_path / "storage.jsonl")
    with path.open("ab") as f:
        f.write('{"type": "measurement", "name": "\u00e9'.encode()[:-1])
    with pytest.warns(TruncatedRecordWarning, match=":5: skipped a truncated last line"):
        _, records = read_records(path)
    assert len(records) == 3


@pytest.mark.parametrize("damage", [b"garbage\n", b"\xff\xfe\n"])
def test_appending_to_a_file_with_a_damaged_middle_line_is_refused_and_leaves_it(tmp_path, damage):
    path = _file(tmp_path / "storage.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:2], damage, *lines[2:]]))
    before = path.read_bytes()
    with pytest.raises(RecordsAppendError) as info:
        RecordWriter(path, MACHINE, append=True)
    assert f"cannot append to {path}:3: corrupt line" in str(info.value)
    assert "move that file aside or give another --out" in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("tail", [b"garbage\n", b"\xff\xfe\n", b'{"type": "measur'])
def test_a_bad_last_line_is_cut_before_appending_whether_it_ends_in_a_newline_or_not(
    tmp_path, tail
):
    """A newline-terminated bad last line was kept: the appended records followed it, and the
    file became one with a corrupt line in the middle."""
    path = _file(tmp_path / "storage.jsonl")
    with path.open("ab") as f:
        f.write(tail)
    with pytest.warns(TruncatedRecordWarning, match="removed a truncated last line"):
        with RecordWriter(path, MACHINE, append=True) as writer:
            writer.write(RECORD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, records = read_records(path)
    assert len(records) == 4


def test_microbench_append_to_a_damaged_records_file_is_one_line_and_keeps_it(tmp_path):
    path = _file(tmp_path / "storage.jsonl")
    path.write_bytes(path.read_bytes().replace(b"\n", b"\ngarbage\n", 1))
    before = path.read_bytes()
    result = run_microbench("storage", "--quick", "--sizes", "64KiB", "--time-cap", "0.01",
                            "--out", str(tmp_path), "--append", "--quiet", timeout=120)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"python -m microbench storage: error: cannot append to {path}:2: corrupt line: invalid "
        "JSON (Expecting value, column 1); move that file aside or give another --out"
    ]
    assert path.read_bytes() == before


@pytest.mark.parametrize(("make", "kind"), [(os.mkfifo, "a FIFO"), (os.mkdir, "a directory")])
def test_a_records_name_taken_by_no_file_is_named_with_the_fix(tmp_path, make, kind):
    make(tmp_path / "storage.jsonl")
    problem = out_dir_problem(tmp_path, "storage.jsonl", append=True)
    assert problem == (
        f"{tmp_path / 'storage.jsonl'} is {kind}, not a records file; move it aside or give "
        "another --out"
    )


def test_an_empty_records_file_in_a_run_is_named_as_empty(tmp_path):
    (tmp_path / "compute.jsonl").write_bytes(b"")
    with pytest.warns(UserWarning, match="compute.jsonl: an empty file .*, skipped"):
        assert not is_records_file(tmp_path / "compute.jsonl")
