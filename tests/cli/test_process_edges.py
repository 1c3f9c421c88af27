"""What the process brings with it: its environment, its streams, the signals it gets and the
names it is given. Each wrong one is one line and exit status 2 (or the signal's status),
never a traceback deep in a library."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from microbench.threads import thread_environment_problem
from pdlsim.cli import main as cli_main
from pdlsim.train.launch import Stopped
from tests.conftest import REPO, run_microbench, run_pdlsim


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("NUMBA_NUM_THREADS", "0", "not a positive thread count"),
        ("NUMBA_NUM_THREADS", "abc", "not a positive thread count"),
        ("OMP_NUM_THREADS", "-1", "not a positive thread count"),
        ("OMP_NUM_THREADS", "4,x", "not a positive thread count"),
        ("OMP_NUM_THREADS", "²", "not a positive thread count"),  # a digit int() refuses
        ("NUMBA_THREADING_LAYER", "bogus", "unknown to numba"),
    ],
)
def test_thread_settings_the_libraries_would_refuse_deep_in_a_run(
    monkeypatch, name, value, problem
):
    monkeypatch.setenv(name, value)
    found = thread_environment_problem()
    assert found is not None and found.startswith(f"{name}=") and problem in found


@pytest.mark.parametrize(
    ("name", "value"),
    [("OMP_NUM_THREADS", "4,2"), ("OMP_NUM_THREADS", ""), ("NUMBA_NUM_THREADS", "3")],
)
def test_thread_settings_that_are_fine_pass(monkeypatch, name, value):
    for other in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, value)
    assert thread_environment_problem() is None


def test_a_bad_thread_setting_stops_a_command_before_its_work():
    result = run_pdlsim("workload", "show", "mlp", env={"NUMBA_NUM_THREADS": "0"}, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "pdlsim: error: NUMBA_NUM_THREADS='0' is not a positive thread count; set a number or "
        "unset it"
    ]


@pytest.mark.parametrize(
    ("name", "value"), [("NUMBA_NUM_THREADS", "0"), ("NUMBA_THREADING_LAYER", "bogus")]
)
def test_a_bad_thread_setting_stops_a_microbench_stage_in_one_line(monkeypatch, name, value):
    """``python -m microbench STAGE``, as a cluster job runs it without pdlsim, checked the
    environment not at all: loading its stages' modules (numba), or the benchmark, died with a
    traceback."""
    monkeypatch.setenv(name, value)
    result = run_microbench("collectives", "--help", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"python -m microbench: error: {thread_environment_problem()}"
    ]


def test_a_thread_setting_set_to_nothing_is_unset_before_the_libraries_read_it(monkeypatch):
    """It counts as unset, but stayed in the environment: GNU OpenMP printed "libgomp:
    Invalid value for environment variable OMP_NUM_THREADS" into a training run, and numba a
    warning for an empty NUMBA_NUM_THREADS, in pdlsim and in every process it starts."""
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    monkeypatch.setenv("NUMBA_NUM_THREADS", " ")
    assert cli_main.main(["workload", "list"]) == 0
    assert "OMP_NUM_THREADS" not in os.environ and "NUMBA_NUM_THREADS" not in os.environ


def test_sigterm_while_a_command_runs_processes_is_one_line(monkeypatch, capsys):
    """SIGTERM reaches the command as :class:`Stopped` once its processes are stopped; every
    command ends the same way, not only those that catch it themselves."""
    monkeypatch.setattr(cli_main, "_cmd_workload_list", lambda args: (_ for _ in ()).throw(
        Stopped(signal.SIGTERM)))  # fmt: skip
    assert cli_main.main(["workload", "list"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "pdlsim: stopped by SIGTERM\n"


def test_a_stop_survives_a_copy_and_a_pickle():
    """An exception is copied when it crosses a process (pickle) or a test's probe (copy):
    ``Stopped`` comes back whole, not as "'SIGTERM' is not a valid Signals"."""
    import copy
    import pickle

    for again in (copy.copy(Stopped(signal.SIGTERM)),
                  pickle.loads(pickle.dumps(Stopped(signal.SIGHUP)))):  # fmt: skip
        assert isinstance(again, Stopped) and str(again) in ("SIGTERM", "SIGHUP")
    assert pickle.loads(pickle.dumps(Stopped(signal.SIGHUP))).signum == signal.SIGHUP
    rebuilt = Stopped(*Stopped(signal.SIGTERM).args)  # as SimPy re-raises a process's error
    assert rebuilt.signum == signal.SIGTERM and str(rebuilt) == "SIGTERM"


def test_a_closed_stdout_is_no_traceback():
    result = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -m pdlsim workload show mlp >&-"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr == ""


def test_names_the_terminal_cannot_encode_are_escaped(tmp_path):
    doc = run_pdlsim("workload", "show", "mlp", "--json", timeout=60).stdout
    workload = tmp_path / "greek.json"
    described = json.loads(doc)
    described = described.get("workload", described)
    described["name"] = "réseau-Ω"
    workload.write_text(json.dumps(described, ensure_ascii=False), encoding="utf-8")
    result = run_pdlsim("workload", "show", str(workload), env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("workload r\\xe9seau-\\u03a9: input [784]")


@pytest.mark.parametrize(
    "args",
    [
        ("calibrate", "--from", "RUN", "--out", "profile.json/"),
        ("predict", "--nodes", "2", "--trace", "trace.json/"),
    ],
)
def test_a_file_name_ending_in_a_slash_is_refused_not_written(tmp_path, args):
    (tmp_path / "RUN").mkdir()
    kept = tmp_path / args[-1].rstrip("/")
    kept.write_text("KEEP")
    result = run_pdlsim(*args, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "ends in '/', which names a directory" in result.stderr
    assert kept.read_text() == "KEEP"
