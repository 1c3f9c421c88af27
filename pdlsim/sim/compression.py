"""Gradient compression on the wire: what a bucket sends and which collective carries it.

``"fp16"``: every gradient is cast to float16, so the bucket's allreduce carries half the
bytes (the sum is taken in float16, as PyTorch DDP's fp16 compression hook does).
``"topk:F"``: each rank keeps the k = ceil(F n) largest-magnitude of the bucket's n elements
and sends them as float32 values plus int32 indices (8 k bytes). Sparse vectors of different
ranks do not add up element-wise on the way, so they are **allgathered** (every rank receives
every rank's k pairs) and each rank scatter-adds them into a dense gradient; ``"topk"`` alone
is F = 0.01.

An allgather of b bytes per rank is the allgather half of an allreduce of P b bytes: MPICH's
recursive doubling (the second half of Rabenseifner's algorithm) when P is a power of two and
P b is under :data:`ALLGATHER_LONG_MSG_BYTES` (MPICH's ``MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE``),
the ring otherwise. So the cost model times it with the allreduce's own steps, the phases named
"allgather", and both engines play them as they play any collective. The bucket's compression
(before its collective) and expansion (after) are the rank's compute: the cost model's
``compression_time(method, nbytes, phase, ranks)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import collectives
from .collectives import TimedStep
from .cost import CostModel, Placement
from .errors import ConfigError

__all__ = [
    "ALLGATHER_LONG_MSG_BYTES",
    "DEFAULT_TOPK_DENSITY",
    "MIN_TOPK_DENSITY",
    "Wire",
    "parse_compression",
    "wire",
]

ALLGATHER_LONG_MSG_BYTES = 512 * 1024
DEFAULT_TOPK_DENSITY = 0.01
# The smallest kept fraction taken: published top-k sparsification keeps 0.1% to 0.001% of a
# gradient; below a millionth the figure is a typo (1e-300 kept one element a bucket, silently).
MIN_TOPK_DENSITY = 1e-6
ELEMENT_BYTES = 4  # float32 gradients
PAIR_BYTES = 8  # float32 value + int32 index


def parse_compression(text: str | None) -> tuple[str, float | None] | None:
    """``None``/``"none"`` -> None; ``"fp16"`` -> ("fp16", None); ``"topk:0.05"`` ->
    ("topk", 0.05); ``"topk"`` -> ("topk", 0.01). Anything else: :class:`ConfigError`."""
    if text is None or text == "none":
        return None
    name, sep, value = text.partition(":")
    if name == "fp16" and not sep:
        return "fp16", None
    if name == "topk":
        if not sep:
            return "topk", DEFAULT_TOPK_DENSITY
        try:
            density = float(value)
        except ValueError:
            density = math.nan
        if 0.0 < density <= 1.0 and density >= MIN_TOPK_DENSITY:
            return "topk", density
        if 0.0 < density < MIN_TOPK_DENSITY:
            raise ConfigError(
                f"top-k density must be at least {MIN_TOPK_DENSITY:g} (a millionth of the "
                f"gradient kept), got '{value}'"
            )
        raise ConfigError(f"top-k density must be a number in (0, 1], got '{value}'")
    raise ConfigError(
        f"unknown compression '{text}'; use none, fp16 or topk:F (F the kept fraction, e.g. 0.01)"
    )


@dataclass(frozen=True)
class Wire:
    """How one bucket travels: the collective, its bytes per rank, its timed steps."""

    algorithm: str
    wire_bytes: int  # what each rank puts on the wire (its contribution)
    schedule: tuple[TimedStep, ...]
    collective_s: float
    compress_s: float = 0.0
    decompress_s: float = 0.0


def _allgather(
    cost: CostModel, block_bytes: int, nodes: int, ranks_per_node: int
) -> tuple[str, tuple[TimedStep, ...]]:
    ranks = nodes * ranks_per_node
    native = cost.native_allgather(ranks * block_bytes, Placement(nodes, ranks_per_node))
    if native is not None:
        return native
    pof2 = ranks & (ranks - 1) == 0
    short = ranks * block_bytes < ALLGATHER_LONG_MSG_BYTES
    host = "rabenseifner" if pof2 and short else "ring"
    full = cost.collective_schedule(
        "allreduce", ranks * block_bytes, ranks, Placement(nodes, ranks_per_node, host)
    )
    steps = tuple(t for t in full if t.step.phase.endswith("allgather"))
    name = "recursive doubling allgather" if host == "rabenseifner" else "ring allgather"
    return name, steps


def wire(
    cost: CostModel,
    compression: str | None,
    nbytes: int,
    nodes: int,
    ranks_per_node: int,
    algorithm: str | None,
) -> Wire:
    """The collective of a bucket of ``nbytes`` float32 gradient bytes, compressed or not."""
    ranks = nodes * ranks_per_node
    placement = Placement(nodes, ranks_per_node, algorithm)
    parsed = parse_compression(compression)
    if ranks == 1:  # nothing to send, nothing to compress
        return Wire("none", 0, (), 0.0)
    if parsed is not None and parsed[0] == "topk":
        elements = max(1, nbytes // ELEMENT_BYTES)
        k = min(elements, math.ceil(parsed[1] * elements))
        name, schedule = _allgather(cost, PAIR_BYTES * k, nodes, ranks_per_node)
        return _with_compute(cost, compression, nbytes, ranks, name, PAIR_BYTES * k, schedule)
    sent = nbytes // 2 if parsed is not None else nbytes
    name = cost.collective_name("allreduce", sent, placement)
    schedule = cost.collective_schedule("allreduce", sent, ranks, placement)
    if parsed is None:
        return Wire(name, sent, schedule, collectives.total_time_s(schedule))
    return _with_compute(cost, compression, nbytes, ranks, name, sent, schedule)


def _with_compute(
    cost: CostModel,
    compression: str,
    nbytes: int,
    ranks: int,
    name: str,
    sent: int,
    schedule: tuple[TimedStep, ...],
) -> Wire:
    return Wire(
        algorithm=f"{name} ({compression})",
        wire_bytes=sent,
        schedule=schedule,
        collective_s=collectives.total_time_s(schedule),
        compress_s=float(cost.compression_time(compression, nbytes, "compress", ranks)),
        decompress_s=float(cost.compression_time(compression, nbytes, "decompress", ranks)),
    )
