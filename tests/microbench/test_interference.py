"""Interference: IMB-NBC's overlap formula, the comm thread, the GEMM loop, records of MPI runs."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from microbench.interference import METHODS, QUICK_POLICY
from microbench.measurement import Measurement
from microbench.overlap import CommThread, Point, calibrate_gemm_loop, overlap_pct
from microbench.records import read_records
from tests.conftest import run_microbench

PROG = "python -m microbench interference"
KiB, MiB = 1 << 10, 1 << 20


pytestmark = pytest.mark.usefixtures("no_inherited_rank")


# ---------------------------------------------------------------------------- the formula


@pytest.mark.parametrize(
    ("t_comm", "t_cpu", "t_both", "expected"),
    [
        (1.0, 4.0, 4.0, 100.0),  # perfect: the allreduce hid entirely behind the computation
        (4.0, 1.0, 4.0, 100.0),  # perfect, the other way round
        (1.0, 4.0, 5.0, 0.0),  # none: one after the other
        (2.0, 4.0, 5.0, 50.0),  # partial: 1 of the 2 comm seconds hidden
        (3.0, 3.0, 4.5, 50.0),  # partial, equal parts (IMB-NBC's calibrated case)
        (1.0, 4.0, 6.0, 0.0),  # clamp: slower than one after the other
        (1.0, 4.0, 3.5, 100.0),  # clamp: faster than the longer part alone (noise)
    ],
)
def test_overlap_follows_imb_nbc(t_comm, t_cpu, t_both, expected):
    assert overlap_pct(t_comm, t_cpu, t_both) == pytest.approx(expected)


def test_overlap_needs_positive_times():
    for times in ((0.0, 1.0, 1.0), (1.0, -1.0, 1.0), (1.0, 1.0, 0.0)):
        with pytest.raises(ValueError):
            overlap_pct(*times)


def test_point_derives_its_figures_from_medians():
    def m(name, values):
        return Measurement(values, benchmark="interference", name=name, params={"method": "x"})

    point = Point(
        comm_alone=m("comm_alone", [2.0, 2.0, 2.0]),
        compute_alone=m("compute_alone", [4.0, 4.0, 4.0]),
        both=m("both", [5.0, 5.0, 5.0]),
        compute_s=np.array([4.4, 4.4, 4.4]),
        comm_s=np.array([3.0, 3.0, 3.0]),
        comm_alone_thread_s=np.array([1.5, 1.5, 1.5]),
        compute={"kernel": "gemm_float32"},
    )
    assert point.overlap_pct == pytest.approx(50.0)
    assert point.overlap_uncertainty_pct == 0.0  # constant samples: zero-width intervals
    assert point.compute_slowdown == pytest.approx(1.1)
    assert point.comm_slowdown == pytest.approx(2.0)
    names = [(r["type"], r["name"]) for r in point.records()]
    assert names == [
        ("measurement", "comm_alone"),
        ("measurement", "compute_alone"),
        ("measurement", "both"),
        ("summary", "overlap"),
    ]
    nbc = dataclasses.replace(point, comm_s=None, comm_alone_thread_s=None)
    assert nbc.comm_slowdown is None and nbc.summary_record()["comm_slowdown"] is None


def test_paired_overlap_uses_the_rounds():
    def m(name, values):
        return Measurement(values, benchmark="interference", name=name)

    # Load drifts over the three rounds; each round hides half of its allreduce.
    point = Point(
        comm_alone=m("comm_alone", [1.0, 2.0, 3.0]),
        compute_alone=m("compute_alone", [2.0, 4.0, 6.0]),
        both=m("both", [2.5, 5.0, 7.5]),
        compute_s=np.array([2.0, 4.0, 6.0]),
        comm_s=None,
        comm_alone_thread_s=None,
        compute={},
    )
    assert point.overlap_pct == pytest.approx(50.0)
    assert point.overlap_uncertainty_pct > 100  # the medians alone cannot tell
    median, low, high = point.overlap_paired_pct()
    # hidden per round: 0.5, 1, 1.5 s over the shorter median (2 s); 3 samples: full range
    assert (median, low, high) == pytest.approx((50.0, 25.0, 75.0))
    record = point.summary_record()
    assert record["overlap_paired_pct"] == pytest.approx(50.0)
    assert record["overlap_paired_ci_pct"] == pytest.approx([25.0, 75.0])


# ---------------------------------------------------------------------------- the pieces


def test_comm_thread_runs_beside_the_main_thread_and_reports_errors():
    with CommThread(lambda: time.sleep(0.1)) as thread:
        start = time.perf_counter()
        thread.start()
        time.sleep(0.1)  # the "computation"
        elapsed_s = thread.wait()
        assert 0.09 < elapsed_s and time.perf_counter() - start < 0.19  # ran at the same time
        thread.start()
        assert thread.wait() >= 0.09  # and again
    assert not any(t.name == "microbench-comm" for t in threading.enumerate())

    def fail() -> None:
        raise RuntimeError("allreduce failed")

    with CommThread(fail) as thread:
        thread.start()
        with pytest.raises(RuntimeError, match="allreduce failed"):
            thread.wait()


def test_gemm_loop_is_calibrated_to_the_target():
    loop = calibrate_gemm_loop(0.004, n=64)
    assert loop.reps == max(1, round(0.004 / loop.gemm_s))
    assert loop.describe() == {
        "kernel": "gemm_float32",
        "gemm_n": 64,
        "gemm_reps": loop.reps,
        "gemm_s": loop.gemm_s,
    }
    loop()
    assert np.allclose(loop.c, loop.a @ loop.b, rtol=1e-4)
    with pytest.raises(ValueError):
        calibrate_gemm_loop(0.0)


# ---------------------------------------------------------------------------- MPI runs

QUICK_ARGS = ("--quick", "--bytes", "64KiB,1MiB", "--compute-ms", "2")


def _check_run(out, ranks: int) -> list[dict]:
    header, records = read_records(out / "interference.jsonl")
    assert header["machine"]["mpi"]["ranks"] == ranks
    assert header["run"]["settings"]["mpi_thread_level"] == "multiple"
    measurements = [r for r in records if r["type"] == "measurement"]
    summaries = [r for r in records if r["type"] == "summary"]
    points = [(m, b) for b in (64 * KiB, MiB) for m in METHODS]
    assert [(s["params"]["method"], s["params"]["bytes"]) for s in summaries] == points
    assert len(measurements) == 3 * len(points)
    for record in measurements:
        params = record["params"]
        assert set(params) == {
            "method",
            "op",
            "bytes",
            "ranks",
            "ranks_per_node",
            "compute_s_target",
            "threads",
        }
        assert params["op"] == "allreduce" and params["ranks"] == ranks
        assert params["compute_s_target"] == 0.002 and params["threads"] == 1
        assert record["benchmark"] == "interference"
        assert record["name"] in ("comm_alone", "compute_alone", "both")
        n = len(record["samples"])
        assert n >= QUICK_POLICY.min_samples and record["warmup_discarded"] == QUICK_POLICY.warmup
        assert all(s > 0 for s in record["samples"])
        thread = params["method"] == "thread"
        if record["name"] == "both":
            assert len(record["compute_samples"]) == n
        if record["name"] in ("both", "comm_alone"):
            assert (record["comm_samples"] is not None) == thread
            assert not thread or len(record["comm_samples"]) == n
        assert record["compute"]["gemm_reps"] >= 1
    for summary in summaries:
        assert 0.0 <= summary["overlap_pct"] <= 100.0
        assert summary["compute_slowdown"] > 0
        assert (summary["comm_slowdown"] is None) == (summary["params"]["method"] == "nbc")
        assert summary["overlap_uncertainty_pct"] >= 0
        low, high = summary["overlap_paired_ci_pct"]
        assert 0.0 <= low <= summary["overlap_paired_pct"] <= high <= 100.0
    return summaries


def test_two_ranks_both_methods(tmp_path):
    start = time.perf_counter()
    result = run_microbench(
        "interference", *QUICK_ARGS, "--out", str(tmp_path), ranks=2, timeout=60
    )
    elapsed_s = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert elapsed_s < 15.0
    _check_run(tmp_path, ranks=2)
    assert result.stdout.count("\nnbc ") == 2 and result.stdout.count("\nthread ") == 2


def test_one_rank_runs_the_trivial_allreduce(tmp_path):
    result = run_microbench(
        "interference", *QUICK_ARGS, "--quiet", "--out", str(tmp_path), ranks=1, timeout=60
    )
    assert result.returncode == 0, result.stderr
    _check_run(tmp_path, ranks=1)
    assert "local copy" in result.stdout


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--bytes", "1MiB,64KiB"], "out of order"),
        (["--bytes", "6"], "multiple of 4"),
        (["--compute-ms", "5,0"], "positive"),
        (["--compute-ms", "5,,20"], "empty item"),
        (["--methods", "nbc,rdma"], "unknown method 'rdma'"),
        (["--threads", "0"], "positive integer"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(args, problem):
    result = run_microbench("interference", *args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error:") and problem in lines[0]


def test_buffers_beyond_the_memory_give_one_line_and_status_2(tmp_path):
    result = run_microbench("interference", "--bytes", "4096GiB", "--out", str(tmp_path), ranks=1)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "exceed half of" in result.stderr
    assert not (tmp_path / "interference.jsonl").exists()
