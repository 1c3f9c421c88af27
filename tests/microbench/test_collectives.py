"""MPI collectives: sizes, the records of a quick run at 2 ranks, result checks, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from microbench.collectives import OPS, QUICK_POLICY, QUICK_SIZES, format_summary, summarize
from microbench.records import load_dataframe, read_records, stopped_sweep_points
from microbench.sampling import STOP_REASONS
from microbench.sizes import SizeError, format_bytes, parse_sizes
from tests.conftest import REPO, mpiexec, run_microbench, run_mpi_python

KiB, MiB = 1 << 10, 1 << 20
PROG = "python -m microbench collectives"


pytestmark = pytest.mark.usefixtures("no_inherited_rank")


# ---------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8:64MiB", tuple(8 << k for k in range(24))),
        ("8:64MiB:4", tuple(8 << 2 * k for k in range(12)) + (64 * MiB,)),
        ("1KiB,64KiB,1MiB", (KiB, 64 * KiB, MiB)),
        ("8, 16:64 ,1kib", (8, 16, 32, 64, KiB)),
        ("4096B:16KiB", (4 * KiB, 8 * KiB, 16 * KiB)),
        ("1GiB", (1 << 30,)),
        ("64", (64,)),
    ],
)
def test_size_lists_parse(text, expected):
    assert parse_sizes(text, multiple_of=4) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("64KiB,8", "out of order"),
        ("8,8", "out of order"),
        ("1MiB:8", "out of order"),
        ("1KB", "unknown unit 'KB'"),
        ("abc", "bad size"),
        ("8:1KiB:1", "factor"),
        ("8:1KiB:x", "factor"),
        ("8:16:32:64", "LOW:HIGH"),
        ("", "empty"),
        ("8,,16", "empty item"),
        ("6", "multiple of 4"),
        ("-8", "bad size"),
        ("8:1KiB:\u00b2", "factor"),  # a digit to str.isdigit, no number to int
    ],
)
def test_bad_size_lists_say_what_is_wrong_in_one_line(text, problem):
    with pytest.raises(SizeError, match=problem) as caught:
        parse_sizes(text, multiple_of=4, minimum=4)
    assert "\n" not in str(caught.value)


def test_format_bytes():
    assert [format_bytes(n) for n in (8, KiB, 64 * MiB, 3 * MiB // 2, 1 << 30)] == [
        "8 B",
        "1 KiB",
        "64 MiB",
        "1.5 MiB",
        "1 GiB",
    ]


# ---------------------------------------------------------------------------- a quick run


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "bench"
    start = time.perf_counter()
    result = run_microbench("collectives", "--quick", "--out", str(out), ranks=2)
    return result, out, time.perf_counter() - start


def test_quick_run_at_two_ranks_writes_every_point(quick_run):
    result, out, elapsed_s = quick_run
    assert result.returncode == 0, result.stderr
    assert elapsed_s < 15.0
    header, records = read_records(out / "collectives.jsonl")
    assert header["machine"]["mpi"]["ranks"] == 2
    assert header["run"]["settings"]["policy"] == QUICK_POLICY.to_dict()
    assert header["run"]["settings"]["mpi_thread_level"] == "multiple"  # mpi4py's default

    by_op: dict[str, list[dict]] = {}
    for record in records:
        assert record["type"] == "measurement" and record["benchmark"] == "collectives"
        by_op.setdefault(record["name"], []).append(record)
    assert list(by_op) == list(OPS)  # every op, in the default order
    for op, points in by_op.items():
        sizes = [p["params"]["bytes"] for p in points]
        assert sizes == ([0] if op == "barrier" else list(QUICK_SIZES))  # ascending
        for point in points:
            params = point["params"]
            assert params["op"] == op and params["ranks"] == 2
            assert params["ranks_per_node"] == 2 and params["algorithm"] is None
            assert params["in_place"] is (op == "allreduce")  # as training loops call it
            wide = op in ("allgather", "reduce_scatter")
            assert params["total_bytes"] == params["bytes"] * (2 if wide else 1)
            assert point["stop_reason"] in STOP_REASONS
            assert len(point["samples"]) == point["summary"]["n"] >= QUICK_POLICY.min_samples
            assert all(s > 0 for s in point["samples"])
            assert point["warmup_discarded"] >= 1 and point["unit"] == "s"
            assert point["policy"]["max_samples"] >= len(point["samples"])

    for op in OPS:
        assert f"\n{op} " in result.stdout  # the progress lines and the summary
    assert result.stdout.count("allreduce") >= len(QUICK_SIZES) + 1
    frame = load_dataframe(out, type="measurement")
    assert len(frame) == len(records) and (frame["machine.mpi.ranks"] == 2).all()


def test_summary_of_the_quick_run(quick_run):
    _, out, _ = quick_run
    summaries = {s.op: s for s in summarize(read_records(out / "collectives.jsonl")[1])}
    assert list(summaries) == list(OPS)
    allreduce = summaries["allreduce"]
    assert (allreduce.smallest_bytes, allreduce.largest_bytes) == (QUICK_SIZES[0], QUICK_SIZES[-1])
    assert allreduce.bandwidth_bytes_per_s == pytest.approx(MiB / allreduce.largest_time_s)
    assert allreduce.bus_bandwidth_bytes_per_s == pytest.approx(allreduce.bandwidth_bytes_per_s)
    assert summaries["barrier"].bandwidth_bytes_per_s is None


def test_bus_bandwidth_follows_nccl_tests():
    def record(op, nbytes, total, median, ranks=4):
        params = {"op": op, "bytes": nbytes, "total_bytes": total, "ranks": ranks}
        return {"type": "measurement", "benchmark": "collectives", "name": op, "params": params}

    records = [
        {**record("allreduce", 8, 8, 0), "samples": [2e-6, 1e-6, 3e-6]},
        {**record("allreduce", MiB, MiB, 0), "samples": [1e-3]},
        {**record("allgather", MiB, 4 * MiB, 0), "samples": [2e-3]},
        {**record("allreduce", MiB, MiB, 0, ranks=1), "samples": [1e-4]},
        {"type": "skipped", "benchmark": "collectives", "params": {}},
    ]
    (single, allreduce, allgather) = summarize(records)
    assert (allreduce.op, allreduce.ranks, allreduce.latency_s) == ("allreduce", 4, 2e-6)
    assert allreduce.bandwidth_bytes_per_s == pytest.approx(MiB / 1e-3)
    assert allreduce.bus_bandwidth_bytes_per_s == pytest.approx(1.5 * MiB / 1e-3)  # 2(p-1)/p
    assert allgather.bandwidth_bytes_per_s == pytest.approx(4 * MiB / 2e-3)
    assert allgather.bus_bandwidth_bytes_per_s == pytest.approx(0.75 * 4 * MiB / 2e-3)
    assert single.ranks == 1 and single.bus_bandwidth_bytes_per_s is None
    assert "allgather" in format_summary([allreduce, allgather])


# ---------------------------------------------------------------------------- result checks

CHECKS = textwrap.dedent(
    """
    import dataclasses, json
    from mpi4py import MPI
    from microbench.collectives import OPS, CollectiveCheckError, _checked_once, make_operation

    comm = MPI.COMM_WORLD
    ok = {}
    for op in OPS:
        for nbytes in (8, 4096, 1 << 20):
            operation = make_operation(op, nbytes, comm)
            before = operation.check() if op not in ("barrier", "bcast") or comm.rank else None
            operation.call()
            ok[f"{op}:{nbytes}"] = (before, operation.check())
    # In place, as training calls it: one buffer, zeroed once the checked call passed, so the
    # sums of the repetitions that follow stay finite.
    operation = make_operation("allreduce", 4096, comm)
    repetition = _checked_once(operation, comm)
    for _ in range(300):
        repetition()
    in_place = [len(operation.buffers), bool((operation.buffers[0] == 0.0).all())]
    # A wrong result on rank 1 only must fail on every rank, at the first repetition.
    operation = make_operation("allreduce", 64, comm)
    wrong = dataclasses.replace(operation, check=lambda: comm.rank != 1)
    try:
        _checked_once(wrong, comm)()
        raised = None
    except CollectiveCheckError as e:
        raised = str(e)
    everyone = comm.gather((ok, raised, in_place), root=0)
    if comm.rank == 0:
        print(json.dumps(everyone))
    """
)


def test_each_collective_checks_its_result_and_a_wrong_one_fails_everywhere():
    result = run_mpi_python(CHECKS)
    assert result.returncode == 0, result.stderr
    for ok, raised, in_place in json.loads(result.stdout):
        for point, (before, after) in ok.items():
            assert after is True, point
            assert before in (False, None) or point.startswith(("barrier", "pingpong")), point
        assert "allreduce at 64 B returned wrong data" in raised
        assert in_place == [1, True]


# ---------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--sizes", "64KiB,8"], "out of order"),
        (["--sizes", "8:1KB"], "unknown unit"),
        (["--sizes", "6"], "multiple of 4"),
        (["--ops", "allreduce,alltoall"], "unknown collective 'alltoall'"),
        (["--target", "-0.1"], "positive"),
        (["--time-cap", "soon"], "not a number"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(args, problem):
    result = run_microbench("collectives", *args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error:") and problem in lines[0]
    assert result.stdout == ""


def test_bad_arguments_under_mpiexec_are_reported_once(tmp_path):
    result = run_microbench("collectives", "--sizes", "1MiB:8", ranks=2)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "out of order" in result.stderr

    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    result = run_microbench("collectives", "--quick", "--out", str(a_file / "run"), ranks=2)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"{PROG}: error: --out {a_file / 'run'}: {a_file} is a file, not a directory"
    ]


def test_one_rank_skips_the_pingpong_and_append_adds_to_the_file(tmp_path):
    args = ["collectives", "--quick", "--ops", "pingpong,barrier", "--sizes", "8", "--quiet"]
    first = run_microbench(*args, "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    again = run_microbench(*args, "--out", str(tmp_path))
    assert again.returncode == 2 and "--append" in again.stderr
    appended = run_microbench(*args, "--out", str(tmp_path), "--append")
    assert appended.returncode == 0, appended.stderr

    header, records = read_records(tmp_path / "collectives.jsonl")
    assert header["machine"]["mpi"]["ranks"] == 1
    assert [r["type"] for r in records] == ["skipped", "measurement"] * 2
    assert records[0]["reason"] == "needs at least 2 ranks"
    assert records[1]["params"] == {
        "op": "barrier",
        "bytes": 0,
        "total_bytes": 0,
        "ranks": 1,
        "ranks_per_node": 1,
        "algorithm": None,
        "in_place": False,
    }


def test_help_names_the_subcommand():
    result = run_microbench("--help")
    assert result.returncode == 0 and "collectives" in result.stdout
    assert run_microbench().returncode == 2  # a subcommand is required


def test_an_interrupted_run_keeps_every_finished_point(tmp_path):
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "microbench", "collectives"]
    command += ["--ops", "allreduce", "--sizes", "8:64MiB", "--out", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    path = tmp_path / "collectives.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and len(path.read_bytes().splitlines()) >= 5:  # header, start, 3
            break
        time.sleep(0.05)
    process.send_signal(2)  # SIGINT, as Ctrl-C; mpiexec forwards it to the ranks
    try:
        process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("the benchmark did not stop within 30 s of SIGINT")
    assert process.returncode != 0
    _, records = read_records(path)  # no truncated or corrupt line
    assert len(records) >= 3
    assert [r["params"]["bytes"] for r in records] == [8 << k for k in range(len(records))]
    assert stopped_sweep_points(path) == len(records)  # its start, and no end: refused later


def test_microbench_runs_without_pdlsim_calibration_scipy_or_pandas(tmp_path):
    """It is copied to clusters on its own: its command line must not need the rest."""
    code = (
        "import sys\n"
        "for name in ('pdlsim', 'calibration', 'scipy', 'pandas'):\n"
        "    sys.modules[name] = None  # any import of these now fails\n"
        "sys.argv = ['microbench', 'collectives', '--quick', '--ops', 'barrier', '--quiet',\n"
        f"            '--thread-level', 'single', '--out', {str(tmp_path)!r}]\n"
        "from microbench.__main__ import main\n"
        "sys.exit(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    header, records = read_records(tmp_path / "collectives.jsonl")
    assert header["run"]["settings"]["mpi_thread_level"] == "single"
    assert [r["name"] for r in records] == ["barrier"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["collectives", "--sizes", "1KiB:1MiB:\u00b2"], "the factor must be an integer"),
        (["interference", "--threads", "\u00b2"], "must be a positive integer, got"),
        (["copies", "--gpu", "\u00b2"], "expected a GPU index (0, 1, ...), got"),
    ],
)
def test_a_superscript_digit_is_named_as_no_number(argv, said, tmp_path):
    """'²' is a digit to str.isdigit and no number to int: every integer flag of the
    microbenchmarks checks with isdecimal, so it gets the flag's own message (not argparse's
    bare 'invalid value' from int's ValueError)."""
    from tests.conftest import run_microbench

    result = run_microbench(*argv, "--out", str(tmp_path / "out"), timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and said in result.stderr


def test_every_quick_size_is_sampled_under_the_whole_quick_policy():
    """The fewer samples of large messages start above --quick's largest size, the point its
    bandwidths rest on (a tenth of the samples left that point 10, and noisy)."""
    from microbench.collectives import LARGE_MESSAGE_BYTES, QUICK_SIZES

    assert max(QUICK_SIZES) < LARGE_MESSAGE_BYTES
