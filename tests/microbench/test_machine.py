"""Machine metadata: complete, JSON-serialisable, MPI only when asked, right under mpiexec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from microbench.machine import machine_metadata, utc_now
from microbench.records import load_dataframe

REPO = Path(__file__).resolve().parents[2]
MPI_TIMEOUT_S = 30
KEYS = {
    "hostname",
    "os",
    "kernel",
    "platform",
    "arch",
    "python_version",
    "python_implementation",
    "cpu_model",
    "logical_cores",
    "physical_cores",
    "cores_available",
    "cpu_quota_cores",
    "memory_total_bytes",
    "memory_limit_bytes",
    "numpy_version",
    "blas",
    "threadpools",
    "numba_version",
    "mpi",
    "threads",
    "thread_env",
    "gpus",
    "cuda_visible_devices",
    "pdlsim_version",
    "collected_utc",
}
MPI_KEYS = {
    "library_version",
    "standard_version",
    "mpi4py_version",
    "ranks",
    "rank",
    "ranks_per_node",
    "nodes",
}


def mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def run_python(code: str, *launcher: str, args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*launcher, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT_S,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )


def test_metadata_has_the_documented_keys_and_is_json():
    md = machine_metadata(threads=3, extra={"note": "x"})
    assert set(md) == KEYS | {"note"}
    assert set(md["mpi"]) == MPI_KEYS
    assert json.loads(json.dumps(md, allow_nan=False)) == md
    assert md["threads"] == 3 and md["note"] == "x"
    assert md["logical_cores"] >= 1 and 1 <= md["cores_available"] <= md["logical_cores"]
    assert md["memory_total_bytes"] > 2**20
    assert isinstance(md["gpus"], list) or md["gpus"] is None
    assert md["pdlsim_version"] and md["numpy_version"]
    assert md["blas"] is None or "num_threads" in md["blas"]
    assert md["collected_utc"].endswith("Z") and utc_now() >= md["collected_utc"]


def test_extra_keys_win():
    assert machine_metadata(extra={"threads": 8})["threads"] == 8


def test_no_mpi_without_a_communicator():
    code = (
        "import json, sys\n"
        "from microbench.machine import machine_metadata\n"
        "md = machine_metadata()\n"
        "json.dumps(md)\n"
        "assert 'mpi4py.MPI' not in sys.modules, 'mpi4py.MPI was imported'\n"
        "print(json.dumps(md['mpi']))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    mpi = json.loads(done.stdout)
    assert mpi["ranks"] is None and mpi["library_version"] is None


def test_an_odd_machine_gives_nulls_not_errors(monkeypatch):
    import microbench.machine as machine

    def broken(*args, **kwargs):
        raise OSError("no such thing here")

    monkeypatch.setattr(machine, "_read_text", broken)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: None)
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    monkeypatch.setattr(machine.platform, "uname", broken)
    md = machine_metadata()
    assert set(md) == KEYS
    assert md["gpus"] == [] and md["os"] is None and md["logical_cores"] is None
    assert md["memory_total_bytes"] is None or md["memory_total_bytes"] > 0  # sysconf fallback
    json.dumps(md, allow_nan=False)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_mpi_layout_under_mpiexec_with_two_ranks(tmp_path):
    # Each rank writes its own records file (stdout of two ranks may interleave mid-line).
    code = (
        "import sys\n"
        "from mpi4py import MPI\n"
        "from microbench.machine import machine_metadata\n"
        "from microbench.records import RecordWriter\n"
        "md = machine_metadata(comm=MPI.COMM_WORLD, threads=1)\n"
        "rank = MPI.COMM_WORLD.Get_rank()\n"
        "with RecordWriter(f'{sys.argv[1]}/rank{rank}.jsonl', md) as writer:\n"
        "    writer.write({'type': 'hello', 'rank': rank, 'no_comm': machine_metadata()['mpi']})\n"
    )
    done = run_python(code, mpiexec(), "-n", "2", args=[str(tmp_path)])
    assert done.returncode == 0, done.stderr
    frame = load_dataframe(tmp_path)
    assert list(frame["source"]) == ["rank0.jsonl", "rank1.jsonl"]
    assert list(frame["machine.mpi.rank"]) == list(frame["rank"]) == [0, 1]
    assert (frame["machine.mpi.ranks"] == 2).all()
    assert (frame["machine.mpi.ranks_per_node"] == 2).all()
    assert (frame["machine.mpi.nodes"] == 1).all()
    assert (frame["machine.threads"] == 1).all()
    # Without a communicator: what needs no collective call, and no per-node count.
    assert list(frame["no_comm.rank"]) == [0, 1] and (frame["no_comm.ranks"] == 2).all()
    assert frame["no_comm.ranks_per_node"].isna().all()
    assert all("MPICH" in library for library in frame["machine.mpi.library_version"])
    assert all(v[0].isdigit() for v in frame["machine.mpi.standard_version"])
