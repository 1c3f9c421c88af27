"""The machine's noise floor of a validation (:mod:`pdlsim.validate_floor`), from synthetic
speed checks whose levels give the floor in closed form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from microbench.measurement import Measurement
from microbench.records import RecordWriter
from pdlsim.validate_floor import (
    add_noise_floor,
    deviation,
    floor_errors,
    speed_levels,
    summarize_floor,
)
from pdlsim.validate_report import format_floor


def _checks(out: Path, steps_s: dict[tuple, list[float]]) -> Path:
    """One ``microbench speed`` record per check and step, as ``pdlsim validate`` writes them;
    keys (name, model, batch), or with the thread count last (default 1)."""
    with RecordWriter(out / "speed.jsonl", {"hostname": "synthetic"}) as writer:
        for (name, model, batch, *threads), medians in steps_s.items():
            for k, median in enumerate(medians, 1):
                params = {"model": model, "batch": batch, "threads": threads[0] if threads else 1,
                          "moment": f"v {k}"}  # fmt: skip
                samples = [0.9 * median, median, 1.1 * median]
                writer.write(Measurement(samples, "speed", name, params).to_record())
    return out


def _row(
    model: str = "cnn", batch: int = 32, inference: bool = False, over: bool = False, threads=1
):
    return {
        "model": model, "batch": batch, "inference": inference, "oversubscribed": over,
        "threads": threads, "launch_medians_s": [0.9, 1.0, 1.2],
    }  # fmt: skip


def test_levels_are_each_check_over_the_median_of_its_step(tmp_path: Path) -> None:
    levels = speed_levels(
        _checks(tmp_path, {("step_compute", "cnn", 32): [0.02, 0.03, 0.02, 0.03, 0.03]})
    )
    assert list(levels) == [("step_compute", "cnn", 32, 1, "cpu")]
    np.testing.assert_allclose(
        levels[("step_compute", "cnn", 32, 1, "cpu")], [2 / 3, 1, 2 / 3, 1, 1]
    )
    assert speed_levels(tmp_path / "missing") == {}


def test_a_steady_machine_has_no_floor(tmp_path: Path) -> None:
    levels = speed_levels(_checks(tmp_path, {("step_compute", "cnn", 32): [0.02] * 6}))
    errors = floor_errors([_row(), _row()], levels, repeats=3, draws=50)
    assert errors.shape == (2, 50) and np.all(errors == 0.0)


def test_a_two_level_machine_floor_is_the_chance_that_most_launches_are_slow() -> None:
    """Levels 1 (p = 0.6) and 1.5 (p = 0.4): one launch is 50% off with probability 0.4; the
    median of three is, with probability 3 * 0.4^2 * 0.6 + 0.4^3 = 0.352."""
    levels = {("step_compute", "cnn", 32, 1, "cpu"): np.array([1.0, 1.0, 1.0, 1.5, 1.5])}
    one = floor_errors([_row()], levels, repeats=1, draws=20_000, seed=1)
    three = floor_errors([_row()], levels, repeats=3, draws=20_000, seed=1)
    assert set(np.unique(one)) == {0.0, 0.5}
    assert one.mean() == pytest.approx(0.5 * 0.4, abs=0.01)
    assert three.mean() == pytest.approx(0.5 * 0.352, abs=0.01)


def test_rows_take_their_own_step_and_unchecked_ones_are_left_out(tmp_path: Path) -> None:
    """Inference rows move with the forward-only step (the training step where no check timed
    it); a workload no check timed has no floor and no say in the summary."""
    checks = {
        ("step_compute", "cnn", 32): [1.0, 1.0, 1.0, 1.5, 1.5],
        ("forward_compute", "cnn", 32): [1.0] * 5,
        ("step_compute", "mlp", 16): [1.0, 2.0, 1.0, 2.0, 1.0],
    }
    out = _checks(tmp_path, {k: [1e-3 * v for v in vs] for k, vs in checks.items()})
    rows = [
        _row(),
        _row(inference=True),
        _row("mlp", 16, inference=True),
        _row("mlp", 64),
        _row(over=True),
    ]
    summary = add_noise_floor(rows, out, repeats=1)
    floors = [r["noise_floor_rel_error"] for r in rows]
    assert floors[1] == 0.0  # the steady forward-only step
    assert floors[2] is not None  # no forward-only check: the training step
    assert floors[3] is None  # no check at batch 64
    assert summary["configurations"] == 3  # rows 0-2: row 3 unchecked, row 4 oversubscribed
    assert summary["repeats"] == 1
    med, worst = summary["median_rel_error"], summary["worst_rel_error"]
    assert 0.0 <= med["p10"] <= med["p50"] <= med["p90"] <= worst["p50"] <= 1.0
    # launches [0.9, 1.0, 1.2] lie 10%, 0% and 20% from their median
    assert summary["launch_deviation"] == pytest.approx(0.1)
    assert summary["check_deviation"] is None  # one launch per draw: nothing to spread
    line = format_floor(summary)
    assert "median of 1 launches" in line and "3 configurations" in line


def test_rows_take_the_checks_at_their_thread_count_else_at_one_thread(tmp_path: Path) -> None:
    """The 2-thread CNN step was checked (steady), the 2-thread MLP step was not: the CNN's
    2-thread row has no floor, the MLP's moves with its 1-thread step."""
    checks = {
        ("step_compute", "cnn", 32, 1): [1.0, 1.0, 1.5, 1.5, 1.5],
        ("step_compute", "cnn", 32, 2): [1.0] * 5,
        ("step_compute", "mlp", 32, 1): [1.0, 1.0, 1.0, 1.5, 1.5],
    }
    out = _checks(tmp_path, {k: [1e-3 * v for v in vs] for k, vs in checks.items()})
    levels = speed_levels(out)
    assert set(levels) == {(n, m, b, t, "cpu") for n, m, b, t in checks}
    cnn, mlp = floor_errors([_row(threads=2), _row("mlp", threads=2)], levels, 1, draws=500)
    assert np.all(cnn == 0.0) and set(np.unique(mlp)) == {0.0, 0.5}


