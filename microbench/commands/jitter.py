"""``python -m microbench jitter``: one training step's compute time on every rank at once, a
fixed number of times; records to ``DIR/jitter.jsonl`` (rank 0), a summary at the end."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time

from ..cli import (
    add_output_arguments,
    add_step_arguments,
    add_step_count_arguments,
    agree_on_usage,
    checked_out_dir,
    label_argument,
    start_mpi,
    step_counts,
    thread_level_name,
)
from ..jitter import (
    FULL_SAMPLES,
    FULL_WARMUP,
    QUICK_SAMPLES,
    QUICK_WARMUP,
    JitterSummary,
    format_summary,
    gather_samples,
    jitter_records,
    make_gather,
    make_training_step,
    sample_interleaved,
    sample_steps,
)
from ..memory import activations_problem
from ..workload import Workload

RECORDS_FILE = "jitter.jsonl"
TIMER_SAMPLES = 10_000


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "jitter",
        help="distribution of one training step's compute time on every rank at once",
        description="Time one identical training step (forward, backward, SGD update on a "
        "fixed batch, no communication) on every rank simultaneously, a fixed number of "
        "times after a warm-up; record each rank's raw samples and the per-sample maximum over "
        "ranks, which is what a synchronous data-parallel step pays. With N > 1 the step is also "
        "timed on rank 0 alone (the others idle), in interleaved blocks: the co-location "
        "slowdown. Run it under mpiexec -n N.",
    )
    add_step_arguments(parser, per_rank=True)
    add_step_count_arguments(
        parser, "steps per rank", (FULL_SAMPLES, FULL_WARMUP), (QUICK_SAMPLES, QUICK_WARMUP)
    )
    parser.add_argument(
        "--moment",
        type=label_argument,
        default=None,
        metavar="LABEL",
        help="label of this run in the records, when one step is timed at several moments, "
        "e.g. 'jitter 2 of 3' (calibration takes the typical moment's skew)",
    )
    add_output_arguments(parser, RECORDS_FILE, quiet=False)
    return parser


def run(args: argparse.Namespace) -> int:
    mpi = start_mpi("multiple")

    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..sampling import timer_overhead
    from ..threads import available_cores, oversubscription, set_threads

    comm = mpi.COMM_WORLD
    ranks, root = comm.Get_size(), comm.Get_rank() == 0
    workload: Workload = args.model  # argparse converts the default too
    samples, warmup = step_counts(args, (FULL_SAMPLES, FULL_WARMUP), (QUICK_SAMPLES, QUICK_WARMUP))
    too_big = activations_problem("--batch", (args.batch,), (workload,)) if root else None
    agree_on_usage(comm, too_big)  # rank 0 decides, every rank leaves alike
    out = checked_out_dir(args, RECORDS_FILE, comm)

    set_threads(args.threads)
    machine = machine_metadata(comm=comm, threads=args.threads)  # collective
    per_node = (machine.get("mpi") or {}).get("ranks_per_node") or ranks
    problems = comm.allgather(oversubscription(per_node, args.threads))
    warning = next((p for p in problems if p is not None), None)
    hosts = comm.gather(socket.gethostname(), root=0)
    params = {
        "model": workload.name,
        "batch": args.batch,
        "threads": args.threads,
        "ranks": ranks,
        "ranks_per_node": per_node,
        **({"moment": args.moment} if args.moment is not None else {}),
    }
    settings = {
        **params,
        "workload": workload.to_dict(),
        "samples": samples,
        "warmup": warmup,
        "clock": "perf_counter",
        "cores": available_cores(),
        "oversubscribed": warning is not None,
        "oversubscription_warning": warning,
        "mpi_thread_level": thread_level_name(mpi),
        "quick": args.quick,
    }
    writer = None
    if root:
        run_info = {"command": "microbench jitter", "argv": sys.argv[1:], "settings": settings}
        writer = RecordWriter(out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True)
        print(
            f"jitter: {workload.name} batch {args.batch}, {ranks} rank(s) ({per_node} per node) "
            f"x {args.threads} thread(s), {warmup} warm-up + {samples} samples; "
            f"records: {writer.path}",
            flush=True,
        )
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    # the writer closes on the way out; a failure before its first record removes the
    # header-only file it made, so that the retry needs no --append
    with contextlib.nullcontext() if writer is None else writer:
        step = make_training_step(workload, args.batch)
        gather = make_gather(workload, args.batch)  # untimed before each step, as training
        alone = None
        if ranks > 1:  # also rank 0 alone, interleaved: the co-location slowdown
            local, alone = sample_interleaved(step, samples, warmup, comm, before=gather)
        else:
            local = sample_steps(step, samples, warmup, comm, before=gather)
        table = gather_samples(local, comm)
        if writer is not None:
            extra = {"clock": "perf_counter", "oversubscribed": warning is not None}
            for record in jitter_records(table, params, warmup, hosts, alone, **extra):
                writer.write(record)
            overhead = timer_overhead(time.perf_counter, TIMER_SAMPLES)
            writer.write(overhead.to_record(rank=0, host=hosts[0], ranks=ranks))
            summary = JitterSummary.from_samples(table)
            writer.write(
                {
                    "type": "summary",
                    "benchmark": "jitter",
                    "name": "step_compute",
                    "params": params,
                    **summary.to_dict(),
                    "timer_overhead_median_s": overhead.median,
                }
            )
            print(format_summary(summary, workload.name, args.batch, args.threads))
            print(f"timer overhead: {overhead.median * 1e9:.0f} ns per sample (median)")
    return 0
