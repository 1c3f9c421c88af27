"""Hardware presets and assumptions as data: the packaged file, a user's overlay, its errors,
and the band drawing each assumption in its range."""

from __future__ import annotations

import json

import pytest

from microbench.errors import UserError
from pdlsim import api
from pdlsim.cli.main import main
from pdlsim.costmodel.presets import (
    ASSUMPTIONS,
    GPU_PRESETS,
    NETWORK_PRESETS,
    PACKAGED,
    load_hardware,
)
from tests.costmodel.test_model import write_synthetic_profile


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("presets") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _file(tmp_path, doc) -> str:
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_packaged_file_holds_the_data_sheets_and_ranged_assumptions():
    doc = json.loads(PACKAGED.read_text())
    assert set(doc["gpus"]) == set(GPU_PRESETS) and set(doc["networks"]) == set(NETWORK_PRESETS)
    h100 = GPU_PRESETS["h100-sxm"]
    assert (h100.fp32_flops_per_s, h100.memory_bytes) == (67e12, 80 * 10**9)
    assert NETWORK_PRESETS["ib-hdr"].bandwidth_bytes_per_s == 200e9 / 8
    for a in ASSUMPTIONS.values():
        assert a.low < a.value < a.high and a.unit and a.basis


def test_a_users_file_adds_a_gpu_and_moves_an_assumption(tmp_path):
    doc = {
        "gpus": {"my-gpu": {**json.loads(PACKAGED.read_text())["gpus"]["v100"], "source": "mine"}},
        "assumptions": {"gpu_flops_efficiency": {"value": 0.6}},
    }
    hw = load_hardware(_file(tmp_path, doc))
    assert hw.gpu("my-gpu").source == "mine" and hw.gpu("v100") == GPU_PRESETS["v100"]
    moved = hw.assumptions["gpu_flops_efficiency"]
    assert moved.value == 0.6 and moved.low == ASSUMPTIONS["gpu_flops_efficiency"].low


def test_an_assumption_keeps_the_unit_the_model_reads_it_in(tmp_path):
    """The unit is what the model reads the figure as: a file that renames it (to slip an
    efficiency of 2 past the check of a fraction) is refused; the same unit is accepted."""
    unit = ASSUMPTIONS["gpu_flops_efficiency"].unit
    renamed = {"value": 2, "low": 1, "high": 3, "unit": "ratio"}
    with pytest.raises(UserError, match=f"reads this figure as '{unit}', got 'ratio'"):
        load_hardware(_file(tmp_path, {"assumptions": {"gpu_flops_efficiency": renamed}}))
    same = {"value": 0.5, "low": 0.4, "high": 0.6, "unit": unit}
    hw = load_hardware(_file(tmp_path, {"assumptions": {"gpu_flops_efficiency": same}}))
    assert hw.assumptions["gpu_flops_efficiency"].value == 0.5


def test_an_assumption_prices_what_rests_on_it(tmp_path, profile_path):
    """Compute-bound GPU layers from a data sheet take FLOPs / (peak x efficiency): halving the
    efficiency doubles the compute beyond the launch."""
    cluster = api.Cluster.gpus(1, 1)
    base = api.predict("cnn", cluster, batch=4096, profile=profile_path, gpu_preset="v100")
    doc = {"assumptions": {"gpu_flops_efficiency": {"value": 0.25, "low": 0.2}}}
    slow = api.predict("cnn", cluster, batch=4096, profile=profile_path, gpu_preset="v100",
                       hardware=_file(tmp_path, doc))  # fmt: skip
    ratio = slow["breakdown"]["compute_s"] / base["breakdown"]["compute_s"]
    assert 1.5 < ratio <= 2.0
    assert slow["provenance"]["hardware"].endswith("hw.json")


