"""The sampling discipline: the stopping rule, warm-up, lockstep over MPI ranks, the timers."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from microbench.sampling import (
    STOP_REASONS,
    SamplingPolicy,
    measure,
    time_loop,
    timed,
    timer_overhead,
)
from tests.conftest import run_mpi_python


class FakeTime:
    """A clock that only moves when a fake repetition says it took time."""

    def __init__(self, durations: Iterator[float]) -> None:
        self.now = 0.0
        self.calls = 0
        self._durations = durations

    def clock(self) -> float:
        return self.now

    def repetition(self) -> float:
        self.calls += 1
        duration = float(next(self._durations))
        self.now += duration
        return duration


def draws(draw: Callable[[np.random.Generator], float], seed: int = 1) -> Iterator[float]:
    rng = np.random.default_rng(seed)
    while True:
        yield draw(rng)


def run(source: Iterator[float], policy: SamplingPolicy):
    fake = FakeTime(source)
    result = measure(fake.repetition, policy, clock=fake.clock, name="x", params={"k": 1})
    assert fake.calls == policy.warmup + result.n  # every call is a warm-up or a sample
    return result


def test_constant_times_stop_at_the_target_after_min_samples():
    for min_samples in (1, 6, 25):
        policy = SamplingPolicy(warmup=2, min_samples=min_samples, max_samples=1000)
        result = run(iter(lambda: 1e-3, None), policy)
        # At 95% the interval needs 6 samples; a zero-width interval meets any target.
        assert result.n == max(min_samples, 6)
        assert result.stop_reason == "ci_target"
        assert (result.name, result.params, result.warmup_discarded) == ("x", {"k": 1}, 2)


def test_low_noise_stops_at_the_ci_target_with_the_interval_within_it():
    policy = SamplingPolicy(warmup=0, min_samples=10, max_samples=10_000, target_rel_ci=0.05)
    result = run(draws(lambda rng: rng.normal(1e-3, 1e-5)), policy)
    assert result.stop_reason == "ci_target"
    assert result.relative_ci_width() <= 0.05
    assert 10 <= result.n < 100


def test_the_stop_is_the_first_sample_that_meets_the_target():
    policy = SamplingPolicy(0, 6, 10_000, target_rel_ci=0.02, time_cap_s=1e9)
    result = run(draws(lambda rng: rng.lognormal(0.0, 0.05), seed=3), policy)
    assert result.stop_reason == "ci_target"
    widths = [type(result)(result.samples[:n]).relative_ci_width() for n in range(6, result.n + 1)]
    assert widths[-1] <= 0.02 and all(w > 0.02 for w in widths[:-1])


def test_heavy_noise_runs_to_max_samples():
    policy = SamplingPolicy(warmup=1, min_samples=10, max_samples=60, time_cap_s=1e9)
    result = run(draws(lambda rng: rng.lognormal(0.0, 2.0)), policy)
    assert (result.n, result.stop_reason) == (60, "max_samples")
    assert result.relative_ci_width() > 0.05


def test_heavy_noise_stops_at_the_time_cap_counting_warm_up():
    policy = SamplingPolicy(warmup=5, min_samples=10, max_samples=100_000, time_cap_s=2.0)
    fake = FakeTime(draws(lambda rng: 0.01 * rng.lognormal(0.0, 2.0)))
    result = measure(fake.repetition, policy, clock=fake.clock)
    assert result.stop_reason == "time_cap"
    assert fake.now >= 2.0 and fake.now - result.samples[-1] < 2.0  # stopped at the first chance
    assert result.n > policy.min_samples


def test_never_fewer_than_min_samples_even_past_the_time_cap():
    policy = SamplingPolicy(warmup=3, min_samples=12, max_samples=50, time_cap_s=1e-6)
    result = run(draws(lambda rng: rng.lognormal(0.0, 2.0)), policy)
    assert (result.n, result.stop_reason) == (12, "time_cap")


def test_warm_up_repetitions_are_discarded():
    calls = []

    def slow_first() -> None:  # the first three calls are slow (cold caches, lazy set-up)
        calls.append(None)
        if len(calls) <= 3:
            time.sleep(0.02)

    policy = SamplingPolicy(warmup=3, min_samples=8, max_samples=8)
    result = measure(timed(slow_first), policy)
    assert result.warmup_discarded == 3 and len(calls) == 3 + result.n
    assert result.maximum < 0.01

    fake = FakeTime(iter([5.0, 5.0] + [1.0] * 100))
    result = measure(fake.repetition, SamplingPolicy(2, 6, 6), clock=fake.clock)
    assert result.samples.tolist() == [1.0] * 6


def test_stop_reasons_are_the_documented_three():
    assert STOP_REASONS == ("ci_target", "max_samples", "time_cap")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"warmup": -1},
        {"min_samples": 0},
        {"max_samples": 4},
        {"target_rel_ci": 0.0},
        {"time_cap_s": 0.0},
        {"confidence": 1.0},
    ],
)
def test_policy_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        SamplingPolicy(**{"warmup": 1, "min_samples": 5, "max_samples": 10, **kwargs})


def test_fewer_keeps_the_floor_target_and_cap():
    policy = SamplingPolicy(warmup=10, min_samples=20, max_samples=1000, time_cap_s=3.0)
    fewer = policy.fewer(10)
    assert (fewer.warmup, fewer.min_samples, fewer.max_samples) == (1, 20, 100)
    assert (fewer.time_cap_s, fewer.target_rel_ci) == (3.0, 0.05)
    assert policy.fewer(1000).max_samples == 20 and policy.fewer(1000).warmup == 1
    assert SamplingPolicy(0, 1, 1).fewer(5).warmup == 0
    assert fewer.to_dict()["max_samples"] == 100


def test_time_loop_averages_and_rotates_through_calls():
    fake = FakeTime(iter(lambda: 0.5, None))
    assert time_loop(fake.repetition, 8, clock=fake.clock) == 0.5
    order: list[int] = []
    calls = [lambda i=i: order.append(i) for i in range(3)]
    time_loop(calls, 7)
    assert order == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        time_loop(calls, 0)


def test_timer_overhead_is_small_and_non_negative():
    m = timer_overhead(samples=2000)
    assert m.n == 2000 and m.minimum >= 0.0 and m.median < 1e-4
    assert m.params["clock"] == "perf_counter" and 0 < m.params["resolution_s"] < 1e-3


LOCKSTEP = textwrap.dedent(
    """
    import json
    import numpy as np
    from mpi4py import MPI
    from microbench.sampling import SamplingPolicy, measure

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(100 + comm.rank)  # each rank its own noise
    local = []
    def repetition():
        local.append(float(rng.lognormal(np.log(1e-3 * (comm.rank + 1)), 0.3)))
        return local[-1]
    policy = SamplingPolicy(warmup=2, min_samples=8, max_samples=300, target_rel_ci=0.1)
    m = measure(repetition, policy, comm)
    everyone = comm.gather((m.samples.tolist(), m.stop_reason, local[policy.warmup:]), root=0)
    if comm.rank == 0:
        print(json.dumps(everyone))
    """
)


def test_ranks_stay_in_lockstep_and_samples_are_the_max_over_ranks():
    out = run_mpi_python(LOCKSTEP)
    assert out.returncode == 0, out.stderr
    (samples0, reason0, local0), (samples1, reason1, local1) = json.loads(out.stdout)
    assert samples0 == samples1 and reason0 == reason1 == "ci_target"
    assert len(local0) == len(local1) == len(samples0)
    assert samples0 == [max(a, b) for a, b in zip(local0, local1, strict=True)]


def test_what_runs_before_a_timed_repetition_is_not_timed():
    """The kernel sweep lets BLAS threads fall asleep before each GEMM sample: that gap runs
    first, outside the timed window."""
    clock = iter([10.0, 10.5])
    order: list[str] = []
    repetition = timed(lambda: order.append("fn"), clock=lambda: next(clock),
                       before=lambda: order.append("before"))  # fmt: skip
    assert repetition() == pytest.approx(0.5)
    assert order == ["before", "fn"]
