"""GPU collectives as NCCL runs them: ring, tree, NVLink SHARP, chosen by size and scale.

A collective of ``nbytes`` over ``nodes`` x ``gpus`` GPUs (:class:`Fabric`) is timed for each
algorithm and protocol the fabric allows, and the fastest is taken, as NCCL's tuner does::

    time = base latency + hops x hop latency + nbytes / algorithm bandwidth

The latencies and the protocols' bandwidth fractions are NCCL's own tuning figures
(``nccl.json``). The bandwidths are the hardware's line rates times efficiencies
(:data:`EFFICIENCIES`, assumptions with an interval, given by the caller), through the
bottleneck each algorithm's traffic crosses:

* **ring** (every op): each GPU sends 2(n-1)/n of the message for an allreduce, (n-1)/n for a
  reduce-scatter or allgather, over its fabric link inside the node; across nodes the rings
  run through the node's NICs, one channel per NIC, so a node moves the same share through
  all of them together. Bus bandwidth = min(GPU link x fabric efficiency, NICs x NIC x network
  efficiency); algorithm bandwidth = bus bandwidth x n / steps.
* **tree** (allreduce, several nodes): a chain inside each node, a double binary tree across
  nodes; latency grows with log2(N), not N. Each GPU of the chain sends the message twice
  (reduced up, broadcast down) through its one port into the switch, so its bandwidth is half
  the ring's bus bandwidth, times NCCL's own 0.9: a tree needs more SMs than NCCL gives it by
  default to reach more (NVIDIA/nccl issue 1649), and NCCL's tuner rates it so.
* **nvls** (allreduce, one node with NVLink SHARP): the switches reduce; each GPU sends and
  receives the message once, at ``nvls_efficiency`` of its line rate.
* **nvls_tree** (allreduce, several such nodes): NVLS inside, a double binary tree across
  nodes on each GPU's shard through its own NIC, pipelined: the slower of the two. Across, the
  busiest node moves twice the message through its NICs: where it is interior it sends half up
  and half to each of two children, where it is a leaf half up. Two nodes are the exception:
  each is the other's only child in one tree and root in the other, and moves the message once.

Bus bandwidth is nccl-tests' figure: algorithm bandwidth x 2(n-1)/n for an allreduce,
x (n-1)/n for a reduce-scatter or allgather (whose size is the whole gathered buffer).

Fat-tree oversubscription: a ring or tree leaves a leaf switch once per channel, so the
traffic crossing a leaf's uplinks is one NIC's worth per NIC of a node; it slows the
collective only when a leaf's uplinks (``leaf_nodes`` x NICs / oversubscription) are fewer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = [
    "ALGORITHMS",
    "EFFICIENCIES",
    "NCCL_OPS",
    "PROTOCOLS",
    "Estimate",
    "Fabric",
    "bus_factor",
    "estimate",
]

NCCL_OPS = ("allreduce", "reduce_scatter", "allgather")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree")
PROTOCOLS = ("ll", "ll128", "simple")
EFFICIENCIES = (
    "nvlink_ring_efficiency",
    "xgmi_ring_efficiency",
    "pcie_ring_efficiency",
    "nvls_efficiency",
    "network_efficiency",
)


@cache
def _tuning() -> dict:
    return json.loads(Path(__file__).with_name("nccl.json").read_text())


def _protocols() -> dict:
    return _tuning()["protocols"]


@dataclass(frozen=True)
class Fabric:
    """What a GPU collective runs on: ``nodes`` x ``gpus`` GPUs, each with a ``link_bytes_per_s``
    line rate per direction into the node's ``fabric`` (nvlink, xgmi or pcie), NVLink SHARP or
    not, and ``nics`` NICs per node in use, each of ``nic_bytes_per_s`` per direction."""

    nodes: int
    gpus: int
    fabric: str
    link_bytes_per_s: float
    nvls: bool
    nics: int
    nic_bytes_per_s: float
    net_latency_s: float
    oversubscription: float = 1.0
    leaf_nodes: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus < 1 or self.nics < 1:
            raise ValueError(
                f"a fabric needs nodes, gpus and nics >= 1, got {self.nodes}, {self.gpus}, "
                f"{self.nics}"
            )

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus

    def uplink_factor(self) -> float:
        """The share of the NICs' rate a ring or tree keeps through oversubscribed leaves."""
        if self.leaf_nodes == 0 or self.nodes <= self.leaf_nodes:
            return 1.0
        return min(1.0, self.leaf_nodes / self.oversubscription)


