"""pdlsim bench: every stage runs, records land per process count, bad input is refused."""

from __future__ import annotations

import pytest

from microbench.jitter import FULL_SAMPLES
from pdlsim.cli.bench_suite import BenchPlan, oversubscription_warnings, plan_stages
from tests.conftest import run_pdlsim


def test_the_plan_runs_compute_once_and_mpi_stages_per_process_count(tmp_path):
    stages = plan_stages(BenchPlan(out=tmp_path, procs=(1, 2, 4), threads=(1, 2)))
    names = [s.name for s in stages]
    assert names[:6] == ["kernels", "compute", "copies", "compression", "storage", "nodefill"]
    kernels = list(stages[0].command)
    assert kernels[kernels.index("kernels") + 1 :][:2] == ["--threads", "1,2"]
    assert "--model" not in kernels  # the sweep runs no workload
    assert [n for n in names if n.startswith("collectives")] == [
        "collectives-p1",
        "collectives-p2",
        "collectives-p4",
    ]
    assert names[-6:] == [  # the jitter's last moments at P >= 2 after everything else
        "interference-p4", "jitter-p2-mlp-m3", "jitter-p2-cnn-m3", "jitter-p4-mlp-m3",
        "jitter-p4-cnn-m3", "speed-5",
    ]  # fmt: skip
    assert "--quick" not in stages[0].command
    compute = list(stages[1].command)
    assert compute[compute.index("--batch") + 1] == "16,32,64"


def test_a_caller_skips_the_one_process_stages_it_reads_nothing_of(tmp_path):
    """validate's calibration: no compression on this machine; the node fill only where a
    validated configuration runs more ranks per node than the calibration measured."""
    from pdlsim.validate.calibrate import unread_stages

    modes = ((1, 1), (1, 2), (2, 1), (2, 2), (4, 1))
    assert unread_stages(modes, cores=2) == ("compression", "nodefill")  # 2x2, 4x1 refused
    assert unread_stages(modes, cores=16) == ("compression",)  # 4 ranks: the straggler term
    stages = plan_stages(BenchPlan(out=tmp_path, skip=unread_stages(modes, cores=2)))
    names = [s.name for s in stages]
    assert names[:4] == ["kernels", "compute", "copies", "storage"]
    assert "speed-1" in names and "collectives-p2" in names
    swept = plan_stages(BenchPlan(out=tmp_path, skip=("kernels", "storage")))
    assert [s.name for s in swept][:4] == ["compute", "copies", "compression", "nodefill"]


