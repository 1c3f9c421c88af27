"""What a one-thread call pays to read data that a parallel loop has just written.

    OPENBLAS_THREAD_TIMEOUT=4 python benchmarks/cross_core.py [--threads 2]

A parallel numba loop splits its array over the threads, so after it each core's cache holds
its own share; a one-thread call that reads the whole array next (a small GEMM, a serial loop)
fetches the other shares from the other cores. Each consumer is timed over an array just
written by the parallel relu, just written by the serial relu (its own core's cache), and
untouched since its last read (as the kernel tables time calls: operands their own). The
difference between the first two, over the bytes the other threads wrote ((T - 1) / T of
them), is the rate at which data crosses between cores; it is what a step at more than one
thread pays that the tables do not see. Medians over repeats, after warm-up.
"""

from __future__ import annotations

import argparse

import numpy as np

from microbench.kernels import loops
from microbench.sampling import SamplingPolicy, median_s
from microbench.threads import set_threads

REPEATS, WARMUP = 40, 5
POLICY = SamplingPolicy(warmup=WARMUP, min_samples=REPEATS, max_samples=REPEATS, time_cap_s=60)
SIZES_KIB = (64, 256, 1024, 4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"{args.threads} threads; us per call after the array was written by each writer")
    print(f"{'consumer':26} {'KiB':>6} {'untouched':>9} {'serial':>8} {'parallel':>8}"
          f" {'GB/s across':>11}")  # fmt: skip
    for kib in SIZES_KIB:
        n = kib * 1024 // 4
        x = np.abs(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
        left = np.ones((12, 64), dtype=np.float32)
        out = np.empty((12, n // 64), dtype=np.float32)
        consumers = {
            "serial relu (read+write)": lambda x=x: loops.relu_serial(x),
            "GEMM 12 x 64 @ (64 x n/64)": lambda x=x, left=left, out=out: np.matmul(
                left, x.reshape(64, -1), out=out
            ),
        }
        for name, consume in consumers.items():
            consume()
            loops.relu(x)
            loops.relu_serial(x)
            untouched = median_s(consume, POLICY, lambda: None)
            serial = median_s(consume, POLICY, lambda x=x: loops.relu_serial(x))
            parallel = median_s(consume, POLICY, lambda x=x: loops.relu(x))
            moved = 4 * n * (args.threads - 1) / args.threads
            extra = parallel - serial
            clear = moved and extra > 0.05 * serial  # else no crossing to speak of
            rate = f"{moved / extra / 1e9:11.1f}" if clear else f"{'-':>11}"
            print(f"{name:26} {kib:6d} {untouched * 1e6:9.1f} {serial * 1e6:8.1f}"
                  f" {parallel * 1e6:8.1f} {rate}")  # fmt: skip


if __name__ == "__main__":
    main()
