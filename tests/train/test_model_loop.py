"""Model (tensor) parallelism for real: P ranks that split the dense layers compute serial's steps,
and forward-only runs change no weight."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from microbench.nn import Network
from microbench.records import load_dataframe, read_records
from microbench.workload import load_workload, split_columns
from pdlsim.train.comm import LocalComm
from pdlsim.train.config import TrainConfig
from pdlsim.train.device import Device, cpu_device
from pdlsim.train.epoch import prepare_data
from pdlsim.train.loop import train
from pdlsim.train.model_loop import MODEL_PHASES, train_model_parallel
from tests.conftest import run_pdlsim

SMALL = ["--samples", "512", "--test-samples", "64", "--max-steps", "24", "--batch", "16"]
# A conv stack (replicated) under dense layers whose widths 7 and 5 do not split evenly in two.
ODD = {
    "name": "odd",
    "input_shape": [2, 8, 8],
    "layers": [
        {"kind": "conv2d", "filters": 3, "kernel": 3, "padding": 1},
        {"kind": "relu"},
        {"kind": "maxpool2d", "size": 2},
        {"kind": "flatten"},
        {"kind": "dense", "units": 7},
        {"kind": "relu"},
        {"kind": "dense", "units": 5},
        {"kind": "softmax_cross_entropy"},
    ],
}


def _run(out: Path, *args: str) -> Path:
    result = run_pdlsim("train", *SMALL, "--out", str(out), *args)
    assert result.returncode == 0, result.stderr
    return out


def _losses(run_dir: Path, rank: int = 0) -> np.ndarray:
    steps = load_dataframe(run_dir, type="train_step")
    return steps[steps["rank"] == rank].sort_values("global_step")["loss"].to_numpy()


def test_split_columns_are_contiguous_and_the_busiest_rank_has_the_ceiling():
    assert split_columns(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert split_columns(256, 2) == [(0, 128), (128, 256)]
    for units, parts in ((7, 2), (5, 3), (10, 10)):
        widths = [hi - lo for lo, hi in split_columns(units, parts)]
        assert sum(widths) == units and max(widths) == math.ceil(units / parts)


@pytest.mark.parametrize("model", ["mlp", "odd"])
def test_two_ranks_splitting_the_dense_layers_give_serials_loss_curve(tmp_path, model):
    """mlp (256, 128, 10 split 2 ways) and a conv stack with uneven widths 7 and 5: the same
    24 steps as one process with the same batch, with momentum; every rank sees that batch."""
    if model == "odd":
        model = str(tmp_path / "odd.json")
        Path(model).write_text(json.dumps(ODD))
    common = ("--model", model, "--momentum", "0.9")
    serial = _run(tmp_path / "serial", *common)
    split = _run(tmp_path / "split", *common, "--parallel", "model", "--procs", "2")
    reference = _losses(serial)
    assert len(reference) == 24 and reference[-1] < reference[0]
    np.testing.assert_allclose(_losses(split, 0), reference, rtol=1e-4)
    np.testing.assert_array_equal(_losses(split, 1), _losses(split, 0))  # one batch, one loss

    header, records = read_records(split / "rank1.jsonl")
    run = header["run"]
    assert run["parallel"] == "model" and run["global_batch"] == 16 and run["ranks"] == 2
    assert "same mini-batch" in run["batch_semantics"]
    widths = {s["layer"]: s["columns"] for s in run["split_layers"]}
    if model == "mlp":
        assert widths == {"dense0": [128, 256], "dense2": [64, 128], "dense4": [5, 10]}
    else:
        assert widths == {"dense4": [4, 7], "dense6": [3, 5]}  # rank 1 gets the smaller halves
    steps = [r for r in records if r["type"] == "train_step"]
    for record in steps:
        assert list(record["phases_s"]) == list(MODEL_PHASES)
        assert sum(record["phases_s"].values()) == pytest.approx(record["step_s"], rel=1e-9)
        assert record["phases_s"]["allgather"] > 0 and record["phases_s"]["allreduce"] > 0
    # Each rank holds half of the split layers' weights: mlp 235,146 parameters in all.
    epoch = next(r for r in records if r["type"] == "train_epoch")
    if model == "mlp":
        expected = 4 * (784 * 128 + 128 + 256 * 64 + 64 + 128 * 5 + 5)
        assert epoch["model_state_bytes"]["weights"] == expected


def test_forward_only_runs_change_no_weight_in_either_mode(tmp_path):
    """--inference: every step's loss is the INITIAL network's loss on that step's batch."""
    config = TrainConfig(batch_per_rank=16, samples=512, test_samples=64, max_steps_per_epoch=8,
                         inference=True)  # fmt: skip
    quiet = {"log": lambda line: None}
    data = train(config, LocalComm(), cpu_device(), tmp_path / "d", **quiet)
    model_cfg = TrainConfig(**{**config.__dict__, "parallel": "model"})
    model = train_model_parallel(model_cfg, LocalComm(), cpu_device(), tmp_path / "m", **quiet)
    workload = load_workload("mlp")
    train_set, _ = prepare_data(config, workload)
    net = Network(workload, seed=0)
    permutation = np.random.default_rng(0).permutation(len(train_set))
    expected = [
        net.forward(train_set.x[idx], train_set.y[idx])[0]
        for idx in (permutation[s * 16 : (s + 1) * 16] for s in range(8))
    ]
    np.testing.assert_array_equal(data.step_losses, expected)
    np.testing.assert_array_equal(model.step_losses, expected)
    for run_dir in (tmp_path / "d", tmp_path / "m"):
        _, records = read_records(run_dir / "rank0.jsonl")
        for r in (r for r in records if r["type"] == "train_step"):
            assert r["phases_s"]["forward"] > 0
            assert r["phases_s"]["backward"] == r["phases_s"]["update"] == 0.0


