"""The ``pdlsim predict`` command line: options shared with ``pdlsim sweep``, the printed report.

:mod:`pdlsim.prediction.core` computes; this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from microbench.cli import file_path_argument
from microbench.errors import UserError
from microbench.options import given
from pdlsim.cli.args import positive_int, seed
from pdlsim.cli.predict_options import (
    add_checkpoint_options,
    add_parallel_options,
    add_power_options,
    add_whatif_options,
    positive_number,
)
from pdlsim.prediction.checks import (
    GPU_SETTINGS,
    gpu_only_error,
    single_node_note,
    unused_inter_node,
)
from pdlsim.prediction.config import PredictConfig, resolve_profile
from pdlsim.prediction.core import run_prediction
from pdlsim.prediction.energy import format_energy
from pdlsim.prediction.reliability import format_checkpoint
from pdlsim.prediction.whatif import whatif_lines

__all__ = [
    "add_common_options",
    "add_predict_parser",
    "check_flags",
    "config_from_args",
    "cores_warning",
    "fmt_s",
    "format_prediction",
    "run_predict_command",
]


def cores_warning(cfg: PredictConfig) -> str | None:
    if cfg.gpus > 0:
        return None
    profile, _ = resolve_profile(cfg.profile)
    cores = profile.machine.get("cores_available") or profile.machine.get("physical_cores")
    used = cfg.procs_per_node * cfg.threads
    if not isinstance(cores, int) or used <= cores:
        return None
    swept = swept_threads(profile.models)
    law = ""
    if swept and cfg.threads > max(swept):
        law = (
            f"; each kernel beyond the {max(swept)} threads its sweep ran follows Amdahl's law "
            "from its two largest thread counts, and the band widens with the distance"
        )
    return (
        f"pdlsim: warning: {used} cores per node asked, the profile's machine has {cores}: "
        f"this predicts nodes like it with more cores{law}"
    )


def swept_threads(models: dict[str, Any]) -> list[int]:
    """The thread counts of a profile's kernel sweep, from its ``models`` as stored (none
    without a kernel model): the warning reads them without building the model or copying
    the profile."""
    kernels = models.get("kernels") or {}
    return sorted(
        {int(t) for by_threads in (kernels.get("gemm") or {}).values() for t in by_threads}
    )


def check_flags(args: argparse.Namespace, gpus: bool) -> list[str]:
    """Refuse a flag the configuration would ignore (one line, exit 2); the warnings (for
    stderr, once, after the configuration is priced, so that a refusal stays one line) where
    one flag refines another."""
    if gpus:
        for dest in ("procs_per_node", "threads"):
            flag = given(args, dest)
            if flag:
                raise UserError(
                    f"{flag} is for CPU ranks; with --gpus every GPU is one rank: drop {flag} "
                    "(or --gpus for CPU ranks)"
                )
    else:
        for dest in GPU_SETTINGS:  # given, even at its default: the config check misses those
            flag = given(args, dest)
            if flag:
                raise gpu_only_error(flag)
    network, bw, lat = (given(args, d) for d in ("network", "inter_bw", "inter_lat"))
    if network and bw and lat:
        raise UserError(
            "--inter-bw and --inter-lat replace every figure of --network: drop --network, or "
            "one of --inter-bw/--inter-lat to keep its other figure"
        )
    warnings = _one_node_warnings(args)
    if network and (bw or lat):
        kept = "latency" if bw else "bandwidth"
        warnings.append(
            f"pdlsim: warning: {bw or lat} replaces the {'bandwidth' if bw else 'latency'} of "
            f"--network {args.network}; its {kept} is kept"
        )
    return warnings


def _one_node_warnings(args: argparse.Namespace) -> list[str]:
    """Inter-node settings (flags, or ``--vary`` of a network knob) that change nothing
    because no configuration reaches a second node (predict's --nodes, sweep's largest,
    --vary nodes): said on stderr, so that the report's network is not taken as priced."""
    nodes = args.nodes if isinstance(args.nodes, int) else max(args.nodes)
    varied = {name: values for name, values, _ in getattr(args, "vary", None) or ()}
    nodes = max((nodes, *varied.get("nodes", ())))
    notes = [unused_inter_node(args, nodes)]
    notes += [single_node_note(f"--vary {name}") for name in ("network-scale", "latency-scale")
              if name in varied and nodes == 1]  # fmt: skip
    return [f"pdlsim: warning: {note}" for note in notes if note]


