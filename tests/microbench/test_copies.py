"""Host <-> device copies: skipped in one line without a GPU; bad arguments; the code path and its
records on a numpy stand-in for CuPy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from microbench.copies import QUICK_POLICY, format_summary, run_copies, summarize
from microbench.gpu import find_gpu
from microbench.records import RecordWriter, read_records
from microbench.sampling import STOP_REASONS
from tests import fake_cupy
from tests.conftest import REPO

HAS_GPU = find_gpu()[0] is not None
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def microbench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    command = [sys.executable, "-m", "microbench", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the no-GPU path cannot be exercised")
def test_without_a_gpu_copies_are_skipped_in_one_line(tmp_path):
    proc = microbench("copies", "--quick", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no GPU: host<->device copies skipped")
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--sizes", "1MiB,4KiB"], "out of order"),
        (["--sizes", "4KB"], "unknown unit"),
        (["--gpu", "-1"], "GPU index"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, args, problem):
    proc = microbench("copies", *args, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and problem in proc.stderr, proc.stderr


def test_out_that_is_a_file_gets_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    proc = microbench("copies", "--out", str(tmp_path / "file"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is a file; give a directory" in proc.stderr


def test_records_on_a_stand_in_for_cupy(monkeypatch, tmp_path):
    """Control flow, result checks and records of the copy path, on numpy posing as CuPy."""
    fake_cupy.install(monkeypatch)
    gpu, why = find_gpu()
    assert gpu is not None, why
    sizes = (4 << 10, 1 << 20)
    with RecordWriter(tmp_path / "copies.jsonl", {}) as writer:
        results = run_copies(gpu, sizes, QUICK_POLICY, writer)
    _, records = read_records(tmp_path / "copies.jsonl")
    assert len(records) == len(results) == 2 * 2 * len(sizes)
    keys = [
        (r["params"]["direction"], r["params"]["pinned"], r["params"]["bytes"]) for r in records
    ]
    assert keys == [(d, p, n) for n in sizes for d in ("h2d", "d2h") for p in (True, False)]
    for r in records:
        assert r["benchmark"] == "copies" and r["name"] == r["params"]["direction"]
        assert r["params"]["device"] == "gpu" and r["params"]["gpu"] == 0
        assert r["stop_reason"] in STOP_REASONS and len(r["samples"]) >= QUICK_POLICY.min_samples
    summaries = summarize(records)
    assert [(s.direction, s.pinned) for s in summaries] == [
        ("h2d", True),
        ("h2d", False),
        ("d2h", True),
        ("d2h", False),
    ]
    assert all(s.smallest_bytes == 4 << 10 and s.largest_bytes == 1 << 20 for s in summaries)
    assert "pageable" in format_summary(summaries)