@dataclass(frozen=True)
class Estimate:
    """One collective, as nccl-tests reports it."""

    op: str
    size_bytes: int
    time_s: float
    algorithm: str
    protocol: str
    ranks: int

    @property
    def algbw_bytes_per_s(self) -> float:
        """size / time; 0 where nothing moves (one rank, or no bytes)."""
        return self.size_bytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * bus_factor(self.op, self.ranks)

    @property
    def label(self) -> str:
        """``algorithm/protocol``, as the reports name the choice."""
        return f"{self.algorithm}/{self.protocol}"


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth."""
    if op == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    return (ranks - 1) / ranks


def _candidates(op: str, fabric: Fabric) -> list[str]:
    if op != "allreduce":
        return ["ring"]
    if fabric.nodes == 1:
        return ["ring", "nvls"] if fabric.nvls and fabric.gpus > 1 else ["ring"]
    return ["ring", "tree", "nvls_tree"] if fabric.nvls else ["ring", "tree"]


def _bandwidths(fabric: Fabric, eff: Mapping[str, float]) -> tuple[float, float]:
    """Bytes per second per direction: one GPU's link into the fabric, and a node's NICs; inf
    for a level the collective does not cross (one GPU per node, one node)."""
    link = fabric.link_bytes_per_s * eff[f"{fabric.fabric}_ring_efficiency"]
    nics = fabric.nics * fabric.nic_bytes_per_s * eff["network_efficiency"] * fabric.uplink_factor()
    return (link if fabric.gpus > 1 else math.inf), (nics if fabric.nodes > 1 else math.inf)


def _algbw(algorithm: str, op: str, fabric: Fabric, eff: Mapping[str, float]) -> float:
    """The algorithm bandwidth (message bytes per second) of ``algorithm`` at full protocol."""
    n, nodes = fabric.ranks, fabric.nodes
    link, nics = _bandwidths(fabric, eff)
    across = (1.0 if nodes == 2 else 0.5) if nodes > 1 else math.inf  # message / node volume
    if algorithm == "ring":
        return min(link, nics) / bus_factor(op, n)
    if algorithm == "tree":  # as NCCL's tuner rates it (module docstring)
        return min(link, nics) / 2 * _tuning()["tree_bandwidth_fraction"]
    nvls = fabric.link_bytes_per_s * eff["nvls_efficiency"]
    if algorithm == "nvls":
        return nvls
    return min(nvls, nics * across)  # nvls_tree


def _hops(algorithm: str, op: str, fabric: Fabric) -> tuple[int, int]:
    """Latency hops inside nodes and across nodes on the critical path."""
    n, nodes, gpus = fabric.ranks, fabric.nodes, fabric.gpus
    if algorithm == "ring":
        per = 2 if op == "allreduce" else 1
        inter = per * (nodes - 1)
        return per * (n - 1) - inter, inter
    depth = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    if algorithm == "tree":
        return 2 * (gpus - 1), 2 * depth
    return 1, 2 * depth  # nvls, nvls_tree: one switch round trip inside


def _time(
    algorithm: str, protocol: str, op: str, nbytes: int, fabric: Fabric, eff: Mapping[str, float]
) -> float | None:
    proto = _protocols()[protocol]
    if fabric.fabric not in proto["fabrics"] or algorithm not in proto["base_latency_s"]:
        return None
    hop = proto["hop_latency_s"]
    intra_kind = "pcie" if fabric.fabric == "pcie" else "nvlink"
    intra_hops, inter_hops = _hops(algorithm, op, fabric)
    net_hop = max(hop["net"].get(algorithm, 0.0), fabric.net_latency_s) if inter_hops else 0.0
    latency = (
        proto["base_latency_s"][algorithm]
        + intra_hops * hop[intra_kind].get(algorithm, 0.0)
        + inter_hops * net_hop
    )
    return latency + nbytes / (_algbw(algorithm, op, fabric, eff) * proto["bandwidth_fraction"])


def estimate(
    op: str,
    nbytes: int,
    fabric: Fabric,
    efficiencies: Mapping[str, float],
    algorithm: str | None = None,
    protocol: str | None = None,
) -> Estimate:
    """The fastest algorithm and protocol for ``op`` of ``nbytes`` on ``fabric``, or the
    forced ones (ValueError saying a name is none of NCCL's, or naming what the fabric allows
    when they cannot run there).
    ``efficiencies``: a value for each name of :data:`EFFICIENCIES`."""
    if op not in NCCL_OPS:
        raise ValueError(f"unknown collective '{op}'; known: {', '.join(NCCL_OPS)}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if algorithm is not None and algorithm not in ALGORITHMS:  # a typo, not this fabric's lack
        raise ValueError(f"unknown algorithm '{algorithm}'; NCCL's: {', '.join(ALGORITHMS)}")
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol '{protocol}'; NCCL's: {', '.join(PROTOCOLS)}")
    allowed = _candidates(op, fabric)
    if algorithm is not None and algorithm not in allowed:
        raise ValueError(
            f"algorithm '{algorithm}' cannot run {op} on {fabric.nodes} node(s) of "
            f"{fabric.gpus} GPU(s) of this fabric; it allows {', '.join(allowed)}"
        )
    if fabric.ranks == 1 or nbytes == 0:
        return Estimate(op, nbytes, 0.0, "none", "none", fabric.ranks)
    best: tuple[float, str, str] | None = None
    for name in [algorithm] if algorithm else allowed:
        for proto in [protocol] if protocol else PROTOCOLS:
            time = _time(name, proto, op, nbytes, fabric, efficiencies)
            if time is not None and (best is None or time < best[0]):
                best = (time, name, proto)
    if best is None:
        raise ValueError(
            f"protocol '{protocol}' cannot run {algorithm or op} on the {fabric.fabric} fabric"
        )
    return Estimate(op, nbytes, best[0], best[1], best[2], fabric.ranks)