def test_the_jitter_step_of_every_model_at_every_process_count_in_one_file(tmp_path):
    """At one rank one run; at P >= 2 three labelled moments spread over the bench (two after
    the collectives, one after everything), each a third of one run's samples;
    --quick: one run at every P."""
    stages = plan_stages(BenchPlan(out=tmp_path, model="mlp,cnn", procs=(1, 2)))
    names = [s.name for s in stages]
    jitter = [s for s in stages if s.name.startswith("jitter")]
    assert [s.name for s in jitter] == [
        "jitter-p1-mlp", "jitter-p1-cnn", "jitter-p2-mlp-m1", "jitter-p2-cnn-m1",
        "jitter-p2-mlp-m2", "jitter-p2-cnn-m2", "jitter-p2-mlp-m3", "jitter-p2-cnn-m3",
    ]  # fmt: skip
    assert names.index("collectives-p2") < names.index("jitter-p2-mlp-m1")
    assert names.index("interference-p2") < names.index("jitter-p2-mlp-m3")
    for stage in jitter:
        command = list(stage.command)
        assert command[command.index("--batch") + 1] == "32"  # the middle batch
        first = stage.name.endswith(("p1-mlp", "p2-mlp-m1"))  # each file's first run creates it
        assert ("--append" in command) == (not first)
        if stage.ranks >= 2:
            k = int(stage.name[-1])
            assert command[command.index("--moment") + 1] == f"jitter {k} of 3"
            assert command[command.index("--samples") + 1] == str(FULL_SAMPLES // 3)
        else:
            assert "--moment" not in command and "--samples" not in command
    quick = plan_stages(BenchPlan(out=tmp_path, model="mlp,cnn", procs=(1, 2), quick=True))
    assert [s.name for s in quick if s.name.startswith("jitter")] == [
        "jitter-p1-mlp", "jitter-p1-cnn", "jitter-p2-mlp", "jitter-p2-cnn"
    ]  # fmt: skip
    assert not any("--moment" in s.command for s in quick if s.name.startswith("jitter"))


def test_oversubscribed_configurations_warn_once_each(tmp_path):
    stages = plan_stages(BenchPlan(out=tmp_path, procs=(1, 2, 4), threads=(2,)))
    warnings = oversubscription_warnings(stages, cores=2)
    assert warnings == [
        "2 ranks x 2 threads = 4 threads on 2 cores: oversubscribed, expect throughput to "
        "collapse (BLAS threads busy-wait)",
        "4 ranks x 1 threads = 4 threads on 2 cores: oversubscribed, expect throughput to "
        "collapse (BLAS threads busy-wait)",
        "4 ranks x 2 threads = 8 threads on 2 cores: oversubscribed, expect throughput to "
        "collapse (BLAS threads busy-wait)",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--procs", "1,x"], "expected a comma-separated list of positive integers"),
        (["--procs", "2,1"], "ascending order"),
        (["--threads", "0"], "at least 1"),
        (["--model", "nope"], "no workload preset or file named 'nope'"),
        (["--batch", "-1"], "every value must be at least 1"),
        (["--batch", "16,100000000000"], "mlp's activations alone take"),  # before any stage
        (["--layer-times", "--device", "cpu", "--batch", "100000000000"], "give a smaller --batch"),
        (["--skip", "collectives"], "'collectives' is not one of kernels, copies, compression"),
        (["--skip", "kernels,kernels"], "'kernels' is listed twice"),
        (["--layer-times", "--skip", "kernels"], "--skip is for the CPU microbenchmarks"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_status_2(args, message):
    result = run_pdlsim("bench", "--quick", *args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_output_that_is_a_file_or_holds_records_is_refused_untouched(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("keep")
    result = run_pdlsim("bench", "--quick", "--out", str(a_file), timeout=60)
    assert result.returncode == 2 and "is a file" in result.stderr
    assert a_file.read_text() == "keep"
    used = tmp_path / "used" / "ranks1"
    used.mkdir(parents=True)
    (used / "compute.jsonl").write_text("old records\n")
    result = run_pdlsim("bench", "--quick", "--out", str(tmp_path / "used"), timeout=60)
    assert result.returncode == 2 and "already holds records" in result.stderr
    assert (used / "compute.jsonl").read_text() == "old records\n"


def test_speed_checks_are_spread_over_the_calibration_in_one_file(tmp_path):
    """The same step, briefly, after the one-process stages, after each process count's jitter
    and at the end: moments minutes apart, each with its own label, all in ranks1/speed.jsonl."""
    stages = plan_stages(BenchPlan(out=tmp_path, model="mlp,cnn", procs=(1, 2)))
    names = [s.name for s in stages]
    speed = [i for i, n in enumerate(names) if n.startswith("speed")]
    assert [names[i - 1] for i in speed] == [
        "nodefill", "jitter-p1-cnn", "jitter-p2-cnn-m2", "jitter-p2-cnn-m3"
    ]  # fmt: skip
    moments = []
    for k, i in enumerate(speed):
        command = list(stages[i].command)
        assert command[command.index("--out") + 1] == str(tmp_path / "ranks1")
        assert ("--append" in command) == (k > 0)
        moments.append(command[command.index("--moment") + 1])
    assert moments == [f"check {k} of 4" for k in range(1, 5)]


def test_a_quick_bench_checks_the_speed_at_its_start_and_its_end(tmp_path):
    """Two moments, the first after the one-process stages and the last after everything."""
    stages = plan_stages(BenchPlan(out=tmp_path, model="mlp", procs=(1, 2), quick=True))
    names = [s.name for s in stages]
    assert [n for n in names if n.startswith("speed")] == ["speed-1", "speed-2"]
    assert names[-1] == "speed-2" and names[names.index("speed-1") - 1] == "nodefill"
    assert "check 2 of 2" in stages[-1].command
