"""Checkpoints: a killed run, resumed from its last checkpoint, ends where an uninterrupted one
ends (bit for bit serially, to float32 rounding under MPI), and its records survive."""

from __future__ import annotations

import json
import os
import shutil
import signal
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from microbench.errors import UserError
from microbench.records import load_dataframe, read_records
from microbench.workload import load_workload
from pdlsim.train.checkpoint import (
    FORMAT_VERSION,
    KEEP,
    CheckpointError,
    check_resumable,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_header,
    save_checkpoint,
)
from pdlsim.train.comm import LocalComm
from pdlsim.train.config import TrainConfig
from pdlsim.train.device import Device, cpu_device
from pdlsim.train.loop import train
from pdlsim.validate.run import measured_step_times
from tests.conftest import run_pdlsim
from tests.train.runs import TINY, stop_after_first_checkpoint

# 512 samples at a global batch of 16: 32 steps per epoch; checkpoints every 50 fall mid-epoch.
RUN = ["--samples", "512", "--test-samples", "64", "--momentum", "0.9", "--checkpoint-every", "50"]
STEPS_PER_EPOCH = 32


def _header(step: int) -> dict:
    return {
        "config": TrainConfig().to_dict(),
        "workload": {"name": "w"},
        "position": {"epoch": 0, "step": step, "global_step": step},
        "rng_state": {
            "bit_generator": "PCG64",
            "state": {"state": 2**100 + 7, "inc": 3},
            "has_uint32": 0,
            "uinteger": 0,
        },
        "epoch_sums": {"loss": 1.5, "correct": 3.0, "phases_s": {}, "elapsed_s": 0.25},
        "epochs": [],
    }


def test_a_checkpoint_round_trips_without_pickle_and_old_ones_are_pruned(tmp_path):
    params = np.arange(10, dtype=np.float32) / 3
    velocity = -params
    (tmp_path / ".checkpoint-step00000001.npz.abc.tmp").write_bytes(b"left by a killed write")
    for step in (1, 2, 10, 3):
        state = {"velocity": velocity} if step != 3 else {}
        save_checkpoint(tmp_path, _header(step), params * step, state)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-step00000003.npz",
        "checkpoint-step00000010.npz",
    ]
    assert len(list_checkpoints(tmp_path)) == KEEP
    assert not list(tmp_path.glob(".*.tmp"))
    latest = latest_checkpoint(tmp_path)
    assert read_header(latest)["position"]["global_step"] == 10
    ckpt = load_checkpoint(latest)
    assert (ckpt.epoch, ckpt.step, ckpt.global_step) == (0, 10, 10)
    np.testing.assert_array_equal(ckpt.params, params * 10)
    np.testing.assert_array_equal(ckpt.velocity, velocity)
    assert ckpt.params.dtype == np.float32
    assert ckpt.header["rng_state"]["state"]["state"] == 2**100 + 7  # big ints survive JSON
    assert ckpt.header["format_version"] == FORMAT_VERSION
    assert ckpt.header["epoch_sums"]["elapsed_s"] == 0.25
    assert load_checkpoint(tmp_path / "checkpoint-step00000003.npz").velocity is None
    with np.load(latest, allow_pickle=False) as members:  # plain arrays, no pickle needed
        assert sorted(members.files) == ["header", "params", "velocity"]


def test_damaged_or_foreign_checkpoints_are_refused_with_the_file_named(tmp_path):
    path = save_checkpoint(tmp_path, _header(5), np.zeros(4, np.float32), {})
    torn = tmp_path / "checkpoint-step00000006.npz"
    torn.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=f"checkpoint {torn}: unreadable"):
        load_checkpoint(torn)
    future = {**_header(7), "format_version": FORMAT_VERSION + 1}
    newer = tmp_path / "newer.npz"
    np.savez(newer, header=np.array(json.dumps({"format": "pdlsim.checkpoint", **future})))
    with pytest.raises(CheckpointError, match=f"format version {FORMAT_VERSION + 1}"):
        load_checkpoint(newer)
    np.savez(tmp_path / "foreign.npz", params=np.zeros(3))
    with pytest.raises(CheckpointError, match="no header member"):
        load_checkpoint(tmp_path / "foreign.npz")
    with pytest.raises(UserError, match="no checkpoint in"):
        latest_checkpoint(tmp_path / "nowhere")


