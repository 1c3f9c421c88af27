"""Where a loop's parallel driver starts to pay, read from a profile's loop tables.

    python benchmarks/parallel_crossover.py [--profile xeon-2core] [--threads 2]

A numba loop runs its serial or its parallel driver by the elements of work it does
(:func:`microbench.kernels.policy.runs_parallel`). The kernel sweep times both drivers
of every loop at the same sizes (serial at one thread, parallel at ``--threads``). For each
loop this prints the work above which the parallel driver is faster at four in five measured
sizes, and, for candidate thresholds, the most a call loses to the driver the threshold does not
take (microseconds, and as a ratio to the faster driver).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from microbench.kernels.policy import PARALLEL_MIN_ELEMENTS
from pdlsim.prediction.config import resolve_profile

CANDIDATES = tuple(1 << p for p in range(15, 21))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="default: what pdlsim predict uses")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tables = resolve_profile(args.profile)[0].model("kernels").loops_
    print(f"the policy: parallel from 2^{math.log2(PARALLEL_MIN_ELEMENTS):.0f} elements of work")
    for (name, threads), parallel in sorted(tables.items()):
        serial = tables.get((name + "_serial", 1))
        if threads != args.threads or serial is None:
            continue
        points = sorted(
            (e, serial.time_s(e, run), t)
            for run, (elements, seconds) in parallel.curves.items()
            for e, t in zip(elements, seconds, strict=True)
        )
        work = np.array([p[0] for p in points])
        faster = np.array([p[2] < p[1] for p in points])
        cross = next((w for i, w in enumerate(work) if faster[i:].mean() >= 0.8), math.inf)
        cells = []
        for limit in CANDIDATES:
            taken = [(t if e >= limit else s, min(s, t)) for e, s, t in points]
            lost = max(a - b for a, b in taken) * 1e6
            ratio = max(a / b for a, b in taken)
            cells.append(f"2^{math.log2(limit):.0f}: {lost:6.0f} us x{ratio:4.1f}")
        where = f"2^{math.log2(cross):4.1f}" if math.isfinite(cross) else "never"
        print(f"{name:24s} parallel pays from {where} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
