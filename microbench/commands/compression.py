"""``python -m microbench compression``: compress and decompress a float32 gradient (fp16 cast,
top-k) at each size; records to ``DIR/compression.jsonl``, a summary table at the end."""

from __future__ import annotations

import argparse
import sys

from ..cli import (
    UsageError,
    add_output_arguments,
    add_sampling_arguments,
    checked_out_dir,
    policy_from_args,
)
from ..compression import (
    DEFAULT_DENSITY,
    DEFAULT_SIZES,
    FULL_POLICY,
    METHODS,
    QUICK_POLICY,
    QUICK_SIZES,
    buffer_bytes,
)
from ..memory import available_memory_bytes
from ..sizes import SizeError, format_bytes, parse_sizes

RECORDS_FILE = "compression.jsonl"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text, multiple_of=4)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _methods(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in METHODS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(METHODS)} without repeats, got {text!r}"
        )
    return names


def _density(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"the top-k density must be in (0, 1], got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compression",
        help="gradient compression: fp16 cast and top-k, compress and decompress",
        description="Time what gradient compression costs on this CPU (numpy): the float16 "
        "cast and back, and top-k (argpartition on |g|, values and int32 indices; expanding "
        "is zero + scatter-add), one phase at a time, at each gradient size. Every raw sample "
        "is recorded.",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="SIZES",
        help="float32 gradient sizes in bytes: a list (64KiB,1MiB) or a range of powers of "
        "two (64KiB:64MiB) or four (64KiB:64MiB:4); multiples of 4 bytes (default "
        f"{format_bytes(DEFAULT_SIZES[0])}:{format_bytes(DEFAULT_SIZES[-1])}; --quick powers "
        "of four)",
    )
    parser.add_argument(
        "--methods",
        type=_methods,
        default=METHODS,
        metavar="NAME,...",
        help=f"methods to time (default {','.join(METHODS)})",
    )
    parser.add_argument(
        "--density",
        type=_density,
        default=DEFAULT_DENSITY,
        help=f"fraction of the elements top-k keeps (default {DEFAULT_DENSITY})",
    )
    add_output_arguments(parser, RECORDS_FILE)
    add_sampling_arguments(parser, FULL_POLICY, QUICK_POLICY)
    return parser


def check_memory(sizes: tuple[int, ...], methods: tuple[str, ...], available: int | None) -> None:
    """UsageError, before anything is measured, where the largest size's buffers
    (:func:`microbench.compression.buffer_bytes`) outgrow the memory available: it failed only
    when reached, after the smaller sizes were recorded, naming no flag."""
    need = buffer_bytes(max(sizes), methods)
    if available is not None and need > available:
        raise UsageError(
            f"--sizes {format_bytes(max(sizes))}: compressing a gradient that large holds "
            f"{need / 2**30:.1f} GiB of buffers, more than the {available / 2**30:.1f} GiB of "
            "memory available; give smaller --sizes"
        )


def run(args: argparse.Namespace) -> int:
    from ..compression import format_summary, run_compression, summarize
    from ..machine import machine_metadata
    from ..records import RecordWriter

    policy = policy_from_args(args, FULL_POLICY, QUICK_POLICY)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    check_memory(sizes, args.methods, available_memory_bytes())
    out = checked_out_dir(args, RECORDS_FILE)
    settings = {
        "sizes_bytes": list(sizes),
        "methods": list(args.methods),
        "density": args.density,
        "policy": policy.to_dict(),
        "clock": "perf_counter",
        "quick": args.quick,
    }
    run_info = {"command": "microbench compression", "argv": sys.argv[1:], "settings": settings}
    with RecordWriter(
        out / RECORDS_FILE, machine_metadata(), run_info, append=args.append, sweep=True
    ) as w:
        print(
            f"compression: {', '.join(args.methods)} at {len(sizes)} sizes "
            f"{format_bytes(sizes[0])}..{format_bytes(sizes[-1])}, target "
            f"{policy.target_rel_ci:g}, time cap {policy.time_cap_s:g} s; records: {w.path}",
            flush=True,
        )
        results = run_compression(
            sizes, policy, w, None if args.quiet else sys.stdout, args.methods, args.density
        )
    print(format_summary(summarize(m.to_record() for m in results)))
    return 0
