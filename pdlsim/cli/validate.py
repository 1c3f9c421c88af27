"""The ``pdlsim validate`` command line (the work is :mod:`pdlsim.validate.run`'s)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from microbench.boundary import Stopped
from microbench.cli import path_argument
from microbench.errors import UserError
from microbench.fileio import new_run_dir, removed_if_empty_on_failure
from microbench.threads import too_many_threads
from pdlsim.cli.args import choice_list, int_list, name_list, positive_int, seed
from pdlsim.costmodel.corrections import CORRECTIONS, parse_corrections
from pdlsim.prediction.checks import MAX_BATCH
from pdlsim.validate.plan import GPU_CHOICES, ValidateConfig  # no numpy: parsing stays light

__all__ = ["add_validate_parser", "run_validate_command"]

PARALLEL_CHOICES = ("data", "model")
_WHOLE = (frozenset(), frozenset(CORRECTIONS))  # none, all: kept as the words


def add_validate_parser(commands: argparse._SubParsersAction) -> None:

    p = commands.add_parser(
        "validate", help="run real training over a matrix, predict each, report the error"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="4 held-out workloads at one batch, fewer steps and launches "
        "(about 6 min on a 2-core VM)",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="NAME|PATH",
        help="predict from this profile (default: calibrate one now, before the training runs)",
    )
    p.add_argument("--repeats", type=positive_int, default=None, help="launches each (3; quick 2)")
    p.add_argument(
        "--steps", type=positive_int, default=None, help="min steps per launch (40; quick 12)"
    )
    p.add_argument("--models", type=name_list, default="mlp,cnn", metavar="NAME,...",
                   help="workloads (mlp,cnn)")  # fmt: skip
    p.add_argument("--batches", default=None, metavar="B,...", help="batches per rank (16,32,64)")
    p.add_argument("--modes", default=None, metavar="PxT,...", help="e.g. 1x1,2x1 (all five)")
    p.add_argument(
        "--parallel",
        type=choice_list(PARALLEL_CHOICES),  # each once, none empty: as every list flag
        default="data,model",
        metavar="MODE,...",
        help="data (the modes above), model (P=2 tensor parallel, training and inference); "
        "default both",
    )
    p.add_argument(
        "--gpu",
        choices=GPU_CHOICES,
        default="auto",
        help="one GPU, copying in turn and pinned with prefetch, at every workload and batch: "
        "auto (default) where a GPU is found and the profile has a GPU model, on (an error "
        "otherwise), off",
    )
    p.add_argument(
        "--seed",
        type=seed,
        default=0,
        help="draws the held-out set: random workloads and batches the calibration never runs "
        "(default 0; at most 4294967295)",
    )
    p.add_argument(
        "--corrections",
        default="all",
        metavar="none|all|NAME,...",
        help="the model's named corrections to switch on for the headline (default all); the "
        "report also scores none, all and this set without each of its terms",
    )
    p.add_argument("--breakdown", action="store_true", help="print measured vs predicted phases")
    p.add_argument("--published", nargs="?", const=True, default=None, metavar="FILE",
                   help="score the GPU cluster model against the shipped table of published "
                   "measurements instead (no training runs), or against FILE, a table shaped "
                   "as pdlsim/validate/published.json")  # fmt: skip
    p.add_argument("--json", action="store_true", help="with --published: print it as JSON")
    p.add_argument(
        "--out", type=path_argument, default=None, metavar="DIR", help="report directory"
    )
    p.set_defaults(handler=run_validate_command)


def _parse_modes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        modes = tuple(tuple(int(v) for v in m.lower().split("x")) for m in text.split(","))
    except ValueError:
        raise UserError(f"--modes: expected PxT,... like 1x1,2x1, got '{text}'") from None
    if any(len(m) != 2 or min(m) < 1 for m in modes):
        raise UserError(f"--modes: expected PxT,... like 1x1,2x1, got '{text}'")
    twice = next((m for i, m in enumerate(modes) if m in modes[:i]), None)
    if twice is not None:
        raise UserError(f"--modes lists {twice[0]}x{twice[1]} twice; list each mode once")
    for ranks, threads in modes:  # as train refuses them, before any calibration or launch
        problem = too_many_threads(ranks, threads, fix="list smaller --modes")
        if problem is not None:
            raise UserError(f"--modes {ranks}x{threads}: {problem}")
    return modes  # type: ignore[return-value]


def _run_published(args: argparse.Namespace) -> int:
    import json

    from microbench.options import given
    from pdlsim.validate.published import format_published, score_published

    dests = ("quick", "profile", "repeats", "steps", "models", "batches", "modes", "gpu", "seed",
             "parallel", "corrections", "breakdown", "out")  # fmt: skip
    for dest in dests:
        flag = given(args, dest)
        if flag:
            raise UserError(f"{flag} is for training runs; --published only predicts the "
                            f"published table: drop {flag} or --published")  # fmt: skip
    doc = score_published(None if args.published is True else args.published)
    print(json.dumps(doc, indent=1) if args.json else format_published(doc))
    return 0


def _kept(out: Path, given: bool) -> str:
    """What an interrupted validation leaves (docs/validation.md, "Interrupted"): no report,
    the records of every launch that finished (its ``summary.json`` written last), and the
    profile a finished calibration wrote; and where to validate again: a ``given`` --out holds
    the run's held-out workloads, so a second run there is refused (a new default folder is
    made each time)."""
    again = "validate again into a new --out" if given else "validate again"
    profile = out / "calibration" / "profile.json"
    if profile.is_file():
        again += f" (--profile {profile} skips the calibration)"
    done = len(list((out / "runs").glob("*/r*/summary.json")))
    if not done:
        return f"no report was written and no launch had finished; {again}"
    return (
        f"no report was written; the {done} launch(es) that finished are in {out / 'runs'} "
        f"(each with its summary.json; a folder without one was cut off); {again}"
    )


def run_validate_command(args: argparse.Namespace) -> int:
    from pdlsim.validate.report import format_breakdown, format_report

    if args.published is not None:
        return _run_published(args)
    if args.json:
        raise UserError("--json is for --published; a training validation writes its report "
                        "files to --out")  # fmt: skip

    extra: dict[str, Any] = {}
    if args.batches:
        try:
            extra["batches"] = int_list(args.batches)
        except argparse.ArgumentTypeError as exc:
            raise UserError(f"--batches: {exc}") from None
        if max(extra["batches"]) > MAX_BATCH:
            raise UserError(f"--batches: a batch must be at most {MAX_BATCH:,}, got "
                            f"{max(extra['batches']):,}")  # fmt: skip
    if args.modes:
        extra["modes"] = _parse_modes(args.modes)
    try:  # a typo fails before the calibration, not after; the set as the report names it
        on = parse_corrections(args.corrections)
    except UserError as exc:
        raise UserError(f"--corrections: {exc}") from None
    corrections = (
        args.corrections.strip()
        if on in _WHOLE
        else ",".join(n.strip() for n in args.corrections.split(","))
    )
    parallel = args.parallel
    if args.modes and "data" not in parallel:  # model rows run their own P = 2
        raise UserError(
            "--modes lists data-parallel modes, and --parallel model runs none: add data to "
            "--parallel, or drop --modes"
        )
    made = None if args.out else new_run_dir(Path("runs") / "validate")
    cfg = ValidateConfig(
        out=args.out or made,
        profile=args.profile,
        repeats=args.repeats or (2 if args.quick else 3),
        steps=args.steps or (12 if args.quick else 40),
        target_run_s=0.25 if args.quick else 2.0,
        max_steps=120 if args.quick else 300,
        quick=args.quick,
        models=tuple(m for m in args.models.split(",") if m),
        band_samples=30 if args.quick else ValidateConfig.band_samples,
        parallel=parallel,
        gpu=args.gpu,
        seed=args.seed,
        heldout_workloads=4 if args.quick else 9,
        heldout_batches=1 if args.quick else 2,
        corrections=corrections,
        **extra,
    )
    with removed_if_empty_on_failure(made):  # refused before its first file: no empty folder
        from pdlsim.validate.run import run_validation  # numpy, records: once it runs

        try:
            report = run_validation(cfg, log=lambda s: print(s, file=sys.stderr))
        except KeyboardInterrupt:
            print(f"pdlsim: interrupted; {_kept(cfg.out, made is None)}", file=sys.stderr)
            return 130
        except Stopped as stopped:  # SIGTERM or SIGHUP (pdlsim.cli.main)
            print(f"pdlsim: stopped by {stopped}; {_kept(cfg.out, made is None)}",
                  file=sys.stderr)  # fmt: skip
            return 128 + stopped.signum
    print(format_report(report))
    if args.breakdown:
        print(format_breakdown(report["rows"]))
    return 0
