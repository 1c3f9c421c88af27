"""Bad input found by a fault probe of the commands that run things (``pdlsim train``, ``pdlsim
bench``, ``python -m microbench``): each is one line on stderr that names the culprit, exit
status 2, no traceback, and whatever was already written left as it was. Where a run stops,
its one line says what it left behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration.record_checks import MACHINE_IDENTITY
from microbench import memory
from microbench.__main__ import main as microbench_main
from microbench.commands import compression as compression_command
from microbench.errors import UserError
from microbench.machine import IDENTITY_KEYS, machine_identity
from microbench.records import RecordWriter, append_problem, read_records
from microbench.workload import Workload, load_workload
from pdlsim.cli import train as train_cli
from pdlsim.train import data
from pdlsim.train.config import TrainConfig
from pdlsim.train.epoch import checked_train_samples
from tests.conftest import run_microbench, run_pdlsim

MEASUREMENT = {"type": "measurement", "benchmark": "storage", "name": "atomic_write",
               "unit": "s", "params": {"bytes": 65536}, "samples": [0.001, 0.002]}  # fmt: skip
ELSEWHERE = {"hostname": "far", "cpu_model": "Imaginary CPU 9000", "logical_cores": 512,
             "arch": "x86_64"}  # fmt: skip


def _records(path: Path, machine: dict, run: dict, records: list[dict]) -> bytes:
    """A records file at ``path`` as a writer leaves it; its bytes, to compare afterwards."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with RecordWriter(path, machine, run) as writer:
        for record in records:
            writer.write(record)
    return path.read_bytes()


def _one_line(status: int, stderr: str, prog: str, *words: str) -> str:
    assert status == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _microbench(capsys, args: list[str]) -> tuple[int, str]:
    """``python -m microbench ARGS`` in this process: its status and stderr."""
    try:
        status = microbench_main(args)
    except SystemExit as usage:  # argparse's own errors
        status = usage.code
    return status, capsys.readouterr().err


# ------------------------------------------------------------- --append onto another's file
def test_append_onto_another_machine_s_records_is_refused_and_the_file_kept(tmp_path):
    """The new records were stored under the other machine's header (a warning about the host
    name alone), and calibration, which refuses two machines' records in two files, fitted
    them as that machine's."""
    path = tmp_path / "run" / "storage.jsonl"
    before = _records(path, ELSEWHERE, {"command": "microbench storage"}, [MEASUREMENT])
    result = run_microbench("storage", "--quick", "--sizes", "64KiB", "--quiet", "--append",
                            "--out", str(path.parent), timeout=60)  # fmt: skip
    _one_line(result.returncode, result.stderr, "python -m microbench storage",
              str(path), "another machine", "Imaginary CPU 9000", "another --out")  # fmt: skip
    assert path.read_bytes() == before


def test_append_onto_this_machine_s_records_is_accepted(tmp_path):
    """The refusal above is of another machine only: a host name that changed (a cluster's
    next node, a container's new name) with the same CPU, cores and architecture appends."""
    here = {**machine_identity(), "hostname": "another-node-of-this-partition"}
    path = tmp_path / "storage.jsonl"
    _records(path, here, {"command": "microbench storage"}, [MEASUREMENT])
    assert append_problem(path, "microbench storage") is None
    assert MACHINE_IDENTITY == tuple(f"machine.{key}" for key in IDENTITY_KEYS)


def test_a_benchmark_appended_to_a_training_run_s_records_is_refused(capsys, tmp_path):
    """A training run's header names no command, so the check of the command that wrote a
    file let a benchmark's measurements in among its steps."""
    path = tmp_path / "storage.jsonl"
    step = {"type": "train_step", "rank": 0, "epoch": 0, "step": 0, "loss": 1.0}
    before = _records(path, machine_identity(), {"model": "mlp", "procs": 1}, [step])
    status, err = _microbench(capsys, ["storage", "--sizes", "64KiB", "--append",
                                       "--out", str(tmp_path)])  # fmt: skip
    _one_line(status, err, "python -m microbench storage", "training run", "train_step")
    assert path.read_bytes() == before


