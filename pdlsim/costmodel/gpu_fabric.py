"""A node preset and a network made into the :class:`pdlsim.sim.nccl.Fabric` that GPU
collectives run on, and the collective's time with its band from the assumed efficiencies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from microbench.errors import UserError
from pdlsim.sim.nccl import EFFICIENCIES, Estimate, Fabric, estimate

from .presets import Assumption, NetworkPreset, NodePreset

__all__ = ["CollectiveBand", "collective_band", "efficiencies", "fabric_of"]


def fabric_of(node: NodePreset, network: NetworkPreset, nodes: int, gpus: int | None) -> Fabric:
    """``nodes`` of ``node`` using ``gpus`` GPUs each (default: all), on ``network``. Part of a
    node uses the NICs nearest its GPUs: its share of them, at least one."""
    gpus = node.gpus_per_node if gpus is None else gpus
    if not 1 <= gpus <= node.gpus_per_node:
        raise UserError(
            f"node '{node.name}' holds {node.gpus_per_node} GPUs; asked for {gpus} per node: "
            f"give 1 to {node.gpus_per_node}, or a node file with more (pdlsim hardware show "
            f"{node.name})"
        )
    if nodes < 1:
        raise UserError(f"need at least 1 node, got {nodes}")
    nics = max(1, round(node.nics * gpus / node.gpus_per_node))
    return Fabric(
        nodes, gpus, node.fabric, node.gpu_link_bytes_per_s, node.nvls, nics,
        network.bandwidth_bytes_per_s, network.latency_s, network.oversubscription,
        network.leaf_nodes,
    )  # fmt: skip


def efficiencies(assumptions: Mapping[str, Assumption], at: str = "value") -> dict[str, float]:
    """Each efficiency the collectives assume, at its ``value``, ``low`` or ``high`` end."""
    missing = [name for name in EFFICIENCIES if name not in assumptions]
    if missing:
        raise UserError(f"the hardware assumptions lack {', '.join(missing)}")
    return {name: float(getattr(assumptions[name], at)) for name in EFFICIENCIES}


@dataclass(frozen=True)
class CollectiveBand:
    """A collective at the assumed efficiencies, and at the ends of their ranges."""

    central: Estimate
    fastest: Estimate  # every efficiency at its high end
    slowest: Estimate  # every efficiency at its low end


def collective_band(
    op: str,
    nbytes: int,
    fabric: Fabric,
    assumptions: Mapping[str, Assumption],
    algorithm: str | None = None,
    protocol: str | None = None,
) -> CollectiveBand:
    """:func:`pdlsim.sim.nccl.estimate` at the assumptions and at both ends of their ranges
    (each end chooses its own fastest algorithm, as NCCL would on that machine)."""
    ends = [
        estimate(op, nbytes, fabric, efficiencies(assumptions, at), algorithm, protocol)
        for at in ("value", "high", "low")
    ]
    return CollectiveBand(*ends)
