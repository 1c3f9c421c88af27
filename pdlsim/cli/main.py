"""The ``pdlsim`` command line: a thin layer over functions that tests call directly.

Every user error is one line on stderr and exit status 2; nothing here prints a traceback for
bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from microbench.boundary import (
    describe_failure,
    flush_stdout,
    say,
    silence_stdout,
    silence_stdout_if_broken,
)
from microbench.cli import path_argument
from microbench.errors import UserError
from microbench.fileio import new_run_dir
from microbench.threads import quiet_idle_blas_threads
from pdlsim import __version__
from pdlsim.cli.options import register_once_actions


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit status 2, and
    an option given twice with different values is one (:mod:`pdlsim.cli.options`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_once_actions(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int_at_least(text: str, least: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def seed(text: str) -> int:
    """A random seed: numpy's generators take integers >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


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

    bench = commands.add_parser(
        "bench",
        help="run the microbenchmarks (compute, collectives, copies, jitter, interference)",
        description=(
            "Measure this machine: compute kernels at the workload's layer shapes and thread "
            "counts, GEMM and triad references, MPI collectives at each process count "
            "(mpiexec is started for you), host<->device copies where a GPU exists, step "
            "jitter and allreduce/compute interference. Records (every raw sample, with the "
            "machine's metadata) go to one run directory."
        ),
    )
    bench.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    bench.add_argument(
        "--procs", type=int_list, default=(1, 2), metavar="P,...", help="process counts (1,2)"
    )
    bench.add_argument(
        "--threads",
        type=int_list,
        default=None,
        metavar="T,...",
        help="compute thread counts (default 1 up to the cores)",
    )
    bench.add_argument(
        "--model",
        default="mlp,cnn",
        metavar="NAME|PATH,...",
        help="workloads whose layers, steps and step jitter to time (mlp,cnn)",
    )
    bench.add_argument(
        "--batch",
        type=int_list,
        default=(16, 32, 64),
        metavar="B,...",
        help="per-rank batches of the compute kernels (16,32,64); jitter uses the middle one",
    )
    bench.add_argument(
        "--out", type=path_argument, default=None, metavar="DIR", help="run directory"
    )
    bench.set_defaults(handler=run_bench_command)

    from pdlsim.cli.calibrate import add_calibrate_parser
    from pdlsim.cli.predict import add_predict_parser
    from pdlsim.cli.sweep import add_sweep_parser
    from pdlsim.cli.train import add_train_parser
    from pdlsim.cli.validate import add_validate_parser

    add_calibrate_parser(commands)
    add_predict_parser(commands)
    add_sweep_parser(commands)
    add_train_parser(commands)
    add_validate_parser(commands)
    return parser


def int_list(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): positive, ascending, no repeats."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers like 1,2,4, got '{text}'"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every value must be at least 1, got '{text}'")
    if list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"list values in ascending order, once each: '{text}'")
    return values


def checked_bench_threads(args: argparse.Namespace) -> tuple[int, ...]:
    """The thread counts a bench times, once its workloads load and its process and thread
    counts fit this machine (:class:`UserError` otherwise): before any folder or stage."""
    from microbench.threads import available_cores, too_many_threads
    from microbench.workload import load_workload

    for model in args.model.split(","):
        load_workload(model)
    threads = args.threads or tuple(range(1, available_cores() + 1))
    problem = too_many_threads(max(args.procs), 1) or too_many_threads(1, max(threads))
    if problem is not None:
        raise UserError(problem)
    return threads


def run_bench_command(args: argparse.Namespace) -> int:
    from pdlsim.cli.bench import BenchPlan, run_bench
    from pdlsim.cli.bench_summary import format_bench_summary
    from pdlsim.train.launch import Stopped

    threads = checked_bench_threads(args)
    out = args.out or new_run_dir(Path("runs") / "bench")
    plan = BenchPlan(
        out=out,
        model=args.model,
        procs=args.procs,
        threads=threads,
        batches=args.batch,
        quick=args.quick,
    )
    try:
        result = run_bench(plan)
    except KeyboardInterrupt:
        print(f"pdlsim: interrupted; finished points are kept in {out}", file=sys.stderr)
        return 130
    except Stopped as stopped:
        print(f"pdlsim: stopped by {stopped}; finished points are kept in {out}", file=sys.stderr)
        return 128 + stopped.signum
    print(format_bench_summary(out))
    print(f"records: {out}")
    if not result.ok:
        failed = ", ".join(s.name for s in result.stages if s.status != "ok")
        print(f"pdlsim: error: stage(s) failed: {failed}; see {out}/logs", file=sys.stderr)
        return 1
    return 0


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
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version or a usage error, printed: make sure it got out
        if not flush_stdout("pdlsim"):
            raise SystemExit(2) from None
        raise
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
