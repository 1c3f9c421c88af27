"""The ``pdlsim`` command line: a thin layer over functions that tests call directly.

Every user error is one line on stderr and exit status 2; nothing here prints a traceback for
bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from microbench.boundary import (
    describe_failure,
    flush_stdout,
    one_line_warnings,
    print_message,
    replace_unencodable_output,
    say,
    silence_stdout,
    silence_stdout_if_broken,
    stopped_by_signals,
)
from microbench.cli import under_launcher
from microbench.errors import UserError, printable
from microbench.options import register_once_actions, usage_hint
from microbench.threads import (
    quiet_idle_blas_threads,
    thread_environment_problem,
    unset_empty_thread_settings,
)
from pdlsim import __version__
from pdlsim.cli.args import positive_int
from pdlsim.cli.bench import add_bench_parser
from pdlsim.cli.calibrate import add_calibrate_parser
from pdlsim.cli.collective import add_collective_parser
from pdlsim.cli.hardware import add_hardware_parser
from pdlsim.cli.predict import add_predict_parser
from pdlsim.cli.sweep import add_sweep_parser
from pdlsim.cli.train import add_train_parser
from pdlsim.cli.validate import add_validate_parser
from pdlsim.train.launch import Stopped


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit status 2, and
    an option given twice with different values is one (:mod:`microbench.options`). The line
    starts ``pdlsim: error:`` for every subcommand, as every other refusal does, so that a
    script tells a refusal by one prefix; the subcommand's help is named at its end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_once_actions(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        root = self.prog.split()[0]  # "pdlsim predict" -> "pdlsim"
        hint = printable(usage_hint(message))
        self.exit(2, f"{root}: error: {hint} (see '{self.prog} --help')\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        print_message("pdlsim", message, file)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pdlsim",
        description=(
            "Predict how data-parallel and hybrid (MPI + threads + GPU) training scales: "
            "describe workloads and run real training to measure."
        ),
    )
    parser.add_argument("--version", action="version", version=f"pdlsim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    workload = commands.add_parser(
        "workload", help="inspect workload descriptions (presets or JSON files)"
    )
    workload_commands = workload.add_subparsers(
        dest="workload_command", metavar="ACTION", parser_class=_Parser
    )
    workload_commands.required = True
    show = workload_commands.add_parser(
        "show", help="print the per-layer table: output shape, parameters, FLOPs, bytes"
    )
    show.add_argument(
        "workload",
        metavar="NAME|PATH",
        help="a preset, a zoo network (workload list) or a JSON file",
    )
    show.add_argument("--tokens", type=positive_int, default=None, metavar="N",
                      help="tokens per sample of a network on token ids (default: its "
                      "description's)")  # fmt: skip
    show.add_argument("--json", action="store_true", help="print the description and table as JSON")
    show.set_defaults(handler=_cmd_workload_show)
    listing = workload_commands.add_parser(
        "list", help="the workloads known by name: presets and the zoo of published networks"
    )
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    listing.set_defaults(handler=_cmd_workload_list)

    add_bench_parser(commands)
    add_calibrate_parser(commands)
    add_collective_parser(commands)
    add_hardware_parser(commands, _Parser)
    add_predict_parser(commands)
    add_sweep_parser(commands)
    add_train_parser(commands)
    add_validate_parser(commands)
    return parser


def _cmd_workload_show(args: argparse.Namespace) -> int:
    from pdlsim.cli.workload_table import show_workload

    print(show_workload(args.workload, args.json, args.tokens))
    return 0


def _cmd_workload_list(args: argparse.Namespace) -> int:
    from pdlsim.cli.workload_table import list_workloads

    print(list_workloads(args.json))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    quiet_idle_blas_threads()  # before anything imports numpy
    unset_empty_thread_settings()  # before numba or an OpenMP runtime reads them
    replace_unencodable_output()
    parser = build_parser()
    args = parser.parse_args(argv)  # its messages are flushed as they are printed (_Parser)
    try:
        problem = thread_environment_problem()
        if problem is not None:
            raise UserError(problem)
        with stopped_by_signals(enabled=not under_launcher()), one_line_warnings("pdlsim"):
            status = int(args.handler(args) or 0)  # a rank's signals are its launcher's
        return status if flush_stdout("pdlsim") else 2
    except UserError as exc:
        say("pdlsim", str(exc))
        return exc.exit_status
    except KeyboardInterrupt:
        print("pdlsim: interrupted", file=sys.stderr)
        return 130
    except Stopped as stopped:  # SIGTERM or SIGHUP (stopped_by_signals)
        print(f"pdlsim: stopped by {stopped}", file=sys.stderr)
        return 128 + stopped.signum
    except BrokenPipeError:  # the reader went away (pdlsim ... | head): stop quietly
        silence_stdout()  # so the interpreter's final flush fails silently
        return 0
    except (MemoryError, OSError, ValueError) as exc:
        message = describe_failure(exc)
        if message is None:
            raise
        silence_stdout_if_broken()
        say("pdlsim", message)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
