"""Starting processes under ``mpiexec`` (training ranks, MPI microbenchmarks) and stopping them.

``pdlsim train --procs P`` re-runs itself as P ranks under the ``mpiexec`` that the ``mpich``
wheel installs next to the Python interpreter. Ranks run under ``python -m mpi4py`` so that an
unhandled exception on one rank aborts them all instead of leaving the others waiting in a
collective. Thread counts go to every rank through the environment, before numpy loads.

Stopping: Ctrl-C is forwarded to the ranks; ranks that do not finish within a grace period
(a rank blocked in a collective cannot run Python signal handlers) are terminated, then killed.
The launcher then says so in one line: the ranks it started know it (:data:`SUPERVISED_ENV`)
and keep quiet about the stop, and MPICH's own line for each rank's ``MPI_Abort`` (how a rank
that stops or fails takes the others down) is left out of what the ranks print.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from microbench.boundary import STOP_SIGNALS, Stopped, raise_stopped
from microbench.errors import UserError
from microbench.threads import thread_env

STOP_GRACE_S = 3.0
# Set for the ranks launch_ranks starts: their launcher reports a stop, so they do not.
SUPERVISED_ENV = "PDLSIM_SUPERVISED_RANK"
# MPICH's line for a rank's MPI_Abort: the rank and its launcher have said why.
_MPI_ABORT_LINE = re.compile(
    r"Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called MPI_Abort"
)


def find_mpiexec() -> str:
    """The mpiexec that belongs to this Python (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UserError(
            "no mpiexec found: install the MPI wheel (pip install mpich) or load your MPI "
            "module, or run with --procs 1"
        )
    return found


def mpiexec_command(procs: int, python_args: Sequence[str]) -> list[str]:
    """``mpiexec -n PROCS python PYTHON_ARGS`` with this interpreter and its mpiexec."""
    return [find_mpiexec(), "-n", str(procs), sys.executable, *python_args]


def launch_ranks(child_args: Sequence[str], procs: int, threads: int) -> int:
    """Run ``python -m pdlsim CHILD_ARGS`` as ``procs`` ranks; return mpiexec's exit status."""
    command = mpiexec_command(procs, ["-m", "mpi4py", "-m", "pdlsim", *child_args])
    env = {**os.environ, **thread_env(threads), SUPERVISED_ENV: "1"}
    return run_supervised(command, env=env, drop=_MPI_ABORT_LINE)


def run_supervised(
    command: Sequence[str], env: dict[str, str], drop: re.Pattern[str] | None = None, **popen: Any
) -> int:
    """Run ``command`` to its end and return its exit status; stop it whole if we are stopped.

    It gets a session of its own, so a terminal's Ctrl-C reaches only us and we decide how to
    stop it: for mpiexec, the signal is forwarded to the ranks (Hydra puts each rank in a
    session of its own, and ranks end when their mpiexec is gone). KeyboardInterrupt and
    :class:`Stopped` are raised again once it has stopped. With ``drop``, its stderr is passed
    on line by line, less the lines that pattern matches.
    """
    if drop is not None:
        popen["stderr"] = subprocess.PIPE
    process = subprocess.Popen(command, env=env, start_new_session=True, **popen)
    pump = _pass_stderr(process, drop) if drop is not None else None
    previous = {sig: signal.signal(sig, raise_stopped) for sig in STOP_SIGNALS}
    try:
        return process.wait()
    except KeyboardInterrupt:
        stop_process_group(process, first_signal=signal.SIGINT)
        raise
    except Stopped as stopped:
        stop_process_group(process, first_signal=stopped.signum)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pump is not None:
            pump.join(timeout=STOP_GRACE_S)


def _pass_stderr(process: subprocess.Popen, drop: re.Pattern[str]) -> threading.Thread:
    """A thread that copies ``process``'s stderr to ours, less the lines ``drop`` matches."""

    def pump() -> None:
        for raw in process.stderr:  # bytes: a rank's output need not be UTF-8
            line = raw.decode("utf-8", "replace")
            if drop.match(line):
                continue
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone: keep draining the pipe
                pass

    thread = threading.Thread(target=pump, name="rank-stderr", daemon=True)
    thread.start()
    return thread


def stop_process_group(process: subprocess.Popen, first_signal: int = signal.SIGINT) -> None:
    """Ask the group to stop, then insist: first_signal, SIGTERM, SIGKILL, a grace period apart."""
    for sig in (first_signal, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_GRACE_S)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # ranks that outlived their mpiexec
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
