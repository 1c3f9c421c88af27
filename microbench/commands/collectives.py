"""``python -m microbench collectives``: MPI collectives at every message size, under any
``mpiexec -n N``; records to ``DIR/collectives.jsonl`` (rank 0), a summary table at the end."""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..cli import (
    add_output_arguments,
    add_sampling_arguments,
    add_thread_level_argument,
    checked_out_dir,
    policy_from_args,
    start_mpi,
    thread_level_name,
)
from ..collectives import (
    DEFAULT_SIZES,
    ELEMENT_BYTES,
    FULL_POLICY,
    LARGE_FACTOR,
    LARGE_MESSAGE_BYTES,
    OPS,
    QUICK_POLICY,
    QUICK_SIZES,
    format_summary,
    run_collectives,
    summarize,
)
from ..sizes import SizeError, format_bytes, parse_sizes

RECORDS_FILE = "collectives.jsonl"


def _ops(text: str) -> tuple[str, ...]:
    names = [name.strip().lower() for name in text.split(",")]
    if names == ["all"]:
        return OPS
    for name in names:
        if name not in OPS:
            raise argparse.ArgumentTypeError(
                f"unknown collective {name!r} (choose from {', '.join(OPS)}, or all)"
            )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a collective is listed twice in {text!r}")
    return tuple(names)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text, multiple_of=ELEMENT_BYTES, minimum=ELEMENT_BYTES)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "collectives",
        help="MPI collectives (allreduce, bcast, allgather, reduce_scatter, barrier, pingpong)",
        description="Time MPI collectives on float32 buffers at each message size; run it "
        "under mpiexec -n N. Each point is sampled until the median's 95% confidence "
        "interval is narrow enough or its time cap is reached; every raw sample is recorded.",
    )
    parser.add_argument(
        "--ops",
        type=_ops,
        default=OPS,
        metavar="OP,...",
        help=f"collectives to time, in this order (default all: {','.join(OPS)})",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="SIZES",
        help="message sizes: a list (8,1KiB,64KiB), a range of powers of two (8:64MiB) or "
        "four (8:64MiB:4), or a mix; units B, KiB, MiB, GiB; ascending multiples of 4 "
        "(default 8:64MiB; --quick 8:1MiB:4). Allgather's size is each rank's contribution, "
        "reduce_scatter's each rank's result block",
    )
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    add_thread_level_argument(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    mpi = start_mpi(args.thread_level)

    from ..machine import machine_metadata
    from ..records import RecordWriter

    comm = mpi.COMM_WORLD
    root = comm.Get_rank() == 0
    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    out = checked_out_dir(args, RECORDS_FILE, comm)

    machine = machine_metadata(comm=comm)  # collective: every rank calls it
    settings = {
        "ops": list(args.ops),
        "sizes_bytes": list(sizes),
        "policy": policy.to_dict(),
        "large_message_bytes": LARGE_MESSAGE_BYTES,
        "large_message_policy": policy.fewer(LARGE_FACTOR).to_dict(),
        "dtype": "float32",
        "clock": "perf_counter",
        "mpi_thread_level": thread_level_name(mpi),
        "quick": args.quick,
    }
    run_info = {"command": "microbench collectives", "argv": sys.argv[1:], "settings": settings}
    writer = None
    if root:
        writer = RecordWriter(out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True)
        per_node = machine["mpi"]["ranks_per_node"] if machine.get("mpi") else None
        print(
            f"collectives: {comm.Get_size()} ranks ({per_node} per node), "
            f"{len(args.ops)} ops, {len(sizes)} sizes {format_bytes(sizes[0])}.."
            f"{format_bytes(sizes[-1])}, target {policy.target_rel_ci:g}, "
            f"time cap {policy.time_cap_s:g} s; records: {writer.path}",
            flush=True,
        )
    # the writer closes on the way out; a failure before its first record removes the
    # header-only file it made, so that the retry needs no --append
    with contextlib.nullcontext() if writer is None else writer:
        results = run_collectives(
            comm,
            args.ops,
            sizes,
            policy,
            machine,
            writer,
            progress=sys.stdout if root and not args.quiet else None,
        )
    if root:
        print(format_summary(summarize(m.to_record() for m in results)))
    return 0
