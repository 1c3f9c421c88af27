"""The one reader of the machine's memory (:mod:`microbench.memory`): what a process may still
allocate now, and what it may hold at most, here or on a machine its records describe. The
metadata stamped into records and every check read it, so the two figures cannot drift apart
between two parsers of the same kernel files."""

from __future__ import annotations

import pytest

from microbench import machine, memory


def test_metadata_and_checks_read_the_same_figures():
    meta = machine.machine_metadata()
    assert meta["memory_total_bytes"] == memory.memory_total_bytes()
    assert meta["memory_limit_bytes"] == memory.cgroup_memory_limit_bytes()
    assert memory.usable_memory_bytes() == memory.usable_memory_bytes(meta)
    assert not hasattr(machine, "usable_memory_bytes")  # one reader, in microbench.memory
    available, usable = memory.available_memory_bytes(), memory.usable_memory_bytes()
    assert available is not None and usable is not None and 0 <= available <= usable


@pytest.mark.parametrize(
    ("limit", "current", "capped"),
    [("max", "5", False), ("1048576", "1048000", True), ("1048576", "2000000", True)],
)
def test_a_cgroup_limit_caps_both_answers(tmp_path, monkeypatch, limit, current, capped):
    (tmp_path / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "memory.current").write_text(f"{current}\n")
    monkeypatch.setattr(memory, "_CGROUP", tmp_path)
    if not capped:
        assert memory.cgroup_memory_limit_bytes() is None
        assert memory.usable_memory_bytes() == memory.memory_total_bytes()
        return
    assert memory.usable_memory_bytes() == 1048576
    assert memory.available_memory_bytes() == max(0, 1048576 - int(current))


def test_an_unreadable_cgroup_file_is_no_limit(tmp_path, monkeypatch):
    (tmp_path / "memory.max").mkdir()  # a directory where the file belongs: unreadable
    monkeypatch.setattr(memory, "_CGROUP", tmp_path)
    assert memory.cgroup_memory_limit_bytes() is None
    assert memory.available_memory_bytes() == memory._meminfo_bytes("MemAvailable")


def test_usable_memory_of_recorded_metadata_ignores_what_is_not_a_size():
    assert (
        memory.usable_memory_bytes({"memory_total_bytes": 8e9, "memory_limit_bytes": None})
        == 8_000_000_000
    )
    assert memory.usable_memory_bytes({"memory_total_bytes": "8", "memory_limit_bytes": -1}) is None
