"""``pdlsim bench``: its options and the command, over :mod:`pdlsim.cli.bench_suite`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from microbench.cli import path_argument
from microbench.errors import UserError
from microbench.fileio import new_run_dir
from microbench.options import given
from pdlsim.cli.args import choice_list, int_list, name_list

# One-process stages a bench may leave out: their records come from elsewhere (calibrate
# --kernels-from pools another node's kernel sweep) or no model of the user's reads them.
SKIPPABLE = ("kernels", "copies", "compression", "storage", "nodefill")


def add_bench_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench",
        help="run the microbenchmarks (compute, collectives, copies, jitter, interference)",
        description=(
            "Measure this machine: compute kernels at the workload's layer shapes and thread "
            "counts, GEMM and triad references, MPI collectives at each process count "
            "(mpiexec is started for you), host<->device copies where a GPU exists, step "
            "jitter and allreduce/compute interference. Records (every raw sample, with the "
            "machine's metadata) go to one run directory."
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a short run: fewer sizes and samples (1-2 minutes on a 2-core VM)",
    )
    bench.add_argument(
        "--procs", type=int_list, default=(1, 2), metavar="P,...", help="process counts (1,2)"
    )
    bench.add_argument(
        "--threads",
        type=int_list,
        default=None,
        metavar="T,...",
        help="compute thread counts (default 1 up to the cores)",
    )
    bench.add_argument(
        "--model",
        type=name_list,
        default="mlp,cnn",
        metavar="NAME|PATH,...",
        help="workloads whose layers, steps and step jitter to time (mlp,cnn)",
    )
    bench.add_argument(
        "--batch",
        type=int_list,
        default=(16, 32, 64),
        metavar="B,...",
        help="per-rank batches of the compute kernels (16,32,64); jitter uses the middle one",
    )
    bench.add_argument(
        "--skip",
        type=choice_list(SKIPPABLE),
        default=(),
        metavar="STAGE,...",
        help=f"stages to leave out, of {','.join(SKIPPABLE)} (none); calibrate --kernels-from "
        "takes a kernel sweep from another run",
    )
    bench.add_argument(
        "--out", type=path_argument, default=None, metavar="DIR", help="run directory"
    )
    layers = bench.add_argument_group(
        "GPU layers (PyTorch)",
        "time each layer of --model at each --batch on a device instead "
        "of the CPU microbenchmarks: pdlsim predict --layer-times prices GPU ranks from them",
    )
    layers.add_argument("--layer-times", action="store_true", help="time the layers")
    layers.add_argument("--device", default="cuda", help="torch device (cuda)")
    layers.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"), default="fp32",
                        help="fp32 (default), tf32, bf16 or fp16 autocast")  # fmt: skip
    layers.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adamw"),
                        default="sgd", help="the update timed (sgd)")  # fmt: skip
    bench.set_defaults(handler=run_bench_command)


def checked_bench_threads(args: argparse.Namespace) -> tuple[int, ...]:
    """The thread counts a bench times, once its workloads load and its process and thread
    counts fit this machine (:class:`UserError` otherwise): before any folder or stage."""
    from microbench.threads import available_cores, too_many_threads
    from microbench.workload import CPU_MODEL_KINDS, load_workload

    for model in args.model.split(","):
        # the bench times each workload's steps and prices them with the CPU kernel model
        load_workload(model).require(CPU_MODEL_KINDS, "pdlsim bench")
    threads = args.threads or tuple(range(1, available_cores() + 1))
    problem = too_many_threads(max(args.procs), 1) or too_many_threads(1, max(threads))
    if problem is not None:
        raise UserError(problem)
    return threads


def check_bench_batches(args: argparse.Namespace) -> None:
    """Refuse a --batch whose activations alone outgrow this machine's memory on the CPU (a
    typo with extra zeros), before any folder or stage: the kernel sweep would run first and
    the compute stage fail minutes later. GPU devices report their own out-of-memory."""
    from microbench.memory import activations_problem
    from microbench.workload import load_workload

    if args.layer_times and args.device != "cpu":
        return
    workloads = [load_workload(model) for model in args.model.split(",")]
    problem = activations_problem("--batch", args.batch, workloads)
    if problem is not None:
        raise UserError(problem)


def run_bench_command(args: argparse.Namespace) -> int:
    check_bench_batches(args)
    if args.layer_times:
        if args.skip:
            raise UserError("--skip is for the CPU microbenchmarks: drop it, or drop --layer-times")
        from pdlsim.cli.bench_layers import run_layer_times_command

        return run_layer_times_command(args)
    for dest in ("device", "precision", "optimizer"):
        flag = given(args, dest)
        if flag:
            raise UserError(f"{flag} is for --layer-times: add it, or drop {flag}")
    return run_cpu_bench(args)


def run_cpu_bench(args: argparse.Namespace) -> int:
    """The CPU microbenchmarks of ``args`` (procs, threads, model, batch, quick, out): the
    records that ``pdlsim calibrate`` fits."""
    from pdlsim.cli.bench_suite import BenchPlan, run_bench
    from pdlsim.cli.bench_summary import format_bench_summary
    from pdlsim.train.launch import Stopped

    threads = checked_bench_threads(args)
    out = args.out or new_run_dir(Path("runs") / "bench")
    plan = BenchPlan(
        out=out,
        model=args.model,
        procs=args.procs,
        threads=threads,
        batches=args.batch,
        quick=args.quick,
        skip=args.skip,
    )
    try:
        result = run_bench(plan)
    except KeyboardInterrupt:
        print(f"pdlsim: interrupted; finished points are kept in {out}", file=sys.stderr)
        return 130
    except Stopped as stopped:
        print(f"pdlsim: stopped by {stopped}; finished points are kept in {out}", file=sys.stderr)
        return 128 + stopped.signum
    print(format_bench_summary(out))
    print(f"records: {out}")
    if not result.ok:
        failed = ", ".join(s.name for s in result.stages if s.status != "ok")
        print(f"pdlsim: error: stage(s) failed: {failed}; see {out}/logs", file=sys.stderr)
        return 1
    return 0
