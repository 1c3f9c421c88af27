"""Bad command-line values, flag combinations and API arguments: each class is refused where it
originates (the shared parser or check), in one line, before any work.

* an option given an empty text is refused, not taken as "not given" (the default);
* counts that would keep the simulator, a sweep or a training run busy for hours are refused
  at once, not after minutes;
* the Python API refuses what the flag parsers refuse (power figures, empty names, a missing
  trace folder, a repeated sweep value, an unknown protocol), as the project's UserError;
* ``python -m microbench`` refuses a repeated flag and a thread count past the machine, as
  ``pdlsim`` does.
"""

from __future__ import annotations

import time

import pytest

import pdlsim
from microbench.__main__ import main as microbench_main
from microbench.argtypes import ArgumentTypeError
from microbench.errors import UserError
from pdlsim.cli.knobs import parse_vary, vary
from pdlsim.cli.sweep import sweep
from pdlsim.prediction.checks import MAX_PREDICTIONS, check_bounds
from pdlsim.prediction.config import PredictConfig
from pdlsim.sim import Cluster
from tests.conftest import pdlsim_here


def _refused(result, *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["predict", "--nodes", "2", "--gpus", "8", "--network", ""],
        ["predict", "--nodes", "2", "--gpus", "8", "--node", " "],
        ["predict", "--nodes", "2", "--gpus", "8", "--gpu-preset", ""],
        ["collective", "allreduce", "--network", ""],
        ["collective", "allreduce", "--node", ""],
    ],
)
def test_an_empty_option_is_refused_not_taken_as_its_default(args):
    flag = next(a for a in args if a.startswith("--") and args[args.index(a) + 1].strip() == "")
    _refused(pdlsim_here(*args), flag, "empty")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--iterations", "100001"], "--iterations must be at most 100,000"),
        (["--samples", "10001"], "--samples must be at most 10,000"),
        (["--gpus", "8", "--grad-accum", "100000000"], "--grad-accum must be at most"),
    ],
)
def test_a_simulation_that_would_run_for_hours_is_refused_at_once(args, message):
    start = time.monotonic()
    _refused(pdlsim_here("predict", "--nodes", "2", *args), message)
    assert time.monotonic() - start < 30


def test_a_sweep_of_more_configurations_than_a_day_holds_is_refused_before_the_first():
    base = PredictConfig(iterations=2, samples=2)
    with pytest.raises(UserError, match=f"give at most {MAX_PREDICTIONS:,}"):
        sweep(base, tuple(range(1, MAX_PREDICTIONS + 2)), (1,), (32,))


def test_a_bad_varied_value_is_refused_before_the_first_prediction():
    calls = []
    knobs = [parse_vary("bucket-mb=1,5"), parse_vary("sync-every=1,1000000")]
    with pytest.raises(UserError, match="--vary sync-every=1000000: --sync-every must be at most"):
        vary(PredictConfig(), knobs, predict=lambda cfg: calls.append(cfg))
    assert calls == []  # nothing predicted for a sweep that cannot finish


def test_one_size_and_a_range_of_sizes_together_are_refused():
    _refused(pdlsim_here("collective", "allreduce", "--size", "8G", "-b", "1K"), "--size", "-b")
    _refused(pdlsim_here("collective", "allreduce", "--size", "8G", "-f", "2"), "--size", "-f")


@pytest.mark.parametrize("models", ["cnn,cnn", "mlp, mlp", "mlp,,cnn", "cnn,"])
def test_a_list_of_names_with_a_repeat_or_a_gap_is_a_usage_error(models):
    _refused(pdlsim_here("bench", "--model", models), "--model")
    _refused(pdlsim_here("validate", "--models", models), "--models")


@pytest.mark.parametrize("corrections", ["pace,", "pace,pace", "magic"])
def test_a_bad_correction_list_is_the_one_line_before_any_warning(tmp_path, corrections):
    """More cores per node than the profile's machine is a warning; a refused list of
    corrections must still be the only line, in predict and in sweep alike."""
    many = ["--procs-per-node", "4", "--corrections", corrections]
    _refused(pdlsim_here("predict", "--nodes", "1", *many), "correction")
    _refused(pdlsim_here("sweep", "--nodes", "1,2", *many, "--out", str(tmp_path)), "correction")


def test_training_for_more_epochs_than_anyone_runs_is_refused_before_its_folder(tmp_path):
    out = tmp_path / "run"
    args = ["--epochs", "1" + "0" * 20, "--max-steps", "3", "--samples", "16", "--batch", "4"]
    _refused(pdlsim_here("train", *args, "--out", str(out)), "--epochs must be at most")
    assert not out.exists()


