"""Outputs never destroy what is already there: an output that is one of the run's own input
files is refused (a trace written over the workload it was computed from), a link is written
through (not replaced by a plain file), a read-only file and a folder under a missing one are
refused up front; each in one line, exit status 2, the existing files byte for byte as they
were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pdlsim
from microbench import fileio
from microbench.errors import UserError
from microbench.records import RecordWriter
from pdlsim.cli.main import main

WORKLOAD = {
    "name": "tiny",
    "input_shape": [4],
    "layers": [{"kind": "dense", "units": 2}, {"kind": "softmax_cross_entropy"}],
}
QUICK = ["--samples", "2", "--iterations", "2"]


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(WORKLOAD))
    return path


@pytest.mark.parametrize("via_link", [False, True])
def test_a_trace_onto_the_workload_it_reads_is_refused_and_the_workload_kept(
    capsys, tmp_path, workload, via_link
):
    before = workload.read_bytes()
    trace = workload
    if via_link:  # another name for the same file
        trace = tmp_path / "trace.json"
        trace.symlink_to(workload)
    err = _refused(capsys, ["predict", "--nodes", "2", "--model", str(workload), *QUICK,
                            "--trace", str(trace)])  # fmt: skip
    assert f"--trace {trace} is the --model file {workload}" in err
    assert "give --trace another name" in err
    assert workload.read_bytes() == before


def test_sweep_tables_onto_an_input_are_refused_before_any_prediction(capsys, tmp_path):
    table = tmp_path / "sweep.csv"  # the workload, saved where the table goes
    table.write_text(json.dumps(WORKLOAD))
    before = table.read_bytes()
    err = _refused(capsys, ["sweep", "--nodes", "1,2", "--model", str(table), *QUICK,
                            "--out", str(tmp_path)])  # fmt: skip
    assert f"--out {table} is the --model file" in err
    assert table.read_bytes() == before and not (tmp_path / "scaling.png").exists()


def test_the_api_refuses_a_trace_onto_its_workload_file(workload):
    before = workload.read_bytes()
    with pytest.raises(UserError, match="is the --model file"):
        pdlsim.predict(str(workload), pdlsim.Cluster.cpus(2), trace=str(workload), samples=2)
    assert workload.read_bytes() == before


def test_a_trace_through_a_link_replaces_the_file_it_leads_to_and_keeps_the_link(capsys, tmp_path):
    target = tmp_path / "kept" / "trace.json"
    target.parent.mkdir()
    target.write_text("OLD\n")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    assert main(["predict", "--nodes", "2", *QUICK, "--trace", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["traceEvents"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "latest.json"]


def test_the_atomic_writers_write_through_a_link(tmp_path):
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)  # relative, as ln -s makes it
    fileio.atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "real.csv"]


def test_a_read_only_trace_is_refused_up_front_and_kept(capsys, tmp_path, monkeypatch):
    """Root may write anything, so the permission is what os.access says (stubbed here)."""
    trace = tmp_path / "trace.json"
    trace.write_text("KEEP\n")
    trace.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(fileio.os, "access", lambda p, mode: False if Path(p) == trace
                        else real_access(p, mode))  # fmt: skip
    err = _refused(capsys, ["predict", "--nodes", "2", *QUICK, "--trace", str(trace)])
    assert f"--trace {trace} is read-only; make it writable (chmod u+w)" in err
    assert trace.read_text() == "KEEP\n"


@pytest.mark.parametrize(
    "command",
    [["sweep", "--nodes", "1,2", *QUICK], ["train", "--max-steps", "2"],
     ["validate", "--profile", "epyc-2core", "--quick"]],
    ids=["sweep", "train", "validate"],
)  # fmt: skip
def test_an_output_in_a_missing_folder_is_refused_and_nothing_made(capsys, tmp_path, command):
    out = tmp_path / "typo" / "run"
    err = _refused(capsys, [*command, "--out", str(out)])
    assert f"the folder {out.parent} does not exist; create it" in err
    assert not out.parent.exists()


def _compute_run(tmp_path: Path) -> Path:
    """A run folder of one records file (compute only: the fits would refuse it, after the
    checks of --out)."""
    path = tmp_path / "run" / "ranks1" / "compute.jsonl"
    path.parent.mkdir(parents=True)
    with RecordWriter(path, machine={"cpu_model": "x", "logical_cores": 2, "arch": "x86_64"}) as w:
        w.write({"type": "measurement", "benchmark": "compute", "name": "gemm", "unit": "s",
                 "params": {"m": 64, "threads": 1}, "samples": [0.1, 0.2]})  # fmt: skip
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("out", "problem"),
    [
        ("missing/profile.json", "the folder {tmp}/missing does not exist"),
        ("run/ranks1/compute.jsonl", "holds benchmark records (pdlsim.records)"),
        ("run/ranks1/profile.json", "the Extra-P file written beside it"),
        ("beside/profile.json", "{tmp}/beside/plots is a file; give a directory"),
    ],
)
def test_a_profile_that_could_only_be_written_over_records_or_nowhere_is_refused_before_the_fits(
    capsys, tmp_path, out, problem
):
    """``calibrate --out`` was probed only for being writable: a missing folder failed at the
    write after every fit, a records file of the run itself (or one where the Extra-P file
    goes beside it) was replaced by the profile, and a file where the plots folder goes failed
    the run after the profile had replaced the old one."""
    run = _compute_run(tmp_path)
    records = run / "ranks1" / "compute.jsonl"
    kept = records.read_bytes()
    if out.endswith("ranks1/profile.json"):
        records.rename(run / "ranks1" / "extrap.jsonl")
    (tmp_path / "beside").mkdir()
    (tmp_path / "beside" / "plots").write_text("KEEP")
    (tmp_path / "beside" / "profile.json").write_text("the old profile")
    err = _refused(capsys, ["calibrate", "--from", str(run), "--out", str(tmp_path / out)])
    assert problem.format(tmp=tmp_path) in err
    assert kept in {p.read_bytes() for p in (run / "ranks1").iterdir()}
    assert (tmp_path / "beside" / "profile.json").read_text() == "the old profile"
    assert not (tmp_path / "missing").exists()
