"""``pdlsim train --procs 2`` stopped or failing on a rank says so in one line: Ctrl-C printed
three (rank 0's "interrupted" without the resume advice, MPICH's ``Abort(130) on node 0 ...``
and the launcher's own), and a rank's error two more after its own (MPICH's abort line, then
the launcher's "mpiexec exited with status 2 ... continue with --resume", which was the very
thing that had failed)."""

from __future__ import annotations

import signal

import numpy as np

from microbench.records import read_records
from pdlsim.train.checkpoint import list_checkpoints
from tests.conftest import run_pdlsim
from tests.train.runs import stop_after_first_checkpoint

BASE = ["train", "--procs", "2", "--samples", "4096", "--test-samples", "16", "--batch", "16",
        "--checkpoint-every", "2"]  # fmt: skip
RUN = [*BASE, "--epochs", "50"]


def test_ctrl_c_on_an_mpi_run_is_one_line_with_the_resume_advice(tmp_path):
    out = tmp_path / "run"
    status, stderr = stop_after_first_checkpoint(RUN, out, signal.SIGINT)
    assert status == 130, stderr
    assert stderr.splitlines() == [
        f"pdlsim: interrupted; all ranks stopped; records so far are in {out}; continue from "
        "its last checkpoint with --resume"
    ]
    for rank in (0, 1):  # kept, whole (a cut-off last line at most, which readers skip)
        _, records = read_records(out / f"rank{rank}.jsonl")
        assert any(r["type"] == "train_step" for r in records)


def test_a_rank_s_error_is_its_one_line_without_mpi_s_abort_line(tmp_path):
    out = tmp_path / "run"
    first = run_pdlsim(*BASE, "--epochs", "1", "--max-steps", "4", "--out", str(out))
    assert first.returncode == 0, first.stderr
    newest = list_checkpoints(out)[-1]
    with np.load(newest) as loaded:
        members = dict(loaded)
    members["params"] = members["params"][:10]  # a whole file, but not this network's weights
    np.savez(newest, **members)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = run_pdlsim(*BASE, "--epochs", "2", "--max-steps", "4", "--out", str(out), "--resume")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pdlsim: error: rank ")
    assert f"checkpoint {newest}: 10 weights, but the network has 235146" in lines[0]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in before} == before
