"""Bad input found by a fault probe of predict, sweep, collective, hardware and workload, and
of the files they read: each is one line on stderr starting ``pdlsim: error:`` that names
what was wrong, exit status 2, no traceback, and an existing output left as it was."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import pytest

from calibration.profile import load_profile
from microbench.errors import UserError
from microbench.workload import Workload
from pdlsim.cli import sweep as sweep_module
from pdlsim.cli.knobs import parse_vary, vary
from pdlsim.costmodel.presets import HARDWARE
from pdlsim.prediction import build as build_module
from pdlsim.prediction import core
from pdlsim.prediction.checks import check_power
from pdlsim.prediction.config import PredictConfig
from tests.conftest import pdlsim_here, refused_here

FAST = ["--iterations", "2", "--samples", "2"]
GPU = ["predict", "--nodes", "2", "--gpus", "8", *FAST]
CPU = ["predict", "--nodes", "2", *FAST]


def _write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# ------------------------------------------------------------ usage errors: one prefix
@pytest.mark.parametrize(
    ("args", "help_of"),
    [
        (["predict", "--nodes", "1", "--samples", "x"], "pdlsim predict"),
        (["predict", "--nodes", "1", "--nodes", "2"], "pdlsim predict"),
        (["sweep", "--nodes", "0", "--out", "x"], "pdlsim sweep"),
        (["collective", "ALLREDUCE"], "pdlsim collective"),
        (["hardware", "bogus"], "pdlsim hardware"),
        (["workload"], "pdlsim workload"),
        (["predict", "--nodes", "1", "--precision", "FP32"], "pdlsim predict"),
    ],
)
def test_a_usage_error_starts_like_every_other_refusal(args, help_of):
    """argparse's errors began "pdlsim predict: error:", every other refusal "pdlsim: error:";
    a script telling refusals by their prefix missed the first kind. The subcommand's help
    is still named."""
    assert f"(see '{help_of} --help')" in refused_here(*args)


# ------------------------------------------------------------ figures too small to be real
@pytest.mark.parametrize("watts", [1e-300, 0.5])
def test_a_gpu_file_with_a_board_power_no_part_draws_is_refused(tmp_path, watts):
    """board_power_w of 1e-300 was taken: 0 (not given) and 1 W up are a part's figures."""
    _, fields = HARDWARE.entry("h100-sxm")
    path = _write(tmp_path, "gpu.json", {**fields, "board_power_w": watts})
    line = refused_here(*GPU, "--gpu-preset", path)
    assert "board_power_w must be 0 (none) or 1 to 100000" in line and path in line
    gpus = {"h100-sxm": {**fields, "board_power_w": watts}}
    line = refused_here(
        "hardware", "list", "--hardware", _write(tmp_path, "hw.json", {"gpus": gpus})
    )
    assert "gpus.h100-sxm: GPU 'h100-sxm': board_power_w" in line


def test_a_board_power_of_zero_still_means_not_given(tmp_path):
    _, fields = HARDWARE.entry("h100-sxm")
    overlay = _write(tmp_path, "hw.json", {"gpus": {"h100-sxm": {**fields, "board_power_w": 0}}})
    assert pdlsim_here("hardware", "list", "--hardware", overlay).returncode == 0


def test_an_assumed_efficiency_drawn_down_to_nothing_is_refused(tmp_path):
    """A low of 1e-300 let the band draw a NIC at 1e-300 of its line rate."""
    path = _write(tmp_path, "hw.json", {"assumptions": {"network_efficiency": {"low": 1e-300}}})
    line = refused_here("hardware", "list", "--hardware", path)
    assert "assumptions.network_efficiency" in line and "need 0.001 <= low" in line


def test_a_hardware_file_whose_about_is_no_text_is_refused(tmp_path):
    path = _write(tmp_path, "hw.json", {"about": 5})
    assert "about: expected a string (a note), got 5" in refused_here("hardware", "list",
                                                                   "--hardware", path)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "8", "--gpu-watts", "1e-300,1e-300"], "IDLE must be 0 or 1 to 100,000 watts"),
        (["--cpu-watts", "0,1e-300"], "BUSY must be 0 or 1 to 100,000 watts"),
        (["--node-other-watts", "1e-300"], "must be 0 or 1 to 100,000 watts, got 1e-300"),
        (["--compression", "topk:1e-300"], "top-k density must be at least 1e-06"),
    ],
)
def test_a_flag_too_small_to_be_real_is_refused(args, message):
    line = refused_here("predict", "--nodes", "2", *FAST, *args)
    assert message in line and args[-2] in line


