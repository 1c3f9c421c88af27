"""``python -m microbench power``: idle and busy watts per energy domain (RAPL sockets, DRAM,
NVML GPUs) and joules per training sample; records to ``DIR/power.jsonl``.

Idle: the process sleeps for ``--idle-seconds`` while the counters run (what the machine burns
doing nothing: other tenants and daemons included, so run it on a quiet node). Busy: the
workload's real training step (forward, backward, update on a fixed batch, as the jitter
benchmark runs it) back to back at ``--threads`` threads for ``--busy-seconds``. Both are
sampled in intervals of ``--interval`` seconds; every interval's watts is a raw sample.

The step runs on the CPU (numpy/numba), so a GPU's "busy" figure is that of a GPU left idle
while the host trains: its idle watts are the figure to use.

One process: RAPL counters are per socket and NVML's per GPU, shared by every process on the
node, so several launched processes would each count the others' energy. Load more cores with
``--threads``. Without readable counters (no powercap tree, ``energy_uj`` readable by root only,
no pynvml or GPU) it says why and exits 0 without writing anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cli import (
    UsageError,
    add_output_arguments,
    add_step_arguments,
    checked_out_dir,
    path_argument,
    seconds,
)
from ..memory import activations_problem
from ..power import EnergyReading

if TYPE_CHECKING:
    from ..power import EnergyMeter

RECORDS_FILE = "power.jsonl"
WARMUP_STEPS = 3
_SIZE_ENV_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
FULL = {"idle_seconds": 10.0, "busy_seconds": 20.0, "interval": 1.0}
QUICK = {"idle_seconds": 2.0, "busy_seconds": 3.0, "interval": 0.5}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..power import RAPL_ROOT

    parser = subparsers.add_parser(
        "power",
        help="idle and busy watts (RAPL, NVML) and joules per training sample",
        description="Read the energy counters (RAPL per CPU socket and DRAM, NVML per GPU) "
        "while idle and while running the workload's training step back to back; record watts "
        "per interval and joules per sample. One process; needs readable counters (RAPL's "
        "energy_uj is root-only since Linux 5.10).",
    )
    add_step_arguments(parser)
    for name, what in (("idle", "sleeping"), ("busy", "training")):
        parser.add_argument(
            f"--{name}-seconds",
            type=seconds,
            metavar="S",
            help=f"seconds {what} (default {FULL[name + '_seconds']:g}, --quick "
            f"{QUICK[name + '_seconds']:g})",
        )
    parser.add_argument(
        "--interval",
        type=seconds,
        metavar="S",
        help=f"seconds per sample (default {FULL['interval']:g}, --quick {QUICK['interval']:g})",
    )
    parser.add_argument("--quick", action="store_true", help="short phases, for a first look")
    parser.add_argument(
        "--powercap-root",
        type=path_argument,
        default=RAPL_ROOT,
        metavar="DIR",
        help=f"where the powercap tree is ({RAPL_ROOT}; another path for a bind-mounted /sys)",
    )
    parser.add_argument("--no-nvml", dest="nvml", action="store_false", help="skip the GPUs")
    add_output_arguments(parser, RECORDS_FILE, quiet=False)
    return parser


def _setting(args: argparse.Namespace, name: str) -> float:
    value = getattr(args, name)
    return value if value is not None else (QUICK if args.quick else FULL)[name]


def run(args: argparse.Namespace) -> int:
    for var in _SIZE_ENV_VARS:
        if os.environ.get(var, "1") not in ("", "1"):
            raise UsageError(
                "power runs as one process (the counters are per node, shared by every "
                "process): launch it without mpiexec and load cores with --threads"
            )
    from ..power import EnergyMeter

    meter = EnergyMeter.open(args.powercap_root, use_nvml=args.nvml)
    try:
        if not meter.available:
            print(f"power: {meter.explain()}; nothing measured, nothing written")
            return 0
        return _measure(args, meter)
    finally:
        meter.close()


def _measure(args: argparse.Namespace, meter: EnergyMeter) -> int:
    from ..jitter import make_training_step
    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..threads import set_threads

    idle_s, busy_s = _setting(args, "idle_seconds"), _setting(args, "busy_seconds")
    interval_s = _setting(args, "interval")
    problem = activations_problem("--batch", (args.batch,), (args.model,))
    if problem is not None:
        raise UsageError(problem)
    out = checked_out_dir(args, RECORDS_FILE)
    set_threads(args.threads)
    counters = {"domains": meter.methods, "problems": meter.problems}
    machine = machine_metadata(threads=args.threads, extra={"energy_counters": counters})
    params = {"model": args.model.name, "batch": args.batch, "threads": args.threads}
    settings = {
        **params,
        "workload": args.model.to_dict(),
        "idle_seconds": idle_s,
        "busy_seconds": busy_s,
        "interval_s": interval_s,
        "warmup_steps": WARMUP_STEPS,
        "powercap_root": str(args.powercap_root),
        "nvml": args.nvml,
        "quick": args.quick,
    }
    run_info = {"command": "microbench power", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True
    ) as writer:
        print(
            f"power: {meter.explain()}; idle {idle_s:g} s, then {args.model.name} batch "
            f"{args.batch} x {args.threads} thread(s) for {busy_s:g} s; records: {writer.path}",
            flush=True,
        )
        idle = sample_energy(meter, idle_s, interval_s)
        step = make_training_step(args.model, args.batch)
        for _ in range(WARMUP_STEPS):
            step()
        busy = sample_energy(meter, busy_s, interval_s, work=step)
        for record in power_records(idle, busy, params, args.batch, meter.methods, WARMUP_STEPS):
            writer.write(record)
        summary = power_summary(idle, busy, params, args.batch, meter.methods)
        writer.write(summary)
    print(format_power(summary))
    return 0


@dataclass(frozen=True)
class IntervalSample:
    """One polling interval: its energy and how many times the work ran in it."""

    reading: EnergyReading
    calls: int


def sample_energy(
    meter: EnergyMeter,
    seconds: float,
    interval_s: float,
    work: Callable[[], object] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> list[IntervalSample]:
    """Energy in consecutive intervals of about ``interval_s`` for about ``seconds`` in all.

    Idle (``work`` None): sleep through each interval. Busy: call ``work`` back to back until
    the interval has passed (an interval ends after the call that crosses it, so it may run
    longer by one call), then read. At least one interval; ``meter.clock`` is the clock.
    """
    if seconds <= 0 or interval_s <= 0:
        raise ValueError(f"seconds and interval_s must be > 0, got {seconds} and {interval_s}")
    intervals = max(1, round(seconds / interval_s))
    meter.start()
    out = []
    for _ in range(intervals):
        calls = 0
        if work is None:
            sleep(interval_s)
        else:
            end = meter.clock() + interval_s
            while True:
                work()
                calls += 1
                if meter.clock() >= end:
                    break
        out.append(IntervalSample(meter.poll(), calls))
    meter.stop()
    return out


def _total_w(sample: IntervalSample) -> float:
    return sample.reading.total_j / sample.reading.elapsed_s


def _domain_watts(samples: list[IntervalSample], domain: str) -> list[float]:
    if domain == "total":
        return [_total_w(s) for s in samples]
    return [s.reading.watts[domain] for s in samples]


def _has_total(methods: dict[str, str], samples: list[IntervalSample]) -> bool:
    return any(samples[0].reading.in_total.get(d, False) for d in methods)


def power_records(
    idle: list[IntervalSample],
    busy: list[IntervalSample],
    params: dict[str, Any],
    batch: int,
    methods: dict[str, str],
    warmup_steps: int,
) -> list[dict[str, Any]]:
    """Measurement records: watts per interval for each domain (and the "total" of those that
    add up) idle and busy, then joules per training sample per busy interval (total)."""
    from ..measurement import Measurement

    domains = list(methods) + (["total"] if _has_total(methods, busy) else [])
    records = []
    for phase, samples in (("idle", idle), ("busy", busy)):
        for domain in domains:
            measurement = Measurement(
                _domain_watts(samples, domain),
                benchmark="power",
                name=f"{phase}_power",
                params={**params, "phase": phase, "domain": domain},
                unit="W",
                warmup_discarded=warmup_steps if phase == "busy" else 0,
                stop_reason="time",
            )
            method = methods.get(domain, "sum of the domains that add up")
            steps = [s.calls for s in samples] if phase == "busy" else None
            intervals = [s.reading.elapsed_s for s in samples]
            records.append(measurement.to_record(method=method, intervals_s=intervals, steps=steps))
    if "total" in domains:
        per_sample = [s.reading.total_j / (s.calls * batch) for s in busy]
        measurement = Measurement(
            per_sample,
            benchmark="power",
            name="busy_energy_per_sample",
            params={**params, "phase": "busy", "domain": "total"},
            unit="J",
            warmup_discarded=warmup_steps,
            stop_reason="time",
        )
        records.append(measurement.to_record(steps=[s.calls for s in busy]))
    return records


def _median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values))


def power_summary(
    idle: list[IntervalSample],
    busy: list[IntervalSample],
    params: dict[str, Any],
    batch: int,
    methods: dict[str, str],
) -> dict[str, Any]:
    """Median watts per domain idle and busy, and the busy joules per sample (medians over
    intervals); "total" is None when no readable domain adds up (psys or core alone)."""
    in_total = busy[0].reading.in_total
    domains = {
        d: {
            "method": m,
            "in_total": in_total.get(d, False),
            "idle_w": _median(_domain_watts(idle, d)),
            "busy_w": _median(_domain_watts(busy, d)),
        }
        for d, m in methods.items()
    }
    has_total = _has_total(methods, busy)
    busy_s = sum(s.reading.elapsed_s for s in busy)
    steps = sum(s.calls for s in busy)
    return {
        "type": "summary",
        "benchmark": "power",
        "params": params,
        "domains": domains,
        "idle_w": _median(_domain_watts(idle, "total")) if has_total else None,
        "busy_w": _median(_domain_watts(busy, "total")) if has_total else None,
        "busy_j_per_sample": _median([s.reading.total_j / (s.calls * batch) for s in busy])
        if has_total
        else None,
        "busy_steps": steps,
        "busy_samples_per_s": steps * batch / busy_s,
    }


def format_power(summary: dict[str, Any]) -> str:
    """The summary as a small table (medians over intervals)."""
    p = summary["params"]
    lines = [
        f"power of {p['model']} batch {p['batch']} x {p['threads']} thread(s), medians over "
        "intervals",
        f"{'domain':<20}{'idle W':>10}{'busy W':>10}{'busy-idle W':>13}",
    ]
    rows = [(d, v["idle_w"], v["busy_w"]) for d, v in summary["domains"].items()]
    if summary["idle_w"] is not None:
        rows.append(("total", summary["idle_w"], summary["busy_w"]))
    for name, idle_w, busy_w in rows:
        lines.append(f"{name:<20}{idle_w:>10.2f}{busy_w:>10.2f}{busy_w - idle_w:>13.2f}")
    if any(d.startswith("gpu-") for d in summary["domains"]):
        lines.append("GPUs: the step runs on the CPU; their busy figure is not GPU-busy")
    if summary["busy_j_per_sample"] is not None:
        lines.append(
            f"busy: {summary['busy_j_per_sample'] * 1e3:.3f} mJ per training sample "
            f"({summary['busy_samples_per_s']:,.0f} samples/s)"
        )
    return "\n".join(lines)
