"""``python -m microbench interference``: how much of an allreduce hides behind computation, by a
nonblocking collective and by a communication thread; records to ``DIR/interference.jsonl``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..cli import (
    MAX_SECONDS,
    add_output_arguments,
    add_sampling_arguments,
    agree_on_usage,
    checked_out_dir,
    policy_from_args,
    positive_float,
    start_mpi,
    thread_level_name,
)
from ..interference import (
    DEFAULT_BYTES,
    DEFAULT_COMPUTE_S,
    ELEMENT_BYTES,
    FULL_POLICY,
    METHODS,
    QUICK_POLICY,
    Point,
    run_interference,
)
from ..memory import usable_memory_bytes
from ..sizes import SizeError, format_bytes, parse_sizes

RECORDS_FILE = "interference.jsonl"
MPI_ENV_PREFIXES = ("MPIR_CVAR_", "MPICH_", "OMPI_MCA_", "I_MPI_", "FI_", "UCX_")
HEADER = (
    f"{'method':<8}{'bytes':>8}{'target':>8}{'comm':>9}{'compute':>9}{'both':>9}"
    f"{'overlap%':>9}{'':>7}{'paired%':>8}{'95% CI':>11}{'comm x':>8}{'comp x':>8}"
)
LEGEND = (
    "times: medians in ms; overlap% from the medians (IMB-NBC) +- what the medians' CIs allow; "
    "paired%: from the rounds, with its 95% CI; comm x, comp x: slowdowns when overlapped"
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def format_point(point: Point) -> str:
    """One line: medians in ms, the two overlaps, slowdowns (comm x, compute x)."""
    p = point.params
    comm = "-" if point.comm_slowdown is None else f"{point.comm_slowdown:.2f}"
    paired, low, high = point.overlap_paired_pct()
    return (
        f"{p['method']:<8}{format_bytes(p['bytes']):>8}{_ms(p['compute_s_target']):>8}"
        f"{_ms(point.comm_alone.median):>9}{_ms(point.compute_alone.median):>9}"
        f"{_ms(point.both.median):>9}{point.overlap_pct:>9.0f}"
        f"{'+-' + format(point.overlap_uncertainty_pct, '.0f'):>7}{paired:>8.0f}"
        f"{f'[{low:.0f}, {high:.0f}]':>11}{comm:>8}{point.compute_slowdown:>8.2f}"
    )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text, multiple_of=ELEMENT_BYTES, minimum=ELEMENT_BYTES)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _milliseconds(text: str) -> tuple[float, ...]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"empty item in {text!r}")
    values = tuple(positive_float(item) / 1e3 for item in items)
    if max(values) > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"a compute time must be at most {MAX_SECONDS * 1e3:,.0f} ms (a day), got {text!r}"
        )
    return values


def _methods(text: str) -> tuple[str, ...]:
    names = [name.strip().lower() for name in text.split(",")]
    for name in names:
        if name not in METHODS:
            raise argparse.ArgumentTypeError(
                f"unknown method {name!r} (choose from {', '.join(METHODS)})"
            )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a method is listed twice in {text!r}")
    return tuple(names)


def _threads(text: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def _memory_problem(machine: dict, ranks_per_node: int, largest_bytes: int) -> str | None:
    """Refuse buffers (send + receive per rank) beyond half the node's memory."""
    memory = usable_memory_bytes(machine)
    needed = 2 * largest_bytes * ranks_per_node
    if memory is not None and needed > memory / 2:
        return (
            f"--bytes {format_bytes(largest_bytes)}: {ranks_per_node} ranks' send and receive "
            f"buffers ({format_bytes(needed)}) exceed half of this node's memory"
        )
    return None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "interference",
        help="allreduce overlapped with computation (nonblocking and comm-thread methods)",
        description="Time a float32 SUM allreduce alone, a calibrated GEMM loop alone and the "
        "two together, by Iallreduce + compute + Wait (IMB-NBC) and by a communication thread "
        "running the blocking Allreduce while the main thread computes; report the overlap "
        "(IMB-NBC's definition) and how much each slows the other. Run it under mpiexec -n N.",
    )
    parser.add_argument(
        "--bytes",
        type=_sizes,
        default=DEFAULT_BYTES,
        metavar="SIZES",
        help="allreduce sizes per rank, ascending multiples of 4 (default 1MiB,16MiB)",
    )
    parser.add_argument(
        "--compute-ms",
        type=_milliseconds,
        default=DEFAULT_COMPUTE_S,
        metavar="MS,...",
        help="computation to overlap with, in milliseconds (default 5,20)",
    )
    parser.add_argument(
        "--methods",
        type=_methods,
        default=METHODS,
        metavar="M,...",
        help=f"methods to run (default {','.join(METHODS)})",
    )
    parser.add_argument(
        "--threads", type=_threads, default=1, help="BLAS threads of the computation (1)"
    )
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    return parser


