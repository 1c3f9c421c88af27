"""The ``pdlsim`` command line: a thin layer over functions that tests call directly.

Every user error is one line on stderr and exit status 2; nothing here prints a traceback for
bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from microbench.boundary import (
    describe_failure,
    flush_stdout,
    print_message,
    say,
    silence_stdout,
    silence_stdout_if_broken,
)
from microbench.errors import UserError
from microbench.threads import quiet_idle_blas_threads
from pdlsim import __version__
from pdlsim.cli.bench import add_bench_parser
from pdlsim.cli.calibrate import add_calibrate_parser
from pdlsim.cli.options import register_once_actions
from pdlsim.cli.predict import add_predict_parser
from pdlsim.cli.sweep import add_sweep_parser
from pdlsim.cli.train import add_train_parser
from pdlsim.cli.validate import add_validate_parser


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit status 2, and
    an option given twice with different values is one (:mod:`pdlsim.cli.options`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_once_actions(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

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
    show.add_argument("workload", metavar="NAME|PATH", help="a preset (mlp, cnn) or a JSON file")
    show.add_argument("--json", action="store_true", help="print the table as JSON")
    show.set_defaults(handler=_cmd_workload_show)

    add_bench_parser(commands)
    add_calibrate_parser(commands)
    add_predict_parser(commands)
    add_sweep_parser(commands)
    add_train_parser(commands)
    add_validate_parser(commands)
    return parser


def _cmd_workload_show(args: argparse.Namespace) -> int:
    from microbench.workload import load_workload
    from pdlsim.cli.workload_table import workload_table

    workload = load_workload(args.workload)
    table = workload_table(workload)
    if args.json:
        print(json.dumps({"workload": workload.to_dict(), "layers": table}, indent=2))
        return 0
    print(
        f"workload {workload.name}: input {list(workload.input_shape)}, "
        f"{workload.num_classes} classes, {workload.param_count:,} parameters, "
        f"{workload.gradient_bytes:,} gradient bytes to allreduce per step"
    )
    from pdlsim.cli.workload_table import format_table

    print(format_table(table))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    quiet_idle_blas_threads()  # before anything imports numpy
    parser = build_parser()
    args = parser.parse_args(argv)  # its messages are flushed as they are printed (_Parser)
    try:
        status = int(args.handler(args) or 0)
        return status if flush_stdout("pdlsim") else 2
    except UserError as exc:
        say("pdlsim", str(exc))
        return exc.exit_status
    except KeyboardInterrupt:
        print("pdlsim: interrupted", file=sys.stderr)
        return 130
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
