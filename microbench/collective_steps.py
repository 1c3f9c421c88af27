"""The collective algorithms themselves, written once: per step, which ranks send to which,
the fraction of the message each sends, and whether the receiver reduces what it gets.

They live with the benchmarks because these are the algorithms the collectives benchmark times
(MPICH's), and every package may import microbench. The calibration sums a pattern into the
closed form it fits (:mod:`calibration.formulas`: messages, bytes moved, bytes reduced); the
simulator (:mod:`pdlsim.sim.collectives`) classifies each step's pairs by the link they cross
and plays the steps. Both read the same steps, so a
fitted latency, bandwidth and reduction rate mean the same in both.

Patterns follow MPICH's implementations: root 0 for the binomial trees; a non-power-of-two
count handled by folding the first 2 (p - pof2) ranks pairwise before the algorithm and
unfolding them after. Fractions are real numbers (n / p), not rounded to elements, so that the
textbook closed forms (ring: 2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma) hold exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

__all__ = ["PATTERNS", "Raw", "pattern", "pattern_columns", "pof2"]

Raw = tuple[float, np.ndarray, np.ndarray, bool, str]  # fraction, src, dst, reduces, phase


def pof2(p: int) -> int:
    """The largest power of two <= ``p``."""
    return 1 << (p.bit_length() - 1)


def _fold(p: int) -> tuple[int, int, np.ndarray]:
    """MPICH's non-power-of-two fold: pof2, rem, and the old rank of each new rank."""
    q = pof2(p)
    rem = p - q
    new = np.arange(q)
    old_of_new = np.where(new < rem, 2 * new + 1, new + rem)
    return q, rem, old_of_new


def _fold_steps(p: int, phase: str) -> tuple[list[Raw], list[Raw]]:
    _, rem, _ = _fold(p)
    if rem == 0:
        return [], []
    even = 2 * np.arange(rem)
    pre = [(1.0, even, even + 1, True, f"{phase} fold")]
    post = [(1.0, even + 1, even, False, f"{phase} unfold")]
    return pre, post


def _exchange(old_of_new: np.ndarray, mask: int) -> tuple[np.ndarray, np.ndarray]:
    new = np.arange(old_of_new.size)
    return old_of_new[new], old_of_new[new ^ mask]


def _ring(p: int) -> list[Raw]:
    src = np.arange(p)
    dst = (src + 1) % p
    rs = [(1.0 / p, src, dst, True, "ring reduce-scatter")] * (p - 1)
    ag = [(1.0 / p, src, dst, False, "ring allgather")] * (p - 1)
    return rs + ag


def _recursive_doubling(p: int) -> list[Raw]:
    q, _, old_of_new = _fold(p)
    pre, post = _fold_steps(p, "recursive doubling")
    steps = list(pre)
    mask = 1
    while mask < q:
        src, dst = _exchange(old_of_new, mask)
        steps.append((1.0, src, dst, True, "recursive doubling"))
        mask <<= 1
    return steps + post


def _rabenseifner(p: int) -> list[Raw]:
    q, _, old_of_new = _fold(p)
    pre, post = _fold_steps(p, "rabenseifner")
    steps = list(pre)
    masks = []
    mask = 1
    while mask < q:
        masks.append(mask)
        mask <<= 1
    for mask in masks:  # reduce-scatter by recursive halving: near partners, big halves
        src, dst = _exchange(old_of_new, mask)
        steps.append((1.0 / (2 * mask), src, dst, True, "reduce-scatter"))
    for mask in reversed(masks):  # allgather by recursive doubling: far partners first
        src, dst = _exchange(old_of_new, mask)
        steps.append((1.0 / (2 * mask), src, dst, False, "allgather"))
    return steps + post


def _binomial_reduce(p: int) -> list[Raw]:
    ranks = np.arange(p)
    steps = []
    mask = 1
    while mask < p:
        src = ranks[ranks % (2 * mask) == mask]
        steps.append((1.0, src, src - mask, True, "binomial reduce"))
        mask <<= 1
    return steps


def _binomial_broadcast(p: int) -> list[Raw]:
    ranks = np.arange(p)
    steps = []
    mask = pof2(p - 1) if p > 1 else 0
    while mask > 0:
        src = ranks[(ranks % (2 * mask) == 0) & (ranks + mask < p)]
        steps.append((1.0, src, src + mask, False, "binomial broadcast"))
        mask >>= 1
    return steps


PATTERNS: dict[str, Callable[[int], list[Raw]]] = {
    "ring": _ring,
    "recursive_doubling": _recursive_doubling,
    "rabenseifner": _rabenseifner,
    "binomial": lambda p: _binomial_reduce(p) + _binomial_broadcast(p),  # allreduce
    "reduce": _binomial_reduce,
    "broadcast": _binomial_broadcast,
}


def pattern(name: str, p: int) -> list[Raw]:
    """The steps of algorithm ``name`` over ``p`` ranks (:data:`PATTERNS`)."""
    return PATTERNS[name](p)


@lru_cache(maxsize=4096)
def pattern_columns(name: str, p: int) -> tuple[float, float, float]:
    """The closed form's columns of ``name`` at ``p`` ranks per byte of the message: steps on
    the critical path, bytes each sends (as a multiple of n), bytes each reduces."""
    steps = pattern(name, p)
    return (
        float(len(steps)),
        float(sum(f for f, *_ in steps)),
        float(sum(f for f, _, _, reduces, _ in steps if reduces)),
    )
