"""Jitter: sampling (warm-up never sampled), the summary statistics, records of real MPI runs."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from microbench.jitter import (
    QUICK_WARMUP,
    Distribution,
    JitterSummary,
    format_summary,
    jitter_records,
    make_step_pair,
    make_training_step,
    sample_alternating,
    sample_interleaved,
    sample_steps,
)
from microbench.records import read_records
from microbench.threads import available_cores
from microbench.workload import PRESETS, load_workload
from tests.conftest import run_microbench

PROG = "python -m microbench jitter"


pytestmark = pytest.mark.usefixtures("no_inherited_rank")


# ---------------------------------------------------------------------------- statistics


def test_distribution_of_known_samples():
    d = Distribution.of(np.arange(1.0, 101.0))  # 1..100
    assert (d.n, d.median_s, d.max_s) == (100, 50.5, 100.0)
    assert d.p90_s == pytest.approx(90.1) and d.p99_s == pytest.approx(99.01)
    assert d.max_over_median == pytest.approx(100 / 50.5)
    with pytest.raises(ValueError):
        Distribution.of([])


def test_summary_of_a_synthetic_table():
    table = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 10.0]])  # 2 ranks x 4 samples
    s = JitterSummary.from_samples(table)
    assert (s.ranks, s.samples_per_rank) == (2, 4)
    assert s.per_rank.median_s == 2.0 and s.per_rank.max_s == 10.0  # pooled over ranks
    assert s.per_rank.max_over_median == 5.0
    assert s.max_over_ranks.median_s == 2.5  # median of [2, 2, 3, 10]
    assert s.max_over_ranks.max_over_median == 4.0
    # max - mean per sample: 0.5, 0, 0.5, 3 -> mean 1.0
    assert s.expected_wait_s == pytest.approx(1.0)
    assert s.expected_wait_rel == pytest.approx(0.5)
    text = format_summary(s, "mlp", 32, 1)
    assert "max over ranks" in text and "expected wait" in text and "50.0%" in text


def test_one_rank_never_waits_and_identical_ranks_neither():
    rng = np.random.default_rng(1)
    one = JitterSummary.from_samples(rng.lognormal(0, 0.3, (1, 500)))
    assert one.expected_wait_s == 0.0 and one.max_over_ranks == one.per_rank
    row = rng.lognormal(0, 0.3, 500)
    same = JitterSummary.from_samples(np.vstack([row, row, row]))
    assert same.expected_wait_s == pytest.approx(0.0, abs=1e-12)


def test_the_slowest_rank_sets_the_pace_more_with_more_ranks():
    rng = np.random.default_rng(2)
    table = rng.lognormal(0, 0.2, (64, 400))
    few, many = JitterSummary.from_samples(table[:2]), JitterSummary.from_samples(table)
    assert many.max_over_ranks.median_s > few.max_over_ranks.median_s > few.per_rank.median_s
    assert many.expected_wait_s > few.expected_wait_s > 0


# ---------------------------------------------------------------------------- sampling


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_warmup_calls_are_never_sampled():
    clock, calls = FakeClock(), []

    def step() -> None:
        calls.append(len(calls))
        clock.now += 100.0 if len(calls) <= 3 else float(len(calls))  # warm-up is slow

    samples = sample_steps(step, samples=5, warmup=3, clock=clock)
    assert len(calls) == 8
    assert samples.tolist() == [4.0, 5.0, 6.0, 7.0, 8.0]
    with pytest.raises(ValueError):
        sample_steps(step, samples=0, warmup=1)


def test_alternating_samples_take_one_call_of_each_step_in_turn_after_their_warmups():
    """Step a costs 1 s, step b 10 s (after slow warm-ups of 100 s): a, a, b, b untimed, then
    a, b, a, b, a, b timed; each step's seconds are its own."""
    clock, calls = FakeClock(), []

    def make(name, seconds):
        def step() -> None:
            calls.append(name)
            warm = calls.count(name) <= 2
            clock.now += 100.0 if warm else seconds

        return step

    a, b = sample_alternating((make("a", 1.0), make("b", 10.0)), 3, 2, clock=clock)
    assert "".join(calls) == "aabb" + "ab" * 3
    assert a.tolist() == [1.0] * 3 and b.tolist() == [10.0] * 3


