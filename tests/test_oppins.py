"""Per-op pinning: a measured workload's layers take their op's measured time (the roofline
only splits it among the layers fused into the op), interpolated in the batch; the rest keep
the roofline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from microbench.workload import load_workload
from pdlsim.costmodel.model import ProfileCostModel
from pdlsim.costmodel.oppins import OpPins, _Row
from tests.test_costmodel import write_synthetic_profile


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> ProfileCostModel:
    profile = write_synthetic_profile(tmp_path_factory.mktemp("pins") / "profile.json")
    cost = ProfileCostModel.from_profile(profile, workload="mlp")
    return replace(cost, pins=OpPins(), _pin_cache={}, _ops_cache={})


def _roofline(cost, name, phase, batch, threads=1):
    layer = next(info for info in load_workload("mlp").layers if info.name == name)
    return cost._roofline_compute(layer, phase, batch, threads, "cpu")


def _pinned(cost, rows):
    return replace(cost, pins=OpPins(tuple(rows)), _pin_cache={}, _ops_cache={})


def _raw(cost, name, phase, batch, threads=1):
    layer = next(info for info in load_workload("mlp").layers if info.name == name)
    return cost._raw_compute(layer, phase, batch, threads, "cpu")


def test_a_fused_op_pins_its_layers_to_its_measurement_split_by_the_roofline(base):
    fused = [_roofline(base, n, "forward", b) for b in (16, 64) for n in ("dense0", "relu1")]
    rows = [
        _Row("cpu", "mlp", "dense0+relu1", "forward", 1, 16, 3.0 * (fused[0] + fused[1])),
        _Row("cpu", "mlp", "dense0+relu1", "forward", 1, 64, 2.0 * (fused[2] + fused[3])),
    ]
    cost = _pinned(base, rows)
    for batch, factor in ((16, 3.0), (64, 2.0)):
        for name in ("dense0", "relu1"):  # each layer by the op's factor: the sum is the op
            assert _raw(cost, name, "forward", batch) == pytest.approx(
                factor * _roofline(base, name, "forward", batch)
            )
    # between measured batches the factor is interpolated in log(batch); beyond, held
    assert _raw(cost, "dense0", "forward", 32) == pytest.approx(
        2.5 * _roofline(base, "dense0", "forward", 32)
    )
    assert _raw(cost, "dense0", "forward", 256) == pytest.approx(
        2.0 * _roofline(base, "dense0", "forward", 256)
    )
    # what the table lacks keeps the roofline: another layer, another phase
    for name, phase in (("dense2", "forward"), ("dense0", "backward")):
        assert _raw(cost, name, phase, 16) == pytest.approx(_roofline(base, name, phase, 16))


def test_the_loss_and_the_update_rows_pin_their_layers(base):
    loss = _roofline(base, "softmax_cross_entropy5", "forward", 32)
    params = [info.name for info in load_workload("mlp").layers if info.param_count > 0]
    update = sum(_roofline(base, n, "update", 32) for n in params)
    rows = [
        _Row("cpu", "mlp", "softmax_cross_entropy5", "loss", 1, 32, 5.0 * loss),
        _Row("cpu", "mlp", "update", "update", 1, 32, 0.5 * update),
    ]
    cost = _pinned(base, rows)
    assert _raw(cost, "softmax_cross_entropy5", "forward", 32) == pytest.approx(5.0 * loss)
    assert sum(_raw(cost, n, "update", 32) for n in params) == pytest.approx(0.5 * update)


def test_another_workload_or_thread_count_without_rows(base):
    rows = [_Row("cpu", "cnn", "dense7+relu8", "forward", 1, 16, 1.0)]
    cost = _pinned(base, rows)  # the model predicts mlp: cnn's rows pin nothing
    assert _raw(cost, "dense0", "forward", 16) == pytest.approx(
        _roofline(base, "dense0", "forward", 16)
    )
    # measured at 1 thread only: 4 threads take the factor of the nearest measured below
    one = _roofline(base, "dense0", "forward", 16, 1) + _roofline(base, "relu1", "forward", 16, 1)
    cost = _pinned(base, [_Row("cpu", "mlp", "dense0+relu1", "forward", 1, 16, 2.0 * one)])
    assert _raw(cost, "dense0", "forward", 16, threads=4) == pytest.approx(
        2.0 * _roofline(base, "dense0", "forward", 16, threads=4)
    )


def test_a_measured_profile_pins_every_op_of_its_table(base):
    """From the compute table itself: the pinned ops of a measured step add up to the
    measured ops (here the synthetic profile's toy model has none: nothing moves)."""
    profile_pins = OpPins.from_table(base.compute.table_)
    assert all(r.model == "toy" for r in profile_pins.rows) and profile_pins.rows
    assert base.pins.op_of("cpu", "mlp", "dense0", "dense", "forward") is None
