"""``python -m microbench storage``: time writing a checkpoint-like file (temporary file, write,
fsync, rename, directory fsync) at each size into ``--dir``; records to ``DIR/storage.jsonl``,
a summary line at the end. The written files are removed."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from ..cli import (
    UsageError,
    add_output_arguments,
    add_sampling_arguments,
    checked_out_dir,
    path_argument,
    policy_from_args,
)
from ..fileio import write_problem
from ..sizes import SizeError, format_bytes, parse_sizes
from ..storage import DEFAULT_SIZES, FULL_POLICY, QUICK_POLICY, QUICK_SIZES

RECORDS_FILE = "storage.jsonl"
HEADROOM_BYTES = 64 << 20  # left free beyond the two copies of the largest file a rename holds


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "storage",
        help="checkpoint writes: temporary file, write, fsync, rename, directory fsync",
        description="Time writing a file the way pdlsim train writes a checkpoint (atomic and "
        "durable: temporary file, write, fsync, rename, fsync of the directory) at each size, "
        "into --dir. Every raw sample is recorded; the files are removed afterwards.",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="SIZES",
        help="file sizes: a list (64KiB,1MiB) or a range of powers of two (64KiB:256MiB) or "
        f"four (64KiB:16MiB:4) (default {format_bytes(DEFAULT_SIZES[0])}:"
        f"{format_bytes(DEFAULT_SIZES[-1])}; --quick {format_bytes(QUICK_SIZES[0])}:"
        f"{format_bytes(QUICK_SIZES[-1])}:4)",
    )
    parser.add_argument(
        "--dir",
        type=path_argument,
        default=None,
        metavar="DIR",
        help="an existing directory on the file system to measure, where checkpoints will go "
        "(default: the --out run directory)",
    )
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    return parser


def dir_problem(directory: Path, largest_bytes: int, flag: str = "--dir") -> str | None:
    """Why the files cannot be written in ``directory`` (None when they can); with ``flag``
    "--out" the directory may not exist yet, and its nearest existing parent is checked."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), Path("."))
    if flag == "--dir" and existing != directory:
        return f"--dir {directory}: no such directory; create it or give another"
    problem = write_problem(directory, "dir")
    if problem is not None:
        return f"{flag} {problem}"
    free = shutil.disk_usage(existing).free
    if free < 2 * largest_bytes + HEADROOM_BYTES:
        return (
            f"{flag} {directory}: only {format_bytes(free)} free, the largest size "
            f"({format_bytes(largest_bytes)}) needs twice that plus 64 MiB; give smaller --sizes"
            " or another --dir"
        )
    return None


def run(args: argparse.Namespace) -> int:
    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..storage import format_summary, run_storage, summarize

    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    out = checked_out_dir(args, RECORDS_FILE)
    problem = dir_problem(args.dir or out, max(sizes), "--dir" if args.dir else "--out")
    if problem is not None:
        raise UsageError(problem)
    settings = {
        "sizes_bytes": list(sizes),
        "dir": str(args.dir or out),
        "policy": policy.to_dict(),
        "clock": "perf_counter",
        "quick": args.quick,
    }
    run_info = {"command": "microbench storage", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine_metadata(), run_info, append=args.append, sweep=True
    ) as w:
        directory = args.dir or out  # the run directory exists now
        print(
            f"storage: atomic writes at {len(sizes)} sizes {format_bytes(sizes[0])}.."
            f"{format_bytes(sizes[-1])} in {directory}, target {policy.target_rel_ci:g}, time "
            f"cap {policy.time_cap_s:g} s; records: {w.path}",
            flush=True,
        )
        results = run_storage(sizes, policy, directory, w, None if args.quiet else sys.stdout)
    print(format_summary(summarize(m.to_record() for m in results)))
    return 0
