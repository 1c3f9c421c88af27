"""``python -m microbench copies``: host <-> device copies (H2D, D2H; pinned, pageable) at each
size; records to ``DIR/copies.jsonl``, a summary table at the end. Without a GPU: one line, exit
0, no records file."""

from __future__ import annotations

import argparse
import sys

from ..cli import (
    add_output_arguments,
    add_sampling_arguments,
    checked_out_dir,
    policy_from_args,
)
from ..copies import DEFAULT_SIZES, FULL_POLICY, QUICK_POLICY, QUICK_SIZES
from ..sizes import SizeError, format_bytes, parse_sizes

RECORDS_FILE = "copies.jsonl"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _nonnegative_int(text: str) -> int:
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"expected a GPU index (0, 1, ...), got {text!r}")
    return int(text)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "copies",
        help="host <-> device copies (H2D, D2H; pinned, pageable), where a GPU exists",
        description="Time copies between host memory and a GPU, both directions, from pinned "
        "(page-locked) and pageable host buffers, with CUDA events. Without CuPy or a GPU this "
        "is skipped with a one-line note (exit status 0).",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="SIZES",
        help="copy sizes: a list (4KiB,1MiB), a range of powers of two (4KiB:256MiB) or four "
        "(4KiB:256MiB:4), or a mix; units B, KiB, MiB, GiB; ascending (default 4KiB:256MiB; "
        "--quick 4KiB:256MiB:4)",
    )
    parser.add_argument("--gpu", type=_nonnegative_int, default=0, help="GPU index (default 0)")
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..copies import format_summary, run_copies, summarize
    from ..gpu import find_gpu
    from ..machine import machine_metadata
    from ..records import RecordWriter

    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    out = checked_out_dir(args, RECORDS_FILE)
    gpu, why = find_gpu(args.gpu)
    if gpu is None:
        print(f"no GPU: host<->device copies skipped ({why})", flush=True)
        return 0
    settings = {
        "sizes_bytes": list(sizes),
        "policy": policy.to_dict(),
        "gpu": args.gpu,
        "clock": "cuda_event",
        "quick": args.quick,
    }
    machine = machine_metadata(extra={"gpu": gpu.metadata})
    run_info = {"command": "microbench copies", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine, run_info, append=args.append, sweep=True
    ) as writer:
        print(
            f"copies: GPU {gpu.index} ({gpu.name}), {len(sizes)} sizes "
            f"{format_bytes(sizes[0])}..{format_bytes(sizes[-1])}, target "
            f"{policy.target_rel_ci:g}, time cap {policy.time_cap_s:g} s; records: {writer.path}",
            flush=True,
        )
        results = run_copies(gpu, sizes, policy, writer, None if args.quiet else sys.stdout)
    print(format_summary(summarize(m.to_record() for m in results)))
    return 0
