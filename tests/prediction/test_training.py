"""Precision and optimizer: what they set in memory, update cost, compute rate and the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import calibration
from microbench.errors import UserError
from microbench.op_records import update_cost
from microbench.workload import load_workload
from pdlsim.costmodel.presets import GPU_PRESETS
from pdlsim.costmodel.training import Training
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.core import run_prediction
from tests.conftest import pdlsim_here

PACKAGED = Path(calibration.__file__).parent / "profiles" / "xeon-2core.json"


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("fp32", "sgd", (4, 4, 0)),
        ("fp32", "momentum", (4, 4, 4)),
        ("tf32", "adam", (4, 4, 8)),
        ("bf16", "sgd", (2, 2, 4)),
        ("bf16", "adam", (2, 2, 12)),  # the ZeRO paper's 16 bytes a parameter
        ("fp16", "adamw", (2, 2, 12)),
    ],
)
def test_memory_per_parameter_follows_the_zero_accounting(precision, optimizer, per_param):
    parts = Training(precision, optimizer).memory_bytes(1000)
    assert (parts["weights"], parts["gradients"], parts["optimizer_state"]) == tuple(
        1000 * b for b in per_param
    )


def test_float32_sgd_updates_cost_what_the_trainer_measures_them_at():
    for optimizer, momentum in (("sgd", 0.0), ("momentum", 0.9)):
        assert Training("fp32", optimizer).update_cost(777) == update_cost(777, momentum)
    adam_flops, adam_bytes = Training("fp32", "adam").update_cost(10)
    assert adam_bytes == 10 * 28  # weights, both moments read and written, gradient read
    assert Training("fp16", "adam").update_cost(10)[1] > Training("bf16", "adam").update_cost(10)[1]


def test_each_precision_computes_at_its_data_sheet_peak_or_is_refused():
    h100, v100 = GPU_PRESETS["h100-sxm"], GPU_PRESETS["v100"]
    peaks = [Training(p).peak_flops_per_s(h100) for p in ("fp32", "tf32", "bf16", "fp16")]
    assert peaks == [67e12, 495e12, 989.4e12, 989.4e12]
    assert Training("fp16").peak_flops_per_s(v100) == 125e12
    for precision in ("tf32", "bf16"):
        with pytest.raises(UserError, match=f"v100 has no {precision} tensor cores"):
            Training(precision).peak_flops_per_s(v100)
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        Training("fp8")


def _gpu(**changes):
    cfg = PredictConfig(nodes=2, gpus=8, model="resnet50", batch=32, samples=3, **changes)
    return run_prediction(cfg)


def test_mixed_precision_halves_the_wire_and_the_activations_and_runs_faster():
    fp32, bf16 = _gpu(), _gpu(precision="bf16", optimizer="adam")
    total = [sum(b["nbytes"] for b in out["buckets"]) for out in (fp32, bf16)]
    assert total[1] * 2 == total[0] == 4 * load_workload("resnet50").param_count
    assert len(bf16["buckets"]) < len(fp32["buckets"])  # a bucket's cap is in bytes, as DDP's
    m32, m16 = fp32["memory_breakdown_bytes"], bf16["memory_breakdown_bytes"]
    params = load_workload("resnet50").param_count
    assert m16["optimizer_state"] == 12 * params and m16["weights"] == 2 * params
    assert m16["activations"] == m32["activations"] // 2
    assert bf16["breakdown"]["compute_s"] < fp32["breakdown"]["compute_s"] / 3
    assert "bf16 (mixed precision" in bf16["provenance"]["training"]
    assert "training" not in fp32["provenance"]


def test_precision_and_optimizer_that_cannot_be_priced_are_one_line_errors():
    for argv, message in (
        (("--precision", "bf16"), "CPU ranks compute in fp32"),
        (("--gpus", "2", "--parallel", "model", "--precision", "bf16"), "data-parallel training"),
        (("--gpus", "2", "--precision", "fp16", "--compression", "fp16"), "16-bit already"),
        (("--gpus", "2", "--gpu-preset", "v100", "--precision", "bf16"), "no bf16 tensor cores"),
        (("--precision", "int8"), "invalid choice: 'int8'"),
    ):
        done = pdlsim_here("predict", "--nodes", "1", "--model", "mlp", *argv)
        assert done.returncode == 2 and message in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr


def test_a_profile_whose_sweep_did_not_time_an_update_refuses_it_on_cpu(tmp_path):
    doc = json.loads(PACKAGED.read_text())
    loops = doc["models"]["kernels"]["loops"]
    for name in [n for n in loops if n.startswith("adam")]:
        del loops[name]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(doc))
    done = pdlsim_here("predict", "--nodes", "1", "--model", "mlp", "--profile", str(older),
                      "--optimizer", "adamw")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "did not time adam, which a step of mlp calls" in done.stderr
    assert "recalibrate" in done.stderr
    again = pdlsim_here("predict", "--nodes", "1", "--model", "mlp", "--profile", str(older),
                       "--optimizer", "momentum")  # fmt: skip
    assert again.returncode == 0, again.stderr


def test_cpu_ranks_price_the_momentum_update_from_its_own_kernel():
    plain = run_prediction(PredictConfig(model="mlp", batch=16, samples=3))
    momentum = run_prediction(PredictConfig(model="mlp", batch=16, samples=3, optimizer="momentum"))
    assert momentum["step_time_s"] > plain["step_time_s"]


def test_sweep_carries_the_precision_and_optimizer_into_every_row(tmp_path):
    import pandas as pd

    training = ("--precision", "bf16", "--optimizer", "adam")
    done = pdlsim_here("sweep", "--nodes", "1,2", "--gpus", "8", "--model", "gpt2", "--batch", "2",
                      *training, "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert set(table["precision"]) == {"bf16"} and set(table["optimizer"]) == {"adam"}
    params = load_workload("gpt2").param_count
    assert (table["memory_bytes_per_rank"] > 16 * params).all()
