"""The cost interface's plain-numbers model, jitter and the max of P draws."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from microbench.workload import load_workload
from pdlsim.sim import ConfigError, CostModel, LognormalJitter, Placement, max_of_draws
from pdlsim.sim.cost import CostHooks
from tests.sim.costs import example_cost

CNN = load_workload("cnn")


def test_linear_cost_model_satisfies_the_protocol():
    assert isinstance(example_cost(), CostModel)


def test_optional_hooks_are_declared_with_the_engines_assumptions_as_defaults():
    cost = example_cost()
    assert cost.sliced(4) is cost
    with pytest.raises(ConfigError, match="needs a cost model that times it"):
        cost.compression_time("fp16", 1024)


def test_a_model_without_the_hooks_is_not_a_cost_model():
    class Bare:  # the four required questions only
        jitter = None
        overlap_efficiency = 1.0

        def compute_time(self, layer, phase, batch, threads, device):
            return 0.0

        def collective_time(self, op, nbytes, ranks, placement):
            return 0.0

        def collective_schedule(self, op, nbytes, ranks, placement):
            return ()

        def transfer_time(self, direction, nbytes, pinned):
            return 0.0

    assert not isinstance(Bare(), CostModel)
    assert isinstance(type("Hooked", (Bare, CostHooks), {})(), CostModel)


def test_compute_time_is_flops_over_rate_with_amdahl_threads_and_gpu_latency():
    cost = example_cost(
        cpu_flops_per_s=1e10,
        cpu_serial_fraction=0.2,
        gpu_flops_per_s=1e13,
        gpu_kernel_latency_s=1e-5,
    )
    conv = CNN.layers[3]
    flops = conv.forward_flops_per_sample * 16
    assert cost.compute_time(conv, "forward", 16, 1, "cpu") == pytest.approx(flops / 1e10)
    assert cost.compute_time(conv, "forward", 16, 4, "cpu") == pytest.approx(
        flops / 1e10 * (0.2 + 0.8 / 4)
    )
    assert cost.compute_time(conv, "backward", 16, 1, "gpu") == pytest.approx(
        1e-5 + conv.backward_flops_per_sample * 16 / 1e13
    )
    assert cost.compute_time(conv, "update", 16, 1, "cpu") == pytest.approx(
        2 * conv.param_count / 1e10
    )
    flatten = CNN.layers[6]
    assert cost.compute_time(flatten, "forward", 16, 1, "gpu") == 0.0
    with pytest.raises(ValueError, match="unknown phase 'sideways'"):
        cost.compute_time(conv, "sideways", 16, 1, "cpu")


def test_transfers_pinned_faster_than_pageable():
    cost = example_cost()
    pinned = cost.transfer_time("h2d", 10**7, True)
    pageable = cost.transfer_time("h2d", 10**7, False)
    assert pinned == pytest.approx(1e-5 + 1e7 / 2.5e10)
    assert pageable > pinned
    assert cost.transfer_time("d2h", 0, True) == 0.0


def test_lognormal_expected_max_matches_monte_carlo():
    jitter = LognormalJitter(0.1)
    rng = np.random.default_rng(1)
    for ranks in (1, 4, 32):
        draws = jitter.sample(rng, (40_000, ranks)).max(axis=1)
        assert jitter.expected_max_factor(ranks) == pytest.approx(draws.mean(), rel=2e-3)


class _SamplingOnly:
    """A jitter with no quantile function (like a resampled empirical distribution)."""

    def __init__(self, sigma: float) -> None:
        self.inner = LognormalJitter(sigma)

    def sample(self, rng, size):
        return self.inner.sample(rng, size)

    def expected_max_factor(self, ranks):
        return self.inner.expected_max_factor(ranks)


@pytest.mark.parametrize("ranks", [1, 7, 300])
def test_max_of_p_draws_by_order_statistics_and_by_sampling_agree(ranks):
    jitter = LognormalJitter(0.08)
    quantile = max_of_draws(jitter, np.random.default_rng(2), ranks, 40_000)
    sampled = max_of_draws(_SamplingOnly(0.08), np.random.default_rng(3), ranks, 40_000)
    want = jitter.expected_max_factor(ranks)
    assert quantile.mean() == pytest.approx(want, rel=2e-3)
    assert sampled.mean() == pytest.approx(want, rel=2e-3)
    assert np.quantile(quantile, 0.9) == pytest.approx(np.quantile(sampled, 0.9), rel=5e-3)


def test_max_of_many_draws_stays_finite():
    draws = max_of_draws(LognormalJitter(0.1), np.random.default_rng(0), 10**9, 10_000)
    assert np.all(np.isfinite(draws)) and draws.min() > 1.5


def test_placement_and_parameters_are_checked():
    with pytest.raises(ValueError, match="nodes >= 1"):
        Placement(0, 4)
    with pytest.raises(ValueError, match="overlap_efficiency"):
        example_cost(overlap_efficiency=1.5)
    with pytest.raises(ValueError, match="sigma"):
        LognormalJitter(-1.0)


def test_the_simulator_imports_neither_mpi4py_numba_nor_matplotlib():
    code = (
        "import sys, pdlsim.sim; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('mpi4py', 'numba', 'matplotlib', 'calibration')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
