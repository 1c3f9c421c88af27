"""The environment a command runs in, probed: junk thread settings, links that lead nowhere
where an output goes, MPI settings that make mpiexec fail, a working directory removed under
the command, and a stop of an MPI run. Each gets one line beginning ``pdlsim: error:`` (or the
stop's one line), the status the code intends, and no file left replaced or half-written.

What each test pins was found by running the commands so: ``OMP_WAIT_POLICY=bogus`` ran with
GNU OpenMP's two-line complaint and spinning threads; ``--trace LOOP`` replaced a loop of links
(or a link to nowhere) with a plain file, status 0; a stopped ``train --procs 2`` printed
MPICH's eleven-line "BAD TERMINATION" banner (or "Sending Ctrl-C to processes") on stdout after
its own line; ``HYDRA_LAUNCHER=bogus`` ended in "mpiexec exited with status 255" with nothing
to say what to fix; in a removed directory mpiexec complained that it could not find it.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from microbench import fileio
from microbench.errors import UserError
from microbench.threads import thread_environment_problem, unset_empty_thread_settings
from pdlsim.train import launch
from tests.conftest import MPI_TIMEOUT_S, pdlsim_here, run_pdlsim

QUICK = ["predict", "--nodes", "2", "--samples", "2", "--iterations", "2"]
TINY = ["train", "--max-steps", "2", "--samples", "256"]


def _one_error_line(result: subprocess.CompletedProcess, prefix: str = "pdlsim: error:") -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("value", ["bogus", "PASSIVE,x", "spin"])
def test_an_unknown_omp_wait_policy_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv("OMP_WAIT_POLICY", value)
    problem = thread_environment_problem()
    assert problem is not None and "OMP_WAIT_POLICY" in problem and "PASSIVE" in problem
    result = pdlsim_here(*QUICK)
    assert result.returncode == 2
    assert "neither ACTIVE nor PASSIVE" in _one_error_line(result)


@pytest.mark.parametrize("value", ["passive", " ACTIVE ", "Passive"])
def test_the_omp_wait_policies_openmp_knows_pass_in_any_case(monkeypatch, value):
    monkeypatch.setenv("OMP_WAIT_POLICY", value)
    assert thread_environment_problem() is None


def test_an_empty_omp_wait_policy_counts_as_unset(monkeypatch):
    """GNU OpenMP calls an empty one invalid too; unset, the PASSIVE default applies."""
    monkeypatch.setenv("OMP_WAIT_POLICY", " ")
    assert thread_environment_problem() is None
    unset_empty_thread_settings()
    assert "OMP_WAIT_POLICY" not in os.environ


def test_microbench_refuses_an_unknown_omp_wait_policy_before_any_work():
    env = {**os.environ, "OMP_WAIT_POLICY": "bogus"}
    result = subprocess.run(
        [sys.executable, "-m", "microbench", "jitter", "--quick"],
        capture_output=True, text=True, timeout=MPI_TIMEOUT_S, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    _one_error_line(result, "python -m microbench: error: OMP_WAIT_POLICY=")


def _loop(tmp_path: Path) -> Path:
    first, second = tmp_path / "loop1", tmp_path / "loop2"
    second.symlink_to(first.name)
    first.symlink_to(second.name)
    return first


@pytest.mark.parametrize("kind", ["loop", "nowhere"])
def test_a_trace_onto_a_link_that_leads_nowhere_is_refused_and_the_link_kept(tmp_path, kind):
    if kind == "loop":
        link = _loop(tmp_path)
    else:
        link = tmp_path / "trace.json"
        link.symlink_to(tmp_path / "missing" / "trace.json")
    target = os.readlink(link)
    result = pdlsim_here(*QUICK, "--trace", str(link))
    assert result.returncode == 2
    assert "link to nowhere (or a loop of links)" in _one_error_line(result)
    assert link.is_symlink() and os.readlink(link) == target


def test_the_atomic_writers_refuse_a_loop_of_links_and_leave_no_temporary_file(tmp_path):
    """The last guard, for a writer whose caller did not probe the place first."""
    link = _loop(tmp_path)
    with pytest.raises(UserError, match="remove the link, or give another name"):
        fileio.atomic_write_text(link, "data")
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


def test_mpi_settings_that_make_mpiexec_fail_are_named_in_the_one_line(tmp_path):
    out = tmp_path / "run"
    result = run_pdlsim(*TINY, "--procs", "2", "--out", str(out),
                        env={"HYDRA_LAUNCHER": "bogus"})  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]  # mpiexec's own lines come first
    assert last.startswith("pdlsim: error: training stopped: mpiexec exited")
    assert "the environment sets HYDRA_LAUNCHER for MPI: check it" in last
    assert "Traceback" not in result.stderr


def test_mpi_settings_are_found_by_their_prefixes(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("HYDRA_", "MPIR_CVAR_", "MPICH_", "MPIEXEC_")):
            monkeypatch.delenv(name)
    assert launch.mpi_settings_in_env() == []
    monkeypatch.setenv("MPIR_CVAR_CH3_NOLOCAL", "abc")
    monkeypatch.setenv("HYDRA_RMK", "bogus")
    assert launch.mpi_settings_in_env() == ["HYDRA_RMK", "MPIR_CVAR_CH3_NOLOCAL"]


def test_an_mpi_run_from_a_removed_directory_says_nothing_of_it(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (
        "import os, sys, subprocess; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "sys.exit(subprocess.run([sys.executable, '-m', 'pdlsim', *sys.argv[2:]]).returncode)"
    )
    args = [*TINY, "--procs", "2", "--out", str(tmp_path / "run")]
    result = subprocess.run([sys.executable, "-c", code, str(gone), *args],
                            capture_output=True, text=True, timeout=MPI_TIMEOUT_S)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert (tmp_path / "run" / "summary.json").is_file()


def test_the_launcher_drops_mpiexec_s_words_about_a_stop_only_once_stopping():
    lines = [
        b"epoch 1/9: loss 1\n",
        b"\n",
        b"=" * 83 + b"\n",
        b"=   EXIT CODE: 15\n",
        b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)\n",
        b"[mpiexec@vm] Sending Ctrl-C to processes as requested\n",
        b"epoch 2/9: loss 0\n",
    ]
    for stopping, kept in ((False, 7), (True, 2)):
        event = threading.Event()
        if stopping:
            event.set()
        read, write = os.pipe()
        os.write(write, b"".join(lines))
        os.close(write)
        sink = io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdout", sink)
            with os.fdopen(read, "rb") as source:
                launch._pass_lines(source, "stdout", launch._MPI_ABORT_LINE, event).join(10)
        shown = sink.getvalue().splitlines()
        assert len(shown) == kept
        assert shown[0].startswith("epoch 1") and shown[-1].startswith("epoch 2")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_mpi_run_prints_its_one_line_and_no_mpiexec_banner(tmp_path, sig):
    out = tmp_path / "run"
    args = ["train", "--procs", "2", "--epochs", "1000", "--samples", "256",
            "--checkpoint-every", "5", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "pdlsim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + MPI_TIMEOUT_S
        while not list(out.glob("checkpoint-*.npz")):
            assert process.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + sig, stderr
    assert len(stderr.strip().splitlines()) == 1 and "all ranks stopped" in stderr
    assert "BAD TERMINATION" not in stdout and "mpiexec@" not in stdout
    assert stdout.splitlines()[-1].startswith("epoch "), stdout[-500:]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # none half-written


def test_microbench_collectives_is_unharmed_by_junk_home_and_tmpdir(tmp_path):
    """HOME a file and TMPDIR missing: nothing the benchmarks write goes there."""
    (tmp_path / "home").write_text("")
    env = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "missing")}
    result = subprocess.run(
        [sys.executable, "-m", "microbench", "collectives", "--quick", "--out",
         str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=MPI_TIMEOUT_S, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (tmp_path / "rec" / "collectives.jsonl").is_file()
