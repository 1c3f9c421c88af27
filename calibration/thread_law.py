"""Thread counts beyond the sweep: Amdahl's law per kernel, with an error that grows with the
distance.

A kernel table is measured at each thread count the sweep ran (every count up to the
calibration machine's cores by default). A prediction at more threads per rank (a node like the
calibration machine with more cores) prices each call from the two largest counts measured,
``a < b``: their ratio ``r = t_b / t_a`` fixes the call's serial share ``s`` in Amdahl's law
``t(n) = t_1 * (s + (1 - s) / n)``, and the call at ``n > b`` costs ``t_b * A(n) / A(b)``.
A call that gained nothing from ``a`` to ``b`` (``r >= 1``: a serial driver, a loop too small
to split, a stalled point) gains nothing beyond; ``s`` is held in [0, 1], so no call gets
slower with threads, nor faster than linearly.

The law knows nothing of what the cores share (memory bandwidth, the last-level cache, the
all-core clock), so its error grows with the distance: ``sigma_per_log * ln(n / b)`` of log
error, added to the band. Where the sweep ran three counts or more, ``sigma_per_log`` is
scored on the machine itself (:func:`score`: each table's largest count priced from the two
below it); with fewer it is :data:`ASSUMED_SIGMA_PER_LOG`, an assumption stated in the profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .stats import robust_rms

__all__ = ["ASSUMED_SIGMA_PER_LOG", "amdahl_factor", "extrapolate", "score", "serial_share"]

# Log error per natural-log unit of threads beyond the sweep where the machine cannot score it:
# a memory-bound loop that Amdahl's law carries from 2 threads to 8 at 7x/2 = 3.5x its speed,
# where the memory bandwidth gives 1.5x, misses by ln(3.5 / 1.5) = 0.85 over ln(4) = 1.39,
# about 0.6; a GEMM, bound by the cores, by far less. Half of the first is the assumption.
ASSUMED_SIGMA_PER_LOG = 0.3


def serial_share(low: int, low_s: float, high: int, high_s: float) -> float:
    """Amdahl's serial share ``s`` from one call's seconds at two thread counts ``low <
    high``, held in [0, 1]."""
    r = high_s / low_s
    denominator = (1.0 - 1.0 / high) - r * (1.0 - 1.0 / low)
    if denominator <= 0.0:  # r at or above what s = 1 gives: no gain
        return 1.0
    return float(min(1.0, max(0.0, (r / low - 1.0 / high) / denominator)))


def amdahl_factor(share: float, threads: int, at: int) -> float:
    """``A(threads) / A(at)``, ``A(n) = s + (1 - s) / n``: the seconds at ``threads`` over
    those at ``at``."""
    return (share + (1.0 - share) / threads) / (share + (1.0 - share) / at)


def extrapolate(price: Callable[[int], float], have: Sequence[int], threads: int) -> float:
    """Seconds at ``threads``, above every measured count in ``have`` (two or more), from
    ``price(count)`` at the two largest."""
    low, top = sorted(have)[-2:]
    top_s = price(top)
    return top_s * amdahl_factor(serial_share(low, price(low), top, top_s), threads, top)


def score(cases: Iterable[tuple[Sequence[int], Callable[[int], float]]]) -> tuple[float, int]:
    """``(sigma_per_log, points)`` from one call's ``price(count)`` at its measured ``counts``
    per case: the largest count priced by the law from the two below it, the log error over
    the log distance. Cases with fewer than three counts are skipped; ``(0.0, 0)`` without
    any."""
    errors = []
    for counts, price in cases:
        if len(counts) < 3:
            continue
        low, mid, top = sorted(counts)[-3:]
        predicted = extrapolate(price, (low, mid), top)
        errors.append(math.log(price(top) / predicted) / math.log(top / mid))
    return robust_rms(np.asarray(errors)), len(errors)
