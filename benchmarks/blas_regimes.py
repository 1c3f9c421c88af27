"""Whether this machine's BLAS computes small GEMMs with a separate kernel, where its rules say.

    python benchmarks/blas_regimes.py [--threads T]

For numpy's BLAS (library and core type as ``microbench.machine`` records them), the rules of
``calibration/blas_small_gemm.json`` (:mod:`calibration.gemm_regimes`) name the shapes its
small-matrix kernel takes. For each layout with a rule, pairs of shapes a few per cent either
side of its line (same m and n, k one step apart) are timed back to back, and the time per
multiply-add of the shape past the line is printed against the one before it: a jump where the
rule puts the line is what makes the kernel tables interpolate each side apart. Without a rule
for this BLAS, the same pairs are timed at the OpenBLAS line (a million multiply-adds), to show
whether there is any jump to model. Medians over repeats, after warm-up, at one thread unless
``--threads``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calibration.gemm_regimes import SmallGemm, small_gemm_rules
from microbench.machine import machine_metadata
from microbench.threads import set_threads

PAIRS_MN = ((4096, 5), (1024, 32), (30, 40), (8, 512), (64, 64))  # (m, n) of each pair
REPEATS, WARMUP = 40, 5


def gemm_s(layout: str, m: int, n: int, k: int, rng: np.random.Generator) -> float:
    """Median seconds of (m x k) @ (k x n) with operand A (t_) or B (_t) read transposed."""
    a = rng.random((k, m) if layout[0] == "t" else (m, k), dtype=np.float32)
    b = rng.random((n, k) if layout[1] == "t" else (k, n), dtype=np.float32)
    left, right = (a.T if layout[0] == "t" else a), (b.T if layout[1] == "t" else b)
    out = np.empty((m, n), np.float32)
    times = []
    for i in range(WARMUP + REPEATS):
        start = time.perf_counter()
        np.matmul(left, right, out=out)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    blas = machine_metadata().get("blas") or {}
    rules = small_gemm_rules(blas.get("name"), blas.get("architecture"))
    listed = rules or "none listed, timing the OpenBLAS line"
    print(f"BLAS {blas.get('name')} {blas.get('version')} on {blas.get('architecture')}, "
          f"{args.threads} thread(s); rules: {listed}")  # fmt: skip
    rng = np.random.default_rng(0)
    for layout in ("nn", "tn", "nt"):
        rule = rules.get(layout, SmallGemm(max_mnk=1e6))
        for m, n in PAIRS_MN:
            k = int(rule.max_mnk // (m * n))  # the last k on the small side of the line
            if k < 1:
                continue
            below, above = gemm_s(layout, m, n, k, rng), gemm_s(layout, m, n, k + 1, rng)
            jump = (above / (k + 1)) / (below / k)
            side = [rule.takes(m, n, kk) for kk in (k, k + 1)]
            print(f"{layout} {m:5d} x {n:4d} x {k:4d}|{k + 1:<4d} {below * 1e6:8.1f} us "
                  f"{above * 1e6:8.1f} us  per multiply-add x{jump:4.2f}  "
                  f"rule: {'small' if side[0] else 'packed'} | "
                  f"{'small' if side[1] else 'packed'}")  # fmt: skip


if __name__ == "__main__":
    main()
