"""``python -m microbench kernels``: the kernel sweep (:mod:`microbench.kernelbench`), every
kernel a training step calls timed alone over a designed grid of shapes, at each thread count;
records to ``DIR/kernels.jsonl``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..cli import (
    add_output_arguments,
    add_sampling_arguments,
    checked_out_dir,
    int_at_least,
    policy_from_args,
    positive_int_list,
)
from ..kernelbench import (
    FULL_POLICY,
    QUICK_CHANNEL_RUNS,
    QUICK_GEMM_ALIAS_MK,
    QUICK_GEMM_ALIAS_N,
    QUICK_GEMM_DIMS,
    QUICK_GEMM_MAX_FLOPS,
    QUICK_GEMM_PARTNER_DIMS,
    QUICK_GEMM_RAGGED_DIMS,
    QUICK_IM2COL_SHAPES,
    QUICK_LOOP_ELEMENTS,
    QUICK_POLICY,
    QUICK_STEP_MAX_FLOPS,
    QUICK_STEP_ROUNDS,
    KernelPlan,
    gemm_shapes,
)
from ..threads import available_cores

RECORDS_FILE = "kernels.jsonl"


def default_threads() -> tuple[int, ...]:
    """Every thread count from 1 to the available cores (each is a table of its own)."""
    return tuple(range(1, available_cores() + 1))


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "kernels",
        help="every kernel a training step calls (GEMMs, loops, gather), over a grid of shapes",
        description="Time the kernels a training step is made of, alone, over a designed grid "
        "of shapes that covers any workload of the supported layer kinds: float32 GEMMs in "
        "three layouts over (m, n, k), each numba loop, the gather and the copy over sizes and "
        "inner-run lengths; and whole training steps of networks no workload names against "
        "the same calls alone, for the Python between kernels and the kernels' slowdown inside "
        "a step. No workload is run. Every raw sample is recorded.",
    )
    parser.add_argument(
        "--threads",
        type=positive_int_list,
        metavar="N,...",
        help="thread counts for BLAS and numba (default every count from 1 to the available "
        f"cores, here {','.join(map(str, default_threads()))})",
    )
    parser.add_argument("--seed", type=int_at_least(0), default=0,
                        help="order of the points (default 0)")  # fmt: skip
    add_output_arguments(parser, RECORDS_FILE)
    # a quick grid still spans every kernel's sizes, so it is the slowest quick benchmark
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY,
                           "about a minute per thread count on a 2-core VM")  # fmt: skip
    return parser


def plan_from_args(args: argparse.Namespace) -> KernelPlan:
    plan = KernelPlan(
        threads=tuple(args.threads or default_threads()),
        policy=policy_from_args(args, FULL_POLICY, QUICK_POLICY),
        seed=args.seed,
    )
    if args.quick:
        plan = replace(
            plan,
            gemm_dims=QUICK_GEMM_DIMS,
            gemm_max_flops=QUICK_GEMM_MAX_FLOPS,
            gemm_ragged_dims=QUICK_GEMM_RAGGED_DIMS,
            gemm_partner_dims=QUICK_GEMM_PARTNER_DIMS,
            gemm_alias_n=QUICK_GEMM_ALIAS_N,
            gemm_alias_mk=QUICK_GEMM_ALIAS_MK,
            loop_elements=QUICK_LOOP_ELEMENTS,
            channel_runs=QUICK_CHANNEL_RUNS,
            im2col_shapes=QUICK_IM2COL_SHAPES,
            step_max_flops=QUICK_STEP_MAX_FLOPS,
            step_rounds=QUICK_STEP_ROUNDS,
        )
    return plan


def run(args: argparse.Namespace) -> int:
    from ..kernelbench import run_kernels
    from ..kernelwarm import compile_loops
    from ..machine import machine_metadata
    from ..records import RecordWriter
    from ..reference import last_level_cache_bytes

    plan = plan_from_args(args)
    out = checked_out_dir(args, RECORDS_FILE)
    cores = available_cores()
    if max(plan.threads) > cores:
        print(
            f"warning: {max(plan.threads)} threads on {cores} available cores: oversubscribed "
            "tables describe a machine that shares its cores; predictions above the cores use "
            "them as measured",
            file=sys.stderr,
            flush=True,
        )
    settings = {
        "threads": list(plan.threads),
        "gemm_dims": list(plan.gemm_dims),
        "gemm_max_flops": plan.gemm_max_flops,
        "gemm_shapes": len(gemm_shapes(plan.gemm_dims, plan.gemm_max_flops)),
        "loop_elements": list(plan.loop_elements),
        "policy": plan.policy.to_dict(),
        "quick": args.quick,
        "seed": plan.seed,
        "available_cores": cores,
        "last_level_cache_bytes": last_level_cache_bytes(),
    }
    variants, seconds = compile_loops(plan, cores)  # a machine's first sweep: over the cores
    if variants:
        print(f"kernels: {variants} loop variants compiled over {cores} processes, "
              f"{seconds:.0f} s of CPU", flush=True)  # fmt: skip
    run_info = {"command": "microbench kernels", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine_metadata(), run_info, append=args.append, sweep=True
    ) as w:
        print(f"kernels: threads {','.join(map(str, plan.threads))}; records: {w.path}", flush=True)
        results = run_kernels(
            plan,
            w,
            None if args.quiet else sys.stdout,
            status=lambda line: print(line, flush=True),
        )
    print(f"kernels: {len(results)} points measured", flush=True)
    return 0