def test_append_to_an_empty_records_file_starts_it(tmp_path):
    """The writer starts an empty file afresh, but the check before the run refused it as a
    damaged header, "move that file aside", for a file that holds nothing."""
    path = tmp_path / "storage.jsonl"
    path.write_bytes(b"")
    assert append_problem(path, "microbench storage") is None
    with RecordWriter(path, ELSEWHERE, {"command": "microbench storage"}, append=True) as w:
        w.write(MEASUREMENT)
    header, records = read_records(path)
    assert header["machine"]["cpu_model"] == "Imaginary CPU 9000" and len(records) == 1


# ------------------------------------------------------------ batches no memory holds
@pytest.fixture
def one_gib(monkeypatch):
    """A machine of 1 GiB, so that a batch of a million mlp samples (2.9 GiB of activations)
    cannot fit it, whatever the machine running the tests has."""
    monkeypatch.setattr(memory, "usable_memory_bytes", lambda machine=None: 2**30)


@pytest.mark.parametrize(
    "command",
    [
        ["compute", "--model", "mlp", "--batch", "32,1000000", "--gemm-sizes", "64"],
        ["speed", "--model", "mlp", "--batch", "32,1000000"],
    ],
    ids=["compute", "speed"],
)
def test_a_batch_no_memory_holds_is_named_before_any_point_is_recorded(
    capsys, tmp_path, one_gib, command
):
    """compute timed its GEMMs and the smaller batches, wrote them, and then failed as "not
    enough memory ... use smaller sizes", naming no flag; the file was left a stopped run."""
    name = f"{command[0]}.jsonl"
    path = tmp_path / name
    run = {"command": f"microbench {command[0]}"}
    before = _records(path, machine_identity(), run, [MEASUREMENT])
    status, err = _microbench(capsys, [*command, "--append", "--out", str(tmp_path)])
    _one_line(status, err, f"python -m microbench {command[0]}", "--batch 1,000,000",
              "mlp's activations", "give a smaller --batch")  # fmt: skip
    assert path.read_bytes() == before
    status, err = _microbench(capsys, [*command, "--out", str(tmp_path / "new")])
    _one_line(status, err, f"python -m microbench {command[0]}", "--batch 1,000,000")
    assert not (tmp_path / "new").exists()


def test_compression_sizes_no_memory_holds_are_named_before_any_point(
    capsys, monkeypatch, tmp_path
):
    """Its smaller sizes were timed and recorded, then the largest failed as "not enough
    memory ... use smaller sizes", naming no flag and leaving a stopped run behind."""
    monkeypatch.setattr(compression_command, "available_memory_bytes", lambda: 2**20)
    path = tmp_path / "compression.jsonl"
    run = {"command": "microbench compression"}
    before = _records(path, machine_identity(), run, [MEASUREMENT])
    args = ["compression", "--sizes", "64KiB,1MiB", "--append", "--out", str(tmp_path)]
    status, err = _microbench(capsys, args)
    _one_line(status, err, "python -m microbench compression", "--sizes 1 MiB",
              "give smaller --sizes")  # fmt: skip
    assert path.read_bytes() == before


def test_pdlsim_bench_and_microbench_share_the_batch_check(one_gib):
    mlp = load_workload("mlp")
    problem = memory.activations_problem("--batch", (16, 1_000_000), (mlp,))
    assert problem is not None and problem.startswith("--batch 1,000,000: mlp's")
    assert memory.activations_problem("--batch", (16, 32), (mlp,)) is None
    wide = Workload.from_dict({"name": "wide", "input_shape": [10], "layers": [
        {"kind": "dense", "units": 2**29}, {"kind": "softmax_cross_entropy"}]})  # fmt: skip
    problem = memory.activations_problem("--batch", (1,), (wide,))  # no batch fits: say so
    assert problem is not None and "per sample" in problem and "smaller workload" in problem


