"""``pdlsim calibrate``: benchmark (or read records), fit every model, write the profile.

The profile is written atomically and only after every fit succeeded, so a failed calibration
never replaces a good profile. Beside it: the report table, the fit plots and the
communication measurements in Extra-P's input format, for cross-checking our fits with an
established empirical modeller.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from microbench.cli import file_path_argument, path_argument
from microbench.errors import UserError
from microbench.fileio import check_folder_exists, check_writable, new_run_dir, special_kind
from pdlsim.cli.args import int_list, name_list, positive_int, seed
from pdlsim.cli.bench import checked_bench_threads, run_cpu_bench


def add_calibrate_parser(commands: argparse._SubParsersAction) -> None:

    p = commands.add_parser(
        "calibrate",
        help="fit cost models to microbenchmark records and write a profile",
        description=(
            "Run 'pdlsim bench' (or read an existing run with --from), fit the cost models "
            "(the kernel tables and step terms of the compute model, Hockney regimes and algorithm "
            "models per collective, transfer, jitter, overlap) with 95% intervals and fit "
            "quality, and write them to a versioned profile, with a report, fit plots and an "
            "Extra-P export beside it. The fit-quality table scores the compute model on the "
            "calibration's own training steps, none of which it was fitted to."
        ),
    )
    p.add_argument("--quick", action="store_true", help="a short benchmark and fewer bootstraps")
    p.add_argument(
        "--from",
        dest="from_dir",
        type=path_argument,
        metavar="RUN_DIR",
        help="fit existing records",
    )
    p.add_argument(
        "--kernels-from",
        type=_run_dirs,
        default=(),
        metavar="RUN_DIR,...",
        help="also fit the kernel sweeps of these earlier runs on this machine: the step terms "
        "and band then see the machine's state move between sweeps",
    )
    p.add_argument(
        "--out",
        type=file_path_argument,
        metavar="PROFILE",
        help="profile path (default: RUN_DIR/profile.json)",
    )
    # the benchmarks' own settings: None when not given, so that --from, which runs no
    # benchmark, refuses them instead of ignoring them (BENCH_DEFAULTS fills them in)
    p.add_argument("--procs", type=int_list, default=None, metavar="P,...",
                   help="for bench (1,2); not with --from")  # fmt: skip
    p.add_argument("--threads", type=int_list, default=None, metavar="T,...",
                   help="for bench (1 up to the cores); not with --from")  # fmt: skip
    p.add_argument("--model", type=name_list, default=None, metavar="NAME|PATH,...",
                   help="for bench (mlp,cnn); not with --from")  # fmt: skip
    p.add_argument("--batch", type=int_list, default=None, metavar="B,...",
                   help="for bench (16,32,64); not with --from")  # fmt: skip
    p.add_argument("--bootstrap", type=positive_int, default=None, help="bootstrap rounds")
    p.add_argument("--seed", type=seed, default=0, help="bootstrap seed")
    p.set_defaults(handler=run_calibrate_command)


# The benchmarks' settings calibrate hands to 'pdlsim bench' when it runs one, and their values
# when not given (--threads: None, every count up to the cores).
BENCH_DEFAULTS = {"procs": (1, 2), "threads": None, "model": "mlp,cnn", "batch": (16, 32, 64)}


def _run_dirs(text: str) -> tuple[Path, ...]:
    """argparse type: comma-separated run directories."""
    return tuple(path_argument(part.strip()) for part in text.split(","))


def run_calibrate_command(args: argparse.Namespace) -> int:
    for extra in args.kernels_from:  # before the benchmarks, like --out
        _check_records_dir(extra, "--kernels-from")
    if args.from_dir is not None:
        _check_records_dir(args.from_dir, "--from")
        given = [name for name in BENCH_DEFAULTS if getattr(args, name) is not None]
        if given:  # the records were measured as they were: the setting would change nothing
            raise UserError(
                f"--{given[0]} sets the benchmarks calibrate runs, and --from {args.from_dir} "
                f"runs none (it fits the records there as they were measured): drop --{given[0]}"
            )  # fmt: skip
    else:
        for name, default in BENCH_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
    _check_runs_distinct(args.kernels_from, args.from_dir)
    # The profile, and the Extra-P file and plots folder beside it, probed before the
    # benchmarks and the fits (so that their work is not lost at the end, and the profile is
    # not replaced when what goes beside it cannot be written); --from's default,
    # RUN_DIR/profile.json, as well.
    default = None if args.out or not args.from_dir else args.from_dir / "profile.json"
    for path, flag, what in (
        (args.out, "--out", ""),
        (default, "--from", "(where the profile goes without --out)"),
    ):
        if path is not None:
            check_writable(path, "file", flag, what)
            # a mistyped folder is refused now, not found missing at the write after the fits
            check_folder_exists(path, flag, flag)
            check_writable(path.parent / "extrap.jsonl", "file", flag, "(written beside it)")
            check_writable(path.parent / "plots", "dir", flag, "(for the fit plots beside it)")
            _check_not_records(path, flag, path)
            _check_not_records(path.parent / "extrap.jsonl", flag, path)
    if args.from_dir is not None:
        run_dir = args.from_dir
    else:
        checked_bench_threads(args)  # bad input fails before a run folder is made
        run_dir = new_run_dir(Path("runs") / "calibrate")
        bench_args = argparse.Namespace(**{**vars(args), "out": run_dir, "skip": ()})
        status = run_cpu_bench(bench_args)
        if status != 0:
            return status
    profile_path = args.out or run_dir / "profile.json"
    return _fit_and_write(run_dir, profile_path, args)


def _check_records_dir(path: Path, flag: str) -> None:
    """Refuse a run directory of records that is not a directory, saying which it is."""
    if path.is_dir():
        return
    if path.exists():
        kind = special_kind(path) or "a file"
        raise UserError(
            f"{flag} {path}: {kind}, not a directory of records; give the run directory that "
            f"holds it ({path.parent})"
        )
    raise UserError(f"{flag} {path}: no such directory of records")


def _check_runs_distinct(kernels_from: tuple[Path, ...], from_dir: Path | None) -> None:
    """Each --kernels-from run named once and none of them the --from run (each an existing
    directory by now): a sweep pooled twice would count each of its samples twice."""
    named: list[tuple[Path, str]] = [(from_dir, "--from")] if from_dir is not None else []
    for extra in kernels_from:
        for other, flag in named:
            if os.path.samefile(extra, other):
                raise UserError(
                    f"--kernels-from {extra} is the run {flag} names already ({other}): its "
                    "sweep would count twice; name each run once"
                )  # fmt: skip
        named.append((extra, "--kernels-from"))


def _check_not_records(path: Path, flag: str, given: Path) -> None:
    """Refuse writing the profile (``given``) or the Extra-P file beside it over ``path`` when
    that holds benchmark records (whole, or with a damaged header): a run's measurements,
    often this calibration's own input (``--out RUN/ranks1/compute.jsonl``), would be replaced
    by the fit of themselves, and lost."""
    from microbench.records import SCHEMA, RecordsError, is_records_file

    with warnings.catch_warnings():  # a file that is not one is the answer, not a note
        warnings.simplefilter("ignore")
        try:
            records = is_records_file(path)
        except RecordsError:
            records = True
    if records:
        which = "" if path == given else f": the Extra-P file written beside it, {path},"
        raise UserError(
            f"{flag} {given}{which} holds benchmark records ({SCHEMA}); writing there would "
            f"replace those measurements: give {flag} a file name of its own, e.g. profile.json"
        )


def _fit_and_write(run_dir: Path, profile_path: Path, args: argparse.Namespace) -> int:
    from calibration.extrap import export_extrap
    from calibration.optable import inconsistent_steps
    from calibration.pipeline import fit_profile, load_measurements
    from calibration.report import format_report

    n_boot = args.bootstrap or (50 if args.quick else 200)
    pooled = "".join(f", the kernel sweep of {d}" for d in args.kernels_from)
    print(f"fitting the records in {run_dir}{pooled} ({n_boot} bootstrap rounds) ...", flush=True)
    extrap = profile_path.parent / "extrap.jsonl"
    with warnings.catch_warnings(record=True) as caught:  # shown as notes, not tracebacks
        warnings.simplefilter("always")
        try:
            frame = load_measurements(run_dir)  # read once: the fit, Extra-P and the plots
            profile, models = fit_profile(
                run_dir, n_boot=n_boot, seed=args.seed, kernel_runs=args.kernels_from, frame=frame
            )
        except UserError:  # the notes may say why (a records file skipped): before the error
            _print_notes(caught)
            raise
        lines = export_extrap(frame[frame["benchmark"] == "collectives"], extrap)
    print(format_report(profile.to_dict()))
    _print_notes(caught)
    for line in inconsistent_steps(models["compute"].table_):
        print(f"pdlsim: warning: {line}", file=sys.stderr)
    from pdlsim.plots import plot_calibration

    plots = plot_calibration(models, frame, profile_path.parent / "plots")
    profile.save(profile_path)  # last: a write that fails before it (a full disk) keeps the old
    print(f"profile: {profile_path}")
    print(f"fit plots: {', '.join(str(p) for p in plots)}")
    print(f"Extra-P input ({lines} samples): {extrap}")
    return 0


def _print_notes(caught: list[warnings.WarningMessage]) -> None:
    """The warnings of the fits, each once, as ``pdlsim: note:`` lines on stdout."""
    for note in dict.fromkeys(str(w.message) for w in caught):
        print(f"pdlsim: note: {note}", flush=True)
