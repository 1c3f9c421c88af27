"""``python -m microbench speed``: the same training step now, one moment of the machine's speed.

A shared machine does not run at one speed: a neighbour on the same physical core can switch the
speed of identical work between levels tens of percent apart, every few seconds to a minute
(evidence: docs/evidence.md, "Drift"). A profile fitted from one moment describes whichever
level that moment had. ``pdlsim bench`` therefore runs this command several times, spread over
the whole calibration, each run labelled with ``--moment``: the whole training step (forward,
backward, SGD update on a fixed batch, no communication,
:func:`microbench.jitter.make_step_pair`) of every workload at every batch and thread count, a
fixed, small number of samples after a warm-up, each after an untimed mini-batch gather as in
training (:func:`microbench.jitter.make_gather`: without it a small network's step runs a few
percent faster than ``pdlsim train``'s, and every prediction built on it). Across moments, the
median of each step's medians is its typical time and their spread the machine's speed
distribution (:mod:`calibration.drift`).

The forward-only step (forward and loss, what ``pdlsim train --inference`` computes) is timed
with it, in alternation on the same network, in blocks of :data:`BLOCK` calls of each, each
block after untimed calls (:data:`SETTLE`: one training step, five forward passes): the two
medians of one moment saw the same speed, so their ratio holds whatever the speed was, and
across moments its median is the forward-only step's share of the training step
(:meth:`calibration.drift.DriftModel.forward_fraction`). The untimed calls matter: the
forward passes right after a training step still run several percent slower than a forward
loop, which is how ``pdlsim train --inference`` runs, so one untimed forward pass is not enough
and the share would come out too high. Timed in separate runs seconds apart, the two can land
on different speed levels of a shared machine, and their ratio mixes the speed with the work.
Alternated call for call, each forward pass runs right after a training step's backward and
update have evicted its weights, and the share comes out above both the compute stage's and
the trainer's forward-only loop's (evidence: docs/evidence.md, "Speed checks").

With ``--gpu-batch`` the same pair is timed on the GPU (CuPy arrays, one host thread, each call
ending with the device synchronised, on the host's clock) at those batches: a small network's
GPU step is the host launching kernels, and its speed drifts with the host's (by tens of
percent between calibrations; evidence: docs/evidence.md, "Drift"), so
``pdlsim validate`` times it between its GPU launches as it times the CPU steps.

Records go to ``DIR/speed.jsonl``: benchmark "speed", name "step_compute" (the training step)
and "forward_compute" (the forward-only step), params model, batch, threads, device ("cpu" or
"gpu"; GPU records carry threads 1) and moment, every raw sample.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..cli import (
    MAX_REPEATS,
    UsageError,
    add_output_arguments,
    add_workloads_arguments,
    checked_out_dir,
    int_at_least,
    label_argument,
    positive_int_list,
)
from ..memory import activations_problem

if TYPE_CHECKING:
    import numpy as np

    from ..gpu import Gpu
    from ..workload import Workload

RECORDS_FILE = "speed.jsonl"
BENCHMARK = "speed"
DEFAULT_SAMPLES, DEFAULT_WARMUP = 15, 3
BLOCK = 3  # timed calls of one step in a row (module docstring)
SETTLE = (1, 5)  # untimed calls before each block: training step, forward-only (docstring)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "speed",
        help="one moment of the machine's speed: the same training step, briefly",
        description="Time each workload's whole training step (forward, backward, SGD update "
        "on a fixed batch, no communication, each after an untimed mini-batch gather) and, in "
        "alternation with it, its forward-only step "
        "at each batch and thread count, a fixed number of times after a warm-up, labelled "
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
        "--gpu-batch",
        type=positive_int_list,
        default=(),
        metavar="B,...",
        help="also time each workload's steps on the GPU (CuPy) at these batches; an error "
        "without a GPU (default: none)",
    )
    parser.add_argument(
        "--samples",
        type=int_at_least(1, MAX_REPEATS),
        default=DEFAULT_SAMPLES,
        metavar="N",
        help=f"timed steps per workload (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--warmup",
        type=int_at_least(1, MAX_REPEATS),
        default=DEFAULT_WARMUP,
        metavar="N",
        help=f"untimed steps first (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--moment",
        type=label_argument,
        default="speed",
        metavar="LABEL",
        help="label of this moment in the records, e.g. 'check 2 of 4' (default 'speed')",
    )
    add_output_arguments(parser, RECORDS_FILE)
    return parser


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..jitter import FORWARD_NAME, NAME
    from ..machine import machine_metadata
    from ..measurement import Measurement
    from ..records import RecordWriter
    from ..threads import oversubscription, set_threads

    gpu = None
    if args.gpu_batch:
        from ..gpu import find_gpu

        gpu, why = find_gpu()
        if gpu is None:
            raise UsageError(f"--gpu-batch: no GPU ({why}); leave --gpu-batch out")
    problem = activations_problem("--batch", args.batch, args.model)
    if problem is not None:
        raise UsageError(problem)
    out = checked_out_dir(args, RECORDS_FILE)
    warning = oversubscription(1, max(args.threads))
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    settings = {
        "models": [w.name for w in args.model],
        "batches": list(args.batch),
        "gpu_batches": list(args.gpu_batch),
        "threads": list(args.threads),
        "samples": args.samples,
        "warmup": args.warmup,
        "moment": args.moment,
        "block": BLOCK,
        "settle": list(SETTLE),
        "clock": "perf_counter",
        "oversubscribed": warning is not None,
    }
    run_info = {"command": "microbench speed", "argv": sys.argv[1:], "settings": settings}
    machine = machine_metadata(threads=max(args.threads))
    # (device, threads, batches): the CPU at every thread count, then the GPU on one thread
    runs = [("cpu", t, args.batch) for t in args.threads]
    runs += [("gpu", 1, args.gpu_batch)] if gpu is not None else []
    with RecordWriter(
        out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True
    ) as writer:
        for device, threads, batches in runs:
            set_threads(threads)
            for workload in args.model:
                for batch in batches:
                    on = gpu if device == "gpu" else None
                    timed = _timed_pair(workload, batch, on, args.samples, args.warmup)
                    params = {"model": workload.name, "batch": batch, "threads": threads,
                              "device": device, "moment": args.moment}  # fmt: skip
                    for name, samples in zip((NAME, FORWARD_NAME), timed, strict=True):
                        measurement = Measurement(
                            samples, benchmark=BENCHMARK, name=name, params=params,
                            warmup_discarded=args.warmup, stop_reason="max_samples",
                        )  # fmt: skip
                        writer.write(measurement.to_record(clock="perf_counter"))
                    if not args.quiet:
                        step_ms, forward_ms = (np.median(t) * 1e3 for t in timed)
                        where = "on the GPU" if device == "gpu" else f"x {threads} thread(s)"
                        print(
                            f"speed ({args.moment}): {workload.name} batch {batch} {where}: "
                            f"median {step_ms:.3f} ms over {args.samples} steps, "
                            f"forward only {forward_ms:.3f} ms",
                            flush=True,
                        )
            if device == "gpu":
                gpu.release_pools()
    return 0


def _timed_pair(
    workload: Workload, batch: int, gpu: Gpu | None, samples: int, warmup: int
) -> list[np.ndarray]:
    """The training step and the forward-only step of ``workload`` at ``batch``, timed in
    alternation (module docstring): on the host, each call after a mini-batch gather, or on
    ``gpu``, where the trainer's gather and copy are not the device's compute."""
    from ..jitter import make_gather, make_step_pair, sample_alternating

    if gpu is None:
        pair, gather = make_step_pair(workload, batch), make_gather(workload, batch)
    else:
        pair = make_step_pair(workload, batch, xp=gpu.cupy, synchronize=gpu.synchronize)
        gather = None
    return sample_alternating(pair, samples, warmup, block=BLOCK, settle=SETTLE, before=gather)
