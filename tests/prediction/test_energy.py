"""The power model: exact joules by hand arithmetic, presets, overrides, ``pdlsim predict``."""

from __future__ import annotations

import argparse
import json

import pytest

from microbench.errors import UserError
from pdlsim.cli import predict_options
from pdlsim.prediction.energy import (
    POWER_PRESETS,
    PowerModel,
    StepActivity,
    estimate_energy,
    power_model_for,
    power_preset,
)

CPU_NODE = PowerModel(50.0, 150.0, sockets_per_node=2, cores_per_socket=10, node_other_w=20.0)


def test_cpu_ranks_compute_on_all_threads_and_poll_on_one():
    # 3 nodes x 2 ranks x 4 threads; step 0.1 s of which 0.06 s compute.
    activity = StepActivity(0.1, 0.06, nodes=3, ranks_per_node=2, threads_per_rank=4, device="cpu")
    e = estimate_energy(activity, CPU_NODE, steps_per_epoch=10, dataset_samples=1000)
    # busy core-s per rank: 4 x 0.06 + 1 x 0.04 = 0.28; per node 0.56
    assert e["busy_core_seconds_per_step"] == pytest.approx(0.56, abs=1e-12)
    # CPU: 2 sockets x 50 W x 0.1 s + (150 - 50) / 10 W per core x 0.56 = 10 + 5.6
    assert e["node_joules_per_step"] == pytest.approx({"cpu": 15.6, "gpu": 0.0, "other": 2.0})
    assert e["joules_per_step"] == pytest.approx(3 * 17.6)
    assert e["joules_per_epoch"] == pytest.approx(10 * 3 * 17.6)
    assert e["joules_per_sample"] == pytest.approx(10 * 3 * 17.6 / 1000)
    assert e["average_watts_per_node"] == pytest.approx(176.0)


def test_every_core_busy_draws_the_busy_watts_and_oversubscription_no_more():
    full = StepActivity(0.5, 0.5, nodes=1, ranks_per_node=2, threads_per_rank=10, device="cpu")
    over = StepActivity(0.5, 0.5, nodes=1, ranks_per_node=4, threads_per_rank=10, device="cpu")
    for activity in (full, over):
        e = estimate_energy(activity, CPU_NODE, steps_per_epoch=1, dataset_samples=1)
        assert e["node_joules_per_step"]["cpu"] == pytest.approx(2 * 150.0 * 0.5)
        assert e["busy_core_seconds_per_step"] == pytest.approx(20 * 0.5)


def test_gpu_busy_only_while_computing_and_one_host_core_per_gpu():
    model = PowerModel(30.0, 100.0, 1, 8, gpu_idle_w=50.0, gpu_busy_w=400.0)
    activity = StepActivity(0.2, 0.15, 1, 4, 1, "gpu", gpu_busy_s=0.1)
    e = estimate_energy(activity, model, steps_per_epoch=5, dataset_samples=100)
    # host: 30 W x 0.2 s + 70/8 W per core x 4 cores x 0.2 s = 6 + 7
    # GPU: busy 0.1 s at 400 W + idle 0.1 s at 50 W, x 4 GPUs = 180
    assert e["node_joules_per_step"] == pytest.approx({"cpu": 13.0, "gpu": 180.0, "other": 0.0})
    assert e["gpu_busy_s_per_step"] == 0.1
    assert e["joules_per_sample"] == pytest.approx(5 * 193.0 / 100)
    # without a copy wait the GPU is busy for the whole compute time
    e = estimate_energy(StepActivity(0.2, 0.15, 1, 4, 1, "gpu"), model, 5, 100)
    assert e["node_joules_per_step"]["gpu"] == pytest.approx(4 * (0.15 * 400 + 0.05 * 50))


def test_measured_phases_split_into_compute_and_the_rest():
    phases = {"data": 0.01, "h2d": 0.0, "forward": 0.02, "backward": 0.03, "wait": 0.005,
              "allreduce": 0.01, "update": 0.005}  # fmt: skip
    activity = StepActivity.from_phases(phases, 0.08, ranks_per_node=2, threads_per_rank=2)
    assert activity.compute_s == pytest.approx(0.055)
    e = estimate_energy(activity, CPU_NODE, steps_per_epoch=1, dataset_samples=64)
    # busy core-s: 2 ranks x (2 x 0.055 + 0.025) = 0.27
    assert e["busy_core_seconds_per_step"] == pytest.approx(0.27)
    assert e["joules_per_step"] == pytest.approx(2 * 50 * 0.08 + 10 * 0.27 + 20 * 0.08)


def test_presets_carry_their_data_sheet_and_assumptions():
    assert set(POWER_PRESETS) == {"cpu-2s", "h100-sxm", "a100-sxm", "v100"}
    h100, cpu = POWER_PRESETS["h100-sxm"], POWER_PRESETS["cpu-2s"]
    assert (h100.gpu_idle_w, h100.gpu_busy_w) == (70.0, 700.0)
    assert (POWER_PRESETS["a100-sxm"].gpu_busy_w, POWER_PRESETS["v100"].gpu_busy_w) == (400, 300)
    assert (cpu.cpu_idle_w_per_socket, cpu.cpu_busy_w_per_socket) == (81.0, 270.0)
    for preset in POWER_PRESETS.values():
        assert preset.cpu_idle_w_per_socket == pytest.approx(0.3 * preset.cpu_busy_w_per_socket)
        assert "data sheet" in preset.cpu_source and "assumption" in preset.cpu_source
        if preset.gpu_busy_w:
            assert "data sheet" in preset.gpu_source and "assumption" in preset.gpu_source
    assert "GPU" not in cpu.source("cpu") and "700 W" not in h100.source("cpu")
    assert "70/700 W" in h100.source("gpu")


