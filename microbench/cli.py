"""Command-line plumbing shared by the ``python -m microbench`` subcommands.

Every subcommand may run under ``mpiexec -n N``, so a user error must come out once, not N
times, and every rank must leave with the same status (a rank that stays behind blocks the
others in their next collective). Two kinds of error, two paths:

- Argument syntax (argparse, sizes, numbers) is decided identically on every rank from the same
  argv, before MPI is initialised: :class:`Parser` prints one line on the launcher's rank 0 and
  every rank exits 2. The rank comes from the launcher's environment, as MPI is not up yet.
- Checks that need the file system (an output directory that is a file) are made on rank 0
  only, after MPI is up, and broadcast (:func:`agree_on_usage`), so every rank raises the same
  :class:`UsageError`; ``microbench.__main__`` turns it into one line on rank 0 and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .argtypes import MAX_BATCH
from .boundary import describe_failure, print_message
from .errors import UserError, digits_past_int, unprintable
from .fileio import new_run_dir, special_kind, write_problem
from .options import register_once_actions, usage_hint
from .threads import MAX_THREADS_PER_CORE, available_cores, too_many_threads

if TYPE_CHECKING:  # only annotations: importing numpy here would come before BLAS is set up
    from .sampling import SamplingPolicy

__all__ = [
    "MAX_REPEATS",
    "MAX_SECONDS",
    "BenchmarkError",
    "Parser",
    "UsageError",
    "add_output_arguments",
    "add_sampling_arguments",
    "add_thread_level_argument",
    "agree_on_usage",
    "checked_out_dir",
    "current_rank",
    "default_out_dir",
    "launcher_rank",
    "out_dir_problem",
    "path_argument",
    "policy_from_args",
    "positive_float",
    "seconds",
    "start_mpi",
    "thread_level_name",
]

# Where launchers put a process's rank before MPI_Init (MPICH/Hydra, Open MPI, PMIx, Slurm).
_RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


class UsageError(UserError):
    """A user mistake found after parsing: one line on rank 0, exit status 2 on every rank."""


class BenchmarkError(RuntimeError):
    """A failure raised identically on every rank (a collective check, say): one line on rank 0,
    exit status 1, no traceback."""


def current_rank() -> int:
    """The rank in COMM_WORLD once MPI is up, else :func:`launcher_rank`; never starts MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            return int(mpi.COMM_WORLD.Get_rank())
    except Exception:
        pass
    return launcher_rank()


def under_launcher() -> bool:
    """True when an MPI launcher (mpiexec, srun) started this process as one of its ranks."""
    return any(name in os.environ for name in _RANK_ENV_VARS)


def launcher_rank() -> int:
    """This process's rank as the launcher set it in the environment; 0 outside a launcher."""
    for name in _RANK_ENV_VARS:
        value = os.environ.get(name, "")
        if value.isdecimal():
            return int(value)
    return 0


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on rank 0 (exit 2) and whose help is printed
    by rank 0 only; an option given twice with different values, or an empty one, is such an
    error (:mod:`microbench.options`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_once_actions(self)

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {' '.join(usage_hint(message).split())}\n")
        sys.exit(2)

    def _print_message(self, message: str, file: Any = None) -> None:
        if launcher_rank() == 0:
            print_message("python -m microbench", message, file)


def label_argument(text: str) -> str:
    """argparse type: a label stored in the records and printed in every line that reports
    them, so one line of printable text (a newline would split a report's line, a terminal
    escape would reach the screen)."""
    problem = unprintable(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}; give one line of printable text")
    return text


def path_argument(text: str) -> Path:
    """argparse type: a path, which may not be empty (``Path("")`` would silently mean the
    current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty; give a file or directory name")
    return Path(text)


def file_path_argument(text: str) -> Path:
    """argparse type: a path to write one file to. A name ending in a separator names a
    directory, which ``Path`` would silently drop, writing a file where a folder was meant."""
    path = path_argument(text)
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(
            f"{text} ends in '/', which names a directory; give a file name"
        )
    return path


# What a benchmark's own counts and durations may be: a million timed (or untimed) repetitions,
# or a day, is past any measurement worth waiting for; beyond it a value is a typo with extra
# zeros, which would keep the machine busy until someone stops it.
MAX_REPEATS = 1_000_000
MAX_SECONDS = 86_400.0


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, > 0 and at most :data:`MAX_SECONDS` (a day)."""
    value = positive_float(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SECONDS:,.0f} seconds (a day), got {text!r}"
        )
    return value


