"""Output paths are checked before a long run, so that its results are not lost at the end."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from microbench import fileio
from microbench.fileio import removed_if_empty_on_failure, write_problem


def test_a_new_nested_directory_is_writable_and_the_check_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    assert write_problem(target, "dir") is None
    assert write_problem(target / "profile.json", "file") is None
    assert list(tmp_path.iterdir()) == []  # the probe is removed, nothing is made


def test_a_file_where_a_directory_goes_and_the_reverse(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("keep")
    assert write_problem(a_file, "dir") == f"{a_file} is a file; give a directory"
    assert write_problem(tmp_path, "file") == f"{tmp_path} is a directory; give a file name"
    assert (
        write_problem(a_file / "x", "dir") == f"{a_file / 'x'}: {a_file} is a file, not a directory"
    )
    assert a_file.read_text() == "keep"


def test_a_place_that_refuses_writes_is_named_with_the_reason(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.tempfile, "mkstemp", full)
    problem = write_problem(tmp_path / "new" / "trace.json", "file")
    assert problem == (
        f"{tmp_path / 'new' / 'trace.json'}: cannot write in {tmp_path} "
        "(No space left on device); give a writable place"
    )


def test_kind_must_be_dir_or_file(tmp_path):
    with pytest.raises(ValueError, match="kind must be"):
        write_problem(tmp_path, "link")


def test_a_run_folder_is_removed_on_failure_only_while_empty(tmp_path):
    empty, used, kept = tmp_path / "empty", tmp_path / "used", tmp_path / "kept"
    for folder in (empty, used, kept):
        folder.mkdir()
    (used / "records.jsonl").write_text("{}\n")
    for folder in (empty, used):
        with pytest.raises(RuntimeError), removed_if_empty_on_failure(folder):
            raise RuntimeError("refused")
    with removed_if_empty_on_failure(kept):
        pass
    assert not empty.exists() and (used / "records.jsonl").exists() and kept.is_dir()


def test_files_that_belong_together_are_written_all_or_none(tmp_path, monkeypatch):
    """A table and its plot: the plot failing on a full disk leaves the old table, not a new
    table beside an old plot; once both are staged, both are renamed into place."""
    table, plot = tmp_path / "sweep.csv", tmp_path / "scaling.png"
    table.write_text("old table")
    plot.write_bytes(b"old plot")
    staged = fileio._staged

    def full_at_the_plot(path, data):
        if path == plot:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return staged(path, data)

    monkeypatch.setattr(fileio, "_staged", full_at_the_plot)
    with pytest.raises(OSError):
        fileio.atomic_write_all({table: b"new table", plot: b"new plot"})
    assert (table.read_text(), plot.read_bytes()) == ("old table", b"old plot")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaling.png", "sweep.csv"]
    monkeypatch.setattr(fileio, "_staged", staged)
    fileio.atomic_write_all({table: b"new table", plot: b"new plot"})
    assert (table.read_text(), plot.read_bytes()) == ("new table", b"new plot")


def test_a_signal_while_files_are_staged_acts_after_they_are_in_place(tmp_path, monkeypatch):
    """Ctrl-C landing just as a temporary file was made (before its name was noted) left a
    ``.sweep.csv.*.tmp`` behind in --out (seen after an interrupted checkpoint write); held back,
    it acts once the set is in place, and nothing stray is left."""
    table, plot = tmp_path / "sweep.csv", tmp_path / "scaling.png"
    staged = fileio._staged

    def interrupted_on_return(path, data):
        tmp = staged(path, data)
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs as this call returns
        return tmp

    monkeypatch.setattr(fileio, "_staged", interrupted_on_return)
    with pytest.raises(KeyboardInterrupt):
        fileio.atomic_write_all({table: b"new table", plot: b"new plot"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaling.png", "sweep.csv"]
    assert (table.read_bytes(), plot.read_bytes()) == (b"new table", b"new plot")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_link_that_leads_nowhere_is_no_place_to_write(tmp_path):
    """``--out LOOP`` (or ``LOOP/sub``) passed the check and failed at mkdir: a FileExistsError
    or ELOOP traceback from sweep, after its work."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for place in (loop, loop / "sub"):
        assert "is a link to nowhere (or a loop), not a directory" in write_problem(place)
    assert write_problem(loop / "x.json", "file") is not None
