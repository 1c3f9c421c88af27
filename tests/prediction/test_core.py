"""``pdlsim predict`` and ``pdlsim sweep``: the JSON contract, errors, scaling sanity, files."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from calibration.profile import load_profile, packaged_profile_names
from pdlsim.cli.main import main
from pdlsim.prediction.config import DEFAULT_PROFILES, PredictConfig, parse_rate, parse_time
from pdlsim.prediction.core import run_prediction
from tests.conftest import run_pdlsim
from tests.costmodel.test_model import write_synthetic_profile

KEYS = {
    "step_time_s", "epoch_time_s", "throughput_samples_per_s", "speedup", "efficiency",
    "comm_overhead_pct", "breakdown", "band", "memory_bytes_per_rank", "provenance", "config",
}  # fmt: skip


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("predict") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _cli(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pdlsim", *args], capture_output=True, text=True, timeout=timeout
    )


def _check(out: dict) -> None:
    assert KEYS <= out.keys()
    assert set(out["breakdown"]) == {"compute_s", "comm_s", "sync_s", "overlap_s"}
    band = out["band"]
    assert band["p10_s"] <= band["p50_s"] <= band["p90_s"]
    assert 0 < out["efficiency"] <= 1
    assert out["step_time_s"] > 0 and out["memory_bytes_per_rank"] > 0
    b = out["breakdown"]
    total = b["compute_s"] + b["comm_s"] + b["sync_s"] - b["overlap_s"]
    assert total == pytest.approx(out["step_time_s"], rel=1e-9)


def test_predict_json_with_a_profile_path(profile_path):
    run = _cli("predict", "--nodes", "16", "--gpus", "4", "--profile", profile_path, "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    _check(out)
    assert 0 < out["gpu_utilization"] <= 1
    assert "compute" in out["data_sheet"] and "inter-node links" in out["data_sheet"]


@pytest.mark.skipif(not packaged_profile_names(), reason="no packaged reference profile yet")
def test_predict_exactly_as_documented_on_a_fresh_install():
    run = _cli("predict", "--nodes", "16", "--gpus", "4")
    assert run.returncode == 0, run.stderr
    assert "step time" in run.stdout and "data-sheet" in run.stdout
    out = json.loads(_cli("predict", "--nodes", "16", "--gpus", "4", "--json").stdout)
    _check(out)


def test_the_packaged_h100_profile_predicts_gpu_ranks_from_what_it_measured():
    """Measured on one H100 (16-core host): GPU compute from its GPU steps, at the batches it
    timed there, and copies from its transfer model; the data-sheet default is far quicker for
    this trainer's launch-bound steps."""
    run = _cli("predict", "--profile", "h100-16core", "--nodes", "2", "--gpus", "4", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    _check(out)
    sources = out["provenance"]
    assert sources["compute"] == (
        "profile (gpu: pdlsim's own trainer; another framework's job: --step-time); scaled to "
        "the measured cnn steps (batches 64,256,1024)"
    )
    assert sources["copies"] == "profile"
    assert "compute" not in out["data_sheet"] and "copies" not in out["data_sheet"]
    default = json.loads(_cli("predict", "--nodes", "2", "--gpus", "4", "--json").stdout)
    assert default["provenance"]["profile"] == DEFAULT_PROFILES[0]
    assert default["provenance"]["measured"].startswith(
        load_profile(DEFAULT_PROFILES[0]).created_utc[:10]
    )
    assert out["breakdown"]["compute_s"] > 3 * default["breakdown"]["compute_s"]


def test_the_packaged_h200_host_profile_carries_a_full_node_from_its_node_fill(capsys):
    """Calibrated at 1-2 ranks on a 16-core host: a node of 16 ranks takes its co-location, its
    straggler and its collectives' pace from the node-fill benchmark, not from any training run
    at 16 ranks."""

    def predict(procs: int) -> dict:
        argv = ["predict", "--profile", "h200-16core", "--nodes", "1", "--procs", str(procs),
                "--model", "cnn", "--batch", "24", "--json"]  # fmt: skip
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    full, pair = predict(16), predict(2)
    _check(full)
    sources = full["provenance"]
    assert "carried above 2 by the node-fill slowdown" in sources["co-location"]
    assert sources["stragglers"].startswith("profile's node fill: the slowest of 16 ranks")
    assert sources["compute"].startswith("profile kernel tables")
    assert sources["collective pace"].startswith("profile's node fill: the slowest of 16 busy")
    assert "stragglers" not in pair["provenance"]  # the jitter measured 2 ranks itself
    assert "collective pace" not in pair["provenance"]  # and the collectives 2 ranks
    assert full["breakdown"]["sync_s"] > pair["breakdown"]["sync_s"]
    assert full["step_time_s"] > pair["step_time_s"]


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "0", "--gpus", "4"],
        ["--nodes", "2", "--batch", "-3"],
        ["--nodes", "2", "--gpus", "4", "--gpu-preset", "none"],
        ["--nodes", "2", "--network", "carrier-pigeon"],
        ["--nodes", "2", "--gpu-preset", "tpu", "--gpus", "1"],
        ["--nodes", "2", "--inter-bw", "fast"],
        ["--nodes", "2", "--inter-lat", "2 parsecs"],
        ["--nodes", "2", "--procs-per-node", "0"],
        ["--nodes", "2", "--model", "no-such-model"],
        ["--nodes", "2", "--gpu-preset", "tpu"],  # a typo, even where CPU ranks use no preset
    ],
)
def test_nonsense_is_one_line_and_exit_2(profile_path, args, capsys):
    assert main(["predict", *args, "--profile", profile_path]) == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err


