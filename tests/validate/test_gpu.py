"""``pdlsim validate``'s GPU configurations: one GPU copying in turn and one prefetching, added
where a GPU is found and the profile has a GPU model, skipped with one line where not.

No GPU is needed: :mod:`tests.fake_cupy` stands in for CuPy, in this process and (through
``cupy.py``/``cupyx.py`` shims on PYTHONPATH) in the training runs validate launches. What a
real GPU's copies and kernels cost is measured where a GPU is lent."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from microbench.errors import UserError
from microbench.machine import machine_identity
from pdlsim.cli.main import main
from pdlsim.validate.calibrate import gpu_configurations
from pdlsim.validate.report import format_report
from pdlsim.validate.run import RunSpec, ValidateConfig, plan_matrix, predict_spec, run_validation
from tests import fake_cupy
from tests.profiles import STEP_TABLES

PROFILE = STEP_TABLES


@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The packaged profile with a stand-in GPU model (the host's curves under "gpu"),
    measured on this machine as far as validate's machine check can tell."""
    doc = json.loads(PROFILE.read_text())
    devices = doc["models"]["compute"]["devices"]
    devices["gpu"] = copy.deepcopy(devices["cpu"])
    doc["machine"].update(machine_identity())
    path = tmp_path_factory.mktemp("profile") / "gpu-profile.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import microbench.gpu

    monkeypatch.setattr(microbench.gpu, "find_gpu", lambda index=0: (None, "no CUDA device found"))


def test_every_serial_workload_and_batch_gets_a_gpu_copying_in_turn_and_one_prefetching(
    tmp_path: Path,
) -> None:
    cfg = ValidateConfig(out=tmp_path, quick=True)
    cpu, both = plan_matrix(cfg), plan_matrix(cfg, gpu=True)
    assert [s for s in both if s.device == "cpu"] == cpu
    serial = {(s.model, s.batch) for s in cpu if s.mode == "serial"}
    gpus = [s for s in both if s.device == "gpu"]
    assert sorted((s.model, s.batch, s.prefetch) for s in gpus) == sorted(
        (m, b, p) for m, b in serial for p in (False, True)
    )
    assert {(s.procs, s.threads, s.parallel, s.inference) for s in gpus} == {(1, 1, "data", False)}
    ahead = RunSpec("cnn", 1, 1, 32, device="gpu", prefetch=True)
    assert (ahead.mode, ahead.label) == ("gpu+prefetch", "cnn-gpu-b32-prefetch")
    assert ahead.train_flags == ("--parallel", "data", "--device", "gpu", "--pinned", "--prefetch")
    in_turn = RunSpec("cnn", 1, 1, 32, device="gpu")
    assert in_turn.train_flags[-2:] == ("--device", "gpu") and in_turn.label == "cnn-gpu-b32"


def test_gpu_rows_need_a_gpu_and_a_gpu_model(monkeypatch, gpu_profile: str) -> None:
    log: list[str] = []
    assert gpu_configurations("off", gpu_profile, log.append) is False and log == []
    _no_gpu(monkeypatch)
    assert gpu_configurations("auto", gpu_profile, log.append) is False
    assert log == ["no GPU here (no CUDA device found): the GPU configurations are left out"]
    monkeypatch.undo()
    fake_cupy.install(monkeypatch)
    assert gpu_configurations("auto", gpu_profile, log.append) is True
    assert gpu_configurations("auto", str(PROFILE), log.append) is False
    assert log[-1].startswith(f"the profile {PROFILE} has no GPU model (its compute was measured")
    with pytest.raises(UserError, match="--gpu on: the profile .* has no GPU model"):
        gpu_configurations("on", str(PROFILE))


def test_gpu_on_without_a_gpu_is_one_line_and_exit_2_before_any_work(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    _no_gpu(monkeypatch)
    out = tmp_path / "v"
    assert main(["validate", "--gpu", "on", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "pdlsim: error: --gpu on: no GPU here (no CUDA device found); use --gpu auto or off\n"
    )
    assert not out.exists()


def test_prefetch_is_predicted_no_slower_than_copying_in_turn(gpu_profile: str, tmp_path) -> None:
    cfg = ValidateConfig(out=tmp_path, profile=gpu_profile, band_samples=2)
    in_turn, ahead = (
        predict_spec(RunSpec("cnn", 1, 1, 64, device="gpu", prefetch=p), cfg) for p in (False, True)
    )
    assert in_turn["provenance"]["compute"].startswith("profile (gpu:")
    assert in_turn["provenance"]["copies"].endswith("PCIe data sheet")  # no transfer model
    # the copy (64 CIFAR images, 786 KB) hides behind the previous step's compute
    assert 0 < in_turn["step_time_s"] - ahead["step_time_s"] < 1e-3


def test_a_tiny_validation_with_a_stand_in_gpu(monkeypatch, gpu_profile: str, tmp_path) -> None:
    """Serial CPU, one GPU copying in turn, one prefetching: trained for real (the GPU runs on
    the stand-in in their own processes), predicted, reported and drawn."""
    fake_cupy.install(monkeypatch)
    shims = fake_cupy.write_importable(tmp_path / "shims")
    path = os.pathsep.join(filter(None, [str(shims), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    cfg = ValidateConfig(
        out=tmp_path / "report", profile=gpu_profile, repeats=1, steps=12, models=("mlp",),
        modes=((1, 1),), batches=(16,), band_samples=2, target_run_s=0.01, max_steps=12,
        parallel=("data",), gpu="on", heldout_workloads=0,
    )  # fmt: skip
    report = run_validation(cfg, log=lambda line: None)
    rows = {r["mode"]: r for r in report["rows"]}
    assert sorted(rows) == ["gpu", "gpu+prefetch", "serial"]
    for mode in ("gpu", "gpu+prefetch"):
        r = rows[mode]
        assert (r["device"], r["prefetch"]) == ("gpu", mode == "gpu+prefetch")
        assert r["measured_speedup"] == pytest.approx(
            rows["serial"]["measured_s"] / r["measured_s"]
        )
        assert r["predicted_speedup"] == pytest.approx(
            rows["serial"]["predicted_p50_s"] / r["predicted_p50_s"]
        )
        run = tmp_path / "report" / "runs" / f"mlp-gpu-b16{'-prefetch' * r['prefetch']}" / "r0"
        header = json.loads((run / "rank0.jsonl").read_text().splitlines()[0])
        assert header["run"]["prefetch"] == header["run"]["pinned"] == r["prefetch"]
        assert header["run"]["device"] == "gpu0:Fake GPU"  # trained on the stand-in
    assert not (tmp_path / "report" / "profile-span.json").exists()  # the profile is frozen
    assert "gpu+prefetch" in format_report(report)
    assert (tmp_path / "report" / "speedup-mlp.png").stat().st_size > 1000