def test_a_checkpoint_of_a_diverged_run_says_so_not_that_it_was_edited(tmp_path):
    """The training loop records a nan loss when a run diverges (and warns then): its
    checkpoints hold no state to continue from, and resuming says why."""
    header = _header(5)
    header["epoch_sums"]["loss"] = float("nan")
    path = save_checkpoint(tmp_path, header, np.full(4, np.nan, np.float32), {})
    with pytest.raises(CheckpointError, match="the run had diverged") as caught:
        load_checkpoint(path)
    assert "edited" not in str(caught.value) and "lower --lr" in str(caught.value)


def test_a_resume_with_other_settings_names_every_difference():
    config = TrainConfig(model="mlp", batch_per_rank=16, seed=0, epochs=3)
    workload = load_workload("mlp").to_dict()
    header = {**_header(40), "config": config.to_dict(), "workload": workload}
    header["position"] = {"epoch": 1, "step": 8, "global_step": 40}
    path = Path("run/checkpoint-step00000040.npz")
    check_resumable(header, replace(config, threads=2, epochs=5), workload, path)  # allowed
    with pytest.raises(UserError) as caught:
        check_resumable(header, replace(config, batch_per_rank=8, seed=3), workload, path)
    assert str(caught.value).startswith(f"--resume: {path} was written with --batch 16 --seed 0")
    assert "not --batch 8 --seed 3" in str(caught.value)
    with pytest.raises(UserError, match="was written with no --scale-lr, not --scale-lr;"):
        check_resumable(header, replace(config, scale_lr=True), workload, path)
    with pytest.raises(UserError, match="another workload"):
        check_resumable(header, config, {**workload, "layers": workload["layers"][:2]}, path)
    with pytest.raises(UserError, match="already in epoch 2 of the run; give --epochs 2"):
        check_resumable(header, replace(config, epochs=1), workload, path)


NUMPY_AS_GPU = Device(
    kind="gpu", xp=np, name="numpy-as-gpu", synchronize=lambda: None, kernel_backend="array"
)