def test_the_api_holds_watts_to_the_flags_rule():
    """Values no flag parser has seen (the Python API) meet the same rule."""
    with pytest.raises(Exception, match="--cpu-watts BUSY must be 0 or 1 to 100,000 watts"):
        check_power(PredictConfig(cpu_watts=(0.0, 1e-300)))
    with pytest.raises(Exception, match="--node-other-watts must be 0 or 1"):
        check_power(PredictConfig(node_other_watts=1e-300))


@pytest.mark.parametrize(
    ("vary", "message"),
    [
        ("bucket-mb=25,1e-300", "--bucket-mb must be from 9.54e-07 (1 byte)"),
        ("compression=none,topk:1e-300", "top-k density must be at least 1e-06"),
    ],
)
def test_a_varied_value_too_small_to_be_real_leaves_the_tables(tmp_path, vary, message):
    out = tmp_path / "sweep"
    out.mkdir()
    for name in ("knobs.csv", "knob_ranking.csv"):
        (out / name).write_text("kept\n")
    assert message in refused_here(
        "sweep", "--nodes", "2", *FAST, "--vary", vary, "--out", str(out)
    )
    assert all((out / n).read_text() == "kept\n" for n in ("knobs.csv", "knob_ranking.csv"))


# ------------------------------------------------------------ what an error names
@pytest.mark.parametrize(
    ("algorithm", "said"), [("bogus", "is unknown"), ("RING", "is unknown"),
                            ("rabenseifner", "is one of MPICH's")],
)  # fmt: skip
def test_an_algorithm_gpu_ranks_lack_is_named_for_what_it_is(algorithm, said):
    """Any name NCCL lacks was called "one of MPICH's", a typo included."""
    line = refused_here(*GPU, "--algorithm", algorithm)
    assert f"--algorithm {algorithm} {said}; GPU ranks run NCCL's: ring, tree" in line


# ------------------------------------------------------------ --corrections, read once
def test_the_corrections_are_parsed_once_per_build(monkeypatch):
    """check_config parsed --corrections, and build parsed it again."""
    calls = []
    real = build_module.parse_corrections

    def counted(text):
        calls.append(text)
        return real(text)

    monkeypatch.setattr(build_module, "parse_corrections", counted)
    cfg = PredictConfig(nodes=2, model="mlp", iterations=2, samples=2, corrections="glue,pace")
    _, _, cost, _, _ = build_module.build(cfg)
    assert calls == ["glue,pace"]
    assert build_module.check_config(cfg).corrections == frozenset({"glue", "pace"})


# ------------------------------------------------------------ damaged profiles
@lru_cache(maxsize=1)
def _gpu_profile() -> dict:
    return load_profile("h100-16core").to_dict()


def _profile(tmp_path, change) -> str:
    doc = copy.deepcopy(_gpu_profile())
    change(doc)
    return _write(tmp_path, "profile.json", doc)


def test_a_profile_with_no_compute_device_is_refused_on_loading(tmp_path):
    """An empty devices table was a KeyError traceback at the first prediction."""
    path = _profile(tmp_path, lambda d: d["models"]["compute"].update(devices={}))
    line = refused_here(*CPU, "--model", "mlp", "--profile", path)
    assert f"{path}: models.compute.devices: is empty" in line


def test_a_profile_of_gpu_layers_alone_says_it_prices_no_cpu_ranks(tmp_path):
    """Without a cpu device, CPU ranks were a KeyError traceback."""
    path = _profile(tmp_path, lambda d: d["models"]["compute"]["devices"].pop("cpu"))
    line = refused_here(*CPU, "--model", "mlp", "--profile", path)
    assert "the profile measured compute on gpu, not on CPU ranks" in line


@pytest.mark.parametrize(
    ("key", "value", "got"),
    [("cores_available", -1, "-1"), ("physical_cores", "16", '"16"'),
     ("memory_total_bytes", 1e-300, "1e-300"), ("logical_cores", 0, "0")],
)  # fmt: skip
def test_a_profile_machine_count_that_is_no_count_is_refused(tmp_path, key, value, got):
    """-1 cores was printed in a warning; 1e-300 bytes of memory refused every layout with
    "0.0 GB"."""
    path = _profile(tmp_path, lambda d: d["machine"].update({key: value}))
    line = refused_here(*CPU, "--model", "mlp", "--profile", path)
    assert f"machine.{key}: must be a whole number >= 1 or null, got {got}" in line