def fmt_s(seconds: float) -> str:
    """Milliseconds below a second, else seconds."""
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def format_prediction(out: dict[str, Any]) -> str:
    """The text report (``--json`` prints ``out`` itself); layer-wise modes (model, pipeline,
    inference) add their lines (:func:`pdlsim.prediction.memory.mode_lines`)."""
    c, b, band, m = out["config"], out["breakdown"], out["band"], out["memory_breakdown_bytes"]
    par = out.get("parallel")
    where = (
        f"{c['gpus']} GPUs"
        if c["gpus"]
        else f"{c['procs_per_node']} procs x {c['threads']} threads"
    )
    idle = "idle (bubble)" if par and par["mode"] == "pipeline" else "sync"
    if par is None:
        baseline = "one device"
    else:
        baseline = "one rank, same batch" if par["scaling"].startswith("strong") else "one rank"
    per_step = f", {out['samples_per_step']:,} per step" if par else ""
    accumulated = c.get("grad_accum", 1)
    if accumulated > 1:
        per_step = f", {out['samples_per_step']:,} per step"
    micro = f" x {accumulated} micro-batches" if accumulated > 1 else ""
    lines = [
        f"{c['model']} batch {c['batch']}{'' if par else '/rank'}{micro} on {c['nodes']} nodes x "
        f"{where} ({c['devices']} ranks, {c['mode']}), {c['iterations']} iterations",
        f"step time        {fmt_s(out['step_time_s'])}   band P10/P50/P90 "
        f"{fmt_s(band['p10_s'])} / {fmt_s(band['p50_s'])} / {fmt_s(band['p90_s'])}",
        f"epoch time       {fmt_s(out['epoch_time_s'])}  ({out['dataset_samples']:,} "
        f"samples{per_step})",
        f"throughput       {out['throughput_samples_per_s']:,.0f} samples/s",
        f"speedup          {out['speedup']:.2f} x {baseline}   efficiency {out['efficiency']:.1%}",
        f"comm overhead    {out['comm_overhead_pct']:.1f}% of the step (exposed)",
        f"breakdown        compute {fmt_s(b['compute_s'])} + comm {fmt_s(b['comm_s'])} + "
        f"{idle} {fmt_s(b['sync_s'])} - overlap {fmt_s(b['overlap_s'])}",
        "memory per rank  " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in m.items()),
    ]
    if par is None:
        lines[1:1] = whatif_lines(c)
    else:
        lines[1:1] = mode_lines(out)
    buckets = [b for b in out.get("buckets", []) if b["algorithm"] != "none"]
    if buckets and par is None:
        lines.append(_gradients_line(buckets))
    if out["gpu_utilization"] is not None:
        lines.append(f"GPU utilisation  {out['gpu_utilization']:.1%} (compute busy / step)")
    if "checkpoint" in out:
        lines.append(format_checkpoint(out["checkpoint"]))
    if "energy" in out:
        lines.append(format_energy(out["energy"]))
    lines.append("sources:")
    lines += [f"  {k}: {v}" for k, v in out["provenance"].items()]
    if out["data_sheet"]:
        lines.append(f"data-sheet figures (not measured): {', '.join(out['data_sheet'])}")
    if "warning" in out:
        lines.append(f"warning: {out['warning']}")
    return "\n".join(lines)


def _gradients_line(buckets: list[dict[str, Any]]) -> str:
    """The gradient exchange in one line: buckets, bytes, and the algorithms that carry them
    (NCCL's algorithm/protocol on GPU ranks, MPICH's on CPU ranks), each with its count."""
    total = sum(b["wire_bytes"] for b in buckets)
    seconds = sum(b["collective_s"] for b in buckets)
    names: dict[str, int] = {}
    for b in buckets:
        names[b["algorithm"]] = names.get(b["algorithm"], 0) + 1
    used = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in names.items())
    return (f"gradients        {len(buckets)} bucket(s), {total / 2**20:.1f} MiB on the wire, "
            f"{fmt_s(seconds)} of collectives: {used}")  # fmt: skip


