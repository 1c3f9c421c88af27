"""A GPU collective on nodes of GPUs as nccl-tests reports it, per size: what ``pdlsim
collective`` prints and :func:`pdlsim.collective` returns (:mod:`pdlsim.costmodel.gpu_fabric`
for the model and its band)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from microbench.errors import UserError
from pdlsim.costmodel.gpu_fabric import collective_band, fabric_of
from pdlsim.costmodel.presets import DEFAULT_NODE_PRESET, load_hardware
from pdlsim.prediction.checks import MAX_NODES
from pdlsim.sim.nccl import NCCL_OPS, PROTOCOLS

__all__ = ["collective_document"]


MAX_COLLECTIVE_BYTES = 2**40  # one GPU's buffer: more than any GPU's memory is a typo
MAX_SIZES = 10_000  # rows of one table: nccl-tests' whole 1 B..1 TiB range by 2 is 41


def collective_document(
    op: str,
    sizes: Iterable[int],
    nodes: int = 1,
    node: str | None = None,
    gpus: int | None = None,
    network: str | None = None,
    hardware: str | None = None,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> dict[str, Any]:
    """``op`` (allreduce, reduce_scatter or allgather) of each of ``sizes`` bytes over
    ``nodes`` of ``node`` (a preset or a file; default dgx-h100), ``gpus`` of each (default all),
    on ``network`` (default the node's); ``hardware``: a file over the packaged presets."""
    if op not in NCCL_OPS:
        raise UserError(f"unknown collective '{op}'; known: {', '.join(NCCL_OPS)}")
    if not 1 <= nodes <= MAX_NODES:
        raise UserError(f"--nodes must be 1 to {MAX_NODES:,}, got {nodes:,}")
    if protocol is not None and protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol '{protocol}'; known: {', '.join(PROTOCOLS)}")
    sizes = [int(size) for size in sizes]
    if len(sizes) > MAX_SIZES:
        raise UserError(
            f"{len(sizes):,} sizes asked; give at most {MAX_SIZES:,} (a range with a larger "
            "step factor, or a few sizes)"
        )
    if sizes and max(sizes) > MAX_COLLECTIVE_BYTES:
        raise UserError(
            f"a collective's size must be at most {MAX_COLLECTIVE_BYTES:,} bytes (1 TiB, past any "
            f"GPU's memory), got {max(sizes):,}"
        )
    described = load_hardware(hardware)
    chosen = described.resolve("node", node or DEFAULT_NODE_PRESET)
    net = described.resolve("network", network or chosen.network)
    fabric = fabric_of(chosen, net, nodes, gpus)
    if fabric.ranks == 1:
        raise UserError(
            f"one GPU has nothing to {op.replace('_', '-')}: give --gpus 2 or more, or "
            "--nodes 2 or more"
        )
    rows = []
    for size in sizes:
        if int(size) < 1:
            raise UserError(f"a collective's size must be at least 1 byte, got {size}")
        try:
            band = collective_band(op, int(size), fabric, described.assumptions, algorithm,
                                   protocol)  # fmt: skip
        except ValueError as exc:
            raise UserError(str(exc)) from None
        c = band.central
        rows.append({
            "size_bytes": int(size), "time_s": c.time_s,
            "algbw_GBps": c.algbw_bytes_per_s / 1e9, "busbw_GBps": c.busbw_bytes_per_s / 1e9,
            "algorithm": c.algorithm, "protocol": c.protocol,
            "time_s_low": band.fastest.time_s, "time_s_high": band.slowest.time_s,
            "busbw_GBps_low": band.slowest.busbw_bytes_per_s / 1e9,
            "busbw_GBps_high": band.fastest.busbw_bytes_per_s / 1e9,
        })  # fmt: skip
    return {
        "op": op, "nodes": fabric.nodes, "gpus_per_node": fabric.gpus, "ranks": fabric.ranks,
        "node": chosen.name, "network": net.name, "nics_per_node": fabric.nics,
        "sources": {
            "node": f"{chosen.name} ({chosen.kind}: {chosen.source})",
            "network": f"{net.name} ({net.kind}: {net.source})",
            "algorithms": "NCCL's tuning model (pdlsim/sim/nccl.json); efficiencies assumed "
            "(pdlsim/costmodel/hardware.json), the band is their ranges",
        },
        "rows": rows,
    }  # fmt: skip