# ------------------------------------------------------------ names that would break the line
@pytest.mark.parametrize(
    "args",
    [
        ["predict", "--nodes", "2", "--network", "a\nb"],
        ["predict", "--nodes", "2", "--gpus", "8", "--gpu-preset", "h100\x1b[31m"],
        ["hardware", "show", "dgx\nh100"],
        ["predict", "--nodes", "1", "--bucket-mb", "1\n2"],
    ],
)
def test_a_name_with_a_newline_or_escape_stays_on_the_one_line(args):
    """A name echoed in the error ("unknown network preset 'a<newline>b'") broke the line in
    two, and a terminal escape reached the terminal."""
    line = refused_here(*args)
    assert "\x1b" not in line and ("\\n" in line or "\\x1b" in line), line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "a\nb"}, "name: 'a\\nb' holds the unprintable character '\\n'"),
        ({"source": "data\x1b[2J sheet"}, "source: 'data\\x1b[2J sheet' holds the unprintable"),
        ({"device_names": ["H100\r"]}, "device_names: 'H100\\r' holds the unprintable"),
        ({"name": "x" * 300}, "name: is 300 characters long; give at most 200"),
        ({"name": " "}, "name: a preset's name is empty"),
    ],
)
def test_a_preset_file_whose_text_would_break_a_report_line_is_refused(tmp_path, change, message):
    """A GPU named 'a<newline>b' was taken and printed across two lines of the report."""
    _, fields = HARDWARE.entry("h100-sxm")
    path = _write(tmp_path, "gpu.json", {**fields, **change})
    assert message in refused_here(*GPU, "--gpu-preset", path)


def test_a_hardware_file_with_an_empty_preset_name_is_refused(tmp_path):
    _, fields = HARDWARE.entry("ib-hdr")
    fields.pop("name")
    path = _write(tmp_path, "hw.json", {"networks": {"": fields}})
    assert "networks..name: a preset's name is empty" in refused_here("hardware", "list",
                                                                  "--hardware", path)  # fmt: skip


# ------------------------------------------------------------ layer times of another network
def test_layer_times_of_a_layer_the_workload_lacks_are_refused(tmp_path):
    """A row for a layer the workload does not have (another network's file, a renamed layer)
    was dropped without a word."""
    rows = [{"name": info.name, "forward_s": 1e-3, "backward_s": 2e-3}
            for info in Workload.load("cnn").layers]  # fmt: skip
    rows.append({"name": "conv9", "forward_s": 1e-3, "backward_s": 2e-3})
    doc = {"workload": "cnn", "batch": 32, "precision": "fp32", "optimizer": "sgd",
           "device": "cuda:0", "layers": rows, "step_s": 0.04, "update_s": 0.004}  # fmt: skip
    path = _write(tmp_path, "layer_times.json", doc)
    line = refused_here(*GPU, "--layer-times", path)
    assert f"--layer-times {path} times layer(s) conv9 that workload cnn lacks" in line


# ------------------------------------------------------------ no warning before a refusal
@pytest.mark.parametrize(
    "args",
    [
        ["predict", "--nodes", "1", "--network", "ib-hdr", "--dataset-samples", "1"],
        ["predict", "--nodes", "1", "--inter-bw", "25GB/s", "--profile", "nonexistent"],
        ["predict", "--nodes", "2", "--network", "ib-hdr", "--inter-bw", "25GB/s",
         "--model", "nonexistent"],
    ],
)  # fmt: skip
def test_a_refused_prediction_prints_no_warning_before_its_error(args):
    """A warning about a flag ("--network changes nothing on one node") was printed before the
    checks ran, so that a refusal was two lines on stderr."""
    refused_here(*args, *FAST)


def test_a_refused_sweep_prints_no_warning_before_its_error(tmp_path):
    out = tmp_path / "sweep"
    refused_here("sweep", "--nodes", "1", "--network", "ib-hdr", "--model", "nonexistent",
             "--out", str(out), *FAST)  # fmt: skip
    refused_here("sweep", "--nodes", "1", "--vary", "network-scale=1,2", "--model", "nonexistent",
             "--out", str(out), *FAST)  # fmt: skip
    assert not out.exists() or not any(out.iterdir())