def test_the_band_widens_with_the_assumptions_range(tmp_path, profile_path):
    pinned = {
        name: {"low": a.value, "high": a.value} for name, a in ASSUMPTIONS.items()
    }  # every assumption taken as certain
    cluster = api.Cluster.gpus(4, 4)
    wide = api.predict("cnn", cluster, profile=profile_path)["band"]
    sure = api.predict("cnn", cluster, profile=profile_path,
                       hardware=_file(tmp_path, {"assumptions": pinned}))["band"]  # fmt: skip
    assert wide["p90_s"] - wide["p10_s"] > 2 * (sure["p90_s"] - sure["p10_s"])


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"gpu": {}}, r"unknown key\(s\) gpu; allowed"),
        ({"assumptions": {"gpu_magic": {"value": 1}}}, "assumptions.gpu_magic: no such"),
        ({"assumptions": {"copy_latency_s": {"value": "x"}}}, r"latency_s.value: expected a num"),
        ({"assumptions": {"pinned_efficiency": {"value": 2.0}}}, "need low <= value <= high"),
        ({"assumptions": {"network_efficiency": {"value": 2.0, "low": 1.0, "high": 3.0}}},
         r"is a fraction of a NIC's line rate: need 0.001 <= low and high <= 1, got 1.0..3.0"),
        ({"assumptions": {"nccl_overlap_efficiency": {"low": 0.0}}}, "need 0.001 <= low"),
        ({"assumptions": {"network_efficiency": {"low": 1e-300}}}, "need 0.001 <= low"),
        ({"assumptions": {"copy_latency_s": {"low": -1e-6}}}, r"\(s\) cannot be negative"),
        ({"networks": {"x": {"latency_s": 1e-6}}}, r"networks.x: missing field\(s\) bandwidth"),
        ({"gpus": {"g": {"memory_bytes": 1.5}}}, "gpus.g: missing field"),
        ({"networks": []}, "'networks' must be an object"),
        ([], "expected a JSON object"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line_naming_file_and_field(doc, match, tmp_path):
    with pytest.raises(UserError, match=match) as info:
        load_hardware(_file(tmp_path, doc))
    assert "hw.json" in str(info.value) and "\n" not in str(info.value)


def test_command_line_refuses_a_bad_hardware_file_with_status_2(tmp_path, capsys, profile_path):
    path = tmp_path / "hw.json"
    path.write_text("{not json")
    assert main(["predict", "--nodes", "2", "--gpus", "2", "--profile", profile_path,
                 "--hardware", str(path)]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid JSON" in err[0] and "hw.json" in err[0]
    missing = str(tmp_path / "none.json")
    assert main(["predict", "--nodes", "2", "--hardware", missing, "--profile", profile_path]) == 2
    assert "no such file" in capsys.readouterr().err


def test_every_node_names_a_packaged_gpu_and_network():
    hw = load_hardware()
    assert {"dgx-v100", "dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "mi300x-8"} <= set(hw.nodes)
    assert any(n.fabric == "pcie" and n.nics == 1 for n in hw.nodes.values())
    for node in hw.nodes.values():
        assert hw.gpu(node.gpu) and hw.network(node.network) and node.source
    for gpu in ("v100-16gb", "a100-sxm-40gb", "h100-pcie", "h200", "b200", "mi300x", "l40s"):
        assert hw.gpu(gpu).fp32_flops_per_s > 0 and hw.gpu(gpu).memory_bytes > 0


def test_the_driver_names_of_a_gpu_find_the_node_that_holds_it():
    hw = load_hardware()
    names = [name for gpu in hw.gpus.values() for name in gpu.device_names]
    assert all(gpu.device_names for gpu in hw.gpus.values())
    assert len(names) == len({name.casefold() for name in names})  # one part per name
    assert hw.node_for_device("NVIDIA H200") == "hgx-h200"
    assert hw.node_for_device(" nvidia h100 80gb hbm3 ") == "dgx-h100"  # the default first
    assert hw.node_for_device("Tesla V100-SXM2-16GB") is None  # no node holds the 16 GB part
    assert hw.node_for_device("Tesla V100-SXM2-32GB") == "dgx-v100"
    assert hw.node_for_device("NVIDIA GeForce RTX 4090") is None


def test_gpu_ranks_default_to_the_node_of_the_gpu_the_profile_measured():
    """The packaged H200 host's profile puts GPU ranks on H200 nodes unless --node says
    otherwise; a profile of a CPU machine keeps dgx-h100."""
    h200 = api.predict("cnn", api.Cluster.gpus(2, 8), profile="h200-16core")
    assert h200["provenance"]["node"].startswith("hgx-h200 (")
    assert h200["provenance"]["node"].endswith("; the node of the profile's NVIDIA H200)")
    assert h200["provenance"]["gpu_preset"].startswith("h200 ")
    asked = api.predict("cnn", api.Cluster.gpus(2, 8), profile="h200-16core", node="dgx-h100")
    assert asked["provenance"]["node"].startswith("dgx-h100 (")
    assert asked["provenance"]["gpu_preset"].startswith("h100-sxm ")
    cpu_machine = api.predict("cnn", api.Cluster.gpus(2, 8), profile="xeon-2core")
    assert cpu_machine["provenance"]["node"].startswith("dgx-h100 (")


def test_a_preset_shown_as_a_file_reads_back_as_the_same_preset(tmp_path, capsys):
    assert main(["hardware", "show", "dgx-a100"]) == 0
    path = tmp_path / "mine.json"
    path.write_text(capsys.readouterr().out)
    hw = load_hardware()
    mine = hw.resolve("node", str(path))
    assert mine.kind == f"file {path}"
    assert {**mine.__dict__, "kind": ""} == {**hw.node("dgx-a100").__dict__, "kind": ""}
    assert hw.resolve("gpu", "v100") == GPU_PRESETS["v100"]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"fabric": "warp"}, "unknown fabric 'warp'; known: nvlink, xgmi, pcie"),
        ({"gpu": "tpu"}, "unknown GPU preset 'tpu'"),
        ({"nvls": "yes"}, "nvls: expected true or false"),
        ({"nics": 0}, "need gpus_per_node in 1..64, nics in 1..256"),
        ({"gpus_per_node": 10**15}, "need gpus_per_node in 1..64"),
        ({"fabric": "pcie", "nvls": True}, "nvls .NVLink SHARP. needs the nvlink fabric"),
        ({"colour": "green"}, r"unknown field\(s\) colour"),
    ],
)
def test_a_bad_node_file_is_one_line_naming_what_is_wrong(change, match, tmp_path):
    _assert_one_line_refusal("node", "dgx-h100", change, match, tmp_path)


