"""Starting processes under ``mpiexec`` (training ranks, MPI microbenchmarks) and stopping them.

``pdlsim train --procs P`` re-runs itself as P ranks under the ``mpiexec`` that the ``mpich``
wheel installs next to the Python interpreter. Ranks run under ``python -m mpi4py`` so that an
unhandled exception on one rank aborts them all instead of leaving the others waiting in a
collective. Thread counts go to every rank through the environment, before numpy loads.

Stopping: Ctrl-C is forwarded to the ranks; ranks that do not finish within a grace period
(a rank blocked in a collective cannot run Python signal handlers) are terminated, then killed.
The launcher then says so in one line: the ranks it started know it (:data:`SUPERVISED_ENV`)
and keep quiet about the stop, MPICH's own line for each rank's ``MPI_Abort`` (how a rank
that stops or fails takes the others down) is left out of what the ranks print, and so, once
a stop is under way, is what Hydra's mpiexec prints on its stdout about it (a "BAD
TERMINATION" banner for a rank ended by SIGTERM, "Sending Ctrl-C to processes"): the stop was
ours, and the one line says so.
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

# What Hydra's mpiexec prints while the ranks it runs are being stopped: a banner for a rank
# that a signal ended, a note for a forwarded Ctrl-C, the blank lines around them.
_STOP_CHATTER = re.compile(
    r"\s*$|=+\s*$|=   |YOUR APPLICATION TERMINATED WITH THE EXIT STRING|This typically refers "
    r"to a problem with your application|Please see the FAQ page|\[mpiexec@[^\]]*\] "
)

# The prefixes of the environment variables MPICH and its Hydra mpiexec take settings from.
_MPI_SETTING_PREFIXES = ("HYDRA_", "MPIR_CVAR_", "MPICH_", "MPIEXEC_")


def mpi_settings_in_env() -> list[str]:
    """The names of the MPI settings in this environment, sorted. When mpiexec fails, one of
    them is the usual cause (an unknown launcher, an algorithm MPICH does not have), and what
    mpiexec says ("unable to initialize the bootstrap server", "Other MPI error") names none."""
    return sorted(name for name in os.environ if name.startswith(_MPI_SETTING_PREFIXES))


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
    # the ranks' output reaches the terminal through our pipes: unbuffered, each line as it
    # is printed (the banner at the start, not at the end)
    env = {**os.environ, **thread_env(threads), SUPERVISED_ENV: "1", "PYTHONUNBUFFERED": "1"}
    return run_supervised(command, env=env, drop=_MPI_ABORT_LINE)


def run_supervised(
    command: Sequence[str], env: dict[str, str], drop: re.Pattern[str] | None = None, **popen: Any
) -> int:
    """Run ``command`` to its end and return its exit status; stop it whole if we are stopped.

    It gets a session of its own, so a terminal's Ctrl-C reaches only us and we decide how to
    stop it: for mpiexec, the signal is forwarded to the ranks (Hydra puts each rank in a
    session of its own, and ranks end when their mpiexec is gone). KeyboardInterrupt and
    :class:`Stopped` are raised again once it has stopped. With ``drop``, its stdout and
    stderr are passed on line by line, less the lines that pattern matches and, once we stop
    it, less mpiexec's own words about that stop (:data:`_STOP_CHATTER`). It runs in the
    current directory, or in ``/`` where that was removed under us (mpiexec would complain
    that it cannot find it; every path handed on is absolute by then, or already refused).
    """
    if drop is not None:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    popen.setdefault("cwd", _working_dir())
    process = subprocess.Popen(command, env=env, start_new_session=True, **popen)
    stopping = threading.Event()
    pumps = (
        [_pass_lines(process.stdout, "stdout", drop, stopping),
         _pass_lines(process.stderr, "stderr", drop, stopping)]
        if drop is not None
        else []
    )  # fmt: skip
    previous = {sig: signal.signal(sig, raise_stopped) for sig in STOP_SIGNALS}
    try:
        return process.wait()
    except KeyboardInterrupt:
        stopping.set()
        stop_process_group(process, first_signal=signal.SIGINT)
        raise
    except Stopped as stopped:
        stopping.set()
        stop_process_group(process, first_signal=stopped.signum)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for pump in pumps:
            pump.join(timeout=STOP_GRACE_S)


def _working_dir() -> str | None:
    """None (this process's directory) where it still exists, else ``/``."""
    try:
        os.getcwd()
    except OSError:
        return "/"
    return None


def _pass_lines(
    source: Any, stream: str, drop: re.Pattern[str], stopping: threading.Event
) -> threading.Thread:
    """A thread that copies ``source`` (a child's pipe) to ``sys.<stream>``, less the lines
    ``drop`` matches and, once ``stopping`` is set, :data:`_STOP_CHATTER`."""

    def pump() -> None:
        for raw in source:  # bytes: a rank's output need not be UTF-8
            line = raw.decode("utf-8", "replace")
            if drop.match(line) or (stopping.is_set() and _STOP_CHATTER.match(line)):
                continue
            try:
                out = getattr(sys, stream)
                out.write(line)
                out.flush()
            except (OSError, ValueError, AttributeError):  # ours is gone: keep draining
                pass

    thread = threading.Thread(target=pump, name=f"rank-{stream}", daemon=True)
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
