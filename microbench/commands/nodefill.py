"""``python -m microbench nodefill``: one core's kernels while k processes of the node run them.

What it measures and why: :mod:`microbench.nodefill`. Records go to ``DIR/nodefill.jsonl``:
benchmark "nodefill", name the kernel ("gemm", "stream", "calls"), params ``procs`` (k),
``launch`` (0, 1, ...: fresh processes each) and ``process`` (0..k-1), every raw sample in
seconds per call. Run it alone, never under ``mpiexec``: it starts its own processes.
"""

from __future__ import annotations

import argparse
import sys

from ..cli import (
    MAX_REPEATS,
    BenchmarkError,
    UsageError,
    add_output_arguments,
    checked_out_dir,
    int_at_least,
    positive_int_list,
    seconds,
)

RECORDS_FILE = "nodefill.jsonl"
BENCHMARK = "nodefill"
DEFAULT_LAUNCHES, QUICK_LAUNCHES = 3, 2
DEFAULT_SECONDS, QUICK_SECONDS = 0.5, 0.25


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "nodefill",
        help="one core's GEMM, stream and small calls while k processes run them at once",
        description="Time a GEMM, a memory-bound stream and a run of small NumPy calls in k "
        "processes at once (one thread each, no MPI), for k = 1, 2, 4, ... up to the cores, "
        "each level in several launches of fresh processes: how much slower one core's work "
        "runs as the node fills.",
    )
    parser.add_argument("--procs", type=positive_int_list, metavar="K,...",
                        help="process counts (default 1, 2, 4, ... up to the cores, and the "
                        "cores)")  # fmt: skip
    parser.add_argument("--launches", type=int_at_least(1, MAX_REPEATS), metavar="N",
                        help=f"launches of fresh processes per count (default "
                        f"{DEFAULT_LAUNCHES}; --quick {QUICK_LAUNCHES})")  # fmt: skip
    parser.add_argument("--seconds", type=seconds, metavar="S",
                        help=f"timed seconds per kernel and launch (default {DEFAULT_SECONDS}; "
                        f"--quick {QUICK_SECONDS})")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="fewer launches, shorter")
    add_output_arguments(parser, RECORDS_FILE)
    return parser


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..cli import under_launcher
    from ..machine import machine_metadata
    from ..measurement import Measurement
    from ..memory import available_memory_bytes
    from ..nodefill import KERNELS, WARMUP_CALLS, NodeFillError, fill, levels, stream_elements
    from ..records import RecordWriter
    from ..reference import DEFAULT_LLC_BYTES, last_level_cache_bytes
    from ..threads import available_cores

    if under_launcher():
        raise UsageError("nodefill starts its own processes: run it without mpiexec")
    cores = available_cores()
    procs = tuple(sorted(args.procs or levels(cores)))  # each shown against the first
    if max(procs) > cores:
        raise UsageError(f"--procs {max(procs)} is more than the {cores} cores here; the "
                         "benchmark measures busy cores, not time-sharing: give at most "
                         f"{cores}")  # fmt: skip
    launches = args.launches or (QUICK_LAUNCHES if args.quick else DEFAULT_LAUNCHES)
    timed_s = args.seconds or (QUICK_SECONDS if args.quick else DEFAULT_SECONDS)
    cache = last_level_cache_bytes() or DEFAULT_LLC_BYTES
    elements = stream_elements(cache, available_memory_bytes(), max(procs))
    out = checked_out_dir(args, RECORDS_FILE)
    settings = {"procs": list(procs), "launches": launches, "seconds": timed_s,
                "kernels": list(KERNELS), "stream_elements": elements,
                "last_level_cache_bytes": cache, "warmup_calls": WARMUP_CALLS,
                "clock": "perf_counter"}  # fmt: skip
    run_info = {"command": "microbench nodefill", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine_metadata(), run_info, append=args.append, sweep=True
    ) as w:
        print(f"nodefill: {', '.join(map(str, procs))} processes x {launches} launches, "
              f"{timed_s:g} s per kernel; records: {w.path}", flush=True)  # fmt: skip
        base: dict[str, float] = {}
        for k in procs:
            medians: dict[str, list[float]] = {name: [] for name in KERNELS}
            slowest: dict[str, list[float]] = {name: [] for name in KERNELS}  # per launch
            for launch in range(launches):
                try:
                    results = fill(k, timed_s, elements)
                except NodeFillError as exc:
                    if k == procs[0] and launch == 0:  # not one record: a failed run, exit 1
                        raise BenchmarkError(f"{exc}; nothing was measured") from None
                    print(f"nodefill: stopped at {k} processes: {exc}; the levels before it are "
                          "kept, and a calibration holds its co-location above them",
                          file=sys.stderr, flush=True)  # fmt: skip
                    return 0
                for process, samples in enumerate(results):
                    for name in KERNELS:
                        params = {"kernel": name, "procs": k, "launch": launch,
                                  "process": process}  # fmt: skip
                        m = Measurement(samples[name], benchmark=BENCHMARK, name=name,
                                        params=params, warmup_discarded=WARMUP_CALLS,
                                        stop_reason="time_cap")  # fmt: skip
                        w.write(m.to_record(clock="perf_counter"))
                        medians[name].append(float(np.median(samples[name])))
                for name in KERNELS:  # this launch's slowest process over its median one
                    launch_medians = medians[name][-len(results) :]
                    slowest[name].append(max(launch_medians) / float(np.median(launch_medians)))
            typical = {name: float(np.median(v)) for name, v in medians.items()}
            base = base or typical
            if not args.quiet:
                cells = ", ".join(f"{n} {1e3 * typical[n]:.3f} ms (x{typical[n] / base[n]:.2f}, "
                                  f"slowest x{float(np.median(slowest[n])):.2f})"
                                  for n in KERNELS)  # fmt: skip
                print(f"nodefill: {k} processes: {cells}", flush=True)
    return 0
