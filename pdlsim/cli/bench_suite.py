"""``pdlsim bench``: the whole microbenchmark suite, one ``python -m microbench`` run per stage.

Each stage is the command a user would run on a cluster by hand (``mpiexec -n P python -m
microbench collectives ...``), so what ``pdlsim bench`` measures here is what a batch job
measures there. Records go to one run directory, one subdirectory per process count
(``ranks1/compute.jsonl``, ``ranks2/collectives.jsonl`` ...), so that every file's header
(ranks, ranks per node, threads) is true for the points in it; ``load_dataframe(run_dir)``
reads them all. Each stage's own output goes to ``logs/<stage>.log``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from microbench.cpustat import cpu_times, steal_fraction
from microbench.errors import UserError
from microbench.fileio import atomic_write_text, check_writable
from microbench.jitter import FULL_SAMPLES
from microbench.threads import available_cores, oversubscription, thread_env
from pdlsim.train.launch import mpiexec_command, run_supervised

PLAN_FILE = "bench.json"
# The jitter step at P >= 2 is timed at this many moments of the bench (one with --quick): a
# run of it sees one moment of a machine whose noise comes and goes, and calibration takes
# the typical moment's skew (calibration.jitter).
JITTER_MOMENTS = 3


@dataclass(frozen=True)
class BenchPlan:
    out: Path
    model: str = "mlp,cnn"  # comma-separated workloads
    procs: tuple[int, ...] = (1, 2)
    threads: tuple[int, ...] = (1, 2)
    batches: tuple[int, ...] = (16, 32, 64)  # per-rank batches the compute kernels are timed at
    quick: bool = False
    gpu_batches: tuple[int, ...] | None = None  # on a GPU (None: microbench compute's default)
    skip: tuple[str, ...] = ()  # one-process stages not to run: kernels, copies, compression,
    # storage, nodefill (pdlsim.cli.bench.SKIPPABLE)

    @property
    def jitter_batch(self) -> int:
        """The batch of the jitter (and co-location) steps: the middle one."""
        return sorted(self.batches)[len(self.batches) // 2]


@dataclass(frozen=True)
class Stage:
    name: str  # also the log file's name
    label: str  # what the progress line says
    command: tuple[str, ...]
    ranks: int
    threads: int


@dataclass
class StageResult:
    name: str
    label: str
    status: str  # "ok", "failed (exit N)"
    time_s: float
    log: str
    steal: float | None = None  # share of CPU time the hypervisor took meanwhile (cpustat)


@dataclass
class BenchResult:
    plan: BenchPlan
    stages: list[StageResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(stage.status == "ok" for stage in self.stages)


def _microbench(*args: str) -> list[str]:
    return ["-m", "microbench", *args]


def _csv(values: Iterable[int]) -> str:
    return ",".join(map(str, values))


def _jitter_stages(
    plan: BenchPlan, procs: int, models: list[str], threads: int, moment: tuple[int, int]
) -> list[Stage]:
    """The jitter step of every model at ``procs`` ranks, moment k of n (n > 1: labelled, and
    each with 1/n of the samples, so that the n moments together take one run's)."""
    k, n = moment
    out = str(plan.out / f"ranks{procs}")
    quick = ["--quick"] if plan.quick else []
    label = (
        [] if n == 1 else ["--moment", f"jitter {k} of {n}", "--samples", str(FULL_SAMPLES // n)]
    )
    suffix = "" if n == 1 else f"-m{k}"
    return [
        Stage(
            f"jitter-p{procs}-{Path(model).stem}{suffix}",
            f"step jitter of {model} at {procs} rank(s) x {threads} thread(s)"
            + ("" if n == 1 else f", moment {k} of {n}"),
            tuple(
                mpiexec_command(
                    procs,
                    _microbench(
                        "jitter",
                        *("--model", model, "--batch", str(plan.jitter_batch)),
                        *("--threads", str(threads), "--out", out, *quick, *label),
                        *(["--append"] if i or k > 1 else []),
                    ),
                )
            ),
            ranks=procs,
            threads=threads,
        )
        for i, model in enumerate(models)
    ]


def plan_stages(plan: BenchPlan) -> list[Stage]:
    """The stages, in the order they run: compute and copies on one process, then per P
    collectives and per model the jitter step (the same step at every P: its slowdown from one
    rank to P is the co-location factor)."""
    quick = ["--quick"] if plan.quick else []
    threads, batches = _csv(plan.threads), _csv(plan.batches)
    models = [m for m in plan.model.split(",") if m]
    ranks1 = str(plan.out / "ranks1")
    kernels = Stage(
        "kernels",
        f"kernel sweep (GEMMs, loops, steps) at {threads} thread(s)",
        (
            sys.executable,
            *_microbench("kernels", "--threads", threads, "--out", ranks1, "--quiet", *quick),
        ),
        ranks=1,
        threads=max(plan.threads),
    )
    stages = [] if "kernels" in plan.skip else [kernels]
    stages += [
        Stage(
            "compute",
            f"compute kernels of {plan.model} at {threads} thread(s)",
            (
                sys.executable,
                *_microbench("compute", "--model", plan.model, "--threads", threads),
                *("--batch", batches, "--out", ranks1, *quick),
                *(("--gpu-batch", _csv(plan.gpu_batches)) if plan.gpu_batches else ()),
            ),
            ranks=1,
            threads=max(plan.threads),
        ),
    ]
    for name, label in (
        ("copies", "host<->device copies"),
        ("compression", "gradient compression (fp16, top-k)"),
        ("storage", "checkpoint writes (atomic, fsynced) into the run directory"),
        ("nodefill", "one core's kernels as the node fills (1 process to every core)"),
    ):  # one process, one thread (nodefill starts its own), records into ranks1/
        if name in plan.skip:
            continue
        command = (sys.executable, *_microbench(name, "--out", ranks1, *quick))
        stages.append(Stage(name, label, command, ranks=1, threads=1))
    jitter_threads = min(plan.threads)
    speed_checks = [len(stages)]  # after the one-process stages, after each P, at the end
    for procs in plan.procs:
        out = str(plan.out / f"ranks{procs}")
        stages.append(
            Stage(
                f"collectives-p{procs}",
                f"MPI collectives at {procs} rank(s)",
                tuple(mpiexec_command(procs, _microbench("collectives", "--out", out, *quick))),
                ranks=procs,
                threads=1,
            )
        )
        moments = JITTER_MOMENTS if procs >= 2 and not plan.quick else 1
        stages += _jitter_stages(plan, procs, models, jitter_threads, (1, moments))
        if moments > 1:
            stages += _jitter_stages(plan, procs, models, jitter_threads, (2, moments))
        speed_checks.append(len(stages))
    overlap_procs = max(plan.procs)
    if overlap_procs >= 2:
        out = str(plan.out / f"ranks{overlap_procs}")
        stages.append(
            Stage(
                f"interference-p{overlap_procs}",
                f"allreduce/compute interference at {overlap_procs} ranks",
                tuple(
                    mpiexec_command(
                        overlap_procs, _microbench("interference", "--out", out, *quick)
                    )
                ),
                ranks=overlap_procs,
                threads=1,
            )
        )
    for procs in plan.procs:  # the last moment of the jitter at P >= 2, after everything
        if procs >= 2 and JITTER_MOMENTS > 2 and not plan.quick:
            stages += _jitter_stages(
                plan, procs, models, jitter_threads, (JITTER_MOMENTS, JITTER_MOMENTS)
            )
    speed_checks.append(len(stages))  # and one after everything else
    if plan.quick:  # the first and the last: the spread of two moments, in half the time
        speed_checks = [speed_checks[0], speed_checks[-1]]
    gpu_batches = _gpu_batches(plan)  # looked for once, not per check
    for k, at in reversed(list(enumerate(sorted(set(speed_checks)), start=1))):
        stages.insert(at, _speed_stage(plan, k, len(set(speed_checks)), gpu_batches))
    return stages


def speed_command(
    models: str,
    batches: tuple[int, ...],
    moment: str,
    out: Path,
    append: bool,
    quick: bool = False,
    threads: tuple[int, ...] = (1,),
    gpu_batches: tuple[int, ...] = (),
) -> list[str]:
    """``python -m microbench speed`` for the steps of ``models`` at ``batches`` and ``threads``
    (and on the GPU at ``gpu_batches``), labelled ``moment``, into ``out/speed.jsonl``: the
    bench's checks and validate's use it. Every thread count the compute stage times, so that
    each of its steps gets its own typical time (:mod:`calibration.drift`): a step at more
    threads (on a small VM, every core) does not move with the 1-thread step, so a single
    compute moment would set its rows at whatever speed that moment had (evidence:
    docs/evidence.md, "Drift")."""
    return [
        sys.executable, *_microbench(
            "speed", "--model", models, "--batch", _csv(batches),
            "--threads", _csv(threads), "--moment", moment, "--out", str(out),
            *(["--gpu-batch", _csv(gpu_batches)] if gpu_batches else []),
            *(["--samples", "8"] if quick else []), *(["--append"] if append else []),
        ),
    ]  # fmt: skip


def _speed_stage(plan: BenchPlan, k: int, of: int, gpu_batches: tuple[int, ...]) -> Stage:
    """The compute stage's steps (every model and batch), briefly: moment ``k`` of ``of`` of
    the machine's speed (:func:`speed_command`; :mod:`calibration.drift` takes each step's
    typical time and the speed's spread from these moments)."""
    moment = f"check {k} of {of}"
    threads = tuple(plan.threads)
    command = speed_command(
        plan.model, plan.batches, moment, plan.out / "ranks1", k > 1, plan.quick, threads,
        gpu_batches,
    )  # fmt: skip
    return Stage(f"speed-{k}", f"machine speed now ({moment})", tuple(command), 1, max(threads))


def _gpu_batches(plan: BenchPlan) -> tuple[int, ...]:
    """The batches the compute stage times on a GPU, where one is found (none otherwise): the
    speed checks time the GPU steps there too (:mod:`calibration.drift`)."""
    from microbench.compute import GPU_BATCHES
    from microbench.gpu import find_gpu

    if find_gpu()[0] is None:
        return ()
    return tuple(plan.gpu_batches or GPU_BATCHES)


def check_out_dir(out: Path) -> None:
    """Refuse an output that is a file or a directory that already holds records."""
    check_writable(out, "dir", "--out", "for the benchmark records")
    if out.is_dir() and any(out.rglob("*.jsonl")):
        raise UserError(
            f"--out {out} already holds records; choose a new directory (nothing is overwritten)"
        )


def oversubscription_warnings(stages: list[Stage], cores: int) -> list[str]:
    """One line per distinct ranks x threads configuration that exceeds the cores."""
    warnings: list[str] = []
    for stage in stages:
        warning = oversubscription(stage.ranks, stage.threads, cores)
        if warning and warning not in warnings:
            warnings.append(warning)
    return warnings


def run_bench(plan: BenchPlan, progress: TextIO = sys.stderr) -> BenchResult:
    """Run every stage, logging each; a failed stage is reported and the rest still run."""
    check_out_dir(plan.out)
    stages = plan_stages(plan)
    result = BenchResult(plan=plan, warnings=oversubscription_warnings(stages, available_cores()))
    for warning in result.warnings:
        print(f"pdlsim: warning: {warning}", file=progress)
    logs = plan.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    _save(result, stages)
    for number, stage in enumerate(stages, start=1):
        _progress_line(progress, number, len(stages), stage.label, None)
        log = logs / f"{stage.name}.log"
        started, before = time.perf_counter(), cpu_times()
        env = {**os.environ, **thread_env(stage.threads)}
        with log.open("w") as handle:
            status = run_supervised(stage.command, env=env, stdout=handle, stderr=handle)
        elapsed = time.perf_counter() - started
        outcome = "ok" if status == 0 else f"failed (exit {status})"
        steal = steal_fraction(before, cpu_times())
        result.stages.append(
            StageResult(stage.name, stage.label, outcome, elapsed, str(log), steal)
        )
        shown = outcome if steal is None or steal < 0.05 else f"{outcome} ({steal:.0%} CPU stolen)"
        _progress_line(progress, number, len(stages), stage.label, (shown, elapsed))
        if status != 0:
            tail = log.read_text().strip().splitlines()[-3:]
            for line in tail:
                print(f"    {line}", file=progress)
        _save(result, stages)
    return result


def _progress_line(
    out: TextIO, number: int, total: int, label: str, done: tuple[str, float] | None
) -> None:
    width = 20
    filled = width * (number - (done is None)) // total
    bar = "#" * filled + "." * (width - filled)
    if done is None:
        text = f"[{bar}] {number}/{total} {label} ..."
        end = "" if out.isatty() else "\n"
        print(f"\r{text}" if out.isatty() else text, end=end, file=out, flush=True)
        return
    outcome, elapsed = done
    text = f"[{bar}] {number}/{total} {label}: {outcome}, {elapsed:.1f} s"
    print(f"\r{text}" if out.isatty() else text, file=out, flush=True)


def _save(result: BenchResult, stages: list[Stage]) -> None:
    """The plan and each finished stage's outcome, rewritten atomically after every stage."""
    plan = asdict(result.plan)
    plan["out"] = str(result.plan.out)
    doc = {
        "command": "pdlsim bench",
        "argv": sys.argv[1:],
        "plan": plan,
        "cores": available_cores(),
        "warnings": result.warnings,
        "stages": [
            {
                "name": s.name,
                "label": s.label,
                "command": list(s.command),
                "ranks": s.ranks,
                "threads": s.threads,
            }
            for s in stages
        ],
        "results": [asdict(r) for r in result.stages],
    }
    atomic_write_text(result.plan.out / PLAN_FILE, json.dumps(doc, indent=2) + "\n")
