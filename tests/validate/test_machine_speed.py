"""The machine's speed during a validation: reference kernels against the profile's tables,
reported beside the results and read by no prediction."""

from __future__ import annotations

from pathlib import Path

import pytest

import pdlsim.validate.machine_speed as machine_speed_module
from calibration.profile import load_profile
from microbench.kernels.calls import step_calls
from microbench.kernels.steps import glue_workloads
from pdlsim.validate.machine_speed import PROBES, TINY_STEP, machine_speed, probe, speed_line
from pdlsim.validate.run import ValidateConfig, run_validation


class _Priced:
    """A kernel model that prices every kernel call and every step at ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def call_s(self, call, threads: int) -> float:
        return self.seconds

    def step_s(self, workload, batch: int, threads: int) -> float:
        return self.seconds


def test_a_probe_is_the_models_price_over_the_time_measured_now(monkeypatch):
    """A price of one second against kernels and a tiny step that take micro- to milliseconds:
    a speed far above one; with the timing fixed, exactly the price over the time."""
    once = probe(_Priced(1.0))
    assert set(once) == {*PROBES, f"step {TINY_STEP}"}
    assert all(10.0 < v < 1e7 for v in once.values())
    # two timings of a shared machine can differ by more than 2x: compare at a fixed time
    monkeypatch.setattr(machine_speed_module, "median_s", lambda fn, policy: 0.004)
    assert probe(_Priced(2.0)) == dict.fromkeys(once, 500.0)


def test_the_tiny_step_is_priced_as_the_profile_prices_a_step(monkeypatch):
    """The tiny step's price is the profile's whole step at batch 1 and one thread (tables,
    interplay and glue), not its tables alone: timed at exactly that price it reads x1. (Timed
    live, the reading is this machine against the profile's, which need not be the same
    machine.)"""
    model = load_profile("xeon-2core").model("kernels")
    tiny = next(w for w in glue_workloads() if w.name == TINY_STEP)
    price = model.step_s(tiny, 1, 1)
    tables = sum(model.call_s(c, 1) for c in step_calls(tiny, 1, 1, gather=False))
    assert price > 2 * tables  # such a step is mostly the glue between its kernels
    monkeypatch.setattr(machine_speed_module, "median_s", lambda fn, policy: price)
    assert probe(model)[f"step {TINY_STEP}"] == pytest.approx(1.0)


def test_the_report_gives_each_kernels_range_over_the_probes():
    probes = [{"gemm": 0.9, "relu": 1.2}, {"gemm": 1.1, "relu": 0.8}, {"gemm": 1.0, "relu": 1.0}]
    speed = machine_speed(probes)
    assert speed["range"] == {"gemm": [0.9, 1.0, 1.1], "relu": [0.8, 1.0, 1.2]}
    assert "gemm x0.90..x1.10, relu x0.80..x1.20" in speed_line(speed)
    assert machine_speed([]) is None and speed_line(None) is None


def _run(out: Path) -> dict:
    cfg = ValidateConfig(
        out=out, profile="xeon-2core", repeats=1, steps=4, models=("mlp",), modes=((1, 1),),
        batches=(16,), band_samples=2, target_run_s=0.01, max_steps=4, parallel=("data",),
        heldout_workloads=0,
    )  # fmt: skip
    return run_validation(cfg, log=lambda s: None)


def test_no_prediction_reads_the_machines_speed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The same configurations with the machine probed at x100 and at x0.01: the speed is
    reported as measured, before and after the launches, and every prediction is the same."""
    reports = {}
    for speed in (100.0, 0.01):
        monkeypatch.setattr(machine_speed_module, "probe", lambda price, s=speed: {"gemm": s})
        reports[speed] = _run(tmp_path / str(speed))
    fast, slow = reports[100.0], reports[0.01]
    assert fast["machine_speed"]["range"] == {"gemm": [100.0, 100.0, 100.0]}
    assert len(fast["machine_speed"]["probes"]) == 2  # before the one round, after it
    assert slow["machine_speed"]["range"]["gemm"][0] == 0.01
    for a, b in zip(fast["rows"], slow["rows"], strict=True):
        assert a["predicted_p50_s"] == b["predicted_p50_s"]
        assert a["predicted_p10_s"] == b["predicted_p10_s"]