def test_forward_only_over_two_ranks_gathers_but_never_reduces(tmp_path):
    args = ("--parallel", "model", "--procs", "2", "--inference")
    split = _run(tmp_path / "split", *args)
    serial = _run(tmp_path / "serial", "--inference")
    np.testing.assert_allclose(_losses(split, 1), _losses(serial), rtol=1e-5)
    steps = load_dataframe(split, type="train_step")
    assert (steps["phases_s.allgather"] > 0).all()
    assert (steps[["phases_s.allreduce", "phases_s.backward", "phases_s.update"]] == 0).all().all()
    header, _ = read_records(split / "rank0.jsonl")
    assert header["run"]["inference"] is True


def test_one_rank_model_parallel_is_the_serial_run_also_on_the_gpu_code_path(tmp_path):
    """P = 1 splits nothing: bit for bit the data-parallel loop's losses; the GPU branches
    (device copies, synchronisation, array kernels) run with numpy standing in for CuPy."""
    model = tmp_path / "odd.json"
    model.write_text(json.dumps(ODD))
    config = TrainConfig(model=str(model), batch_per_rank=8, samples=48, test_samples=16)
    quiet = {"log": lambda line: None}
    serial = train(config, LocalComm(), cpu_device(), tmp_path / "s", **quiet)
    model_cfg = TrainConfig(**{**config.__dict__, "parallel": "model"})
    split = train_model_parallel(model_cfg, LocalComm(), cpu_device(), tmp_path / "m", **quiet)
    np.testing.assert_array_equal(split.step_losses, serial.step_losses)
    stand_in = Device(
        kind="gpu", xp=np, name="numpy-as-gpu", synchronize=lambda: None, kernel_backend="array"
    )
    gpu = train_model_parallel(model_cfg, LocalComm(), stand_in, tmp_path / "g", **quiet)
    np.testing.assert_allclose(gpu.step_losses, serial.step_losses, rtol=1e-4)
    assert split.epochs[0].test_accuracy == serial.epochs[0].test_accuracy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--procs", "11"], "dense layer dense4 of workload 'mlp' has 10 output neurons, fewer"),
        (["--scale-lr"], "--scale-lr is for data parallelism"),
        (["--checkpoint-every", "5"], "drop them with --parallel model"),
        (["--batch", "600", "--samples", "512"], "--batch 600 (the batch every rank shares"),
        (["--model", "rescnn", "--procs", "2"],
         "workload 'rescnn' is a graph (layer stage1.block.add reads stage1.relu and"),
        (["--model", "transformer", "--procs", "2"], "--parallel model does not handle embedding"),
    ],
)  # fmt: skip
def test_bad_model_parallel_input_is_one_line_and_exit_status_2(tmp_path, args, message):
    result = run_pdlsim("train", "--parallel", "model", *args, "--out", str(tmp_path / "r"))
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_forward_only_runs_refuse_checkpoints(tmp_path):
    result = run_pdlsim("train", "--inference", "--checkpoint-every", "2", "--out", str(tmp_path))
    assert result.returncode == 2 and "nothing to checkpoint" in result.stderr
