"""The training loops' step records: held between timed steps, none lost at the end."""

from __future__ import annotations

import pytest

from microbench.records import RecordWriter, read_records
from pdlsim.train.runinfo import StepLog
from tests.conftest import run_pdlsim

MACHINE = {"hostname": "node01", "logical_cores": 2}


def _step(i: int) -> dict:
    return {"type": "train_step", "step": i, "phases_s": {"forward": 1e-3}}


def test_steps_reach_the_file_only_on_flush_and_then_in_order(tmp_path):
    path = tmp_path / "rank0.jsonl"
    with RecordWriter(path, MACHINE) as writer, StepLog(writer) as log:
        for i in range(3):
            log.add(_step(i))
        assert read_records(path)[1] == []  # nothing between the timed steps
        log.flush()
        assert [r["step"] for r in read_records(path)[1]] == [0, 1, 2]
        log.add(_step(3))
    assert [r["step"] for r in read_records(path)[1]] == [0, 1, 2, 3]  # the exit flushed


def test_a_loop_that_fails_mid_epoch_keeps_the_steps_it_finished(tmp_path):
    path = tmp_path / "rank0.jsonl"
    with pytest.raises(RuntimeError, match="step 2 failed"):
        with RecordWriter(path, MACHINE) as writer, StepLog(writer) as log:
            for i in range(5):
                if i == 2:
                    raise RuntimeError("step 2 failed")
                log.add(_step(i))
    assert [r["step"] for r in read_records(path)[1]] == [0, 1]


def test_a_diverged_loss_is_said_once_and_stored_as_null(tmp_path):
    path, said = tmp_path / "rank0.jsonl", []
    with (
        RecordWriter(path, MACHINE, nonfinite="null") as writer,
        StepLog(writer, said.append) as log,
    ):
        for i, loss in enumerate([2.3, float("inf"), float("nan"), 1.0]):
            log.add({**_step(i), "global_step": i, "loss": loss})
    assert len(said) == 1 and "diverged" in said[0] and "step 1" in said[0]
    assert [r["loss"] for r in read_records(path)[1]] == [2.3, None, None, 1.0]


def test_a_training_run_that_diverges_still_ends_with_its_step_times(tmp_path):
    """A learning rate far too large overflows the weights: the run says so and its timed
    steps stand (validate times training, whatever the loss does)."""
    run = run_pdlsim("train", "--model", "mlp", "--lr", "1000", "--max-steps", "6", "--batch", "16",
                     "--out", str(tmp_path / "run"), timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "the run diverged" in run.stdout + run.stderr
    steps = [r for r in read_records(tmp_path / "run" / "rank0.jsonl")[1]
             if r.get("type") == "train_step"]  # fmt: skip
    assert len(steps) == 6 and all(r["step_s"] > 0 for r in steps)
