"""microbench nodefill: k processes time each kernel at once, every launch and process's raw
samples recorded; counts above the cores and launches under mpiexec refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import microbench.nodefill
from microbench.__main__ import main as microbench_main
from microbench.nodefill import KERNELS, NodeFillError, fill, levels, stream_elements
from microbench.records import read_records
from tests.conftest import REPO, run_microbench


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
    assert proc.stdout.count("slowest x") == 2 * len(KERNELS)  # the straggler, per kernel
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


def test_a_run_shorter_than_one_call_still_times_one_call_per_kernel(tmp_path):
    """--seconds below one call's time: each kernel is timed once, not zero times (an empty
    sample list was a traceback and exit 1)."""
    out = tmp_path / "run"
    proc = run_microbench("nodefill", "--procs", "1", "--launches", "1", "--seconds", "1e-9",
                          "--out", str(out), timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [r for r in read_records(out / "nodefill.jsonl")[1] if r["type"] == "measurement"]
    assert sorted(r["name"] for r in records) == sorted(KERNELS)
    assert all(len(r["samples"]) >= 1 for r in records)


def _start(out: Path, seconds: str = "30") -> tuple[subprocess.Popen, list[int]]:
    """nodefill at 2 processes in a session of its own, once both workers run their own code
    (they ignore SIGINT from then on); the pids of its workers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "microbench", "nodefill", "--procs", "2", "--launches", "1",
         "--seconds", seconds, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        preexec_fn=_own_session,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [pid for pid in _children(proc.pid) if "spawn_main" in _cmdline(pid)]
        if len(workers) == 2 and all(map(_ignores_sigint, workers)):
            return proc, workers
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the workers did not start")


def _own_session() -> None:
    """A session of its own (a group to signal), with Ctrl-C's default action even where
    these tests run in a background job, which ignores SIGINT for every process it starts."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    ps = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in ps.stdout.split()]


def _ignores_sigint(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap an orphan)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(_running, pids))


def test_ctrl_c_stops_every_process_at_once_in_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: one line from the parent, no
    worker's KeyboardInterrupt traceback, and the workers stopped now, not waited for."""
    proc, workers = _start(tmp_path / "run")
    os.killpg(proc.pid, signal.SIGINT)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 4
    assert proc.returncode == 130
    assert "interrupted" in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert _gone_within(workers, 5)


def test_workers_stop_when_their_parent_is_killed_outright(tmp_path):
    """SIGKILL runs no cleanup in the parent; its workers notice and stop instead of timing
    their kernels (up to a day each) for nobody."""
    proc, workers = _start(tmp_path / "run")
    proc.kill()
    proc.communicate(timeout=60)
    try:
        assert _gone_within(workers, 5)
    finally:
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_run_that_measured_nothing_fails_in_one_line(tmp_path, no_inherited_rank, capsys,
                                                       monkeypatch):  # fmt: skip
    """The first launch failing leaves no record: exit 1 and one line, not exit 0 with "the
    levels before it are kept"."""

    def fails(k, seconds, elements):
        raise NodeFillError("cannot start 1 processes (no semaphores)")

    monkeypatch.setattr(microbench.nodefill, "fill", fails)
    assert microbench_main(["nodefill", "--procs", "1", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "failed: cannot start 1 processes" in err and "nothing was measured" in err
    assert err.count("\n") == 1


def test_appending_past_a_cut_off_line_warns_in_one_line(tmp_path):
    """A records file whose last line a killed writer cut off: the line is removed before
    appending, and the command says so in one line, not Python's file:line and source line."""
    out = tmp_path / "run"
    args = ("nodefill", "--procs", "1", "--launches", "1", "--seconds", "0.02", "--out", str(out))
    assert run_microbench(*args, timeout=120).returncode == 0
    path = out / "nodefill.jsonl"
    path.write_bytes(path.read_bytes()[:-20])
    proc = run_microbench(*args, "--append", timeout=120)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m microbench nodefill: warning: {path}: removed a truncated")
