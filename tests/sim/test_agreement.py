"""The simulator and the closed form agree to rounding without jitter, in every execution mode.

About 200 seeded random configurations: serial, threads, MPI, hybrid MPI + threads, single GPU,
MPI + GPU, each with and without overlap, prefetch, pinned copies and gradient accumulation,
random bucket sizes (from one bucket per layer to one for everything), forced or MPICH-chosen
algorithms, random link, compute and copy costs and overlap efficiencies. One communication
stream (the default): the closed form models it exactly (several streams add link contention,
tested separately).
"""

from __future__ import annotations

import numpy as np
import pytest

from microbench.workload import load_workload
from pdlsim.sim import Cluster, LinearCostModel, LinkCost, Scenario, predict, simulate
from pdlsim.sim.collectives import ALLREDUCE_ALGORITHMS
from tests.sim.costs import example_cost

WORKLOADS = {name: load_workload(name) for name in ("mlp", "cnn")}
MODES = ("serial", "threads", "mpi", "hybrid", "gpu", "mpi+gpu")
N_CONFIGS = 200
REL = 1e-9


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def random_config(seed: int) -> tuple[Cluster, Scenario, LinearCostModel]:
    rng = np.random.default_rng(seed)
    mode = MODES[seed % len(MODES)]
    nodes = int(rng.integers(1, 9))
    per_node = int(rng.integers(1, 9))
    threads = int(rng.integers(2, 17))
    cluster = {
        "serial": Cluster.cpus(1),
        "threads": Cluster.cpus(1, 1, threads),
        "mpi": Cluster.cpus(nodes, max(per_node, 2 if nodes == 1 else 1)),
        "hybrid": Cluster.cpus(nodes, max(per_node, 2 if nodes == 1 else 1), threads),
        "gpu": Cluster.gpus(1, 1),
        "mpi+gpu": Cluster.gpus(nodes, max(per_node, 2 if nodes == 1 else 1)),
    }[mode]
    workload = WORKLOADS[str(rng.choice(list(WORKLOADS)))]
    grad = workload.gradient_bytes
    scenario = Scenario(
        workload=workload,
        batch_per_rank=int(rng.choice([1, 8, 32, 64, 256])),
        bucket_bytes=int(rng.choice([1, grad // 20 + 1, grad // 4, grad // 2, 25 * 2**20])),
        overlap=bool(rng.random() < 0.6),
        prefetch=bool(rng.random() < 0.5),
        pinned=bool(rng.random() < 0.5),
        iterations=int(rng.integers(1, 5)),
        warmup_iterations=int(rng.integers(0, 3)),
        seed=seed,
        jitter=False,
        algorithm=None if rng.random() < 0.4 else str(rng.choice(ALLREDUCE_ALGORITHMS)),
        accumulation=int(rng.choice([1, 1, 2, 5])),
    )
    cost = example_cost(
        cpu_flops_per_s=_log_uniform(rng, 1e9, 1e11),
        cpu_serial_fraction=float(rng.uniform(0, 0.3)),
        cpu_layer_overhead_s=float(rng.choice([0.0, 2e-6])),
        gpu_flops_per_s=_log_uniform(rng, 1e12, 1e14),
        gpu_kernel_latency_s=_log_uniform(rng, 1e-6, 2e-5),
        intra=LinkCost(_log_uniform(rng, 1e-7, 5e-6), _log_uniform(rng, 5e9, 5e11)),
        inter=LinkCost(
            _log_uniform(rng, 1e-6, 5e-5),
            _log_uniform(rng, 1e9, 5e10),
            _log_uniform(rng, 1e10, 1e12),
        ),
        transfer_latency_s=_log_uniform(rng, 1e-6, 5e-5),
        pinned_bandwidth_bytes_per_s=_log_uniform(rng, 1e9, 5e10),
        pageable_bandwidth_bytes_per_s=_log_uniform(rng, 5e8, 1e10),
        overlap_efficiency=float(rng.choice([0.0, 1.0, rng.uniform(0, 1)])),
    )
    return cluster, scenario, cost


def _terms(prediction) -> np.ndarray:
    return np.array(
        [
            (s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s, s.h2d_exposed_s)
            for s in prediction.steps
        ]
    )


def test_simulator_and_closed_form_agree_to_rounding_over_random_configurations():
    modes_seen, overlapped, multi_bucket = set(), 0, 0
    for seed in range(N_CONFIGS):
        cluster, scenario, cost = random_config(seed)
        sim = simulate(cluster, scenario, cost)
        closed = predict(cluster, scenario, cost)
        got, want = _terms(sim), _terms(closed)
        scale = np.abs(want[:, :1]).max()
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= REL * scale, (
            f"config {seed}: {cluster} {scenario.overlap=} {scenario.prefetch=}\n"
            f"simulator {got}\nclosed form {want}"
        )
        assert sim.step_time_s == pytest.approx(closed.step_time_s, rel=REL)
        modes_seen.add(cluster.mode)
        overlapped += scenario.overlap and sim.breakdown.overlap_s > 0
        multi_bucket += len(sim.buckets) > 1 and cluster.ranks > 1
    assert modes_seen == set(MODES)
    assert overlapped > 20 and multi_bucket > 40  # the interesting cases are really exercised