# --- the Python API ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["network", "node", "gpu_preset", "algorithm", "hardware"])
def test_an_empty_name_in_the_api_is_refused(name):
    with pytest.raises(ArgumentTypeError, match=f"^{name} is empty"):
        PredictConfig(gpus=8, **{name: ""})


def test_an_empty_name_or_an_unknown_protocol_of_a_collective_is_refused():
    with pytest.raises(UserError, match="node is empty"):
        pdlsim.collective(node="")
    with pytest.raises(UserError, match="unknown protocol 'LL'"):
        pdlsim.collective(protocol="LL")  # was a KeyError from the tuning table
    with pytest.raises(UserError, match="give at most"):
        pdlsim.collective(sizes=range(1, 20_000))


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"cpu_sockets": (10**6, 4)}, "--cpu-sockets must be"),
        ({"cpu_sockets": (0, 4)}, "--cpu-sockets must be"),
        ({"cpu_watts": (300.0, 100.0)}, "--cpu-watts must be"),
        ({"gpu_watts": (0.0, float("inf"))}, "--gpu-watts must be"),
        ({"node_other_watts": float("nan")}, "--node-other-watts must be"),
    ],
)
def test_power_figures_no_flag_would_take_are_refused_from_the_api(option, message):
    with pytest.raises(UserError, match=message):
        check_bounds(PredictConfig(**option))


def test_a_cluster_that_makes_no_sense_is_a_user_error():
    for make in (lambda: Cluster.gpus(0, 8), lambda: Cluster.cpus(1, 1, 0)):
        with pytest.raises(UserError, match="at least 1"):
            make()


def test_a_trace_in_a_missing_folder_is_refused_and_no_folder_made(tmp_path):
    trace = tmp_path / "missing" / "trace.json"
    with pytest.raises(UserError, match="does not exist"):
        pdlsim.predict("cnn", trace=str(trace), iterations=2, samples=2)
    assert not trace.parent.exists()


def test_a_value_listed_twice_in_an_api_sweep_is_refused():
    with pytest.raises(UserError, match="nodes lists 2 twice"):
        pdlsim.sweep("cnn", nodes=[2, 1, 2])


# --- python -m microbench ---------------------------------------------------------------------


def _microbench_refuses(capsys, args: list[str], *words: str) -> None:
    try:
        status = microbench_main(args)
    except SystemExit as usage:  # argparse's errors
        status = usage.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], err[0]


def test_microbench_refuses_a_flag_given_twice_with_different_values(capsys, tmp_path):
    args = ["jitter", "--batch", "4", "--batch", "8", "--out", str(tmp_path / "o")]
    _microbench_refuses(capsys, args, "--batch is given twice")
    _microbench_refuses(capsys, ["jitter", "--moment", "", "--out", str(tmp_path / "o")],
                        "--moment", "empty")  # fmt: skip


@pytest.mark.parametrize("command", [["jitter", "--threads", "100000"],
                                     ["compute", "--threads", "1,100000"]])  # fmt: skip
def test_microbench_refuses_more_threads_than_the_machine_runs(capsys, tmp_path, command):
    out = tmp_path / "o"
    _microbench_refuses(capsys, [*command, "--out", str(out)], "more than this machine can run")
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["speed", "--samples", "100000000"], ("--samples", "at most 1,000,000")),
        (["jitter", "--warmup", "10000000"], ("--warmup", "at most 1,000,000")),
        (["jitter", "--batch", "100000000"], ("--batch", "at most 16,777,216")),
        (["collectives", "--time-cap", "1e300"], ("--time-cap", "a day")),
        (["power", "--busy-seconds", "1e9"], ("--busy-seconds", "a day")),
        (["interference", "--compute-ms", "1,1e12"], ("--compute-ms", "a day")),
    ],
)
def test_microbench_refuses_counts_and_durations_that_run_for_days(capsys, tmp_path, command,
                                                                   words):  # fmt: skip
    """A count or a duration with extra zeros would keep the machine busy until stopped."""
    out = tmp_path / "o"
    _microbench_refuses(capsys, [*command, "--out", str(out)], *words)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["predict", "--nodes", "2", "--gpus", "8", "--step-time", "-1ms"], "--step-time"),
        (["predict", "--nodes", "2", "--inter-bw", "-5GB/s"], "--inter-bw"),
    ],
)
def test_a_value_read_as_a_flag_says_how_to_give_it(args, flag):
    """argparse takes "-1ms" for another flag and says only "expected one argument": the
    message says how a value that starts with '-' is given, and given so, the value meets its
    own check."""
    _refused(pdlsim_here(*args), f"argument {flag}: expected one argument",
             f"is written {flag}=VALUE")  # fmt: skip
    given = pdlsim_here(*args[:-2], f"{flag}={args[-1]}")
    _refused(given, flag, args[-1])
    assert "expected one argument" not in given.stderr


