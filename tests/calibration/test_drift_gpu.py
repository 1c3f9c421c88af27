"""GPU steps drift with the host that launches their kernels: their moments (the compute stage,
the speed checks' ``--gpu-batch``) set their own typical time and band, apart from the host's.

No GPU is needed: :mod:`tests.fake_cupy` stands in for CuPy where a command must time one."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibration.drift import DriftModel
from microbench.gpu import find_gpu
from microbench.records import load_dataframe
from microbench.workload import load_workload
from tests import fake_cupy
from tests.conftest import REPO, run_microbench
from tests.profiles import STEP_TABLES

PROFILE = STEP_TABLES
HAS_GPU = find_gpu()[0] is not None


def _host_and_gpu() -> DriftModel:
    """cnn b32 on the host at 12 ms, then 9, 9, 12, 9; mlp b32 on the GPU at 2 ms in the
    compute stage, then 1, 1, 2, 1 ms (a launch-bound step on a host at two speeds); mlp b64
    on the GPU timed once."""
    drift = DriftModel()
    drift.medians_ = {
        "cnn-b32-t1": {"compute step": 12.0, "c1": 9.0, "c2": 9.0, "c3": 12.0, "c4": 9.0},
        "mlp-b32-gpu": {"compute step": 2.0, "c1": 1.0, "c2": 1.0, "c3": 2.0, "c4": 1.0},
        "mlp-b64-gpu": {"compute step": 3.0},
    }
    drift._derive()
    return drift


def test_gpu_steps_take_their_own_level_and_deviations_and_leave_the_hosts_alone():
    drift = _host_and_gpu()
    host_only = DriftModel()
    host_only.medians_ = {"cnn-b32-t1": drift.medians_["cnn-b32-t1"]}
    host_only._derive()
    assert drift.step_level("mlp", 32, 1, "gpu") == pytest.approx(0.5)
    assert drift.step_level("mlp", 64, 1, "gpu") == 1.0  # one moment: the compute stage's time
    assert drift.step_level("cnn", 32, 1) == pytest.approx(0.75)
    np.testing.assert_allclose(np.exp(drift.log_deviations("gpu")), [1, 1, 1, 2, 2])
    # the host's band, sigma and offset are the host's steps' alone
    np.testing.assert_array_equal(drift.log_deviations("cpu"), host_only.log_deviations_)
    assert drift.sigma_ == host_only.sigma_
    assert drift.compute_log_offset_ == host_only.compute_log_offset_
    again = DriftModel.from_dict(json.loads(json.dumps(drift.to_dict())))
    np.testing.assert_array_equal(again.gpu_log_deviations_, drift.gpu_log_deviations_)
    assert again.step_level("mlp", 32, 1, "gpu") == pytest.approx(0.5)


def _gpu_profile(tmp_path: Path, drift: DriftModel | None) -> Path:
    """The packaged profile with a stand-in GPU: the host's curves and 1-thread op table rows
    under "gpu", and ``drift``'s medians added to the host's."""
    doc = json.loads(PROFILE.read_text())
    compute = doc["models"]["compute"]
    compute["devices"]["gpu"] = copy.deepcopy(compute["devices"]["cpu"])
    compute["table"] += [
        {**copy.deepcopy(e), "device": "gpu"} for e in compute["table"] if e["threads"] == 1
    ]
    if drift is not None:
        doc["models"]["drift"]["medians_s"].update(drift.medians_)
    path = tmp_path / ("drifting.json" if drift else "steady.json")
    path.write_text(json.dumps(doc))
    return path


def test_a_gpu_rank_predicts_its_steps_typical_time_and_draws_their_drift(tmp_path):
    """The GPU step at twice its typical time in the compute stage: a GPU rank's compute halves,
    and its band draws the GPU steps' speeds (x1 or x2), not the host's; a CPU rank's
    prediction does not move."""
    from calibration.profile import Profile, load_profile
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.costmodel.presets import GPU_PRESETS

    drift = _host_and_gpu()
    del drift.medians_["cnn-b32-t1"]  # the host's moments are the packaged profile's own
    steady = load_profile(_gpu_profile(tmp_path, None))
    drifting = load_profile(_gpu_profile(tmp_path, drift))
    layer = load_workload("mlp").layers[0]

    def cost(profile: Profile, device: str) -> ProfileCostModel:
        preset = GPU_PRESETS["h100-sxm"] if device == "gpu" else None  # the copies' PCIe
        return ProfileCostModel.from_profile(profile, None, preset, device, workload="mlp")

    gpu_before = cost(steady, "gpu").compute_time(layer, "forward", 32, 1, "gpu")
    gpu_after = cost(drifting, "gpu")
    assert gpu_after.compute_time(layer, "forward", 32, 1, "gpu") == pytest.approx(0.5 * gpu_before)
    assert "moments of the same GPU steps" in gpu_after.provenance["drift"]
    rng = np.random.default_rng(0)
    factors = {round(gpu_after.perturbed(rng).drift_factor, 9) for _ in range(200)}
    assert factors == {1.0, 2.0}
    slow = replace(gpu_after, drift_factor=2.0).compute_time(layer, "forward", 32, 1, "gpu")
    assert slow == pytest.approx(2 * gpu_after.compute_time(layer, "forward", 32, 1, "gpu"))
    cpu = [cost(p, "cpu").compute_time(layer, "forward", 32, 1, "cpu") for p in (steady, drifting)]
    assert cpu[0] == cpu[1]
    assert cost(steady, "gpu").drift_log_deviations == ()  # no GPU moments: no GPU drift


def _stand_in_env(tmp_path: Path) -> dict[str, str]:
    shims = fake_cupy.write_importable(tmp_path / "shims")
    path = os.pathsep.join(filter(None, [str(shims), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_microbench_speed_times_the_gpu_steps_at_their_own_batches(tmp_path):
    """With ``--gpu-batch`` the host's steps at --batch, then the GPU's at --gpu-batch, each
    record naming its device; the drift model files them apart."""
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "microbench", "speed", "--model", "mlp", "--batch", "8",
        "--gpu-batch", "4,16", "--samples", "3", "--warmup", "1", "--moment", "check 1",
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=REPO, env=_stand_in_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "speed (check 1): mlp batch 16 on the GPU" in result.stdout
    frame = load_dataframe(out, type="measurement")
    assert list(frame["params.device"]) == ["cpu"] * 2 + ["gpu"] * 4
    assert list(frame["params.batch"]) == [8, 8, 4, 4, 16, 16]
    assert set(frame["params.threads"]) == {1}
    drift = DriftModel().fit(frame)
    assert set(drift.medians_) == {"mlp-b8-t1", "mlp-b4-gpu", "mlp-b16-gpu"}
    assert set(drift.forward_medians_["mlp-b16-gpu"]) == {"check 1"}


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the no-GPU error cannot be exercised")
def test_speed_on_a_gpu_without_one_is_one_line_and_exit_2(tmp_path):
    result = run_microbench("speed", "--gpu-batch", "32", "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--gpu-batch: no GPU" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_calibrations_speed_checks_time_the_gpu_where_one_is_found(monkeypatch, tmp_path):
    """Where a GPU is found, each speed check of ``pdlsim bench`` times the GPU steps at the
    compute stage's GPU batches; where none is, it times the host's alone."""
    import microbench.gpu
    from pdlsim.cli.bench_suite import BenchPlan, plan_stages

    plan = BenchPlan(out=tmp_path, model="mlp", procs=(1,), gpu_batches=(16, 64))
    found = microbench.gpu.find_gpu
    monkeypatch.setattr(microbench.gpu, "find_gpu", lambda index=0: (None, "no CUDA device"))
    checks = [s.command for s in plan_stages(plan) if s.name.startswith("speed")]
    assert checks and not any("--gpu-batch" in c for c in checks)
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(microbench.gpu, "find_gpu", found)
    checks = [list(s.command) for s in plan_stages(plan) if s.name.startswith("speed")]
    assert checks and all(c[c.index("--gpu-batch") + 1] == "16,64" for c in checks)