def _assert_one_line_refusal(kind, preset, change, match, tmp_path):
    """The preset ``preset`` written to a file with ``change``, read back as a ``kind``."""
    _, fields = load_hardware().entry(preset)
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({**fields, **change}))
    with pytest.raises(UserError, match=match) as info:
        load_hardware().resolve(kind, str(path))
    assert "\n" not in str(info.value) and path.name in str(info.value)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"fp32_flops_per_s": -1}, "fp32_flops_per_s must be above 0, got -1"),
        ({"hbm_bandwidth_bytes_per_s": 0}, "hbm_bandwidth_bytes_per_s must be above 0"),
        ({"memory_bytes": -5}, "memory_bytes must be above 0"),
        ({"tf32_tensor_flops_per_s": -2e12}, r"tf32_tensor_flops_per_s must be 0 \(none\) or"),
        ({"board_power_w": -300}, r"board_power_w must be 0 \(none\) or above"),
        ({"board_power_w": 1e-300}, r"board_power_w must be 0 \(none\) or 1 to 100000"),
        ({"board_power_w": "lots"}, "board_power_w: expected a number"),
        ({"device_names": "NVIDIA H100"}, "device_names: expected a list of strings"),
        ({"device_names": ["NVIDIA H100", 100]}, "device_names: expected a list of strings"),
    ],
)
def test_a_bad_gpu_file_is_one_line_naming_the_field(change, match, tmp_path):
    _assert_one_line_refusal("gpu", "h100-sxm", change, match, tmp_path)


@pytest.mark.parametrize("kind", ["gpu", "node", "network"])
def test_a_directory_for_a_hardware_file_is_one_line(kind, tmp_path):
    with pytest.raises(UserError, match=f"{tmp_path}: a directory; give a {kind} preset's name"):
        load_hardware().resolve(kind, str(tmp_path))