def test_microbench_says_the_same_of_a_value_read_as_a_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        microbench_main(["collectives", "--sizes", "-1KiB"])
    assert stop.value.code == 2
    assert "is written --sizes=VALUE" in capsys.readouterr().err


HUGE = "1" + "0" * 5000  # past the 4,300 digits Python's int() reads


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--step-time", "-1ms", "--step-time: a time cannot be negative, got '-1ms'"),
        ("--step-time", "0ms", "--step-time must be above 0, got 0ms"),
        ("--step-time", "nan", "--step-time: a time must be a finite number with a unit"),
        ("--step-time", "inf", "--step-time: a time must be a finite number with a unit"),
        ("--step-time", "-inf", "--step-time: a time must be a finite number with a unit"),
        ("--step-time", "5", "--step-time: '5' has no unit; give a time with one, like 2us"),
        ("--inter-lat", "-2us", "--inter-lat: a time cannot be negative, got '-2us'"),
        ("--mtbf", "NaNh", "--mtbf: a time must be a finite number with a unit"),
        ("--restart-time", "-1s", "--restart-time: a time cannot be negative"),
        ("--inter-bw", "-5GB/s", "--inter-bw: a bandwidth cannot be negative, got '-5GB/s'"),
        ("--inter-bw", "inf", "--inter-bw: a bandwidth must be a finite number with a unit"),
        ("--checkpoint-bw", "25", "--checkpoint-bw: '25' has no unit; give a bandwidth with one"),
    ],
)
def test_a_time_or_rate_that_is_no_quantity_says_what_is_wrong(flag, value, message):
    """A negative, non-finite or unit-less time or rate is named as such, not as an unknown
    spelling ("expected a time like 2us"), whichever flag it is given to."""
    _refused(pdlsim_here("predict", "--nodes", "2", "--gpus", "1", f"{flag}={value}"), message)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("-8G", "bad size '-8G': a size cannot be negative"),
        ("1.5G", "bad size '1.5G': a size is a whole number of B, KiB, MiB or GiB"),
        ("1e3", "a size is a whole number"),
        ("nan", "bad size 'nan': a size is a whole number of bytes"),
        (HUGE, "5,001 digits is past any memory"),
        (HUGE + "G", "5,001 digits is past any memory"),
    ],
)
def test_a_size_that_is_no_whole_number_of_bytes_says_what_is_wrong(size, message):
    result = pdlsim_here("collective", "allreduce", f"--size={size}")
    _refused(result, message)
    assert len(result.stderr) < 300  # the value is quoted cut short


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--nodes", "1" + "0" * 400], "--nodes must be at most 1,000,000, got"),
        (["predict", "--nodes", "1", "--seed", HUGE], "got one of 5,001 digits"),
        (["predict", "--nodes", "1", "--iterations", HUGE], "a number of 5,001 digits"),
        (["predict", "--nodes", "1", "--iterations", "1e400"], "expected a whole number, got"),
        (["train", "--epochs", HUGE], "--epochs: expected a positive integer, got one of"),
        (["collective", "allreduce", "-f", "2.5"], "expected a whole number, got '2.5'"),
        (["predict", "--nodes", "1", "--precision", "x" * 500], "invalid choice: 'xxxxxxxx"),
        (["sweep", "--nodes", "1", "--vary", " ", "--out", "o"], "expected KNOB=V1,V2,..."),
    ],
)
def test_a_huge_or_unreadable_number_on_a_flag_is_named_short(args, message):
    """A number of hundreds or thousands of digits is refused in one short line (never echoed
    whole, never Python's "Exceeds the limit"), and argparse's "invalid int value" says what
    the flag takes."""
    result = pdlsim_here(*args)
    _refused(result, message)
    assert len(result.stderr) < 400 and "Exceeds the limit" not in result.stderr


def test_microbench_names_a_huge_number_short(capsys):
    for args in (["collectives", "--sizes", f"8:64MiB:{HUGE}"], ["copies", "--gpu", HUGE]):
        with pytest.raises(SystemExit) as stop:
            microbench_main(args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and len(err) < 300, err
        assert "5,001 digits" in err and "invalid" not in err


def test_a_number_too_long_for_int_is_one_line_wherever_it_escapes():
    """The last guard: a reader with no digit check of its own meets Python's "Exceeds the
    limit (4300 digits)" ValueError; the command line names the user's mistake instead."""
    from microbench.boundary import describe_failure

    try:
        int(HUGE)
    except ValueError as exc:
        message = describe_failure(exc)
    assert message is not None and "thousands of digits" in message and "\n" not in message
    assert "set_int_max_str_digits" not in message
