"""How fast the simulator runs: prints wall times against the targets of issue 5.

    python benchmarks/sim_speed.py

Targets: 16 nodes x 4 GPUs with 100 iterations < 0.5 s; 1,024 nodes x 8 GPUs (8,192 ranks)
< 2 s; a 100-configuration sweep < 20 s. Every run here has jitter on (so two representative
ranks), overlap, prefetch and 1 MiB buckets, the CNN at batch 32 per GPU, 100 iterations. Also
timed for comparison: one simpy process per rank (``representation="all_ranks"``), the naive
model the issue measured at 0.6 s for 1,024 ranks x 10 iterations, and the closed form.
"""

from __future__ import annotations

import itertools
import time

from microbench.workload import load_workload
from pdlsim.sim import (
    Cluster,
    LinearCostModel,
    LinkCost,
    LognormalJitter,
    Scenario,
    predict,
    simulate,
)

# The simulator's speed does not depend on the machine's numbers; these are round, made-up
# ones (not a measurement) with every feature that costs simulation time switched on.
COST = LinearCostModel(
    cpu_flops_per_s=2.0e10,
    cpu_serial_fraction=0.05,
    cpu_layer_overhead_s=0.0,
    gpu_flops_per_s=2.0e13,
    gpu_kernel_latency_s=5.0e-6,
    intra=LinkCost(1.0e-6, 1.0e11, 1.0e12),
    inter=LinkCost(5.0e-6, 1.25e10, 1.0e12),
    transfer_latency_s=1.0e-5,
    pinned_bandwidth_bytes_per_s=2.5e10,
    pageable_bandwidth_bytes_per_s=1.0e10,
    jitter=LognormalJitter(0.05),
    overlap_efficiency=0.8,
)
CNN = load_workload("cnn")


def scenario(iterations: int = 100, seed: int = 0) -> Scenario:
    return Scenario(
        CNN, 32, bucket_bytes=2**20, overlap=True, prefetch=True, iterations=iterations, seed=seed
    )


def timed(fn, repeat: int = 3) -> tuple[float, float, object]:
    """(first call, best of ``repeat``, result): the first includes building schedules."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times[0], min(times), result


def line(label: str, first: float, best: float, target: float | None, extra: str = "") -> None:
    verdict = "" if target is None else ("  ok" if first < target else "  OVER TARGET")
    goal = "" if target is None else f" (target < {target:g} s)"
    print(f"{label:<46} first {first:7.3f} s  best {best:7.3f} s{goal}{verdict}{extra}")


def main() -> None:
    first, best, result = timed(lambda: simulate(Cluster.gpus(16, 4), scenario(), COST))
    line(
        "16 nodes x 4 GPUs, 100 iterations",
        first,
        best,
        0.5,
        f"  step {result.step_time_s * 1e3:.3f} ms",
    )

    first, best, result = timed(lambda: simulate(Cluster.gpus(1024, 8), scenario(), COST))
    line(
        "1024 nodes x 8 GPUs (8192 ranks), 100 iterations",
        first,
        best,
        2.0,
        f"  step {result.step_time_s * 1e3:.3f} ms",
    )

    nodes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    gpus = (1, 2, 4, 8)
    batches = (16, 32, 64)
    configs = list(itertools.product(nodes, gpus, batches))[:100]
    assert len(configs) == 100

    def sweep() -> list[float]:
        return [
            simulate(
                Cluster.gpus(n, g),
                Scenario(CNN, b, bucket_bytes=2**20, overlap=True, prefetch=True, iterations=100),
                COST,
            ).step_time_s
            for n, g, b in configs
        ]

    first, best, _ = timed(sweep, repeat=1)
    line("sweep of 100 configurations, 100 iterations each", first, best, 20.0)

    naive = Scenario(CNN, 32, bucket_bytes=2**20, overlap=True, prefetch=True, iterations=10)
    first, best, _ = timed(
        lambda: simulate(Cluster.gpus(128, 8), naive, COST, representation="all_ranks"), repeat=1
    )
    line("one process per rank: 1024 ranks x 10 iterations", first, best, None)

    first, best, _ = timed(lambda: predict(Cluster.gpus(1024, 8), scenario(), COST))
    line("closed form, 8192 ranks", first, best, None)


if __name__ == "__main__":
    main()
