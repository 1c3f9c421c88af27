"""``python -m microbench insitu``: collectives timed inside real training steps
(:mod:`microbench.insitu`); records to ``DIR/insitu.jsonl`` (rank 0)."""

from __future__ import annotations

import argparse
import socket
import sys
from functools import partial

from ..cli import (
    UsageError,
    add_output_arguments,
    add_step_count_arguments,
    add_workloads_arguments,
    checked_out_dir,
    int_at_least,
    start_mpi,
    step_counts,
)

RECORDS_FILE = "insitu.jsonl"
DEFAULT_SAMPLES, DEFAULT_WARMUP = 100, 10
QUICK_SAMPLES, QUICK_WARMUP = 20, 5
ROUNDS, QUICK_ROUNDS = 5, 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "insitu",
        help="collectives timed inside real training steps (data and layer-wise parallel)",
        description="Run each workload's data-parallel training step (gradient allreduce) and "
        "its layer-wise model-parallel step (an allgather per split dense layer, an allreduce "
        "per input gradient) and that step's forward pass alone on every rank, and time each "
        "collective where training calls it: after the layers' compute, not back to back. "
        "Records every rank's seconds per call and the per-step minimum over ranks (the "
        "collective's own cost, without waiting), and rank 0's compute of each step alone "
        "while the other ranks idle (the co-location in place). Run it under mpiexec -n N "
        "with N >= 2.",
    )
    add_workloads_arguments(
        parser, "samples per step, one or more (default 32; model parallelism's batch is shared)"
    )
    parser.add_argument(
        "--threads",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="BLAS and numba threads per rank (default 1)",
    )
    add_step_count_arguments(
        parser,
        "steps per workload and batch",
        (DEFAULT_SAMPLES, DEFAULT_WARMUP),
        (QUICK_SAMPLES, QUICK_WARMUP),
    )
    parser.add_argument(
        "--rounds",
        type=int_at_least(1),
        metavar="R",
        help="spread each step's samples over R rounds through every workload and batch, "
        "each after its own warm-up, so that they see several moments of the machine "
        f"(default {ROUNDS}, --quick {QUICK_ROUNDS}; at most one per sample)",
    )
    add_output_arguments(parser, RECORDS_FILE)
    return parser


def run(args: argparse.Namespace) -> int:
    mpi = start_mpi("multiple")

    import numpy as np

    from ..insitu import (
        MODEL_INFERENCE,
        alone_record,
        data_parallel_pair,
        gather_calls,
        insitu_records,
        layerwise_pair,
        sample_rounds,
        split_rounds,
        splittable,
    )
    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..threads import oversubscription, set_threads

    comm = mpi.COMM_WORLD
    ranks, root = comm.Get_size(), comm.Get_rank() == 0
    if ranks < 2:
        raise UsageError(
            "insitu times collectives between ranks: run it under mpiexec -n N with N >= 2"
        )
    samples, warmup = step_counts(
        args, (DEFAULT_SAMPLES, DEFAULT_WARMUP), (QUICK_SAMPLES, QUICK_WARMUP)
    )
    rounds = len(split_rounds(samples, args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)))
    out = checked_out_dir(args, RECORDS_FILE, comm)
    set_threads(args.threads)
    machine = machine_metadata(comm=comm, threads=args.threads)  # collective
    per_node = (machine.get("mpi") or {}).get("ranks_per_node") or ranks
    warning = next((w for w in comm.allgather(oversubscription(per_node, args.threads)) if w), None)
    hosts = comm.gather(socket.gethostname(), root=0)
    settings = {
        "models": [w.name for w in args.model], "batches": list(args.batch),
        "threads": args.threads, "ranks": ranks, "ranks_per_node": per_node,
        "samples": samples, "warmup": warmup, "rounds": rounds, "clock": "perf_counter",
        "oversubscribed": warning is not None, "quick": args.quick,
    }  # fmt: skip
    writer = None
    if root:
        run_info = {"command": "microbench insitu", "argv": sys.argv[1:], "settings": settings}
        writer = RecordWriter(out / RECORDS_FILE, machine, run_info, append=args.append)
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    try:
        points = []  # (params, (step, what rank 0 times alone), parallel) in record order
        for workload in args.model:
            makers = [("data", data_parallel_pair)]
            if splittable(workload, ranks):
                makers.append(("model", layerwise_pair))
                makers.append((MODEL_INFERENCE, partial(layerwise_pair, inference=True)))
            elif root and not args.quiet:
                why = f"a dense layer has fewer neurons than {ranks} ranks (or there is none)"
                print(f"insitu: {workload.name}: {why}; model parallelism skipped", flush=True)
            for batch in args.batch:
                params = {"model": workload.name, "batch": batch, "threads": args.threads,
                          "ranks": ranks, "ranks_per_node": per_node, "rounds": rounds}  # fmt: skip
                points += [(params, make(workload, batch, comm), p) for p, make in makers]
        timed = sample_rounds(
            [(pair[0], p) for _, pair, p in points], samples, warmup, rounds, comm,
            alone=[pair[1] for _, pair, _ in points],
        )  # fmt: skip
        for (params, _, parallel), (calls, local, alone) in zip(points, timed, strict=True):
            table = gather_calls(local, comm)
            if writer is None:
                continue
            for record in insitu_records(calls, table, params, warmup * rounds, hosts):
                writer.write(record)
            for statistic, samples_s in alone.items():
                point = {**params, "parallel": parallel}
                writer.write(alone_record(samples_s, point, hosts[0], statistic))
            if not args.quiet:
                own = np.median(table.min(axis=0), axis=0)
                shown = ", ".join(
                    f"{c.op} {c.layer}{f' {c.nbytes} B' * (c.op != 'compute')} {t * 1e6:.1f} us"
                    for c, t in zip(calls, own, strict=True)
                )
                print(f"insitu: {params['model']} batch {params['batch']} {parallel}: {shown}",
                      flush=True)  # fmt: skip
    finally:
        if writer is not None:
            writer.close()
    return 0
