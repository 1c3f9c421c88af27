"""Real training runs: every execution mode computes the same thing, and records it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from microbench.records import load_dataframe, read_records
from pdlsim.cli.train_summary import format_memory
from pdlsim.train.comm import LocalComm
from pdlsim.train.config import TrainConfig
from pdlsim.train.device import Device, cpu_device
from pdlsim.train.loop import PHASES, train
from pdlsim.train.runinfo import device_pool_bytes
from tests.conftest import MPI_TIMEOUT_S, mpiexec, run_pdlsim

pytestmark = pytest.mark.long_module  # every execution mode of every preset: about a minute

SMALL = {
    "mlp": ["--samples", "512", "--test-samples", "64", "--max-steps", "6"],
    "cnn": ["--samples", "128", "--test-samples", "32", "--max-steps", "3"],
    "rescnn": ["--samples", "128", "--test-samples", "32", "--max-steps", "3"],
    "transformer": ["--samples", "256", "--test-samples", "32", "--max-steps", "4"],
    "lm": ["--samples", "256", "--test-samples", "32", "--max-steps", "4"],
}
# A causal language model with tied output weights, a label per token (a workload file).
LANGUAGE_MODEL = {
    "name": "lm",
    "input_shape": [12],
    "layers": [
        {"kind": "embedding", "name": "wte", "vocab": 48, "dim": 16, "positions": 12},
        {"kind": "layernorm", "name": "ln1"},
        {"kind": "attention", "name": "attn", "heads": 2, "causal": True},
        {"kind": "add", "name": "res", "inputs": ["wte", "attn"]},
        {"kind": "layernorm", "name": "lnf"},
        {"kind": "dense", "name": "head", "units": 48, "bias": False, "tied_to": "wte"},
        {"kind": "token_cross_entropy", "name": "loss"},
    ],
}


def _loss_curve(run_dir: Path) -> np.ndarray:
    """The global loss per step: the mean over ranks of each rank's local mean loss."""
    steps = load_dataframe(run_dir, type="train_step")
    return steps.groupby("global_step")["loss"].mean().sort_index().to_numpy()


def _train(
    tmp_path: Path, name: str, model: str, procs: int, threads: int, batch: int,
    optimizer: tuple[str, ...] = ("--momentum", "0.9"),
) -> Path:  # fmt: skip
    out = tmp_path / name
    spec = model
    if model == "lm":
        spec = str(tmp_path / "lm.json")
        Path(spec).write_text(json.dumps(LANGUAGE_MODEL))
    result = run_pdlsim(
        "train",
        "--model",
        spec,
        "--procs",
        str(procs),
        "--threads",
        str(threads),
        "--batch",
        str(batch),
        "--epochs",
        "2",
        *optimizer,
        "--out",
        str(out),
        *SMALL[model],
    )
    assert result.returncode == 0, result.stderr
    return out


ADAMW = ("--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.01")