def add_common_options(p: argparse.ArgumentParser) -> None:
    from pdlsim.costmodel.corrections import CORRECTIONS
    from pdlsim.costmodel.training import OPTIMIZERS, PRECISIONS

    p.add_argument("--model", default="cnn", metavar="NAME|PATH", help="workload (cnn)")
    p.add_argument("--tokens", type=positive_int, default=None, metavar="N",
                   help="tokens per sample (sequence length) of a network on token ids; "
                   "default: its description's")  # fmt: skip
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (default), tf32, bf16/fp16 mixed precision (GPU ranks)")  # fmt: skip
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="sgd (default), momentum, adam, adamw: its update and state")  # fmt: skip
    p.add_argument("--profile", default=None, metavar="NAME|PATH", help="default: packaged")
    p.add_argument("--network", default=None, metavar="NAME|FILE",
                   help="the network between nodes (pdlsim hardware list); default: the "
                   "node's for GPU ranks, the profile's fit or ib-hdr for CPU ranks")  # fmt: skip
    p.add_argument("--inter-bw", default=None, metavar="RATE", help="e.g. 25GB/s, 100Gb/s")
    p.add_argument("--inter-lat", default=None, metavar="TIME", help="e.g. 2us")
    p.add_argument("--node", default=None, metavar="NAME|FILE",
                   help="GPU ranks' node: its GPUs, fabric and NICs (default: the one holding "
                   "the profile's measured GPU, else dgx-h100; "
                   "pdlsim hardware list)")  # fmt: skip
    p.add_argument("--gpu-preset", default=None, metavar="NAME|FILE",
                   help="GPU ranks' GPU (default: the node's); none: the profile's measured "
                   "GPU alone")  # fmt: skip
    p.add_argument("--step-time", default=None, metavar="TIME",
                   help="one GPU's measured step at this batch and precision (e.g. 128ms; per "
                   "micro-batch with --grad-accum): GPU compute is scaled to it")  # fmt: skip
    p.add_argument("--step-time-accum", type=positive_int, default=None, metavar="K1",
                   help="micro-batches per update when --step-time was measured, if not "
                   "--grad-accum's (e.g. 1: timed without accumulation)")  # fmt: skip
    p.add_argument("--mfu", type=float, default=None, metavar="F",
                   help="or one GPU's model-FLOPs utilisation at this batch, e.g. 0.4")  # fmt: skip
    p.add_argument("--layer-times", default=None, metavar="FILE",
                   help="or its layers timed there: pdlsim bench --layer-times")  # fmt: skip
    p.add_argument("--hardware", default=None, metavar="FILE",
                   help="a JSON file shaped as pdlsim/costmodel/hardware.json: your GPUs, networks "
                   "or assumed figures, over the packaged ones")  # fmt: skip
    p.add_argument("--iterations", type=int, default=100, help="simulated steps (100)")
    p.add_argument("--bucket-mb", type=positive_number, default=25.0, help="bucket MiB (25)")
    p.add_argument("--grad-accum", type=positive_int, default=1, metavar="K",
                   help="micro-batches of --batch per optimizer step, one allreduce each step "
                   "(1)")  # fmt: skip
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="allreduce after the backward, not bucket by bucket during it")  # fmt: skip
    p.add_argument("--pinned", dest="pinned", action="store_true", default=True,
                   help="GPU ranks copy batches from page-locked memory (default)")  # fmt: skip
    p.add_argument("--pageable", dest="pinned", action="store_false",
                   help="GPU ranks copy batches from pageable memory (slower copies)")  # fmt: skip
    p.add_argument("--prefetch", action="store_true", help="copy the next batch during this step")
    p.add_argument("--algorithm", default=None, help="force an allreduce algorithm")
    p.add_argument("--seed", type=seed, default=0, help="jitter and band seed")
    p.add_argument("--samples", type=int, default=20, help="band samples (20)")
    p.add_argument("--dataset-samples", type=positive_int, default=None, help="samples per epoch")
    p.add_argument("--allow-oversubscribed-memory", action="store_true",
                   help="predict a layout that needs more memory per rank than a GPU (or the "
                   "host, for CPU ranks) has, instead of refusing it")  # fmt: skip
    p.add_argument(
        "--corrections",
        default="all",
        metavar="none|all|NAME,...",
        help="the cost model's named corrections to switch on (default all): "
        + ", ".join(CORRECTIONS),
    )
    add_power_options(p)
    add_parallel_options(p)
    add_whatif_options(p)
    add_checkpoint_options(p)