def test_the_warning_still_comes_once_the_prediction_is_priced():
    result = pdlsim_here("predict", "--nodes", "1", "--network", "ib-hdr", "--model", "mlp",
                         *FAST)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("pdlsim: warning: --network describes the network") == 1


# ------------------------------------------------------------ a bad row, before the first
def test_a_sweep_row_whose_layout_fails_is_refused_before_any_is_simulated(monkeypatch, tmp_path):
    """A pipeline whose stages do not divide a later row's ranks was found only when that row
    was simulated: after minutes of earlier rows, with progress lines before the error."""
    simulated = []
    monkeypatch.setattr(sweep_module, "run_prediction", lambda cfg: simulated.append(cfg))
    out = tmp_path / "sweep"
    line = refused_here("sweep", "--nodes", "4,5", "--gpus", "8", "--parallel", "pipeline",
                    "--stages", "32", "--microbatches", "4", "--model", "resnet50",
                    "--out", str(out), *FAST)  # fmt: skip
    assert "--stages 32 must divide the 40 ranks" in line
    assert simulated == [] and (not out.exists() or not any(out.iterdir()))


def test_a_varied_value_whose_layout_fails_is_refused_before_any_prediction():
    """The layout is checked where the cost model is built: a varied node count whose ranks
    the stages do not divide was found after the values before it were predicted."""
    predicted = []
    base = PredictConfig(nodes=4, gpus=8, parallel="pipeline", stages=32, microbatches=4,
                         model="resnet50", iterations=2, samples=2)  # fmt: skip
    with pytest.raises(UserError, match="--vary nodes=5: --stages 32 must divide the 40 ranks"):
        vary(base, [parse_vary("nodes=8,5")], predict=lambda cfg: predicted.append(cfg))
    assert predicted == []


def test_a_profile_whose_creation_time_is_no_time_is_refused(tmp_path):
    """Every prediction prints the profile's date from it: "x" was printed as the date."""
    path = _profile(tmp_path, lambda d: d.update(created_utc="yesterday"))
    line = refused_here(*CPU, "--model", "mlp", "--profile", path)
    assert 'created_utc: expected an ISO 8601 time like 2026-01-31T12:00:00Z, got "yes' in line


@pytest.mark.parametrize(("flag", "name"), [("--gpu-preset", "h100-sxm"), ("--network", "ib-hdr")])
def test_a_preset_file_missing_a_field_names_its_flag(tmp_path, flag, name):
    """A file that could not be read named its flag; one missing a field named the file only."""
    _, fields = HARDWARE.entry(name)
    fields.pop("source")
    path = _write(tmp_path, "preset.json", fields)
    assert f"{flag} {path}: missing field(s) source" in refused_here(*GPU, flag, path)


# ------------------------------------------------------------ checkpoint flags, at once
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--checkpoint-every", "1" + "0" * 30], "--checkpoint-every: at most 1,000,000,000"),
        (["--checkpoint-every", "0"], "expected a positive number of steps or 'auto'"),
        (["--checkpoint-every", "10", "--checkpoint-bw", "fast"], "--checkpoint-bw: expected a"),
        (["--mtbf", "5000h", "--restart-time", "soon"], "--restart-time: expected a time"),
    ],
)
def test_a_checkpoint_flag_typo_is_refused_before_any_simulating(monkeypatch, flags, message):
    """The checkpoint flags were read after the simulation (a prediction's seconds, a sweep's
    first row), and a steps count of 1e30 was taken."""
    monkeypatch.setattr(core, "band_step_times", lambda *a, **k: pytest.fail("simulated"))
    assert message in refused_here(*CPU, "--model", "mlp", *flags)
    with pytest.raises(UserError, match=message.split(":")[0]):
        build_module.check_config(PredictConfig(nodes=2, **_api(flags)))


def _api(flags: list[str]) -> dict[str, str]:
    """``--checkpoint-every 10`` as ``checkpoint_every="10"``."""
    return {flags[i][2:].replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}


def test_an_unknown_power_preset_is_refused_before_any_simulating(monkeypatch):
    """The power preset was looked up for the energy line, after the simulation."""
    monkeypatch.setattr(core, "band_step_times", lambda *a, **k: pytest.fail("simulated"))
    line = refused_here(*CPU, "--model", "mlp", "--power-preset", "H100-SXM")
    assert "unknown power preset 'H100-SXM'; known: cpu-2s, h100-sxm" in line


