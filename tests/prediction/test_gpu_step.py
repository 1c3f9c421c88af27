"""GPU compute from the user's own measurement: its single-GPU step (--step-time), its MFU
(--mfu), or its layers timed on the GPU (--layer-times): one GPU takes exactly that step; the
layers keep their shares; the band no longer moves with the compute assumptions; a
measurement that does not describe the configuration is a one-line refusal."""

from __future__ import annotations

import json
import re

import pytest

from microbench.errors import UserError
from microbench.workload import Workload
from pdlsim import api
from pdlsim.cli.main import main
from pdlsim.costmodel.presets import GPU_PRESETS
from tests.costmodel.test_model import write_synthetic_profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gpu_step") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def one_gpu(profile: str, **options) -> dict:
    return api.predict("cnn", api.Cluster.gpus(1, 1), batch=64, profile=profile, samples=8,
                       **options)  # fmt: skip


def test_one_gpu_takes_the_given_step(profile):
    out = one_gpu(profile, step_time="25ms")
    assert out["step_time_s"] == pytest.approx(0.025, rel=1e-6)
    assert out["provenance"]["compute"].startswith("given: one GPU's step 25 ms at batch 64")
    band = out["band"]  # only the batch's copy, assumed, still moves
    assert (band["p90_s"] - band["p10_s"]) / band["p50_s"] < 2e-3


def test_mfu_is_the_workloads_flops_over_that_share_of_the_peak(profile):
    cnn = Workload.load("cnn")
    flops = 64 * (cnn.forward_flops_per_sample + cnn.backward_flops_per_sample)
    peak = GPU_PRESETS["h100-sxm"].bf16_tensor_flops_per_s
    out = one_gpu(profile, mfu=0.01, precision="bf16")
    assert out["step_time_s"] == pytest.approx(flops / (0.01 * peak), rel=1e-6)