def int_at_least(minimum: int, most: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` (and <= ``most``, where given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            digits = digits_past_int(text)
            if digits is not None:
                raise argparse.ArgumentTypeError(
                    f"an integer of {digits:,} digits is too large"
                ) from None
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, got {value:,}")
        return value

    return parse


def thread_count_problem(args: argparse.Namespace) -> str | None:
    """Why the ``--threads`` a benchmark asks for (one count or a list) is refused, or None:
    more threads per rank than this machine can run (:func:`microbench.threads.too_many_threads`,
    a count with extra zeros), which would else start that many threads and stall the machine
    instead of measuring it. Decided from argv alone, so every rank of a launch agrees."""
    threads = getattr(args, "threads", None)
    if not threads:
        return None
    most = max(threads) if isinstance(threads, (list, tuple)) else threads
    if too_many_threads(1, most) is None:
        return None
    cores = available_cores()
    return (
        f"--threads {most:,} is more than this machine can run ({MAX_THREADS_PER_CORE} per "
        f"core, {MAX_THREADS_PER_CORE * cores:,} on its {cores} cores); give fewer --threads"
    )


def positive_int_list(text: str) -> tuple[int, ...]:
    """argparse type: a comma-separated list of distinct integers >= 1."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdecimal() for item in items):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers, got {text!r}"
        )
    values = tuple(int(item) for item in items)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be at least 1, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"a value is listed twice in {text!r}")
    return values


def workload_list(text: str) -> tuple[Any, ...]:
    """argparse type: comma-separated workload presets or JSON files, each once."""
    from .workload import load_workload

    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty model name in {text!r}")
    try:
        workloads = tuple(load_workload(name) for name in names)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len({w.name for w in workloads}) != len(workloads):
        raise argparse.ArgumentTypeError(f"a model is listed twice in {text!r}")
    return workloads


def add_step_arguments(parser: argparse.ArgumentParser, per_rank: bool = False) -> None:
    """``--model`` (one workload), ``--batch`` and ``--threads`` of a timed training step."""
    from .workload import WorkloadError, load_workload, preset_names

    def workload(text: str) -> Any:
        try:
            return load_workload(text)
        except WorkloadError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parser.add_argument(
        "--model",
        type=workload,
        default="mlp",
        metavar="MODEL",
        help=f"workload preset ({', '.join(preset_names())}) or a workload JSON file (default mlp)",
    )
    parser.add_argument(
        "--batch", type=int_at_least(1, MAX_BATCH), default=32, help="samples per step (32)"
    )
    parser.add_argument(
        "--threads",
        type=int_at_least(1),
        default=1,
        help=f"BLAS and numba threads{' per rank' if per_rank else ''} (1)",
    )


def add_workloads_arguments(parser: argparse.ArgumentParser, batch_help: str | None) -> None:
    """``--model`` (workloads, default mlp,cnn) and, unless ``batch_help`` is None, ``--batch``
    (a list, default 32) of the benchmarks that time several workloads' steps."""
    from .workload import preset_names

    parser.add_argument(
        "--model",
        type=workload_list,
        default="mlp,cnn",
        metavar="NAME|PATH,...",
        help=f"workloads: presets ({', '.join(preset_names())}) or workload JSON files "
        "(default mlp,cnn)",
    )
    if batch_help is not None:
        parser.add_argument(
            "--batch", type=positive_int_list, default=(32,), metavar="B,...", help=batch_help
        )


def add_step_count_arguments(
    parser: argparse.ArgumentParser, what: str, full: tuple[int, int], quick: tuple[int, int]
) -> None:
    """``--samples``, ``--warmup`` and ``--quick`` of a benchmark that times whole steps a fixed
    number of times: ``full`` and ``quick`` are its (samples, warm-up) defaults, ``what`` what
    one sample is."""
    parser.add_argument(
        "--samples",
        type=int_at_least(1, MAX_REPEATS),
        metavar="N",
        help=f"timed {what} (default {full[0]}, --quick {quick[0]})",
    )
    parser.add_argument(
        "--warmup",
        type=int_at_least(1, MAX_REPEATS),
        metavar="N",
        help=f"untimed steps first (default {full[1]}, --quick {quick[1]})",
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a first look")


def step_counts(
    args: argparse.Namespace, full: tuple[int, int], quick: tuple[int, int]
) -> tuple[int, int]:
    """``(samples, warmup)`` from :func:`add_step_count_arguments`' flags: as given, else the
    ``quick`` or ``full`` defaults."""
    defaults = quick if args.quick else full
    return args.samples or defaults[0], args.warmup or defaults[1]


def add_sampling_arguments(
    parser: argparse.ArgumentParser,
    full: SamplingPolicy,
    quick: SamplingPolicy,
    quick_takes: str = "seconds, not minutes",
) -> None:
    """``--quick``, ``--target`` and ``--time-cap``, with the policies' values in the help;
    ``quick_takes``: how long a quick run takes, as the help says it."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"fewer sizes and samples, for a smoke test or a first look ({quick_takes})",
    )
    parser.add_argument(
        "--target",
        type=positive_float,
        metavar="REL",
        help="stop sampling a point when the full width of the median's 95%% confidence "
        f"interval is at most REL x median (default {full.target_rel_ci})",
    )
    parser.add_argument(
        "--time-cap",
        type=seconds,
        metavar="SECONDS",
        help="stop sampling a point after this long, warm-up included (default "
        f"{full.time_cap_s:g} s, --quick {quick.time_cap_s:g} s); the minimum sample count "
        f"({full.min_samples}, --quick {quick.min_samples}) is always taken",
    )


def policy_from_args(
    args: argparse.Namespace, full: SamplingPolicy, quick: SamplingPolicy
) -> SamplingPolicy:
    """The policy ``--quick``, ``--target`` and ``--time-cap`` ask for."""
    policy = quick if args.quick else full
    if args.target is not None:
        policy = replace(policy, target_rel_ci=args.target)
    if args.time_cap is not None:
        policy = replace(policy, time_cap_s=args.time_cap)
    return policy


THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def add_thread_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thread-level",
        choices=THREAD_LEVELS,
        default="multiple",
        help="MPI thread support to ask for (default multiple: mpi4py's default, which pdlsim's "
        "training runs with; it changes MPICH's costs, so measure at the level you train at)",
    )


def start_mpi(thread_level: str) -> Any:
    """Initialise MPI at ``thread_level`` (unless already up) and return ``mpi4py.MPI``."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = thread_level
    from mpi4py import MPI

    return MPI


def thread_level_name(mpi: Any) -> str:
    """The thread level MPI provides (it may differ from the one asked for)."""
    provided = mpi.Query_thread()
    for name in THREAD_LEVELS:
        if provided == getattr(mpi, f"THREAD_{name.upper()}"):
            return name
    return str(provided)


def add_output_arguments(
    parser: argparse.ArgumentParser, records_file: str, quiet: bool = True
) -> None:
    """``--out`` and ``--append`` for ``DIR/records_file``, and ``--quiet`` when ``quiet``."""
    parser.add_argument(
        "--out",
        type=path_argument,
        metavar="DIR",
        help=f"run directory for {records_file} (default runs/bench/<UTC date-time>)",
    )
    parser.add_argument(
        "--append", action="store_true", help=f"add to an existing DIR/{records_file}"
    )
    if quiet:
        parser.add_argument("--quiet", action="store_true", help="no line per point, summary only")


def default_out_dir() -> Path:
    """A new, empty ``runs/bench/<UTC date-time>``: where records go without ``--out`` (created
    here, so that two benchmarks started in the same second get two folders)."""
    return new_run_dir(Path("runs", "bench"))


def checked_out_dir(args: argparse.Namespace, records_file: str, comm: Any = None) -> Path:
    """``args.out`` (else :func:`default_out_dir`), once it is known that ``records_file`` can
    be written there, else :class:`UsageError`. With ``comm``, rank 0 alone picks (and makes)
    the directory and checks it, and every rank gets its answer (:func:`agree_on_usage`)."""
    out: Path | None = None
    problem: str | None = None
    if comm is None or comm.Get_rank() == 0:
        try:
            out = args.out or default_out_dir()
            command = getattr(args, "command", None)  # python -m microbench COMMAND
            problem = out_dir_problem(out, records_file, args.append,
                                      f"microbench {command}" if command else None)  # fmt: skip
        except UserError as exc:  # no default directory could be made
            problem = str(exc)
        except OSError as exc:  # a name too long, say: decided here, so every rank leaves
            problem = f"--out {describe_failure(exc) or exc}"
    if comm is None:
        if problem is not None:
            raise UsageError(problem)
        assert out is not None
        return out
    out = comm.bcast(out, root=0)
    agree_on_usage(comm, problem)
    return out


def out_dir_problem(
    out: Path, file_name: str, append: bool, command: str | None = None
) -> str | None:
    """Why ``out/file_name`` cannot be written as a new records file, or appended to by
    ``command`` (None when it can)."""
    problem = write_problem(out, "dir")
    if problem is not None:
        return f"--out {problem}"
    target = out / file_name
    if target.exists() and not append:
        return f"{target} exists; pass --append to add to it, or choose another --out"
    if target.exists() and not target.is_file():
        kind = special_kind(target) or "not a regular file"
        return f"{target} is {kind}, not a records file; move it aside or give another --out"
    if target.is_symlink() and not target.exists():  # creating it would follow the link
        return f"{target} is a link that leads to no file (or a loop); remove it"
    if target.exists():
        from .records import append_problem  # here: records imports numpy (see above)

        return append_problem(target, command)
    return None


def agree_on_usage(comm: Any, problem: str | None) -> None:
    """Broadcast rank 0's ``problem`` (others pass anything) and raise it on every rank."""
    problem = comm.bcast(problem, root=0)
    if problem is not None:
        raise UsageError(problem)