# ------------------------------------------------------------ times shorter than any machine's
@pytest.mark.parametrize("flag", ["--inter-lat", "--checkpoint-latency", "--restart-time"])
def test_a_time_flag_of_1e_300_seconds_is_refused(flag):
    """0 s means none; 1e-300 s was taken as a latency, a typo for no machine's figure."""
    extra = ["--mtbf", "5000h"] if flag == "--restart-time" else ["--checkpoint-every", "10"]
    line = refused_here(*CPU, "--model", "mlp", *extra, flag, "1e-300s")
    assert f"{flag}: time '1e-300s' is out of range: give 0 or at least 1e-12 s" in line


def test_a_network_file_or_an_assumption_of_1e_300_seconds_is_refused(tmp_path):
    _, fields = HARDWARE.entry("ib-hdr")
    path = _write(tmp_path, "net.json", {**fields, "latency_s": 1e-300})
    assert "latency_s must be 0 (none) or 1e-12 to" in refused_here(*GPU, "--network", path)
    doc = {"assumptions": {"copy_latency_s": {"low": 1e-300}}}
    line = refused_here("hardware", "list", "--hardware", _write(tmp_path, "hw.json", doc))
    assert "'copy_latency_s' is in seconds: each figure 0 or at least 1e-12 s" in line


def test_layer_times_of_1e_300_seconds_are_refused(tmp_path):
    rows = [{"name": info.name, "forward_s": 1e-3, "backward_s": 2e-3}
            for info in Workload.load("cnn").layers]  # fmt: skip
    rows[0]["forward_s"] = 1e-300
    doc = {"workload": "cnn", "batch": 32, "precision": "fp32", "optimizer": "sgd",
           "device": "cuda:0", "layers": rows, "step_s": 0.04, "update_s": 0.004}  # fmt: skip
    line = refused_here(*GPU, "--layer-times", _write(tmp_path, "lt.json", doc))
    assert "layers[0].forward_s is 1e-300, expected 0 or at least 1e-12 seconds" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inter-bw", "1000TB/s", "--network-scale", "1e6"],
         "--network-scale 1e+06 takes the inter-node bandwidth of 1e+15 B/s to 1e+21 B/s"),
        (["--inter-lat", "1ns", "--latency-scale", "1e-6"],
         "--latency-scale 1e-06 takes the inter-node latency of 1e-09 s to 1e-15 s"),
    ],
)  # fmt: skip
def test_a_what_if_that_scales_a_link_past_any_is_refused_naming_its_flag(args, message):
    """GPU ranks' network was refused mid-prediction as "network 'given': bandwidth ... must
    be 1 to 1e+15", naming a network nobody gave; CPU ranks priced a 1e21 B/s link."""
    assert message in refused_here(*GPU, *args)
    assert message in refused_here(*CPU, "--model", "mlp", *args)


def test_a_profile_whose_text_would_break_the_report_is_refused(tmp_path):
    """The CPU's name is printed in every prediction's sources: a newline or a terminal escape
    in it reached the report."""
    path = _profile(tmp_path, lambda d: d["machine"].update(cpu_model="Xeon\n\x1b[2J"))
    line = refused_here(*CPU, "--model", "mlp", "--profile", path)
    assert "machine.cpu_model: 'Xeon\\n\\x1b[2J' holds the unprintable character '\\n'" in line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(pdlsim_version=5), "pdlsim_version: must be a string or null, got int"),
        (lambda d: d["sources"][0].update(path="run\n1"), "sources[0].path: 'run\\n1' holds the"),
    ],
)
def test_a_profile_whose_metadata_is_of_the_wrong_kind_is_refused(tmp_path, change, message):
    assert message in refused_here(*CPU, "--model", "mlp", "--profile", _profile(tmp_path, change))


def test_a_low_board_power_prices_its_energy(tmp_path):
    """The idle share of a 5 W board (0.5 W) is the model's figure, not a flag to refuse."""
    _, fields = HARDWARE.entry("h100-sxm")
    path = _write(tmp_path, "gpu.json", {**fields, "board_power_w": 5.0})
    result = pdlsim_here(*GPU, "--gpu-preset", path, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["energy"]["power_model"]["gpu_busy_w"] == 5.0
