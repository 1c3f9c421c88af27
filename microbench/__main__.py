"""``python -m microbench COMMAND``: run a microbenchmark, serially or under ``mpiexec -n N``.

Subcommands live in :mod:`microbench.commands`, one module each with ``add_parser`` and ``run``;
adding one is adding its name to :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from .threads import (
    quiet_idle_blas_threads,
    size_numba_pool,
    thread_environment_problem,
    unset_empty_thread_settings,
)

quiet_idle_blas_threads()  # before numpy loads: BLAS reads it once, and timings must match training
unset_empty_thread_settings()  # before numba or an OpenMP runtime reads them

from .boundary import (  # noqa: E402
    Stopped,
    describe_failure,
    flush_stdout,
    one_line_warnings,
    say,
    silence_stdout,
    silence_stdout_if_broken,
    stopped_by_signals,
)
from .cli import (  # noqa: E402
    BenchmarkError,
    Parser,
    current_rank,
    thread_count_problem,
    under_launcher,
)
from .errors import UserError  # noqa: E402

COMMANDS = (
    "collectives", "jitter", "interference", "compute", "copies", "power", "compression", "storage",
    "speed", "kernels", "nodefill",
)  # fmt: skip


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m microbench",
        description="Measure this machine for pdlsim: each command writes JSON Lines records "
        "(every raw sample, with the machine's metadata) into a run directory.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"microbench.commands.{name}")
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def _abort_mpi(status: int) -> None:
    """Take every rank down: one rank leaving alone would leave the others in a collective."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        if mpi.COMM_WORLD.Get_size() > 1:
            mpi.COMM_WORLD.Abort(status)


def main(argv: list[str] | None = None) -> int:
    # The environment's thread settings first: the commands' modules load numba, which refuses
    # a bad one with a traceback. Every rank decides alike (the launcher hands each the same
    # environment), rank 0 says.
    problem = thread_environment_problem()
    if problem is not None:
        if current_rank() == 0:
            say("python -m microbench", problem)
        return 2
    args = build_parser().parse_args(argv)  # its messages are flushed as they are printed
    prog = f"python -m microbench {args.command}"
    threads = getattr(args, "threads", None)  # one count, or a list of them
    problem = thread_count_problem(args)
    if problem is not None:  # before any thread starts; every rank decides alike, rank 0 says
        if current_rank() == 0:
            say(prog, problem)
        return 2
    if threads:
        size_numba_pool(max(threads) if isinstance(threads, (list, tuple)) else threads)
    try:
        with stopped_by_signals(enabled=not under_launcher()), one_line_warnings(prog):
            status = int(args.run(args))  # a rank's signals are its launcher's
        return status if flush_stdout(prog) else 2
    except UserError as e:  # UsageError, and any other user error raised on the way
        if current_rank() == 0:
            say(prog, str(e))
        return 2
    except BenchmarkError as e:
        if current_rank() == 0:
            print(f"{prog}: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if current_rank() == 0:
            print(f"{prog}: interrupted; the records of finished points are kept", file=sys.stderr)
        _abort_mpi(130)
        return 130
    except Stopped as stopped:  # SIGTERM or SIGHUP (stopped_by_signals)
        print(f"{prog}: stopped by {stopped}; the records of finished points are kept",
              file=sys.stderr)  # fmt: skip
        return 128 + stopped.signum
    except BrokenPipeError:  # the reader went away (... | head): stop quietly
        silence_stdout()
        return 0
    except (MemoryError, OSError, ValueError) as e:
        message = describe_failure(e)
        if message is None:  # a bug: keep its traceback
            _report_bug()
            raise
        silence_stdout_if_broken()
        say(prog, message)  # from the rank that failed: the others may not have
        _abort_mpi(2)
        return 2
    except Exception:
        _report_bug()
        raise


def _report_bug() -> None:
    """A traceback, then every rank down: the others would wait for this one forever."""
    traceback.print_exc()
    _abort_mpi(1)


if __name__ == "__main__":
    sys.exit(main())