def test_nonsense_from_the_shell_is_one_line_without_traceback(profile_path):
    run = _cli("predict", "--nodes", "0", "--gpus", "4", "--profile", profile_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr


def test_unreadable_profile_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for profile in (str(bad), str(tmp_path / "missing.json"), "no-such-packaged-profile"):
        assert main(["predict", "--nodes", "2", "--profile", profile]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err


def test_a_step_larger_than_the_dataset_is_refused(profile_path, capsys):
    """No epoch is one step of more samples than it holds: refused before simulating."""
    args = ["predict", "--nodes", "2", "--batch", "40000", "--profile", profile_path, "--json"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "a step takes 80,000 samples, more than the epoch's 50,000" in err
    assert main([*args, "--dataset-samples", "80000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples_per_step"] == 80_000 and out["epoch_time_s"] == out["step_time_s"]
    assert "warning" not in out


def test_parsing_units():
    assert parse_rate("25GB/s") == 25e9
    assert parse_rate("100Gb/s") == 12.5e9
    assert parse_time("2us") == pytest.approx(2e-6)


def test_one_device_has_speedup_one(profile_path):
    for cfg in (
        PredictConfig(nodes=1, gpus=1, profile=profile_path, samples=3, iterations=10),
        PredictConfig(nodes=1, threads=2, profile=profile_path, samples=3, iterations=10),
    ):
        out = run_prediction(cfg)
        assert out["speedup"] == pytest.approx(1.0) and out["efficiency"] == pytest.approx(1.0)


def test_more_nodes_on_a_slow_network_lose_efficiency(profile_path):
    def eff(nodes: int) -> float:
        cfg = PredictConfig(nodes=nodes, gpus=4, profile=profile_path, network="eth-10g",
                            samples=2, iterations=10)  # fmt: skip
        return run_prediction(cfg)["efficiency"]

    effs = [eff(n) for n in (2, 8, 32)]
    assert effs[0] > effs[1] > effs[2]
    fast = run_prediction(PredictConfig(nodes=32, gpus=4, profile=profile_path, network="ib-ndr",
                                        samples=2, iterations=10))  # fmt: skip
    assert fast["efficiency"] > effs[2]


def test_cpu_cluster_warns_when_oversubscribing_the_profile_machine(profile_path):
    run = _cli("predict", "--nodes", "4", "--procs-per-node", "4", "--threads", "2",
               "--profile", profile_path, "--inter-bw", "25GB/s", "--inter-lat", "2us")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "warning" in run.stderr
    assert "given" in run.stdout


def test_trace_is_chrome_json(profile_path, tmp_path):
    trace = tmp_path / "trace.json"
    run = _cli("predict", "--nodes", "2", "--gpus", "2", "--profile", profile_path,
               "--iterations", "3", "--trace", str(trace))  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(trace.read_text())
    assert doc["traceEvents"]


def test_sweep_writes_one_row_per_combination_and_a_png(profile_path, tmp_path):
    out = tmp_path / "sweep"
    run = _cli("sweep", "--nodes", "1,2,4", "--gpus", "1,4", "--batch", "16,32",
               "--profile", profile_path, "--iterations", "5", "--samples", "2",
               "--out", str(out), timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    frame = pd.read_csv(out / "sweep.csv")
    assert len(frame) == 3 * 2 * 2
    assert set(zip(frame["nodes"], frame["per_node"], frame["batch"], strict=True)) == {
        (n, g, b) for n in (1, 2, 4) for g in (1, 4) for b in (16, 32)
    }
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_refuses_an_output_that_is_a_file(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("keep")
    result = run_pdlsim("sweep", "--nodes", "1,2", "--gpus", "1", "--out", str(a_file), timeout=120)
    assert result.returncode == 2 and "is a file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and a_file.read_text() == "keep"


def test_memory_per_rank_counts_im2col_and_buckets_only_where_they_exist(profile_path):
    """cnn at batch 16: conv2d0's columns (32 x 32 rows of 3 x 3 x 3 floats, no gradient: it is
    the first layer) and conv2d3's columns and their gradient (16 x 16 rows of 3 x 3 x 32)."""
    cols = 32 * 32 * 27 * 4 + 2 * (16 * 16 * 288 * 4)
    base = dict(model="cnn", batch=16, profile=profile_path, samples=2, iterations=5)
    cpu = run_prediction(PredictConfig(nodes=1, procs_per_node=2, **base))
    memory = cpu["memory_breakdown_bytes"]
    assert memory["workspace"] == 16 * cols
    assert memory["buffers"] == 16 * 3 * 32 * 32 * 4  # the batch; CPU ranks reduce in place
    assert memory["weights"] == memory["gradients"] == 4 * 1_070_794
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
    gpu = run_prediction(PredictConfig(nodes=1, gpus=2, **base))["memory_breakdown_bytes"]
    assert gpu["buffers"] == memory["buffers"] + 4 * 1_070_794  # DDP buckets
    # a GPU library's workspace is one call's: the larger layer's columns alone
    assert gpu["workspace"] == 16 * max(32 * 32 * 27 * 4, 2 * (16 * 16 * 288 * 4))


def test_gpu_ranks_keep_the_activations_autograd_saves():
    """cnn: a relu's output is kept (its gradient masks by it) and so is every tensor a conv,
    dense layer, pool or the loss reads; a conv's output that only its relu reads is not, nor
    a pool's that only the flatten (a view) reads."""
    from microbench.workload import Workload
    from pdlsim.prediction.memory import activation_bytes_per_sample

    cnn = Workload.load("cnn")
    sizes = {info.name: info.activation_bytes_per_sample for info in cnn.layers}
    kept = ("relu1", "maxpool2d2", "relu4", "flatten6", "relu8", "dense9")
    assert activation_bytes_per_sample(cnn, "gpu") == sum(sizes[n] for n in kept)
    assert activation_bytes_per_sample(cnn, "cpu") == cnn.activation_bytes_per_sample


def test_resnet50_at_batch_256_in_fp32_fits_the_32_gb_v100s_it_was_published_on(profile_path):
    cfg = PredictConfig(nodes=1, gpus=8, node="dgx-v100", model="resnet50", batch=256,
                        profile=profile_path, samples=2, iterations=3)  # fmt: skip
    out = run_prediction(cfg)
    assert out["memory_bytes_per_rank"] < 32e9 and "warning" not in out


def test_the_links_say_which_collective_they_were_fitted_on(tmp_path):
    """A profile that measured no allreduce prices its links from the next collective it did
    measure, and the provenance names that one rather than the allreduce."""
    doc = json.loads(json.dumps(load_profile(DEFAULT_PROFILES[0]).to_dict()))  # a copy
    del doc["models"]["collectives"]["collectives"]["allreduce"]
    path = tmp_path / "no-allreduce.json"
    path.write_text(json.dumps(doc))
    cfg = PredictConfig(nodes=1, procs_per_node=2, model="mlp", samples=2, iterations=3)
    full = run_prediction(cfg)["provenance"]["intra-node links"]
    without = run_prediction(PredictConfig(**{**cfg.__dict__, "profile": str(path)}))
    assert full == "profile (allreduce alpha/beta)"
    assert without["provenance"]["intra-node links"] == "profile (reduce_scatter alpha/beta)"
