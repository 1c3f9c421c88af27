"""``pdlsim sweep``: many predictions at once, a CSV table and a scaling plot."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from microbench.cli import path_argument
from microbench.errors import UserError
from microbench.fileio import atomic_write_all, check_folder_exists, check_writable, encode_text
from pdlsim.cli.args import int_list
from pdlsim.cli.knobs import KNOBS, parse_vary, run_vary
from pdlsim.cli.predict import add_common_options, check_flags, config_from_args, cores_warning
from pdlsim.cli.progress import Progress
from pdlsim.prediction.checks import MAX_PREDICTIONS
from pdlsim.prediction.config import PredictConfig, check_not_an_input
from pdlsim.prediction.core import check_prediction, run_prediction


def sweep(base: PredictConfig, nodes: tuple[int, ...], per_node: tuple[int, ...],
          batches: tuple[int, ...],
          progress: Callable[[int, int], None] | None = None) -> Any:  # fmt: skip
    """Predict every (nodes, ranks per node, batch): a DataFrame, one row per combination.
    ``per_node`` is GPUs per node when ``base.gpus > 0``, else processes per node;
    ``progress(done, total)`` is called after each row."""
    import pandas as pd

    gpu = base.gpus > 0
    count = len(nodes) * len(per_node) * len(batches)
    if count > MAX_PREDICTIONS:
        raise UserError(
            f"the sweep asks for {count:,} configurations ({len(nodes):,} node counts x "
            f"{len(per_node):,} per node x {len(batches):,} batches); give at most "
            f"{MAX_PREDICTIONS:,}, or split it into several sweeps"
        )
    configs = [
        replace(base, nodes=n, batch=batch, **{"gpus" if gpu else "procs_per_node": q})
        for n in nodes
        for q in per_node
        for batch in batches
    ]
    for cfg in configs:  # a bad row is refused before the first is simulated
        check_prediction(cfg)
    rows = []
    for i, cfg in enumerate(configs):
        n, q, batch = cfg.nodes, cfg.gpus if gpu else cfg.procs_per_node, cfg.batch
        out = run_prediction(cfg)
        rows.append({
            "nodes": n, "per_node": q, "device": "gpu" if gpu else "cpu",
            "threads": cfg.threads, "batch": batch, "devices": n * q,
            "step_time_s": out["step_time_s"], "epoch_time_s": out["epoch_time_s"],
            "throughput_samples_per_s": out["throughput_samples_per_s"],
            "speedup": out["speedup"], "efficiency": out["efficiency"],
            "comm_overhead_pct": out["comm_overhead_pct"],
            **out["breakdown"], **out["band"],
            "memory_bytes_per_rank": out["memory_bytes_per_rank"],
            "parallel": cfg.parallel, "inference": cfg.inference,
            "precision": cfg.precision, "optimizer": cfg.optimizer,
            "grad_accum": cfg.grad_accum, "tokens": cfg.tokens,
            "bubble_fraction": out.get("parallel", {}).get("bubble_fraction"),
        })  # fmt: skip
        if progress is not None:
            progress(i + 1, len(configs))
    return pd.DataFrame(rows)


def add_sweep_parser(commands: argparse._SubParsersAction) -> None:

    p = commands.add_parser("sweep", help="predict many configurations: CSV and scaling plot")
    p.add_argument("--nodes", type=int_list, required=True, metavar="N,...",
                   help="node counts to predict, e.g. 1,2,4,8")  # fmt: skip
    p.add_argument("--gpus", type=int_list, default=None, metavar="G,...", help="GPUs per node")
    p.add_argument("--procs-per-node", type=int_list, default=(1,), metavar="P,...",
                   help="CPU ranks per node, when no --gpus")  # fmt: skip
    p.add_argument("--threads", type=int, default=1,
                   help="threads per CPU rank (1), without --gpus")  # fmt: skip
    p.add_argument("--batch", type=int_list, default=(32,), metavar="B,...",
                   help="samples per rank per step (32), one or more")  # fmt: skip
    add_common_options(p)
    p.add_argument("--vary", type=parse_vary, action="append", default=None,
                   metavar="KNOB=V1,V2,...", help="vary one knob at a time from the baseline "
                   f"(repeatable) and rank what each buys; knobs: {', '.join(KNOBS)}")  # fmt: skip
    p.add_argument("--out", type=path_argument, required=True, metavar="DIR",
                   help="folder for sweep.csv and scaling.png (knobs.csv with --vary)")  # fmt: skip
    p.set_defaults(handler=run_sweep_command)


def run_sweep_command(args: argparse.Namespace) -> int:
    gpus = args.gpus or ()
    warnings = check_flags(args, gpus=bool(gpus))  # said after the work (_warn), as below
    cfg = config_from_args(args, nodes=1, batch=args.batch[0], gpus=gpus[0] if gpus else 0,
                           procs_per_node=args.procs_per_node[0])  # fmt: skip
    if not gpus:
        warnings.append(cores_warning(replace(cfg, procs_per_node=max(args.procs_per_node))))
    check_writable(args.out, "dir", "--out", "for sweep.csv and the plot")
    check_folder_exists(args.out, "--out", "--out")  # the folder itself is made, not above it
    names = ("knobs.csv", "knob_ranking.csv") if args.vary else ("sweep.csv", "scaling.png")
    for name in names:  # a FIFO or a device there would be replaced, not written to
        check_writable(args.out / name, "file", "--out")
        check_not_an_input(cfg, args.out / name, "--out")
    if args.vary:
        status = run_vary(args, cfg, Progress("sweep --vary", "predictions"))
        _warn(warnings)
        return status
    progress = Progress("sweep", "configurations")
    frame = sweep(cfg, args.nodes, gpus or args.procs_per_node, args.batch, progress)
    _warn(warnings)  # after every row was priced: a refusal stays the one line it is
    from pdlsim.plots.scaling import scaling_png

    atomic_write_all({  # the table and its plot, both or neither
        args.out / "sweep.csv": encode_text(frame.to_csv(index=False)),
        args.out / "scaling.png": scaling_png(frame),
    })  # fmt: skip
    cols = ["nodes", "per_node", "batch", "devices", "step_time_s", "speedup", "efficiency",
            "comm_overhead_pct", "p10_s", "p90_s"]  # fmt: skip
    print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"table: {args.out / 'sweep.csv'}\nplot: {args.out / 'scaling.png'}")
    return 0


def _warn(warnings: list[str | None]) -> None:
    """The sweep's warnings, once its rows are priced: a row refused on the way (a bad
    --profile, a layout past the memory) is then the one line on stderr, with no warning
    printed before it."""
    for warning in warnings:
        if warning:
            print(warning, file=sys.stderr)