@pytest.mark.parametrize("device", [cpu_device(), NUMPY_AS_GPU], ids=["cpu", "gpu-path"])
@pytest.mark.parametrize(
    "optimizer",
    [{"momentum": 0.9}, {"optimizer": "adamw", "weight_decay": 0.01, "lr": 1e-3}],
    ids=["momentum", "adamw"],
)
def test_resuming_in_process_mid_epoch_or_with_more_epochs_repeats_the_run(
    tmp_path, device, optimizer
):
    """Checkpoints every 20 steps of 32 per epoch: 60 is mid-epoch (kept with the final 64)."""
    config = TrainConfig(
        model="mlp", epochs=2, batch_per_rank=16, samples=512, test_samples=64, **optimizer
    )
    config = replace(config, checkpoint_every=20)
    quiet = {"log": lambda line: None}
    full = train(config, LocalComm(), device, tmp_path / "full", **quiet)
    kept = list_checkpoints(tmp_path / "full")
    assert [load_checkpoint(p).global_step for p in kept] == [60, 64]
    assert load_checkpoint(kept[0]).step == 60 - STEPS_PER_EPOCH
    resumed = train(config, LocalComm(), device, tmp_path / "again", resume=kept[0], **quiet)
    a, b = load_checkpoint(full.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    np.testing.assert_array_equal(a.params, b.params)
    assert set(a.state) == set(b.state) == ({"velocity"} if "momentum" in optimizer else
                                            {"adam_m", "adam_v"})  # fmt: skip
    for name in a.state:
        np.testing.assert_array_equal(a.state[name], b.state[name])
    assert [e.loss for e in resumed.epochs] == [e.loss for e in full.epochs]
    assert [e.test_accuracy for e in resumed.epochs] == [e.test_accuracy for e in full.epochs]
    assert len(resumed.step_losses) == 2 * STEPS_PER_EPOCH - 60
    # A finished run continued for a third epoch equals a run of three epochs.
    three = replace(config, epochs=3)
    longer = train(three, LocalComm(), device, tmp_path / "more", resume=kept[1], **quiet)
    fresh = train(three, LocalComm(), device, tmp_path / "three", **quiet)
    np.testing.assert_array_equal(
        load_checkpoint(longer.last_checkpoint).params,
        load_checkpoint(fresh.last_checkpoint).params,
    )
    assert [e.loss for e in longer.epochs] == [e.loss for e in fresh.epochs]


@pytest.mark.parametrize("device", [cpu_device(), NUMPY_AS_GPU], ids=["cpu", "gpu-path"])
def test_batchnorm_statistics_and_dropout_masks_resume_where_they_stopped(tmp_path, device):
    """A network with state that is not trained (batchnorm's running statistics, in the
    checkpoint) and random draws (dropout, seeded by the step): resumed mid-epoch, it ends
    where the uninterrupted run ends, bit for bit, its evaluation included."""
    doc = {
        "name": "bn-dropout",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "filters": 4, "kernel": 3, "padding": 1},
            {"kind": "batchnorm2d"},
            {"kind": "relu"},
            {"kind": "dropout", "rate": 0.3},
            {"kind": "global_avgpool"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    }
    path = tmp_path / "bn-dropout.json"
    path.write_text(json.dumps(doc))
    config = TrainConfig(model=str(path), epochs=2, batch_per_rank=16, samples=256,
                         test_samples=32, momentum=0.9, checkpoint_every=12)  # fmt: skip
    quiet = {"log": lambda line: None}
    full = train(config, LocalComm(), device, tmp_path / "full", **quiet)
    first = list_checkpoints(tmp_path / "full")[0]
    assert load_checkpoint(first).global_step == 24 and load_checkpoint(first).running.size == 8
    resumed = train(config, LocalComm(), device, tmp_path / "again", resume=first, **quiet)
    a, b = load_checkpoint(full.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.running, b.running)
    assert [e.test_accuracy for e in resumed.epochs] == [e.test_accuracy for e in full.epochs]


def _unique_steps(run_dir: Path):
    """Every rank's train_step records, the re-run ones (later files) replacing the first."""
    frame = load_dataframe(run_dir, type="train_step")
    frame = frame.drop_duplicates(["rank", "global_step"], keep="last")
    return frame.sort_values(["rank", "global_step"]).reset_index(drop=True)


def _interrupt_and_resume(tmp_path: Path, args: list[str], sig: int, total_steps: int):
    reference, cut = tmp_path / "reference", tmp_path / "cut"
    done = run_pdlsim("train", *args, "--out", str(reference))
    assert done.returncode == 0, done.stderr
    status, stderr = stop_after_first_checkpoint(["train", *args], cut, sig, timeout_s=30)
    assert status in (-signal.SIGKILL, 128 + signal.SIGTERM), stderr
    stopped_at = load_checkpoint(latest_checkpoint(cut)).global_step
    assert stopped_at < total_steps, "the kill came too late to test anything"
    first_records = {p.name: len(read_records(p)[1]) for p in cut.glob("rank*.jsonl")}
    resumed = run_pdlsim("train", *args, "--out", str(cut), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    resumed_from = f"{cut / 'checkpoint-step'}{stopped_at:08d}.npz"
    assert f"resuming from {resumed_from}: {stopped_at} steps done" in resumed.stdout
    for name, count in first_records.items():  # the first segment is kept as it was
        assert len(read_records(cut / name)[1]) == count >= stopped_at
        header, _ = read_records(cut / name.replace(".jsonl", ".resume1.jsonl"))
        assert header["run"]["resumed_from"]["global_step"] == stopped_at
    return load_checkpoint(latest_checkpoint(reference)), load_checkpoint(latest_checkpoint(cut))


def test_a_killed_serial_run_resumes_to_the_same_weights_bit_for_bit(tmp_path):
    args = [*RUN, "--batch", "16", "--epochs", "50"]
    total = 50 * STEPS_PER_EPOCH
    expected, resumed = _interrupt_and_resume(tmp_path, args, signal.SIGKILL, total)
    assert expected.global_step == resumed.global_step == total
    np.testing.assert_array_equal(resumed.params, expected.params)
    np.testing.assert_array_equal(resumed.velocity, expected.velocity)
    for a, b in zip(expected.header["epochs"], resumed.header["epochs"], strict=True):
        assert (a["loss"], a["train_accuracy"], a["test_accuracy"]) == (
            b["loss"],
            b["train_accuracy"],
            b["test_accuracy"],
        )
    cut, reference = tmp_path / "cut", tmp_path / "reference"
    steps, reference_steps = _unique_steps(cut), _unique_steps(reference)
    assert list(steps["global_step"]) == list(range(total))
    np.testing.assert_array_equal(steps["loss"], reference_steps["loss"])
    summary = json.loads((cut / "summary.json").read_text())
    assert len(summary["epochs"]) == 50
    assert len(measured_step_times(cut)[0]) > 0.8 * total  # validate's reader copes


def test_a_stopped_mpi_run_resumes_to_the_same_weights(tmp_path):
    args = ["--procs", "2", *RUN, "--batch", "8", "--epochs", "20"]
    total = 20 * STEPS_PER_EPOCH
    expected, resumed = _interrupt_and_resume(tmp_path, args, signal.SIGTERM, total)
    assert expected.global_step == resumed.global_step == total
    np.testing.assert_allclose(resumed.params, expected.params, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(resumed.velocity, expected.velocity, rtol=1e-6, atol=1e-7)
    steps = _unique_steps(tmp_path / "cut")
    reference = _unique_steps(tmp_path / "reference")
    assert list(steps["rank"]) == [0] * total + [1] * total
    np.testing.assert_allclose(steps["loss"], reference["loss"], rtol=1e-6)


def test_resume_mistakes_are_one_line_and_exit_status_2(tmp_path):
    out = tmp_path / "run"
    args = TINY
    first = run_pdlsim("train", *args, "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert f"checkpoint (weights, optimizer, data order): {out}" in first.stdout
    cases = [
        ([*args[:5], "8", *args[6:], "--resume", "--out", str(out)], "--batch 16, not --batch 8"),
        ([*args, "--resume", "--out", str(tmp_path / "none")], "no checkpoint in"),
        ([*args, "--resume"], "--resume needs --out DIR"),
        ([*args, "--out", str(out)], "already holds records; choose a new directory"),
    ]
    for argv, message in cases:
        result = run_pdlsim("train", *argv, timeout=60)
        assert result.returncode == 2, (argv, result.stderr)
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "or add --resume to continue it" in result.stderr
    *earlier, newest = sorted(out.glob("checkpoint-step*.npz"))
    newest.write_bytes(b"not a checkpoint")  # torn: the one kept before it is the way on
    result = run_pdlsim("train", *args, "--resume", "--out", str(out), timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "unreadable" in result.stderr
    assert f"move it aside to resume from {earlier[-1].name}" in result.stderr


def test_a_resume_whose_two_kept_checkpoints_are_torn_is_not_sent_to_the_older(
    tmp_path, finished_run
):
    """With the newest checkpoint torn the advice was to resume from the one before it, torn
    as well; and "without --resume" into the same --out is refused (it holds records)."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    *_, older, newest = sorted(out.glob("checkpoint-step*.npz"))
    for path in (older, newest):
        path.write_bytes(b"not a checkpoint")
    result = run_pdlsim("train", *TINY, "--resume", "--out", str(out), timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result
    assert f"the one before it, {older.name}, is unreadable too; start the run again into a " \
        "new --out, without --resume" in result.stderr  # fmt: skip


def _in_the_way(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "dir":
        path.mkdir()
    else:
        os.mkfifo(path)


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("summary.json", "dir", "summary.json is a directory, where the run writes its summary"),
        ("summary.json", "fifo", "summary.json is a FIFO, where the run writes its summary"),
        ("oldest", "dir", "is a directory, where the run writes its checkpoints"),
        ("newest", "fifo", "is a FIFO, not a checkpoint file; move it aside to resume from"),
    ],
)
def test_a_resume_whose_outputs_are_taken_is_refused_before_training(
    tmp_path, finished_run, name, kind, message
):
    """The summary written at the end, or a checkpoint the run prunes, taken by a directory or
    a FIFO failed only after the whole resumed run (or blocked on the FIFO): it is one line
    naming the place and the fix, before any step, and nothing in the folder changes."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    checkpoints = sorted(out.glob("checkpoint-step*.npz"))
    target = {"oldest": checkpoints[0], "newest": checkpoints[-1]}.get(name, out / name)
    _in_the_way(target, kind)
    before = sorted(p.name for p in out.iterdir())
    result = run_pdlsim("train", *TINY, "--epochs", "2", "--resume", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr and "move it aside" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_new_run_whose_summary_place_is_taken_or_a_resume_into_a_file_is_refused(tmp_path):
    out = tmp_path / "run"
    (out / "summary.json").mkdir(parents=True)
    fresh = run_pdlsim("train", *TINY, "--out", str(out))
    assert fresh.returncode == 2 and len(fresh.stderr.strip().splitlines()) == 1, fresh.stderr
    assert "summary.json is a directory, where the run writes its summary" in fresh.stderr
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    (tmp_path / "run.txt").write_text("x")
    into_file = run_pdlsim("train", *TINY, "--resume", "--out", str(tmp_path / "run.txt"))
    assert into_file.returncode == 2 and len(into_file.stderr.strip().splitlines()) == 1
    assert "is a file, not a run directory; give the --out of the run" in into_file.stderr


def test_a_checkpoint_damaged_at_its_start_is_no_zip_not_a_pickle(tmp_path):
    """A zip is told by its end, numpy by its first bytes: a checkpoint whose first bytes were
    overwritten passed the zip check and numpy took it for a pickle, so the error advised
    loading it with ``allow_pickle``."""
    path = save_checkpoint(tmp_path, _header(5), np.zeros(4, np.float32), {})
    path.write_bytes(b"XX" + path.read_bytes()[2:])
    with pytest.raises(CheckpointError, match="unreadable: not a zip of arrays") as caught:
        load_checkpoint(path)
    assert "pickle" not in str(caught.value)


def test_a_checkpoint_path_that_is_no_plain_zip_of_arrays_is_refused_not_waited_on(tmp_path):
    """A FIFO at a checkpoint's name made ``--resume`` wait forever (numpy opened it), a file
    that is no zip was reported as "pickled data", a header nested thousands deep escaped as a
    RecursionError and a member that is no ``.npy`` array as an AttributeError."""
    fifo = tmp_path / "checkpoint-step00000009.npz"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="is a FIFO, not a checkpoint file"):
        read_header(fifo)
    text = tmp_path / "text.npz"
    text.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="unreadable: not a zip of arrays"):
        load_checkpoint(text)
    deep = tmp_path / "deep.npz"
    np.savez(deep, header=np.array("[" * 100_000 + "]" * 100_000), params=np.zeros(2, np.float32))
    with pytest.raises(CheckpointError, match="header nested too deeply"):
        read_header(deep)
    path = save_checkpoint(tmp_path, _header(5), np.zeros(4, np.float32), {})
    with zipfile.ZipFile(path, "a") as members:
        members.writestr("velocity.npy", b"no npy header")
    with pytest.raises(CheckpointError, match="member 'velocity' is not a numpy array"):
        load_checkpoint(path)