def test_gpu_ranks_run_their_collectives_as_nccl_on_the_node(profile_path):
    out = api.predict("cnn", api.Cluster.gpus(2, 8), profile=profile_path, node="dgx-a100")
    assert out["provenance"]["node"].startswith("dgx-a100")
    assert all(b["algorithm"].startswith("nccl ") for b in out["buckets"])
    cpu = api.predict("cnn", api.Cluster.cpus(2, 2), profile=profile_path)
    assert not any(b["algorithm"].startswith("nccl") for b in cpu["buckets"])


def test_more_gpus_than_the_node_holds_is_refused(profile_path, capsys):
    assert main(["predict", "--nodes", "2", "--gpus", "9", "--profile", profile_path]) == 2
    err = capsys.readouterr().err
    assert "node 'dgx-h100' holds 8 GPUs" in err and err.count("\n") == 1
    assert main(["predict", "--nodes", "2", "--node", "dgx-a100", "--profile", profile_path]) == 2
    assert "--node describes GPU ranks" in capsys.readouterr().err


def test_gpu_ranks_take_nccls_algorithms_only(profile_path, capsys):
    base = ["predict", "--nodes", "4", "--gpus", "8", "--profile", profile_path]
    assert main([*base, "--algorithm", "rabenseifner"]) == 2
    assert "GPU ranks run NCCL's: ring, tree, nvls, nvls_tree" in capsys.readouterr().err
    assert main([*base, "--algorithm", "tree", "--json"]) == 0
    buckets = json.loads(capsys.readouterr().out)["buckets"]
    assert {b["algorithm"].split("/")[0] for b in buckets} == {"nccl tree"}


def test_gpu_ranks_send_and_gather_over_their_nodes_fabric(profile_path):
    """A node without NVLink (L40S on PCIe): point-to-point messages take a GPU's PCIe port at
    the PCIe efficiency, allgathers (tensor parallelism, top-k) are NCCL's."""
    from pdlsim.prediction.build import build
    from pdlsim.prediction.config import PredictConfig
    from pdlsim.sim import Placement

    cfg = PredictConfig(nodes=2, gpus=2, node="pcie-l40s", model="mlp", profile=profile_path)
    _, _, cost, _, _ = build(cfg)
    intra = cost.links(1e6)["intra"]
    assert intra.bandwidth_bytes_per_s == pytest.approx(
        32e9 * ASSUMPTIONS["pcie_ring_efficiency"].value
    )
    name, steps = cost.native_allgather(1 << 20, Placement(2, 2))
    assert name.startswith("nccl ring/") and len(steps) == 1
    out = api.predict("mlp", api.Cluster.gpus(2, 2), profile=profile_path, node="pcie-l40s",
                      parallel="model", samples=2, iterations=5)  # fmt: skip
    assert out["step_time_s"] > 0


def test_a_users_hardware_file_adds_a_node_that_collective_takes(tmp_path, capsys):
    _, node = load_hardware().entry("dgx-a100")
    node.pop("name")
    doc = {"nodes": {"my-a100x4": {**node, "gpus_per_node": 4, "nics": 2, "source": "mine"}}}
    path = _file(tmp_path, doc)
    assert load_hardware(path).node("my-a100x4").gpus_per_node == 4
    argv = ["collective", "allreduce", "--node", "my-a100x4", "--hardware", path, "--nodes", "2",
            "--size", "1G", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ranks"], out["nics_per_node"]) == (8, 2)
    bad = _file(tmp_path, {"nodes": {"x": {**node, "gpu": "tpu-v9"}}})
    with pytest.raises(UserError, match="nodes.x names GPU 'tpu-v9'"):
        load_hardware(bad)


def test_the_report_names_the_algorithms_that_carried_the_gradients(profile_path, capsys):
    argv = ["predict", "--nodes", "2", "--gpus", "8", "--node", "dgx-a100", "--algorithm", "ring",
            "--profile", profile_path, "--samples", "2", "--iterations", "3"]  # fmt: skip
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("gradients"))
    assert "bucket(s)" in line and "nccl ring/" in line
    cpu = ["predict", "--nodes", "2", "--procs-per-node", "2", "--profile", profile_path,
           "--samples", "2", "--iterations", "3"]  # fmt: skip
    assert main(cpu) == 0
    assert "two_level" in capsys.readouterr().out
