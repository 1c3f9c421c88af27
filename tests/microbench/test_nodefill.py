"""microbench nodefill: k processes time each kernel at once, every launch and process's raw
samples recorded; counts above the cores and launches under mpiexec refused in one line."""

from __future__ import annotations

import time

import pytest

from microbench.nodefill import KERNELS, NodeFillError, fill, levels, stream_elements
from microbench.records import read_records
from tests.conftest import run_microbench


def test_levels_double_up_to_the_cores():
    assert levels(1) == [1]
    assert levels(2) == [1, 2]
    assert levels(16) == [1, 2, 4, 8, 16]
    assert levels(12) == [1, 2, 4, 8, 12]


def test_stream_arrays_are_twice_the_cache_and_bounded_by_memory():
    assert stream_elements(30 << 20, None, 16) == (60 << 20) // 12
    assert stream_elements(30 << 20, 64 << 20, 16) * 12 <= (64 << 20) // (8 * 16)


def test_every_process_of_every_launch_is_recorded(tmp_path):
    out = tmp_path / "run"
    proc = run_microbench("nodefill", "--procs", "1,2", "--launches", "2", "--seconds", "0.05",
                          "--out", str(out), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "nodefill: 2 processes: gemm" in proc.stdout
    records = [r for r in read_records(out / "nodefill.jsonl")[1] if r["type"] == "measurement"]
    keys = sorted((r["params"]["procs"], r["params"]["launch"], r["params"]["process"], r["name"])
                  for r in records)  # fmt: skip
    expected = sorted((k, launch, process, kernel) for k in (1, 2) for launch in range(2)
                      for process in range(k) for kernel in KERNELS)  # fmt: skip
    assert keys == expected
    assert all(r["benchmark"] == "nodefill" and len(r["samples"]) >= 1 for r in records)


def test_more_processes_than_cores_are_refused_before_any_record(tmp_path):
    proc = run_microbench("nodefill", "--procs", "1,100000", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "more than the" in proc.stderr and "cores here" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_process_that_fails_is_reported_at_once_not_waited_for():
    """Stream arrays no machine has: each process fails at its allocation; fill says so within
    seconds instead of waiting out its grace."""
    start = time.monotonic()
    with pytest.raises(NodeFillError, match="a process failed: .*Memory"):
        fill(2, 0.01, 10**15)
    assert time.monotonic() - start < 30