@pytest.fixture(scope="module")
def mlp_over_two_ranks(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``pdlsim train --procs 2 --batch 8 --epochs 2`` of the mlp (plain SGD): the run
    whose records, summary and refusal to be overwritten the tests below read."""
    out = tmp_path_factory.mktemp("mlp") / "mpi"
    run = run_pdlsim("train", "--procs", "2", "--batch", "8", "--epochs", "2", "--out", str(out),
                     *SMALL["mlp"])  # fmt: skip
    assert run.returncode == 0, run.stderr
    return out, run


MODES = {"serial": (1, 1, 16), "threads": (1, 2, 16), "mpi": (2, 1, 8), "hybrid": (2, 2, 8)}


@pytest.mark.parametrize(
    ("model", "optimizer", "modes"),
    [("mlp", ("--momentum", "0.9"), MODES), ("cnn", ("--momentum", "0.9"), MODES),
     ("rescnn", ("--momentum", "0.9"), MODES), ("transformer", ADAMW, MODES),
     ("lm", ADAMW, ("serial", "mpi", "hybrid"))],
    ids=["mlp-momentum", "cnn-momentum", "rescnn-momentum", "transformer-adamw", "lm-adamw"],
)  # fmt: skip
def test_serial_threads_mpi_and_hybrid_give_the_same_loss_curve(tmp_path, model, optimizer, modes):
    """Synchronous data parallelism is the same computation: global batch 16 every time (Adam
    reads the summed gradients scaled by 1 / ranks: the same update as serial), chains and
    graphs (residual adds, attention) alike. The language model's tied weights and causal
    attention add nothing that threads alone would split differently: hybrid has its threads."""
    runs = {name: _train(tmp_path, name, model, *MODES[name], optimizer) for name in modes}
    curves = {mode: _loss_curve(run_dir) for mode, run_dir in runs.items()}
    reference = curves["serial"]
    assert len(reference) == 2 * int(SMALL[model][-1])
    assert reference[-1] < reference[0]  # it learns
    for mode, curve in curves.items():
        np.testing.assert_allclose(curve, reference, rtol=2e-4, err_msg=mode)
    # ... and the two MPI ranks really saw different halves of each global batch.
    mpi_steps = load_dataframe(runs["mpi"], type="train_step")
    by_rank = mpi_steps.pivot(index="global_step", columns="rank", values="loss")
    assert not np.allclose(by_rank[0], by_rank[1])


def test_records_hold_every_phase_epoch_summaries_and_machine_metadata(mlp_over_two_ranks):
    out, _ = mlp_over_two_ranks
    header, records = read_records(out / "rank1.jsonl")
    assert header["run"]["mode"] == "mpi"
    assert header["run"]["global_batch"] == 16
    assert header["machine"]["mpi"]["ranks"] == 2
    steps = [r for r in records if r["type"] == "train_step"]
    assert len(steps) == 12 and all(r["rank"] == 1 for r in steps)
    assert set(steps[0]["phases_s"]) == set(PHASES)
    for record in steps:
        assert all(v >= 0 for v in record["phases_s"].values())
        assert sum(record["phases_s"].values()) == pytest.approx(record["step_s"], rel=1e-6)
        assert record["phases_s"]["allreduce"] > 0
    epochs = [r for r in records if r["type"] == "train_epoch"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["mode"] == "mpi" and len(summary["epochs"]) == 2
    frame = load_dataframe(out, type="train_step")
    assert set(frame["rank"]) == {0, 1}
    assert "phases_s.allreduce" in frame.columns


def test_the_printed_summary_states_batch_semantics_and_phase_shares(mlp_over_two_ranks):
    _, result = mlp_over_two_ranks
    assert "batch 8 per rank = global batch 16" in result.stdout
    assert "lr 0.02 (not scaled)" in result.stdout
    assert "samples/s" in result.stdout
    for phase in PHASES:
        assert phase in result.stdout


def test_in_process_training_learns_the_synthetic_task(tmp_path):
    config = TrainConfig(model="mlp", batch_per_rank=32, epochs=3, lr=0.05, samples=2048)
    result = train(config, LocalComm(), cpu_device(), tmp_path / "run", log=lambda line: None)
    accuracies = [e.test_accuracy for e in result.epochs]
    assert accuracies[-1] > 0.5  # ten classes: chance is 0.1
    assert result.epochs[-1].loss < result.epochs[0].loss


def test_the_gpu_code_path_with_numpy_standing_in_for_cupy_trains_the_same(tmp_path):
    """Every GPU branch of the loop (device copies, synchronisation, the array kernels) runs
    here with numpy as the array module; a real GPU is exercised where one is lent."""
    config = TrainConfig(model="cnn", batch_per_rank=8, samples=64, test_samples=16)
    cpu = train(config, LocalComm(), cpu_device(), tmp_path / "cpu", log=lambda line: None)
    stand_in = Device(
        kind="gpu", xp=np, name="numpy-as-gpu", synchronize=lambda: None, kernel_backend="array"
    )
    gpu = train(config, LocalComm(), stand_in, tmp_path / "gpu", log=lambda line: None)
    np.testing.assert_allclose(gpu.step_losses, cpu.step_losses, rtol=1e-4)
    header, _ = read_records(tmp_path / "gpu" / "rank0.jsonl")
    assert header["run"]["mode"] == "serial" and header["run"]["device"] == "numpy-as-gpu"


def test_a_job_started_by_the_users_own_mpiexec(tmp_path):
    out = tmp_path / "own"
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "pdlsim", "train", "--out", str(out)]
    result = subprocess.run(
        command + SMALL["mlp"], capture_output=True, text=True, timeout=MPI_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    mismatch = subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, "-m", "pdlsim", "train", "--procs", "3"],
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT_S,
    )
    assert mismatch.returncode != 0
    assert "--procs 3 but this MPI job has 2 ranks" in mismatch.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "no workload preset or file named 'nope'"),
        (["--data", "imagenet:/x"], "imagenet"),
        (["--data", "mnist:/does/not/exist"], "/does/not/exist"),
        (["--batch", "4096", "--samples", "100"], "exceeds the 100 training samples"),
        (["--momentum", "1.5"], "--momentum must be below 1"),
        (["--optimizer", "adam", "--momentum", "0.9"], "adam keeps its own moments"),
        (["--weight-decay", "0.1"], "--weight-decay is for --optimizer adam or adamw"),
        (["--optimizer", "lion"], "invalid choice: 'lion'"),
        (["--batch", "0"], "expected a positive integer"),
        (["--procs", "two"], "expected a positive integer, got 'two'"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args, message):
    result = run_pdlsim("train", *args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_gpu_mode_without_a_gpu_says_so_and_exits_2(tmp_path):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present: the no-GPU message does not apply")
    except Exception:
        pass
    result = run_pdlsim("train", "--device", "gpu", "--out", str(tmp_path / "g"), timeout=60)
    assert result.returncode == 2
    assert "--device gpu" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "g").exists()


def test_existing_records_are_never_overwritten(tmp_path, mlp_over_two_ranks):
    out, _ = mlp_over_two_ranks
    before = (out / "rank0.jsonl").read_bytes()
    again = run_pdlsim("train", "--out", str(out), *SMALL["mlp"])
    assert again.returncode == 2 and "already holds records" in again.stderr
    assert (out / "rank0.jsonl").read_bytes() == before
    a_file = tmp_path / "file"
    a_file.write_text("keep me")
    result = run_pdlsim("train", "--out", str(a_file))
    assert result.returncode == 2 and "is a file" in result.stderr
    assert a_file.read_text() == "keep me"


def _start_long_run(out: Path) -> subprocess.Popen:
    """A long 2-rank run that takes Ctrl-C as from a terminal: SIGINT back to its default in
    the child, since a suite started in the background (``cmd &``) inherits it ignored."""
    return subprocess.Popen(
        [sys.executable, "-m", "pdlsim", "train", "--procs", "2", "--epochs", "1000"]
        + ["--samples", "512", "--test-samples", "32", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_steps(path: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) > count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never got {count} records")


def test_a_killed_rank_stops_every_rank_and_keeps_the_records(tmp_path):
    out = tmp_path / "killed"
    process = _start_long_run(out)
    try:
        _wait_for_steps(out / "rank1.jsonl", 5)
        header, _ = read_records(out / "rank1.jsonl")
        os.kill(header["run"]["pid"], signal.SIGKILL)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        assert time.monotonic() - started < 15
    finally:
        process.kill()
    assert process.returncode not in (0, None)
    assert "training stopped" in stderr and str(out) in stderr
    frame = load_dataframe(out, type="train_step")
    assert len(frame[frame["rank"] == 0]) >= 5


def _alive(pid: int) -> bool:
    """Running, that is: a zombie waiting for a parent that never reaps it has ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("sig", "status", "message"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_ctrl_c_or_sigterm_stops_all_ranks_within_seconds(tmp_path, sig, status, message):
    out = tmp_path / "interrupted"
    process = _start_long_run(out)
    try:
        _wait_for_steps(out / "rank0.jsonl", 5)
        _wait_for_steps(out / "rank1.jsonl", 5)
        rank_pids = [read_records(out / f"rank{r}.jsonl")[0]["run"]["pid"] for r in (0, 1)]
        process.send_signal(sig)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        assert time.monotonic() - started < 15
    finally:
        process.kill()
    assert process.returncode == status
    assert message in stderr and str(out) in stderr
    time.sleep(1)
    assert not any(_alive(pid) for pid in rank_pids), "a rank outlived the run"
    assert len(load_dataframe(out, type="train_step")) >= 10


MLP_PARAM_BYTES = 4 * 235_146


def test_peak_memory_and_model_state_bytes_are_recorded_serial_and_mpi(
    tmp_path, mlp_over_two_ranks
):
    """Model-state bytes follow from the shapes (mlp 784-256-128-10, batch 16, momentum: one
    velocity); the measured peak holds at least them; both reach the records and the summary."""
    config = TrainConfig(model="mlp", batch_per_rank=16, samples=256, test_samples=32)
    config = dataclasses.replace(config, momentum=0.9, epochs=2)
    result = train(config, LocalComm(), cpu_device(), tmp_path / "serial", log=lambda line: None)
    activations = 16 * (256 + 128 + 256 + 10 + 128 + 10) * 4  # outputs, input grads, dlogits
    host_batch = 16 * 784 * 4 + 16 * 8  # float32 images and int64 labels
    state = result.epochs[-1].model_state_bytes
    assert state == {
        "weights": MLP_PARAM_BYTES,
        "gradients": MLP_PARAM_BYTES,
        "optimizer_state": MLP_PARAM_BYTES,
        "activations": activations,
        "buffers": host_batch,
        "total": 3 * MLP_PARAM_BYTES + activations + host_batch,
    }
    _, records = read_records(tmp_path / "serial" / "rank0.jsonl")
    epochs = [r for r in records if r["type"] == "train_epoch"]
    assert len(epochs) == 2
    for record in epochs:
        assert record["peak_rss_bytes"] == record["peak_rss_bytes_max"] >= state["total"]
        assert record["device_pool_bytes"] is None and record["device_pool_bytes_max"] is None
    assert epochs[1]["peak_rss_bytes"] >= epochs[0]["peak_rss_bytes"]  # a high-water mark

    out, run = mlp_over_two_ranks
    frame = load_dataframe(out, type="train_epoch")
    assert set(frame["rank"]) == {0, 1}
    assert (frame["peak_rss_bytes"] >= MLP_PARAM_BYTES).all()
    by_epoch = frame.groupby("epoch")  # the max over ranks, epoch by epoch
    assert (by_epoch["peak_rss_bytes_max"].nunique() == 1).all()
    assert (by_epoch["peak_rss_bytes_max"].first() == by_epoch["peak_rss_bytes"].max()).all()
    assert (frame["model_state_bytes.weights"] == MLP_PARAM_BYTES).all()
    assert (frame["model_state_bytes.optimizer_state"] == 0).all()  # no momentum: no velocity
    peak_mib = by_epoch["peak_rss_bytes_max"].first().iloc[-1] / 2**20  # the last epoch's
    assert f"peak memory per rank {peak_mib:.1f} MiB resident (max over ranks)" in run.stdout
    total = 2 * MLP_PARAM_BYTES + 8 * 788 * 4 + 8 * (784 * 4 + 8)  # batch 8, no velocity
    assert (frame["model_state_bytes.total"] == total).all()
    assert f"model state {total / 2**20:.2f} MiB (weights 0.90, gradients 0.90" in run.stdout


def test_the_gpu_pool_is_read_only_where_there_is_one():
    pool = types.SimpleNamespace(total_bytes=lambda: 123_456_789)
    fake = types.SimpleNamespace(get_default_memory_pool=lambda: pool)
    gpu = Device(kind="gpu", xp=fake, name="fake", synchronize=lambda: None)
    assert device_pool_bytes(gpu) == 123_456_789
    assert device_pool_bytes(cpu_device()) is None
    assert device_pool_bytes(dataclasses.replace(gpu, xp=np)) is None  # numpy: no pool
    summary = format_memory(
        types.SimpleNamespace(
            peak_rss_bytes_max=300 * 2**20,
            device_pool_bytes_max=123_456_789,
            model_state_bytes={"weights": 2**20, "gradients": 2**20, "total": 2 * 2**20},
        )
    )
    assert summary == (
        "peak memory per rank 300.0 MiB resident, GPU pool 117.7 MiB (max over ranks); "
        "model state 2.00 MiB (weights 1.00, gradients 1.00)"
    )