def test_the_gather_before_each_step_runs_untimed_before_every_call():
    """``before`` (the mini-batch gather, 1000 s here) runs right before every call of a step,
    warm-ups and re-warming calls included, and never inside a sample."""
    clock, calls = FakeClock(), []

    def gather() -> None:
        calls.append("g")
        clock.now += 1000.0

    def make(name, seconds):
        def step() -> None:
            calls.append(name)
            clock.now += seconds

        return step

    samples = sample_steps(make("s", 2.0), samples=3, warmup=1, clock=clock, before=gather)
    assert "".join(calls) == "gs" * 4 and samples.tolist() == [2.0] * 3
    calls.clear()
    steps = (make("a", 1.0), make("b", 10.0))
    a, b = sample_alternating(steps, 3, 1, block=2, clock=clock, before=gather)
    assert "".join(calls) == "gagb" + ("ga" * 3 + "gb" * 3) + ("ga" * 2 + "gb" * 2)
    assert a.tolist() == [1.0] * 3 and b.tolist() == [10.0] * 3


def test_alternating_in_blocks_rewarms_each_step_then_times_a_run_of_it():
    """Blocks of 2, 5 samples: per round each step once untimed, then 2 timed (the last round
    1); a call right after the other step costs 100 s, the timed ones their own seconds."""
    clock, calls = FakeClock(), []

    def make(name, seconds):
        def step() -> None:
            cold = bool(calls) and calls[-1] != name
            calls.append(name)
            clock.now += 100.0 if cold else seconds

        return step

    a, b = sample_alternating((make("a", 1.0), make("b", 10.0)), 5, 0, block=2, clock=clock)
    assert "".join(calls) == "aaabbb" * 2 + "aabb"
    assert a.tolist() == [1.0] * 5 and b.tolist() == [10.0] * 5
    with pytest.raises(ValueError, match="block >= 1"):
        sample_alternating((make("a", 1.0),), 3, 0, block=0, clock=clock)


def test_each_step_settles_for_its_own_number_of_untimed_calls_before_a_block():
    """settle (1, 3): step a has one untimed call before each of its blocks, step b three (a
    forward loop takes longer to reach its speed). A call right after the other step costs
    100 s and a step's second call in a row still 50 s: a's first timed call of each block
    shows it, b's never do."""
    clock, calls = FakeClock(), []

    def make(name, seconds):
        def step() -> None:
            run = 0
            for c in reversed(calls):
                if c != name:
                    break
                run += 1
            calls.append(name)
            clock.now += 100.0 if run == 0 and len(calls) > 1 else 50.0 if run == 1 else seconds

        return step

    steps = (make("a", 1.0), make("b", 10.0))
    a, b = sample_alternating(steps, 4, 0, block=2, settle=(1, 3), clock=clock)
    assert "".join(calls) == ("a" + "aa" + "bbb" + "bb") * 2
    assert b.tolist() == [10.0] * 4 and a.tolist() == [50.0, 1.0, 50.0, 1.0]
    for bad in ((1,), (1, 0)):
        with pytest.raises(ValueError, match="settle >= 1"):
            sample_alternating(steps, 4, 0, block=2, settle=bad, clock=clock)


def test_the_forward_only_step_is_a_share_of_the_training_step_on_the_same_network():
    step, forward_only = make_step_pair(load_workload("mlp"), batch=16)
    full, forward = sample_alternating((step, forward_only), 9, 2)
    assert 0.0 < np.median(forward) < np.median(full)


def test_the_real_training_step_can_be_sampled():
    workload = load_workload("mlp")
    step = make_training_step(workload, batch=8)
    step()
    samples = sample_steps(step, samples=3, warmup=1)
    assert samples.shape == (3,) and (samples > 0).all()


