"""``pdlsim train --resume`` from a checkpoint whose arrays are damaged (a member of another
dtype, an object array, a data-order state numpy refuses): the launching process read only the
header, so the run started and each rank failed on loading: under mpiexec three lines (a rank's
error, MPI's abort, the launcher's) advising the very ``--resume`` that had failed, and never
the checkpoint kept before it. Now the whole checkpoint is read before any rank starts."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import run_pdlsim
from tests.train.runs import TINY


def _as_float64(members: dict) -> None:
    members["params"] = members["params"].astype(np.float64)


def _object_member(members: dict) -> None:
    members["params"] = np.array([{"a": 1}], dtype=object)


def _bad_order_state(members: dict) -> None:
    header = json.loads(str(members["header"]))
    header["rng_state"] = {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1}}
    members["header"] = np.array(json.dumps(header))


@pytest.mark.parametrize(
    ("damage", "problem", "procs"),
    [
        (_as_float64, "params are float64 (235146,), not flat float32", "1"),
        (_object_member, "Object arrays cannot be loaded", "1"),
        (_bad_order_state, "bad data-order generator state", "1"),
        (_as_float64, "params are float64 (235146,), not flat float32", "2"),
    ],
)
def test_a_checkpoint_with_damaged_arrays_is_refused_before_training_in_one_line(
    tmp_path, finished_run, damage, problem, procs
):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    *_, older, newest = sorted(out.glob("checkpoint-step*.npz"))
    with np.load(newest, allow_pickle=True) as loaded:
        members = dict(loaded)
    damage(members)
    np.savez(newest, **members)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = run_pdlsim(
        "train", *TINY, "--procs", procs, "--epochs", "2", "--out", str(out), "--resume",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"pdlsim: error: checkpoint {newest}: ")
    assert problem in lines[0]
    assert lines[0].endswith(f"; move it aside to resume from {older.name}")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written