def run(args: argparse.Namespace) -> int:
    mpi = start_mpi("multiple")  # the thread method needs MPI_THREAD_MULTIPLE

    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..threads import available_cores, oversubscription, set_threads

    comm = mpi.COMM_WORLD
    ranks, root = comm.Get_size(), comm.Get_rank() == 0
    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    out = checked_out_dir(args, RECORDS_FILE, comm)

    set_threads(args.threads)
    machine = machine_metadata(comm=comm, threads=args.threads)  # collective
    per_node = (machine.get("mpi") or {}).get("ranks_per_node") or ranks
    agree_on_usage(comm, _memory_problem(machine, per_node, max(args.bytes)) if root else None)
    problems = comm.allgather(oversubscription(per_node, args.threads))
    warning = next((p for p in problems if p is not None), None)
    # The thread method's communication thread wants a core of its own as well.
    cores = min(comm.allgather(available_cores()))
    comm_thread_shares = per_node * (args.threads + 1) > cores
    level = thread_level_name(mpi)
    skip_thread = None
    if level != "multiple":
        skip_thread = f"MPI provides thread level {level!r}; the thread method needs 'multiple'"
    settings = {
        "methods": list(args.methods),
        "sizes_bytes": list(args.bytes),
        "compute_s_targets": list(args.compute_ms),
        "threads": args.threads,
        "policy": policy.to_dict(),
        "dtype": "float32",
        "clock": "perf_counter",
        "mpi_thread_level": level,
        "oversubscribed": warning is not None,
        "oversubscription_warning": warning,
        "cores": cores,
        "comm_thread_shares_cores": comm_thread_shares,
        "quick": args.quick,
        # Progress settings change what overlaps (MPICH's MPIR_CVAR_ASYNC_PROGRESS, say).
        "mpi_env": {k: v for k, v in os.environ.items() if k.startswith(MPI_ENV_PREFIXES)},
    }
    writer = None
    if root:
        run_info = {
            "command": "microbench interference",
            "argv": sys.argv[1:],
            "settings": settings,
        }
        writer = RecordWriter(out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True)
        print(
            f"interference: {ranks} rank(s) ({per_node} per node), {', '.join(args.methods)}; "
            f"sizes {', '.join(format_bytes(n) for n in args.bytes)}; compute "
            f"{', '.join(f'{s * 1e3:g}' for s in args.compute_ms)} ms; records: {writer.path}",
            flush=True,
        )
        if ranks == 1:
            print("note: at 1 rank the allreduce is a local copy; no network is involved")
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        elif comm_thread_shares and "thread" in args.methods:
            print(
                f"note: {per_node} ranks x ({args.threads} + 1 communication) threads on {cores} "
                "cores: the thread method's threads share cores",
                flush=True,
            )
        if skip_thread is not None:
            print(f"note: {skip_thread}; skipping it", flush=True)
        if not args.quiet:
            print(f"{LEGEND}\n{HEADER}", flush=True)

    def show(point: Point) -> None:
        print(format_point(point), flush=True)

    base = {"ranks": ranks, "ranks_per_node": per_node, "threads": args.threads}
    # the writer closes on the way out; a failure before its first record removes the
    # header-only file it made, so that the retry needs no --append
    with contextlib.nullcontext() if writer is None else writer:
        points = run_interference(
            comm,
            args.methods,
            args.bytes,
            args.compute_ms,
            policy,
            base,
            writer,
            progress=show if root and not args.quiet else None,
            skip_thread=skip_thread,
        )
    if root and args.quiet:
        print("\n".join([LEGEND, HEADER, *map(format_point, points)]))
    return 0