def add_predict_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("predict", help="predict one configuration (step, epoch, speedup)")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the cluster")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: CPU ranks)")
    p.add_argument("--procs-per-node", type=int, default=1,
                   help="CPU ranks per node (1), without --gpus")  # fmt: skip
    p.add_argument("--threads", type=int, default=1,
                   help="threads per CPU rank (1), without --gpus")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (32)")
    add_common_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--trace",
        type=file_path_argument,
        default=None,
        metavar="FILE",
        help="write a Chrome trace",
    )
    p.set_defaults(handler=run_predict_command)


def config_from_args(args: argparse.Namespace, **override: Any) -> PredictConfig:
    fields = PredictConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields}
    return PredictConfig(**{**values, **override})


def run_predict_command(args: argparse.Namespace) -> int:
    warnings = check_flags(args, gpus=args.gpus > 0)
    cfg = config_from_args(args)
    trace = None if args.trace is None else str(args.trace)
    out = run_prediction(cfg, trace=trace)  # refuses a trace file it cannot write, first
    # said once the configuration is priced: a refusal (a bad --profile, a step past the
    # epoch) stays the one line on stderr, not a warning followed by an error
    for warning in [*warnings, cores_warning(cfg)]:
        if warning:
            print(warning, file=sys.stderr)
    print(json.dumps(out, indent=2) if args.json else format_prediction(out))
    if args.trace:
        print(f"trace: {args.trace}", file=sys.stderr if args.json else sys.stdout)
    return 0


def mode_lines(out: dict[str, Any]) -> list[str]:
    par, c = out["parallel"], out["config"]
    what = "inference (forward only)" if par["inference"] else "training"
    if par["mode"] == "model":
        comm = f"allgathers {fmt_s(par['allgather_s'])} ({par['allgather_bytes']:,.0f} B)"
        if not par["inference"]:
            comm += f", allreduces {fmt_s(par['allreduce_s'])} ({par['allreduce_bytes']:,.0f} B)"
        lines = [
            f"parallelism      model (tensor) over {par['tensor_ranks']} ranks, {what}; strong "
            f"scaling: every rank works on the same batch of {c['batch']}",
            f"collectives      {comm} per step, on the critical path",
        ]
        split = ", ".join(
            f"{x['layer']} {x['units']} -> {x['units_per_rank']}/rank" for x in par["split_layers"]
        )
        lines.append(f"split layers     {split or 'none (one rank)'}; all other layers replicated")
        return lines
    if par["mode"] == "data":
        return [f"parallelism      data, {what}: {par['replicas']} ranks, no communication"]
    sizes = sorted(set(par["micro_batch_sizes"]))
    lines = [
        f"parallelism      pipeline, {par['stage_count']} stages x {par['replicas']} replicas, "
        f"{par['microbatches']} micro-batches of {'/'.join(map(str, sizes))} "
        f"({par['schedule']}), {what}",
        f"bubble           {par['bubble_fraction']:.1%} of stage-time idle in the pipeline phase "
        f"({fmt_s(par['pipeline_makespan_s'])}); equal stages, free links: "
        f"{par['ideal_bubble_fraction']:.1%}",
        "stage split      stage      fwd+bwd         idle        sends    allreduce  in flight"
        "  layers",
    ]
    for st in par["stages"]:
        times = (st["forward_s"] + st["backward_s"], st["idle_s"], st["send_s"], st["allreduce_s"])
        lines.append(
            f"                 {st['stage']:>5}"
            + "".join(f"{fmt_s(t):>13}" for t in times)
            + f"  {st['peak_in_flight']:>9}  {', '.join(st['layers'])}"
        )
    return lines