def test_gpu_rows_take_the_gpu_steps_checks_and_cpu_rows_the_hosts(tmp_path: Path) -> None:
    """The same workload and batch checked on the host (steady) and on the GPU (two levels):
    the GPU row moves with the GPU step, the serial row does not."""
    with RecordWriter(tmp_path / "speed.jsonl", {"hostname": "synthetic"}) as writer:
        for device, medians in (("cpu", [1.0] * 5), ("gpu", [1.0, 1.0, 1.0, 1.5, 1.5])):
            for k, median in enumerate(medians, 1):
                params = {"model": "mlp", "batch": 32, "threads": 1, "device": device,
                          "moment": f"v {k}"}  # fmt: skip
                record = Measurement([1e-3 * median] * 3, "speed", "step_compute", params)
                writer.write(record.to_record())
    levels = speed_levels(tmp_path)
    assert set(levels) == {("step_compute", "mlp", 32, 1, d) for d in ("cpu", "gpu")}
    host, gpu = floor_errors(
        [_row("mlp"), {**_row("mlp"), "device": "gpu"}], levels, repeats=1, draws=500
    )
    assert np.all(host == 0.0) and set(np.unique(gpu)) == {0.0, 0.5}


def test_deviation_is_the_median_distance_from_each_groups_median() -> None:
    """The floor's assumption, checked: launches spread about their row's median as drawn
    check levels do about theirs."""
    assert deviation([np.array([0.9, 1.0, 1.2]), np.array([2.0, 2.0, 2.0])]) == pytest.approx(0.0)
    assert deviation([np.array([0.9, 1.0, 1.2])]) == pytest.approx(0.1)
    assert deviation([np.array([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]])]) == pytest.approx(0.0)
    assert deviation([np.array([1.0, 2.0, 4.0])]) == pytest.approx(0.5)
    assert deviation([np.array([1.0])]) is None


def test_no_checked_rows_give_an_empty_summary() -> None:
    assert summarize_floor(floor_errors([_row()], {}, repeats=3, draws=10), 3) == {
        "configurations": 0,
        "repeats": 3,
    }
    with pytest.raises(ValueError, match="repeats"):
        floor_errors([_row()], {}, repeats=0)
