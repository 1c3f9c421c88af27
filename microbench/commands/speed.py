"""``python -m microbench speed``: the same training step now, one moment of the machine's speed.

A shared machine does not run at one speed: on this project's VM a neighbour on the same
physical core switches the speed of identical work between two levels about 1.4x apart, every
ten seconds to a minute. A profile fitted from one moment describes whichever level that moment
had. ``pdlsim bench`` therefore runs this command several times, spread over the whole
calibration, each run labelled with ``--moment``: the whole training step (forward, backward,
SGD update on a fixed batch, no communication, :func:`microbench.jitter.make_training_step`)
of every workload at every batch and thread count, a fixed, small number of samples after a
warm-up. Across moments, the median of each step's medians is its typical time and their
spread the machine's speed distribution (:mod:`calibration.drift`).

Records go to ``DIR/speed.jsonl``: benchmark "speed", name "step_compute", params model, batch,
threads and moment, every raw sample.
"""

from __future__ import annotations

import argparse
import sys

from ..cli import (
    add_output_arguments,
    add_workloads_arguments,
    checked_out_dir,
    int_at_least,
    positive_int_list,
)

RECORDS_FILE = "speed.jsonl"
BENCHMARK = "speed"
NAME = "step_compute"
DEFAULT_SAMPLES, DEFAULT_WARMUP = 15, 3


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "speed",
        help="one moment of the machine's speed: the same training step, briefly",
        description="Time each workload's whole training step (forward, backward, SGD update "
        "on a fixed batch, no communication) at each batch and thread count, a fixed number of "
        "times after a warm-up, labelled "
        "with --moment. Run several times, minutes apart, the medians show how the speed of "
        "identical work moves on this machine; pdlsim bench does so during a calibration.",
    )
    add_workloads_arguments(parser, "samples per step, one or more (default 32)")
    parser.add_argument(
        "--threads",
        type=positive_int_list,
        default=(1,),
        metavar="N,...",
        help="BLAS and numba threads, one or more (default 1)",
    )
    parser.add_argument(
        "--samples",
        type=int_at_least(1),
        default=DEFAULT_SAMPLES,
        metavar="N",
        help=f"timed steps per workload (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--warmup",
        type=int_at_least(1),
        default=DEFAULT_WARMUP,
        metavar="N",
        help=f"untimed steps first (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--moment",
        default="speed",
        metavar="LABEL",
        help="label of this moment in the records, e.g. 'check 2 of 4' (default 'speed')",
    )
    add_output_arguments(parser, RECORDS_FILE)
    return parser


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..jitter import make_training_step, sample_steps
    from ..machine import machine_metadata
    from ..measurement import Measurement
    from ..records import RecordWriter
    from ..threads import set_threads

    out = checked_out_dir(args, RECORDS_FILE)
    settings = {
        "models": [w.name for w in args.model],
        "batches": list(args.batch),
        "threads": list(args.threads),
        "samples": args.samples,
        "warmup": args.warmup,
        "moment": args.moment,
        "clock": "perf_counter",
    }
    run_info = {"command": "microbench speed", "argv": sys.argv[1:], "settings": settings}
    machine = machine_metadata(threads=max(args.threads))
    with RecordWriter(out / RECORDS_FILE, machine, run_info, append=args.append) as writer:
        for threads in args.threads:
            set_threads(threads)
            for workload in args.model:
                for batch in args.batch:
                    step = make_training_step(workload, batch)
                    samples = sample_steps(step, args.samples, args.warmup)
                    params = {"model": workload.name, "batch": batch, "threads": threads,
                              "moment": args.moment}  # fmt: skip
                    measurement = Measurement(
                        samples, benchmark=BENCHMARK, name=NAME, params=params,
                        warmup_discarded=args.warmup, stop_reason="max_samples",
                    )  # fmt: skip
                    writer.write(measurement.to_record(clock="perf_counter"))
                    if not args.quiet:
                        print(
                            f"speed ({args.moment}): {workload.name} batch {batch} x {threads} "
                            f"thread(s): median {np.median(samples) * 1e3:.3f} ms over "
                            f"{args.samples} steps",
                            flush=True,
                        )
    return 0
