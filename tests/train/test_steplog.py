"""The training loops' step records: held between timed steps, none lost at the end."""

from __future__ import annotations

import pytest

from microbench.records import RecordWriter, read_records
from pdlsim.train.runinfo import StepLog

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
