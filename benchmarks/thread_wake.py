"""What a multi-threaded GEMM pays after the cores it wakes have idled for a while.

    OPENBLAS_THREAD_TIMEOUT=4 python benchmarks/thread_wake.py [--threads 2] [--rounds 3]

The kernel sweep times each GEMM after a short busy gap on one core
(:data:`microbench.threads.BLAS_SLEEP_GAP_S`), so that OpenBLAS's idle threads have gone to
sleep and the GEMM pays their wake-up, as it does inside a step. Inside a step the gap before a
GEMM is whatever ran on one core since the last threaded call (glue, one-thread loops): from a
few microseconds to milliseconds. Two things may grow with that gap: on a VM a core that idles
long enough is given back to the hypervisor, and waking it can cost more than waking a thread
on a core still held; and the GEMM's operands may leave a last-level cache that other tenants
share. This times the same GEMMs after busy gaps from none to milliseconds, at one thread
(nothing to wake: the cache part alone) and at ``--threads`` (both), the gaps taking turns
within each round so that a slow spell of a shared machine lands on all of them. Medians over
repeats, after warm-up.
"""

from __future__ import annotations

import argparse

from microbench.threads import quiet_idle_blas_threads

quiet_idle_blas_threads()  # before numpy loads: the sleeping BLAS threads steps have

import numpy as np  # noqa: E402

from microbench.sampling import SamplingPolicy, median_s  # noqa: E402
from microbench.threads import let_blas_threads_sleep, set_threads  # noqa: E402

GAPS_S = (0.0, 20e-6, 100e-6, 300e-6, 1e-3, 3e-3)
SHAPES = ((32, 784, 256), (256, 784, 256), (64, 1024, 256), (512, 512, 512))  # m, k, n
REPEATS, WARMUP = 30, 10
POLICY = SamplingPolicy(warmup=0, min_samples=REPEATS, max_samples=REPEATS, time_cap_s=60)


def _time_after_gaps(a: np.ndarray, b: np.ndarray, out: np.ndarray, rounds: int) -> list[float]:
    """The median seconds of ``a @ b`` after each gap of :data:`GAPS_S` busy on one core (the
    others idle), the gaps in turn within each round."""

    def gemm() -> None:
        np.matmul(a, b, out=out)

    for _ in range(WARMUP):
        gemm()
    per_gap: list[list[float]] = [[] for _ in GAPS_S]
    for _ in range(rounds):
        for i, gap in enumerate(GAPS_S):
            per_gap[i].append(median_s(gemm, POLICY, lambda gap=gap: let_blas_threads_sleep(gap)))
    return [float(np.median(medians)) for medians in per_gap]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    operands = [
        (
            rng.standard_normal((m, k), dtype=np.float32),
            rng.standard_normal((k, n), dtype=np.float32),
            np.empty((m, n), dtype=np.float32),
        )
        for m, k, n in SHAPES
    ]
    gaps = " ".join(f"{g * 1e6:>7.0f}" for g in GAPS_S)
    print(f"us per GEMM after a busy gap on one core (gap in us: {gaps})")
    for (m, k, n), (a, b, out) in zip(SHAPES, operands, strict=True):
        for threads in sorted({1, args.threads}):
            set_threads(threads)
            medians = _time_after_gaps(a, b, out, args.rounds)
            row = " ".join(f"{t * 1e6:7.0f}" for t in medians)
            print(f"{m:>5} x {k:>5} x {n:>5}  T{threads}  {row}")


if __name__ == "__main__":
    main()