def test_records_hold_every_rank_and_the_max():
    table = np.array([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]])
    params = {"model": "mlp", "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
    records = jitter_records(table, params, warmup=4, hosts=["a", "b"], clock="perf_counter")
    assert [r["params"]["rank"] for r in records] == [0, 1, None]
    assert [r["params"]["statistic"] for r in records] == ["per_rank"] * 2 + ["max_over_ranks"]
    assert records[2]["samples"] == [3.0, 5.0, 2.5]
    assert [r["host"] for r in records] == ["a", "b", None]
    assert all(r["warmup_discarded"] == 4 and r["benchmark"] == "jitter" for r in records)


# ---------------------------------------------------------------------------- MPI runs


def _check_run(out, ranks: int, samples: int, warmup: int, model: str = "mlp") -> dict:
    header, records = read_records(out / "jitter.jsonl")
    assert header["machine"]["mpi"]["ranks"] == ranks
    settings = header["run"]["settings"]
    assert (settings["samples"], settings["warmup"]) == (samples, warmup)
    assert settings["oversubscribed"] is False  # 1 thread per rank, at most 2 ranks, 2+ cores
    jitter = [r for r in records if r["type"] == "measurement" and r["benchmark"] == "jitter"]
    per_rank = [r for r in jitter if r["params"]["statistic"] == "per_rank"]
    (top,) = [r for r in jitter if r["params"]["statistic"] == "max_over_ranks"]
    alone = [r for r in jitter if r["params"]["statistic"] == "alone"]
    assert [r["params"]["rank"] for r in per_rank] == list(range(ranks))
    # more than one rank: rank 0 also alone (the co-location baseline), as many samples
    assert [r["params"]["rank"] for r in alone] == ([0] if ranks > 1 else [])
    assert top["params"] == {
        "model": model,
        "batch": 32,
        "threads": 1,
        "ranks": ranks,
        "ranks_per_node": ranks,
        "rank": None,
        "statistic": "max_over_ranks",
    }
    for record in jitter:
        assert len(record["samples"]) == samples and record["warmup_discarded"] == warmup
        assert record["stop_reason"] == "max_samples" and record["unit"] == "s"
    table = np.array([r["samples"] for r in per_rank])
    assert (table > 0).all()
    assert np.array_equal(np.array(top["samples"]), table.max(axis=0))  # >= every rank's
    # numba compilation and first touch stay in the warm-up: no sample near a compile time
    assert table.max() < 0.5
    (timer,) = [r for r in records if r["benchmark"] == "timer"]
    assert timer["name"] == "overhead" and 0 < timer["summary"]["median"] < 1e-4
    (summary,) = [r for r in records if r["type"] == "summary"]
    assert summary["ranks"] == ranks and summary["samples_per_rank"] == samples
    return summary


def test_two_ranks(tmp_path):
    start = time.perf_counter()
    result = run_microbench(
        "jitter", "--quick", "--samples", "30", "--out", str(tmp_path), ranks=2, timeout=60
    )
    elapsed_s = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert elapsed_s < 15.0
    summary = _check_run(tmp_path, ranks=2, samples=30, warmup=QUICK_WARMUP)
    assert summary["max_over_ranks"]["median_s"] >= summary["per_rank"]["median_s"]
    assert summary["expected_wait_s"] >= 0
    assert "max over ranks" in result.stdout and "expected wait" in result.stdout


def test_one_rank_and_a_workload_file(tmp_path):
    model = tmp_path / "small.json"
    model.write_text(json.dumps({**PRESETS["mlp"], "name": "small"}))
    args = ["--model", str(model), "--samples", "10", "--warmup", "2", "--out", str(tmp_path)]
    result = run_microbench("jitter", *args, ranks=1, timeout=60)
    assert result.returncode == 0, result.stderr
    summary = _check_run(tmp_path, ranks=1, samples=10, warmup=2, model="small")
    assert summary["expected_wait_s"] == 0.0


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--model", "resnet"], "no workload preset or file named 'resnet'"),
        (["--batch", "0"], "must be >= 1"),
        (["--samples", "many"], "not an integer"),
        (["--threads", "-1"], "must be >= 1"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(args, problem):
    result = run_microbench("jitter", *args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error:") and problem in lines[0]


def test_an_output_directory_that_is_a_file_gives_one_line_and_status_2(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    result = run_microbench("jitter", "--quick", "--out", str(a_file / "run"), ranks=2)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"{PROG}: error: --out {a_file / 'run'}: {a_file} is a file, not a directory"
    ]


def test_more_threads_than_cores_warns_once_and_is_recorded(tmp_path):
    threads = str(available_cores())  # 2 ranks x all cores each: always oversubscribed
    args = ["--threads", threads, "--samples", "5", "--warmup", "1", "--out", str(tmp_path)]
    result = run_microbench("jitter", *args, ranks=2, timeout=60)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "oversubscribed" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ")
    header, records = read_records(tmp_path / "jitter.jsonl")
    assert header["run"]["settings"]["oversubscribed"] is True
    jitter = [r for r in records if r["type"] == "measurement" and r["benchmark"] == "jitter"]
    assert len(jitter) == 4 and all(r["oversubscribed"] for r in jitter)  # 2 ranks, max, alone


def test_alone_blocks_alternate_with_together_blocks():
    """sample_interleaved: rank 0's alone samples and the together samples come in alternating
    blocks; a fake communicator with one rank stands in for MPI."""

    class OneRank:
        def Get_rank(self):
            return 0

        def Barrier(self):
            calls.append("barrier")

        def Ibarrier(self):
            class Done:
                def Wait(self):
                    return None

            return Done()

    calls: list[str] = []

    def step():
        calls.append("step")

    together, alone = sample_interleaved(step, samples=5, warmup=1, comm=OneRank(), block=2)
    assert len(together) == 5 and len(alone) == 5
    # warm-up (barrier+step), then blocks of 2 together (barrier+step each), 2 alone (one barrier)
    expected = ["barrier", "step"]
    for n in (2, 2, 1):
        expected += ["barrier", "step"] * n + ["barrier"] + ["step"] * n
    assert calls == expected
