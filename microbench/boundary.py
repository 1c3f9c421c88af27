"""What each command line says when the machine, not the code, stops a run.

A command's top level (``pdlsim``, ``python -m microbench``) turns a :class:`UserError` into one
line and exit status 2. Two more kinds of failure are the user's to fix and get the same
treatment here: running out of memory for the sizes asked (numpy's ``_ArrayMemoryError`` is a
:class:`MemoryError`; sizes too large to even describe come as numpy ``ValueError`` messages),
and an operating-system refusal to read or write a file (a full disk, a read-only place, a name
too long). Anything else is a bug and keeps its traceback, so nothing here catches
``Exception``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from .errors import clip_long_numbers, printable

__all__ = [
    "STOP_SIGNALS",
    "Stopped",
    "describe_failure",
    "flush_stdout",
    "one_line_warnings",
    "raise_stopped",
    "say",
    "silence_stdout",
    "silence_stdout_if_broken",
    "stopped_by_signals",
]

# The signals that ask a command to stop (a job scheduler's SIGTERM, a closed terminal's
# SIGHUP); Ctrl-C's SIGINT is Python's KeyboardInterrupt already.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """SIGTERM or SIGHUP arrived (:func:`stopped_by_signals`): the command stops as on Ctrl-C,
    its outputs being atomic, and its top level says so in one line, exit status 128 + N."""

    def __init__(self, signum: int | str) -> None:
        """``signum`` the signal's number, or its name: SimPy re-raises a process's exception
        as ``type(exc)(*exc.args)``, which passes the name kept in ``args``, and a stop that
        lands inside a simulated process must stay a stop."""
        sig = signal.Signals[signum] if isinstance(signum, str) else signal.Signals(signum)
        super().__init__(sig.name)
        self.signum = int(sig)

    def __reduce__(self) -> tuple[type, tuple[int]]:
        """Rebuilt from the signal number (``args`` holds its name): copies and pickles, as
        exceptions crossing processes or ``copy`` are, give the same exception back."""
        return type(self), (self.signum,)


def raise_stopped(signum: int, frame: object) -> None:
    """A signal handler: raise :class:`Stopped` in the main thread."""
    raise Stopped(signum)


@contextlib.contextmanager
def stopped_by_signals(enabled: bool = True) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Stopped` instead of killing the
    process silently half-way; the previous handlers come back after it. Nothing changes when
    not ``enabled`` (an MPI rank, which its launcher stops), outside the main thread, or for a
    signal that is ignored (``nohup``)."""
    previous: dict[int, Any] = {}
    if enabled and threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, raise_stopped)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# OSError numbers that mean "this place cannot be used", with what the user can do about it.
_OS_ADVICE: dict[int, str] = {
    errno.ENOSPC: "the disk is full; free space or write somewhere else",
    errno.EDQUOT: "the disk quota is used up; free space or write somewhere else",
    errno.EFBIG: "the file would be too large for this file system; write somewhere else",
    errno.ENAMETOOLONG: "the file name is too long; give a shorter one",
    errno.EROFS: "the file system is read-only; write somewhere else",
    errno.EACCES: "permission denied; give a place you may use",
    errno.EPERM: "operation not permitted; give a place you may use",
    errno.EIO: "input/output error from the device; check the disk or write somewhere else",
    errno.ELOOP: "a loop of symbolic links; remove the link or give another name",
}

# Python's ValueError for int() of a text of more than 4,300 digits (sys.int_info)
_INT_TOO_LONG = "Exceeds the limit"

# Messages numpy gives, as ValueError, for an array whose size does not even fit an integer.
_NUMPY_TOO_BIG = (
    "array is too big",
    "maximum allowed size exceeded",
    "maximum allowed dimension exceeded",
    "negative dimensions",
)


def describe_failure(exc: BaseException) -> str | None:
    """One line for a failure the user can fix (memory, a file the system refuses), or None
    when ``exc`` is a bug that must keep its traceback."""
    if isinstance(exc, MemoryError):
        detail = str(exc).strip()
        detail = f" ({detail[0].lower()}{detail[1:]})" if detail else ""
        return f"not enough memory for the sizes asked{detail}; use smaller sizes"
    if isinstance(exc, ValueError) and str(exc).lower().startswith(_NUMPY_TOO_BIG):
        return f"not enough memory for the sizes asked ({exc}); use smaller sizes"
    if isinstance(exc, ValueError) and str(exc).startswith(_INT_TOO_LONG):
        # int() of a value typed or written with thousands of digits, where a reader had no
        # check of its own: Python's message names its own setting, which is not the fix
        return "a number given has thousands of digits, past any count or size; give a real one"
    if isinstance(exc, OSError) and exc.errno in _OS_ADVICE:
        advice = _OS_ADVICE[exc.errno]
        if exc.filename is None:
            return f"cannot write the output: {advice}"
        name = os.fsdecode(exc.filename)
        if len(name) > 200:  # the start and the file's own name, which says what failed
            name = f"{name[:60]}...{name[-100:]}"
        return f"{name}: {advice}"
    return None


def say(prog: str, line: str) -> None:
    """``line`` on stderr after ``prog: error:``, a number past any meaning in it cut short
    (:func:`~microbench.errors.clip_long_numbers`) and its unprintable characters escaped
    (:func:`~microbench.errors.printable`: a name echoed from a flag or a file, ``$'a\\nb'``,
    must not break the one line); a stderr that cannot be written stays silent."""
    try:
        print(f"{prog}: error: {printable(clip_long_numbers(line))}", file=sys.stderr, flush=True)
    except OSError:
        pass


@contextlib.contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Warnings raised inside (a records file's cut-off last line removed before appending,
    NumPy's) as one line each on stderr, ``PROG: warning: MESSAGE``, instead of Python's two
    (the file and line, then the source line that raised it)."""

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:  # fmt: skip
        try:
            print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)
        except OSError:
            pass

    saved = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of output that could
    not be written (a reader gone, a full disk) fails silently instead of printing a
    traceback-like complaint at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (captured by a test)
        pass


def silence_stdout_if_broken() -> None:
    """After a write failure, :func:`silence_stdout` if it was stdout that could not be
    written (its buffered output is lost either way; anything else printed still goes out)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        silence_stdout()


def print_message(prog: str, message: str, file: Any = None) -> None:
    """What an argparse parser prints (help, usage, version), written through: argparse's own
    printer swallows an ``OSError``, so ``--help`` onto a full disk printed nothing and exited
    0. Here such a failure is one line and exit status 2; a reader that went away (``| head``)
    is no failure."""
    if not message:
        return
    out = file if file is not None else sys.stderr
    try:
        out.write(message)
        out.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as exc:
        if out is sys.stdout:
            silence_stdout()
        _say_unwritten(prog, exc)
        raise SystemExit(2) from None


def _say_unwritten(prog: str, exc: OSError) -> None:
    say(prog, describe_failure(exc) or f"cannot write the output ({exc.strerror})")


def flush_stdout(prog: str) -> bool:
    """Flush stdout before the command returns, so that a full disk under it is reported as
    one line (False) rather than by the interpreter's flush at exit; a reader that went away
    (``| head``) is no failure (True)."""
    if sys.stdout is None:  # started with stdout closed (``>&-``): nothing was printed
        return True
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as exc:
        silence_stdout()
        _say_unwritten(prog, exc)
        return False
    except ValueError:  # stdout closed by the caller: nothing left to flush
        pass
    return True


def replace_unencodable_output() -> None:
    """Let stdout and stderr write what their encoding cannot (a workload's name in Greek under
    ``PYTHONIOENCODING=ascii``) as escapes instead of failing mid-table with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