def test_default_models_and_overrides():
    assert power_model_for(0).name == "cpu-2s"
    assert power_model_for(4, "a100-sxm").name == "a100-sxm"
    assert power_model_for(4, "a100-sxm-40gb").name == "a100-sxm"  # another memory size
    assert power_model_for(4, "v100-16gb").name == "v100"
    assert power_model_for(4, "none").name == "h100-sxm"  # a measured GPU: no power figures
    given = power_model_for(0, None, "v100", cpu_watts=(10.0, 60.0), cpu_sockets=(1, 6),
                            node_other_watts=5.0)  # fmt: skip
    assert (given.cpu_idle_w_per_socket, given.cpu_busy_w_per_socket) == (10.0, 60.0)
    assert (given.sockets_per_node, given.cores_per_socket, given.node_other_w) == (1, 6, 5.0)
    assert given.gpu_busy_w == 300.0 and given.name == "v100 with given figures"
    assert "data sheet" not in given.source("cpu") and "--cpu-watts" in given.source("cpu")
    assert "data sheet" in given.source("gpu")  # the GPU figures are still the preset's
    with pytest.raises(UserError, match="unknown power preset 'tpu'"):
        power_model_for(0, None, "tpu")
    # a GPU with no power preset of its own draws its data sheet's board power, not an H100's
    l40s = power_model_for(4, "l40s", board_power_w=350.0)
    assert (l40s.gpu_idle_w, l40s.gpu_busy_w) == (35.0, 350.0)
    assert l40s.name == "h100-sxm host, l40s GPU" and "board power 350 W" in l40s.source("gpu")
    assert power_model_for(4, "h100-sxm", board_power_w=700.0) == power_preset("h100-sxm")
    assert power_model_for(4, "l40s", "a100-sxm", board_power_w=350.0).gpu_busy_w == 400.0
    with pytest.raises(UserError, match="0 <= idle <= busy"):
        PowerModel(100.0, 50.0, 2, 10)
    with pytest.raises(UserError, match="at least 1 socket"):
        PowerModel(10.0, 50.0, 0, 10)


def test_prediction_carries_energy_consistent_with_its_breakdown():
    from pdlsim.prediction.config import PredictConfig
    from pdlsim.prediction.core import run_prediction

    cfg = PredictConfig(nodes=2, procs_per_node=2, threads=1, model="mlp", samples=2,
                        iterations=20)  # fmt: skip
    out = run_prediction(cfg)
    e = out["energy"]
    activity = StepActivity(out["step_time_s"], out["breakdown"]["compute_s"], 2, 2, 1, "cpu")
    steps = out["epoch_time_s"] / out["step_time_s"]
    assert steps == pytest.approx(round(steps)) and round(steps) == -(-60_000 // 128)
    again = estimate_energy(activity, POWER_PRESETS["cpu-2s"], steps, 60_000)
    for key in ("joules_per_step", "joules_per_epoch", "joules_per_sample", "node_joules_per_step"):
        assert e[key] == pytest.approx(again[key], rel=1e-12)
    assert e["power_model"] == again["power_model"] and e["source"] == again["source"]
    # one thread per rank computes or polls all the step: 2 cores busy per node
    assert e["average_watts_per_node"] == pytest.approx(2 * 81 + 2 * 189 / 40)
    assert e["joules_per_epoch"] == pytest.approx(2 * e["average_watts_per_node"]
                                                  * out["epoch_time_s"])  # fmt: skip
    assert "power_model" in out["data_sheet"]
    assert out["provenance"]["power_model"] == e["source"]


def test_a_gpu_prediction_draws_the_gpus_own_board_power():
    """Its GPU's data sheet, from the GPU's description (here the node's L40S), sets the busy
    watts: 350 W, where the fallback host's H100 would say 700 W."""
    from pdlsim import api

    out = api.predict("cnn", api.Cluster.gpus(1, 2), node="pcie-l40s", samples=2, iterations=3)
    model = out["energy"]["power_model"]
    assert (model["gpu_idle_w"], model["gpu_busy_w"]) == (35.0, 350.0)
    assert "l40s: data-sheet board power 350 W" in out["energy"]["source"]


def test_cli_flags(pdlsim_cli):
    result = pdlsim_cli("predict", "--nodes", "1", "--cpu-watts", "100,50")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--cpu-watts" in result.stderr
    assert "0 <= IDLE <= BUSY" in result.stderr
    result = pdlsim_cli("predict", "--nodes", "1", "--model", "mlp", "--samples", "2",
                        "--cpu-watts", "40,120", "--cpu-sockets", "1x2", "--node-other-watts",
                        "10", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    e = out["energy"]
    # one rank, one thread: one of the two cores busy the whole step
    assert e["average_watts_per_node"] == pytest.approx(40 + 80 / 2 + 10)
    assert e["joules_per_sample"] == pytest.approx(90 * out["epoch_time_s"] / 60_000)
    assert "power_model" not in out["data_sheet"]  # every figure used was given
    text = pdlsim_cli("predict", "--nodes", "1", "--model", "mlp", "--samples", "2").stdout
    assert "J/step" in text and "mJ/sample" in text and "power model: cpu-2s" in text


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (lambda t: predict_options._watts_pair("cpu-watts", "per socket")(t), "1e300,1e301"),
        (predict_options._watts, "1e6"),
        (predict_options._sockets, "1000000x1000000"),
        (predict_options._sockets, "2x5000"),
    ],
)
def test_power_figures_past_any_machine_are_refused(parse, text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse(text)
    assert predict_options._sockets("2x128") == (2, 128)
