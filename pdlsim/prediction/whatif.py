"""What-if options of ``pdlsim predict`` and ``pdlsim sweep``: communication and heterogeneity.

* ``--compression none|fp16|topk:F``: gradients cast to float16 (half the allreduce bytes) or
  top-k sparsified (an allgather of F x n value/index pairs), compression and expansion timed
  from the profile (:mod:`pdlsim.costmodel.compression`).
* ``--sync-every K``: local SGD, gradients allreduced every K-th step (the mean step time is
  over whole periods of K steps; iterations are rounded up to a multiple of K).
* ``--network-scale X`` / ``--latency-scale Y``: the inter-node links' bandwidth times X and
  latency times Y, on top of the network preset, the given ``--inter-bw``/``--inter-lat`` or
  the profile's fitted inter-node parameters.
* ``--slow-ranks K --slow-factor F``: the last K ranks (node-major: K = ranks per node is one
  slow node) F times slower; or ``--speeds 1,1,0.5,...``: one speed per rank.
  ``--balance static|proportional``: equal batches per rank, or the global batch split in
  proportion to speed (:mod:`pdlsim.sim.ranks`).

Parsing stays light (no numpy) so that building the command line does not load the simulator.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from pdlsim.costmodel.limits import MAX_TIME_S, MIN_TIME_S, RATE_RANGE_BYTES_PER_S

if TYPE_CHECKING:
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.prediction.config import PredictConfig

__all__ = [
    "apply_to_cost",
    "rank_speeds",
    "scenario_options",
    "whatif_lines",
]


def rank_speeds(cfg: PredictConfig, ranks: int) -> tuple[float, ...] | None:
    """Per-rank speeds from ``--slow-ranks/--slow-factor`` or ``--speeds`` (None: all 1)."""
    if cfg.slow_ranks < 0:
        raise UserError(f"--slow-ranks must be 0 or more, got {cfg.slow_ranks}")
    if cfg.speeds is not None and (cfg.slow_ranks or cfg.slow_factor is not None):
        raise UserError("give either --speeds or --slow-ranks/--slow-factor, not both")
    if cfg.speeds is not None:
        if len(cfg.speeds) != ranks:
            raise UserError(f"--speeds gives {len(cfg.speeds)} speeds for {ranks} ranks")
        return tuple(float(s) for s in cfg.speeds)
    if (cfg.slow_ranks > 0) != (cfg.slow_factor is not None):
        raise UserError("--slow-ranks K and --slow-factor F go together (K ranks F times slower)")
    if cfg.slow_ranks == 0:
        return None
    if cfg.slow_ranks > ranks:
        raise UserError(f"--slow-ranks {cfg.slow_ranks} is more than the {ranks} ranks")
    return (1.0,) * (ranks - cfg.slow_ranks) + (1.0 / cfg.slow_factor,) * cfg.slow_ranks


def scenario_options(cfg: PredictConfig) -> dict[str, Any]:
    """The Scenario fields the what-ifs set, and gradient accumulation."""
    return {"compression": cfg.compression, "sync_every": cfg.sync_every, "balance": cfg.balance,
            "accumulation": cfg.grad_accum}  # fmt: skip


def apply_to_cost(cfg: PredictConfig, cost: ProfileCostModel) -> ProfileCostModel:
    """The cost model with its inter-node links scaled, and the what-ifs' sources noted."""
    from pdlsim.sim import LinkCost

    provenance = dict(cost.provenance)
    inter = cost.inter
    if inter is not None and (cfg.network_scale != 1.0 or cfg.latency_scale != 1.0):
        inter = LinkCost(
            _scaled_latency(inter.latency_s, cfg.latency_scale),
            _scaled_bandwidth(inter.bandwidth_bytes_per_s, cfg.network_scale),
            inter.reduce_bandwidth_bytes_per_s,
        )
        provenance["inter-node links"] += (
            f", what-if: bandwidth x{cfg.network_scale:g}, latency x{cfg.latency_scale:g}"
        )
    if cfg.compression is not None:
        provenance["compression"] = (
            f"{cost.gpu.name} HBM data sheet (memory-bound estimate)"
            if cost.device == "gpu" and cost.gpu is not None
            else "profile (host CPU, numpy)"
        )
    return replace(cost, inter=inter, provenance=provenance)


def _scaled_bandwidth(bandwidth: float, scale: float) -> float:
    """``bandwidth`` x ``scale`` (``--network-scale``), refused past any link's range
    (:data:`~pdlsim.costmodel.presets.RATE_RANGE_BYTES_PER_S`), as a figure given so would be:
    the GPU ranks' network was refused mid-prediction, naming a network 'given' nobody gave."""
    low, high = RATE_RANGE_BYTES_PER_S
    scaled = bandwidth * scale
    if scale != 1.0 and not low <= scaled <= high:
        raise UserError(
            f"--network-scale {scale:g} takes the inter-node bandwidth of {bandwidth:.3g} B/s "
            f"to {scaled:.3g} B/s, past any link ({low:g} to {high:g} B/s); give a smaller factor"
        )
    return scaled


def _scaled_latency(latency: float, scale: float) -> float:
    """``latency`` x ``scale`` (``--latency-scale``): 0 or from
    :data:`~pdlsim.costmodel.presets.MIN_TIME_S` to :data:`~pdlsim.costmodel.presets.MAX_TIME_S`,
    as a latency given so (a fitted one already below it, the fit's 0, is left as it is)."""
    scaled = latency * scale
    if scale != 1.0 and latency >= MIN_TIME_S and not MIN_TIME_S <= scaled <= MAX_TIME_S:
        raise UserError(
            f"--latency-scale {scale:g} takes the inter-node latency of {latency:.3g} s to "
            f"{scaled:.3g} s, past any link (0 or {MIN_TIME_S:g} to {MAX_TIME_S:g} s); give "
            "another factor"
        )
    return scaled


def whatif_lines(config: dict[str, Any]) -> list[str]:
    """Lines for the text report naming the what-ifs that are switched on (none: no line)."""
    parts = []
    if config.get("compression"):
        parts.append(f"compression {config['compression']}")
    if config.get("sync_every", 1) != 1:
        parts.append(f"allreduce every {config['sync_every']} steps")
    if config.get("network_scale", 1.0) != 1.0 or config.get("latency_scale", 1.0) != 1.0:
        parts.append(
            f"network bandwidth x{config['network_scale']:g}, latency x{config['latency_scale']:g}"
        )
    if config.get("slow_ranks"):
        parts.append(f"{config['slow_ranks']} ranks {config['slow_factor']:g}x slower")
    if config.get("speeds"):
        parts.append(f"speeds {','.join(f'{s:g}' for s in config['speeds'])}")
    if config.get("balance", "static") != "static":
        parts.append(f"{config['balance']} balance")
    return [f"what-ifs         {'; '.join(parts)}"] if parts else []