@pytest.mark.parametrize("command", ["jitter", "speed"])
def test_a_moment_label_that_would_break_a_report_line_is_refused(capsys, tmp_path, command):
    out = tmp_path / "o"
    status, err = _microbench(capsys, [command, "--moment", "check 1\n\x1b[2J", "--out", str(out)])
    line = _one_line(status, err, f"python -m microbench {command}", "--moment", "\\n")
    assert "\x1b" not in line
    assert not out.exists()


# ------------------------------------------------------------ the data sets of a training run
def _idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    path.write_bytes(header + array.tobytes())


def test_a_test_set_larger_than_the_files_names_test_samples(tmp_path):
    """The default --test-samples 1024 of a small MNIST folder was refused as "asked for 1024
    samples", a number the user never gave, naming no flag."""
    images = np.zeros((16, 28, 28), np.uint8)
    labels = (np.arange(16) % 10).astype(np.uint8)
    for split in ("train", "t10k"):
        _idx(tmp_path / f"{split}-images-idx3-ubyte", images)
        _idx(tmp_path / f"{split}-labels-idx1-ubyte", labels)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    out = kept / "run"
    result = run_pdlsim("train", "--data", f"mnist:{tmp_path}", "--batch", "4", "--max-steps",
                        "1", "--out", str(out), timeout=60)  # fmt: skip
    _one_line(result.returncode, result.stderr, "pdlsim", "16 test samples",
              "give --test-samples 16 or fewer")  # fmt: skip
    assert not out.exists() and (kept / "notes.txt").read_text() == "mine"


def test_a_synthetic_test_set_too_large_names_test_samples(monkeypatch):
    monkeypatch.setattr(data, "available_memory_bytes", lambda: 2**20)
    config = TrainConfig(model="mlp", samples=8, test_samples=5000)
    with pytest.raises(UserError, match="give --test-samples [0-9]+ or fewer") as refused:
        checked_train_samples(config, load_workload("mlp"))
    assert "--samples" not in str(refused.value).replace("--test-samples", "")


def test_the_sets_every_rank_draws_must_fit_memory_together(monkeypatch):
    """Each rank draws the whole training and test sets: each set alone was held to half the
    memory, so two ranks of sets that fitted one by one ran the machine out of memory, and
    the run ended as "mpiexec exited with status ...", its cause unnamed."""
    mlp = load_workload("mlp")
    per_sample = 784 * 4
    monkeypatch.setattr(data, "available_memory_bytes", lambda: 4000 * per_sample)
    alone = TrainConfig(model="mlp", samples=1500, test_samples=400)
    assert checked_train_samples(alone, mlp) == 1500  # 1,900 samples: under half
    together = TrainConfig(model="mlp", samples=1500, test_samples=400, procs=2)
    with pytest.raises(UserError, match="2 ranks each draw 1500 training and 400 test") as no:
        checked_train_samples(together, mlp)
    assert "--procs" in str(no.value) and "\n" not in str(no.value)


# ------------------------------------------------------------ what a stopped run says
@pytest.mark.parametrize("stop", [KeyboardInterrupt(), train_cli.Stopped(15)])
def test_a_run_stopped_before_its_first_record_points_at_no_folder(
    monkeypatch, capsys, tmp_path, stop
):
    """It said "records so far are in DIR; continue from its last checkpoint with --resume"
    of a folder that was never made, and of a --resume that refuses a run with no
    checkpoint."""

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(train_cli, "_train", stopped)
    monkeypatch.setattr(train_cli, "set_threads", lambda threads: None)
    config = TrainConfig(model="mlp", samples=64, batch_per_rank=4, checkpoint_every=2)
    out = tmp_path / "run"
    status = train_cli._run_local(config, out, None)
    assert status in (130, 143)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("; it had written no records yet"), err
    assert str(out) not in err[0] and "--resume" not in err[0]
    out.mkdir()  # a run stopped after a checkpoint: the folder, and the way to go on
    (out / "rank0.jsonl").write_text("{}\n")
    (out / "checkpoint-step00000002.npz").write_bytes(b"")
    status = train_cli._run_local(config, out, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"records so far are in {out}; continue from" in err[0], err
