"""What a parallel call costs after a call of the other thread pool, against alone.

    OPENBLAS_THREAD_TIMEOUT=4 python benchmarks/pool_handoff.py [--threads 2]

At more than one thread a CPU step hands work between two pools: OpenBLAS's threads for the
GEMMs it spreads and numba's OpenMP threads for the parallel loops, both set to sleep when idle
(:mod:`microbench.kernels.cpu`). The kernel tables time each call after a 20 us busy gap
(``let_blas_threads_sleep``); inside a step a call follows another call instead. Each probe
call here is timed in four places: **alone** (after the gap, as the tables time it), after the
**same** call back to back, after a **serial** loop (no pool), and after a call of the
**other** pool. If a step's extra time is a cost of handing work between pools, the "other"
column carries it and the others do not. Medians over repeats, after warm-up.
"""

from __future__ import annotations

import argparse

import numpy as np

from microbench.kernels import loops
from microbench.sampling import SamplingPolicy, median_s
from microbench.threads import let_blas_threads_sleep, set_threads

REPEATS, WARMUP = 60, 5
POLICY = SamplingPolicy(warmup=WARMUP, min_samples=REPEATS, max_samples=REPEATS, time_cap_s=60)


def gemm(m: int, n: int, k: int):
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    return lambda: np.matmul(a, b, out=out)


def parallel_relu(elements: int):
    x = np.random.default_rng(1).standard_normal(elements, dtype=np.float32)
    return lambda: loops.relu(x)


def serial_relu(elements: int):
    x = np.random.default_rng(2).standard_normal(elements, dtype=np.float32)
    return lambda: loops.relu_serial(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    serial = serial_relu(4096)
    probes = {
        "gemm 64x256x256 (threaded)": (gemm(64, 256, 256), parallel_relu(2**16)),
        "gemm 256x256x256 (threaded)": (gemm(256, 256, 256), parallel_relu(2**16)),
        "relu 2^16 (parallel)": (parallel_relu(2**16), gemm(64, 256, 256)),
        "relu 2^20 (parallel)": (parallel_relu(2**20), gemm(64, 256, 256)),
    }
    print(f"{args.threads} threads; us per call, median of {REPEATS}")
    print(f"{'probe':30} {'alone':>8} {'same':>8} {'serial':>8} {'other':>8}")
    for name, (call, other) in probes.items():
        for fn in (call, other, serial):
            fn()  # compile, first touch
        row = [
            median_s(call, POLICY, let_blas_threads_sleep),
            median_s(call, POLICY, call),
            median_s(call, POLICY, serial),
            median_s(call, POLICY, other),
        ]
        print(f"{name:30} " + " ".join(f"{t * 1e6:8.1f}" for t in row))


if __name__ == "__main__":
    main()
