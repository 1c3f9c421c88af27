"""Whole-step scaling of the per-op compute prediction and the mini-batch gather: interpolation
as documented, and the cost model reproducing a measured step exactly at a measured batch."""

from __future__ import annotations

import math

import pytest

from calibration.optable import OpTime
from pdlsim.costmodel.stepscale import StepScale


def _row(phase, model, batch, time_s, threads=1, nbytes=0.0, half_width=0.0):
    return OpTime(
        "cpu", threads, model, phase, phase, phase, batch, 0.0, nbytes,
        time_s, time_s - half_width, time_s + half_width,
    )  # fmt: skip


def _ops(model, batch, threads, device):
    """Made-up per-op sums: 10 us per sample."""
    return 10e-6 * batch


def test_ratio_exact_at_measured_batches_and_log_interpolated_between():
    scale = StepScale.from_table(
        [_row("step", "mlp", 16, 16 * 20e-6), _row("step", "mlp", 64, 64 * 5e-6)]
    )
    assert scale.ratio(_ops, "cpu", "mlp", 16, 1) == pytest.approx(2.0)
    assert scale.ratio(_ops, "cpu", "mlp", 64, 1) == pytest.approx(0.5)
    assert scale.ratio(_ops, "cpu", "mlp", 32, 1) == pytest.approx(1.25)  # halfway in log
    assert scale.ratio(_ops, "cpu", "mlp", 8, 1) == pytest.approx(2.0)  # held below
    assert scale.ratio(_ops, "cpu", "mlp", 1024, 1) == pytest.approx(0.5)  # held above


def test_unmeasured_model_threads_and_device():
    scale = StepScale.from_table(
        [
            _row("step", "mlp", 32, 32 * 20e-6),
            _row("step", "cnn", 32, 32 * 40e-6),
            _row("step", "cnn", 32, 32 * 30e-6, threads=2),
        ]
    )
    assert scale.ratio(_ops, "cpu", "mine", 32, 1) == pytest.approx(3.0)  # median of 2 and 4
    assert scale.ratio(_ops, "cpu", "cnn", 32, 8) == pytest.approx(3.0)  # nearest below: T2
    assert scale.ratio(_ops, "cpu", "mlp", 32, 8) == pytest.approx(2.0)  # mlp: only T1
    assert scale.ratio(_ops, "gpu", "cnn", 32, 1) == 1.0  # nothing measured on a GPU
    assert StepScale().ratio(_ops, "cpu", "cnn", 32, 1) == 1.0


def test_ratio_moves_by_z_standard_deviations_in_log_units():
    half = 1.959963984540054 * 1e-5  # a 95% half-width of 1.96 sigma with sigma = 10 us
    scale = StepScale.from_table([_row("step", "mlp", 32, 320e-6, half_width=half)])
    moved = 320e-6 * math.exp(2.0 * 10 / 320)  # 340.6 us: 340 to first order
    assert scale.ratio(_ops, "cpu", "mlp", 32, 1, z=2.0) == pytest.approx(moved / 320e-6)
    # a wide interval from few samples moves the step a lot, but never to nothing
    wide = StepScale.from_table([_row("step", "mlp", 32, 320e-6, half_width=300e-6)])
    assert wide.ratio(_ops, "cpu", "mlp", 32, 1, z=-2.4) > 0.2


def test_with_sigma_replaces_the_interval_where_the_typical_time_is_known():
    half = 1.959963984540054 * 1e-5
    scale = StepScale.from_table(
        [_row("step", "mlp", 32, 320e-6, half_width=half), _row("step", "cnn", 32, 1e-3)]
    )
    typical = scale.with_sigma(lambda r: 1e-6 if r.model == "mlp" else None)
    assert [r.sigma_s for r in typical.steps] == [1e-6, scale.steps[1].sigma_s]
    assert typical.ratio(_ops, "cpu", "mlp", 32, 1, z=2.0) == pytest.approx(
        math.exp(2.0 / 320) * 320e-6 / 320e-6
    )


def test_gather_line_in_batch_per_model_and_in_bytes_otherwise():
    rows = [
        _row("data", "mlp", 16, 5e-6 + 16 * 1e-6, nbytes=2 * 16 * 3144),
        _row("data", "mlp", 64, 5e-6 + 64 * 1e-6, nbytes=2 * 64 * 3144),
    ]
    scale = StepScale.from_table(rows)
    assert scale.data_time_s("mlp", 32, 3144) == pytest.approx(37e-6)
    # another workload: the same line in bytes (mlp's per-sample bytes from its rows)
    assert scale.data_time_s("big", 16, 2 * 2 * 3144) == pytest.approx(5e-6 + 32 * 1e-6)
    assert StepScale().data_time_s("mlp", 32, 3144) == 0.0
    one = StepScale.from_table(rows[:1])
    assert one.data_time_s("mlp", 32, 3144) == pytest.approx(2 * (5e-6 + 16e-6))


def test_cost_model_reproduces_the_measured_step_and_adds_the_gather(tmp_path):
    """Bound to a preset workload, the predicted compute of one step (the sum over layers and
    phases, as the simulator adds it) equals measured step + gather at a measured batch."""
    from microbench.workload import load_workload
    from pdlsim.costmodel.model import ProfileCostModel
    from tests.test_costmodel import write_synthetic_profile

    profile = write_synthetic_profile(tmp_path / "profile.json")
    base = ProfileCostModel.from_profile(profile)
    table = [
        _row("step", "mlp", 32, 1e-3, half_width=1e-5),
        _row("data", "mlp", 32, 40e-6, nbytes=2 * 32 * 3144),
    ]
    from dataclasses import replace

    cost = replace(base, workload="mlp", scale=StepScale.from_table(table))
    layers = load_workload("mlp").layers
    total = sum(
        cost.compute_time(layer, phase, 32, 1, "cpu")
        for layer in layers
        for phase in ("forward", "backward", "update")
        if phase != "update" or layer.param_count > 0
    )
    assert total == pytest.approx(1e-3 + 40e-6)
    assert math.isclose(cost.step_ratio(32, 1) * cost._ops_s("mlp", 32, 1, "cpu"), 1e-3)


def test_calibration_names_a_step_far_from_the_sum_of_its_ops():
    from calibration.optable import inconsistent_steps

    table = [
        _row("forward", "mlp", 16, 1e-4),
        _row("backward", "mlp", 16, 1e-4),
        _row("step", "mlp", 16, 2.5e-4),  # 1.25x its ops: fine
        _row("data", "mlp", 16, 9e-3),  # the gather is not an op of the step
        _row("forward", "mlp", 16, 1e-4, threads=2),
        _row("step", "mlp", 16, 24e-3, threads=2),  # 240x: the machine was busy
    ]
    (line,) = inconsistent_steps(table)
    assert "mlp step at batch 16, 2 thread(s)" in line and "240.0x" in line


def test_a_host_step_that_starts_with_the_gather_is_counted_without_it():
    """The host's whole step is timed gather first (op "data+step"); the scale uses it less
    the gather measured alone, which the cost model then adds back on its own."""
    rows = [
        OpTime("cpu", 1, "mlp", "data+step", "step", "step", 32, 0.0, 0.0, 340e-6, 330e-6, 350e-6),
        _row("data", "mlp", 32, 20e-6, nbytes=2 * 32 * 3144),
    ]
    scale = StepScale.from_table(rows)
    assert scale.ratio(_ops, "cpu", "mlp", 32, 1) == pytest.approx(320e-6 / (32 * 10e-6))
    assert scale.data_time_s("mlp", 32, 3144) == pytest.approx(20e-6)
