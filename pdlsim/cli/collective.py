"""``pdlsim collective``: a GPU collective on nodes of GPUs, answered as nccl-tests reports it.

Per size: the time, the algorithm bandwidth (size / time), the bus bandwidth (nccl-tests'
factor of the op and rank count), the algorithm and protocol NCCL would choose, and the band
that the assumed efficiencies' ranges give (:mod:`pdlsim.costmodel.gpu_fabric`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from microbench.errors import UserError
from microbench.options import given
from pdlsim.cli.args import positive_int

__all__ = ["add_collective_parser", "parse_nccl_size"]

OP_NAMES = {"allreduce": "allreduce", "reduce-scatter": "reduce_scatter",
            "reduce_scatter": "reduce_scatter", "allgather": "allgather"}  # fmt: skip
_SUFFIX = re.compile(r"^\s*(\d+)\s*([KMGT])\s*$", re.IGNORECASE)


def parse_nccl_size(text: str) -> int:
    """``"8GiB"``, ``"8G"`` (nccl-tests' binary K/M/G/T) or ``"1048576"`` -> bytes."""
    from microbench.sizes import SizeError, check_digits, parse_size

    match = _SUFFIX.match(text)
    try:
        if match:
            scale = 1024 ** ("KMGT".index(match.group(2).upper()) + 1)
            return check_digits(match.group(1), text) * scale
        return parse_size(text)
    except SizeError as exc:
        raise UserError(f"{exc}; nccl-tests' K, M, G and T are understood too") from None


def add_collective_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "collective",
        help="a GPU collective on nodes of GPUs, as nccl-tests reports it",
        description="Time of an NCCL allreduce, reduce-scatter or allgather on GPU nodes "
        "described by data sheets (pdlsim hardware list), with its algorithm and bus "
        "bandwidth per size, as nccl-tests prints them.",
    )
    p.add_argument("op", choices=sorted(OP_NAMES), metavar="OP",
                   help="allreduce, reduce-scatter or allgather")  # fmt: skip
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes (1)")
    p.add_argument("--node", default=None, metavar="NAME|FILE",
                   help="node preset or a file of one (default dgx-h100)")  # fmt: skip
    p.add_argument("--gpus", type=positive_int, default=None,
                   help="GPUs per node taking part (default: all of the node's)")  # fmt: skip
    p.add_argument("--network", default=None, metavar="NAME|FILE",
                   help="the NICs' network (default: the node's)")  # fmt: skip
    p.add_argument(
        "--hardware",
        default=None,
        metavar="FILE",
        help="a JSON file shaped as pdlsim/costmodel/hardware.json over the packaged",
    )
    p.add_argument("--size", default=None, metavar="SIZE", help="one size, e.g. 8GiB or 8G")
    p.add_argument("-b", "--minbytes", default="1K", metavar="SIZE", help="first size (1K)")
    p.add_argument("-e", "--maxbytes", default="8G", metavar="SIZE", help="last size (8G)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, metavar="N",
                   help="multiply the size by N from -b to -e (4)")  # fmt: skip
    p.add_argument("--algorithm", default=None, help="force ring, tree, nvls or nvls_tree")
    p.add_argument("--protocol", default=None, choices=("ll", "ll128", "simple"),
                   help="force an NCCL protocol")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(handler=_cmd_collective)


def _sizes(args: argparse.Namespace) -> list[int]:
    from microbench.sizes import SizeError, size_range

    if args.size is not None:
        for dest in ("minbytes", "maxbytes", "stepfactor"):
            flag = given(args, dest)
            if flag:
                raise UserError(
                    f"--size gives one size, {flag} a range (-b/-e/-f): give one of the two"
                )
        size = parse_nccl_size(args.size)
        if size < 1:
            raise UserError("--size must be at least 1 byte")
        return [size]
    try:
        return size_range(parse_nccl_size(args.minbytes), parse_nccl_size(args.maxbytes),
                          args.stepfactor)  # fmt: skip
    except SizeError as exc:
        raise UserError(f"-b/-e/-f: {exc}") from None


def collective_table(args: argparse.Namespace) -> dict[str, Any]:
    """The answer of ``pdlsim collective`` as a document (what ``--json`` prints)."""
    from pdlsim.prediction.collective import collective_document

    return collective_document(
        OP_NAMES[args.op], _sizes(args), nodes=args.nodes, node=args.node, gpus=args.gpus,
        network=args.network, hardware=args.hardware, algorithm=args.algorithm,
        protocol=args.protocol,
    )  # fmt: skip


def format_table(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['op']} on {doc['nodes']} x {doc['node']} ({doc['gpus_per_node']} GPUs each, "
        f"{doc['ranks']} ranks; {doc['nics_per_node']} NICs per node on {doc['network']})",
        f"{'size_B':>12} {'time_us':>11} {'algbw_GB/s':>10} {'busbw_GB/s':>10} "
        f"{'busbw band':>13}  algorithm",
    ]
    for r in doc["rows"]:
        band = f"{r['busbw_GBps_low']:.1f}-{r['busbw_GBps_high']:.1f}"
        lines.append(
            f"{r['size_bytes']:>12} {r['time_s'] * 1e6:>11.1f} {r['algbw_GBps']:>10.2f} "
            f"{r['busbw_GBps']:>10.2f} {band:>13}  {r['algorithm']}/{r['protocol']}"
        )
    lines.append("sources:")
    lines += [f"  {k}: {v}" for k, v in doc["sources"].items()]
    return "\n".join(lines)


def _cmd_collective(args: argparse.Namespace) -> int:
    doc = collective_table(args)
    if args.network is not None and args.nodes == 1:  # the node's own links carry it all
        from pdlsim.prediction.checks import single_node_note

        print(f"pdlsim: warning: {single_node_note('--network')}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    return 0