def test_the_layers_keep_their_shares_and_scale_out_as_before(profile):
    """The given step moves every layer by one factor: comm is untouched, so at 2 x 8 GPUs the
    step grows by the compute it was given, not by more."""
    cluster = api.Cluster.gpus(2, 8)
    base = api.predict("cnn", cluster, batch=64, profile=profile, samples=4)
    given = api.predict("cnn", cluster, batch=64, profile=profile, samples=4,
                        step_time="10ms")  # fmt: skip
    assert given["breakdown"]["comm_s"] == pytest.approx(base["breakdown"]["comm_s"], rel=1e-6)
    assert given["breakdown"]["compute_s"] > 10 * base["breakdown"]["compute_s"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "2", "--step-time", "5ms", "--mfu", "0.3"], "give one of them"),
        (["--procs-per-node", "2", "--step-time", "5ms"], "--step-time describes GPU ranks"),
        (["--gpus", "2", "--mfu", "1.5"], "--mfu is a fraction of the GPU's peak from 1e-06 to 1"),
        (["--gpus", "2", "--step-time", "fast"], "expected a time like 2us"),
        (["--gpus", "2", "--step-time", "1us"], "is not longer than copying its batch"),
        (["--gpus", "2", "--step-time-accum", "4"], "add --step-time or drop --step-time-accum"),
        (["--gpus", "2", "--mfu", "0.3", "--step-time-accum", "4"], "add --step-time or drop"),
        (["--procs-per-node", "2", "--step-time-accum", "4"], "describes GPU ranks"),
    ],
)
def test_bad_input_is_one_line_and_status_2(profile, capsys, argv, message):
    assert main(["predict", "--nodes", "2", "--profile", profile, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_mfu_without_a_gpu_data_sheet_is_refused(capsys):
    argv = ["predict", "--nodes", "1", "--gpus", "1", "--profile", "h100-16core", "--gpu-preset",
            "none", "--mfu", "0.4"]  # fmt: skip
    assert main(argv) == 2
    assert "--mfu needs the GPU's peak" in capsys.readouterr().err


def _layer_times(tmp_path, **change) -> str:
    """A layer-times file as pdlsim bench --layer-times writes it, for cnn at batch 64 on a
    GPU: every layer 1 ms forward, 2 ms backward; the step 40 ms with a 4 ms update."""
    cnn = Workload.load("cnn")
    doc = {
        "workload": "cnn", "batch": 64, "precision": "fp32", "optimizer": "sgd",
        "device": "cuda:0", "device_name": "A GPU", "torch_version": "2.13.0",
        "layers": [{"name": info.name, "forward_s": 1e-3, "backward_s": 2e-3}
                   for info in cnn.layers],
        "step_s": 0.040, "update_s": 0.004, **change,
    }  # fmt: skip
    path = tmp_path / "layer_times.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_layers_timed_on_a_gpu_price_it_scaled_to_its_measured_step(profile, tmp_path):
    out = one_gpu(profile, layer_times=_layer_times(tmp_path), prefetch=True)
    assert out["breakdown"]["compute_s"] == pytest.approx(0.040, rel=1e-6)
    assert out["provenance"]["compute"].startswith("measured: A GPU, torch 2.13.0, fp32")
    assert "scaled x1.09" in out["provenance"]["compute"]  # 36 ms of step over 33 ms of layers


@pytest.mark.parametrize(
    "change, extra, message",
    [
        ({"batch": 32}, {}, "timed batch 32, this prediction has 64"),
        ({"precision": "bf16"}, {}, "timed precision 'bf16', this prediction has 'fp32'"),
        ({"device": "cpu"}, {}, "was timed on 'cpu', not a GPU"),
        ({"layers": []}, {}, "has no times for layer(s) conv2d0"),
        ({"step_s": 0.001}, {}, "must exceed its update"),
        ({}, {"step_time": "5ms"}, "drop --step-time/--mfu"),
        ({}, {"step_time_accum": 8}, "(and --step-time-accum)"),
    ],
)
def test_a_layer_times_file_that_does_not_fit_is_refused(profile, tmp_path, change, extra,
                                                          message):  # fmt: skip
    with pytest.raises(UserError, match=re.escape(message)):
        one_gpu(profile, layer_times=_layer_times(tmp_path, **change), **extra)


def test_a_file_that_is_not_layer_times_is_one_line(profile, tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text("{}")
    argv = ["predict", "--nodes", "1", "--gpus", "1", "--profile", profile, "--layer-times",
            str(path)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not a layer-times file" in err and err.count("\n") == 1


def test_gradient_accumulation_counts_its_samples_and_one_allreduce(profile, capsys):
    cluster = api.Cluster.gpus(2, 4)
    base = dict(batch=16, profile=profile, samples=4, iterations=5)
    one = api.predict("cnn", cluster, **base)
    four = api.predict("cnn", cluster, grad_accum=4, **base)
    assert four["samples_per_step"] == 4 * one["samples_per_step"] == 4 * 8 * 16
    assert four["breakdown"]["comm_s"] == pytest.approx(one["breakdown"]["comm_s"], rel=1e-6)
    assert four["efficiency"] > one["efficiency"]  # the same allreduce over more compute
    argv = ["predict", "--nodes", "1", "--gpus", "2", "--profile", profile, "--grad-accum", "2",
            "--parallel", "model"]  # fmt: skip
    assert main(argv) == 2
    assert "--grad-accum is for data-parallel training" in capsys.readouterr().err


def test_with_accumulation_the_given_step_is_one_gpus_time_per_micro_batch(profile):
    """A throughput measured with K micro-batches per update gives the time per micro-batch,
    a K-th of the update in it: one GPU's optimizer step is then K times the given step."""
    for k in (1, 4, 32):
        out = one_gpu(profile, step_time="25ms", grad_accum=k, optimizer="adam")
        assert out["step_time_s"] == pytest.approx(k * 0.025, rel=1e-6)
        assert out["throughput_samples_per_s"] == pytest.approx(64 / 0.025, rel=1e-6)


def test_a_step_measured_at_another_accumulation_prices_one_update_per_optimizer_step(profile):
    """A step timed without accumulation paid a whole update; timed over 8 micro-batches, an
    eighth. One GPU's optimizer step of 4 micro-batches is then ``s (4 + x) / (1 + x / K1)``
    for a given step ``s`` measured at K1, with ``x`` the update over a micro-batch's forward
    and backward: below 4 s from K1 = 1, above it from K1 = 8, and one ``x`` fits both."""
    base = dict(step_time="25ms", grad_accum=4, optimizer="adam")
    same = one_gpu(profile, step_time_accum=4, **base)
    assert same["step_time_s"] == pytest.approx(one_gpu(profile, **base)["step_time_s"])
    assert same["step_time_s"] == pytest.approx(4 * 0.025, rel=1e-6)
    every_step = one_gpu(profile, step_time_accum=1, **base)["step_time_s"] / 0.025
    amortised = one_gpu(profile, step_time_accum=8, **base)["step_time_s"] / 0.025
    assert every_step < 4 < amortised
    x = (4 - every_step) / (every_step - 1)
    # the batch's host-to-device copy, not scaled, is the only other term
    assert x > 0 and amortised == pytest.approx((4 + x) / (1 + x / 8), rel=1e-4)
    with pytest.raises(UserError, match="--step-time-accum must be a positive integer, got 0"):
        one_gpu(profile, step_time_accum=0, **base)
