"""``python -m microbench compute``: the real network's ops, GEMM and triad at each thread count
and batch size, on the CPU and (when present) a GPU; records to ``DIR/compute.jsonl``, a summary
table at the end."""

from __future__ import annotations

import argparse
import math
import sys

from ..cli import (
    UsageError,
    add_output_arguments,
    add_sampling_arguments,
    add_workloads_arguments,
    checked_out_dir,
    policy_from_args,
    positive_int_list,
)
from ..compute import (
    DEFAULT_BATCHES,
    FULL_POLICY,
    GEMM_SIZES,
    GPU_BATCHES,
    GPU_GEMM_SIZES,
    QUICK_BATCHES,
    QUICK_GEMM_SIZES,
    QUICK_GPU_GEMM_SIZES,
    QUICK_POLICY,
    ComputePlan,
    format_summary,
    run_compute,
)
from ..memory import activations_problem, available_memory_bytes
from ..threads import available_cores

RECORDS_FILE = "compute.jsonl"
DEVICES = ("auto", "cpu", "gpu")


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))


def _momentum(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"momentum must lie in [0, 1), got {text!r}")
    return value


def _default_threads() -> tuple[int, ...]:
    """1, 2, 4, ... below the available cores, and the cores themselves."""
    cores = available_cores()
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i < cores]
    return (*counts, cores)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compute",
        help="the real network's ops (forward, backward, loss, update, step), GEMM and triad",
        description="Time every op of the real network as training runs it, at each thread "
        "count and batch size, plus square float32 GEMMs and the STREAM triad as machine "
        "references; on a GPU (CuPy) the same at GPU batch sizes. Each point is sampled until "
        "the median's 95% confidence interval is narrow enough or its time cap is reached; "
        "every raw sample is recorded.",
    )
    add_workloads_arguments(parser, None)
    parser.add_argument(
        "--threads",
        type=positive_int_list,
        metavar="N,...",
        help="thread counts for BLAS and numba (default 1, 2, 4, ... up to the available "
        f"cores, here {','.join(map(str, _default_threads()))}); more than the cores runs, "
        "with a warning, and is recorded as oversubscribed",
    )
    parser.add_argument(
        "--batch",
        type=positive_int_list,
        metavar="B,...",
        help=f"CPU batch sizes (default {_csv(DEFAULT_BATCHES)}; --quick {_csv(QUICK_BATCHES)})",
    )
    parser.add_argument(
        "--gpu-batch",
        type=positive_int_list,
        default=GPU_BATCHES,
        metavar="B,...",
        help=f"GPU batch sizes (default {_csv(GPU_BATCHES)})",
    )
    parser.add_argument(
        "--gemm-sizes",
        type=positive_int_list,
        metavar="N,...",
        help=f"square GEMM sizes on the CPU (default {_csv(GEMM_SIZES)}; --quick "
        f"{_csv(QUICK_GEMM_SIZES)}); on a GPU {_csv(GPU_GEMM_SIZES)} (--quick "
        f"{_csv(QUICK_GPU_GEMM_SIZES)})",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="auto (default): the CPU, and the GPU when CuPy finds one (else one line says it "
        "is skipped); cpu; gpu: the GPU only, an error without one",
    )
    parser.add_argument(
        "--momentum",
        type=_momentum,
        default=0.0,
        help="SGD momentum of the timed update, as pdlsim train takes it (default 0)",
    )
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    return parser


def check_gemm_memory(sizes: tuple[int, ...], available: int | None) -> None:
    """UsageError, before anything is measured, where a CPU GEMM's three n x n float32 matrices
    would not fit the memory this process may use: it failed only when reached, after the
    points before it were recorded, so the rerun with smaller sizes needed --append."""
    if available is None or not sizes:
        return
    n = max(sizes)
    need = 3 * 4 * n * n
    if need > available:
        fit = math.isqrt(available // 12)
        raise UsageError(
            f"--gemm-sizes {n}: its three {n} x {n} float32 matrices take "
            f"{need // 2**30:,} GiB, more than the {available / 2**30:.1f} GiB of memory "
            f"available; give sizes up to {fit:,}"
        )


def run(args: argparse.Namespace) -> int:
    from ..gpu import find_gpu
    from ..machine import machine_metadata
    from ..records import RecordWriter

    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    batches = args.batch or (QUICK_BATCHES if args.quick else DEFAULT_BATCHES)
    if args.device != "gpu":
        if args.gemm_sizes:
            check_gemm_memory(tuple(args.gemm_sizes), available_memory_bytes())
        problem = activations_problem("--batch", batches, args.model)
        if problem is not None:
            raise UsageError(problem)
    threads = args.threads or _default_threads()
    out = checked_out_dir(args, RECORDS_FILE)
    gpu = None
    if args.device in ("auto", "gpu"):
        gpu, why = find_gpu()
        if gpu is None and args.device == "gpu":
            raise UsageError(f"--device gpu: no GPU ({why}); use --device cpu or auto")
        if gpu is None:
            print(f"no GPU: skipping GPU compute benchmarks ({why})", flush=True)
    cpu = args.device != "gpu"
    cores = available_cores()
    if cpu and max(threads) > cores:
        print(
            f"warning: {max(threads)} threads on {cores} available cores: oversubscribed; "
            "those points are recorded with oversubscribed: true",
            file=sys.stderr,
            flush=True,
        )

    # loads numba: after NUMBA_NUM_THREADS, which microbench's main sets for --threads
    from ..reference import last_level_cache_bytes

    plan = ComputePlan(
        workloads=args.model,
        threads=threads,
        batches=batches,
        gpu_batches=args.gpu_batch,
        gemm_sizes=args.gemm_sizes or (QUICK_GEMM_SIZES if args.quick else GEMM_SIZES),
        gpu_gemm_sizes=QUICK_GPU_GEMM_SIZES if args.quick else GPU_GEMM_SIZES,
        policy=policy,
        cpu=cpu,
        gpu=gpu,
        momentum=args.momentum,
    )
    settings = {
        "models": [w.name for w in plan.workloads],
        "workloads": [w.to_dict() for w in plan.workloads],
        "threads": list(plan.threads),
        "batches": list(plan.batches) if cpu else [],
        "gpu_batches": list(plan.gpu_batches) if gpu is not None else [],
        "gemm_sizes": list(plan.gemm_sizes) if cpu else [],
        "gpu_gemm_sizes": list(plan.gpu_gemm_sizes) if gpu is not None else [],
        "devices": (["cpu"] if cpu else []) + (["gpu"] if gpu is not None else []),
        "lr": plan.lr,
        "momentum": plan.momentum,
        "policy": policy.to_dict(),
        "quick": args.quick,
        "available_cores": cores,
        "last_level_cache_bytes": last_level_cache_bytes(),
    }
    extra = {"gpu": gpu.metadata} if gpu is not None else None
    machine = machine_metadata(extra=extra)
    run_info = {"command": "microbench compute", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True
    ) as writer:
        print(
            f"compute: {', '.join(settings['models'])} on {' and '.join(settings['devices'])}, "
            f"threads {_csv(threads)}, target {policy.target_rel_ci:g}, time cap "
            f"{policy.time_cap_s:g} s; records: {writer.path}",
            flush=True,
        )
        results = run_compute(plan, writer, None if args.quiet else sys.stdout)
    print(format_summary(m.to_record() for m in results))
    return 0
