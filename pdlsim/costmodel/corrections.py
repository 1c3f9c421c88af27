"""The cost model's named corrections: terms beyond the kernels' own times, each switchable.

Every correction names a physical cause and is measured by a benchmark of its own, never by
timing the steps it is applied to; ``pdlsim validate --corrections`` scores the model with any
set of them switched off, on held-out and in-sample configurations side by side, so that a term
stays only where it earns its place on configurations the calibration never ran.
"""

from __future__ import annotations

from microbench.errors import UserError

__all__ = ["CORRECTIONS", "parse_corrections"]

CORRECTIONS: dict[str, str] = {
    "glue": "the Python between kernel calls, per op call and per step (the kernel sweep's "
    "step benchmark: whole steps of networks no workload names against their calls alone)",
    "interplay": "kernels run slower inside a step than alone, the caches holding the previous "
    "kernel's data (the same step benchmark, its factor at one thread)",
    "colocation": "ranks sharing a node slow each other's compute (the jitter step at 1 and at "
    "P ranks per node; above P, carried by the node-fill benchmark's slowdown where measured)",
    "stragglers": "above the ranks per node the jitter step ran, one rank of a busy node runs "
    "slower than the others, which wait for it (the node-fill benchmark's slowest process "
    "over its median one, carried from those ranks)",
    "pace": "above the ranks per node the collectives benchmark ran, a collective among a busy "
    "node's ranks runs at the pace of its slowest process (the node fill's slowdown times its "
    "straggler, over theirs at those ranks), on each intra-node step",
}


def parse_corrections(text: str) -> frozenset[str]:
    """``none``, ``all`` or a comma-separated list of :data:`CORRECTIONS` names."""
    text = text.strip()
    if text == "all":
        return frozenset(CORRECTIONS)
    if text == "none":
        return frozenset()
    names = [n.strip() for n in text.split(",")]
    if len(names) > 1 and "" in names:
        raise UserError(
            f"correction list {text!r} has an empty name (two commas, or one at an end); "
            f"name each of {', '.join(CORRECTIONS)} once"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(
            f"correction list {text!r} names {', '.join(twice)} more than once; name each of "
            f"{', '.join(CORRECTIONS)} once"
        )
    unknown = [n for n in names if n not in CORRECTIONS]
    if unknown:
        raise UserError(
            f"unknown correction(s) {', '.join(unknown) or repr(text)}; use none, all or a "
            f"comma-separated list of {', '.join(CORRECTIONS)}"
        )
    return frozenset(names)
