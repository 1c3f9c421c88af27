"""The Python API: the command line's numbers, any way of naming a workload, clear errors."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from calibration.profile import load_profile
from microbench.errors import UserError
from microbench.workload import PRESETS, Workload
from pdlsim import api
from pdlsim.cli.main import main
from tests.costmodel.test_model import write_synthetic_profile


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("api") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def _cli_json(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["predict", *args, "--json"]) == 0
    return json.loads(out.getvalue())


def test_predict_gives_what_the_command_line_prints(profile_path):
    cli = _cli_json("--nodes", "4", "--gpus", "2", "--model", "mlp", "--batch", "16",
                    "--profile", profile_path, "--no-overlap")  # fmt: skip
    py = api.predict("mlp", api.Cluster.gpus(4, 2), batch=16, profile=profile_path, overlap=False)
    assert _json(py) == cli


def test_cpu_cluster_with_threads_matches_the_command_line(profile_path):
    cli = _cli_json("--nodes", "2", "--procs-per-node", "2", "--threads", "2",
                    "--model", "cnn", "--profile", profile_path)  # fmt: skip
    py = api.predict("cnn", api.Cluster.cpus(2, 2, threads=2), profile=profile_path)
    assert _json(py) == cli


@pytest.mark.parametrize("how", ["preset", "dict", "file", "workload"])
def test_a_workload_named_any_way_prices_the_same(how, profile_path, tmp_path):
    doc = PRESETS["mlp"]
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(doc))
    spec = {"preset": "mlp", "dict": doc, "file": path, "workload": Workload.load("mlp")}[how]
    ref = api.predict("mlp", profile=profile_path)
    got = api.predict(spec, profile=profile_path)
    assert got["step_time_s"] == ref["step_time_s"]
    assert got["band"] == ref["band"]
    assert json.loads(json.dumps(got))["config"]["model"] in ("mlp", str(path))


def test_a_loaded_profile_prices_as_its_file_does(profile_path):
    by_path = api.predict("cnn", api.Cluster.gpus(2, 4), profile=profile_path)
    by_object = api.predict("cnn", api.Cluster.gpus(2, 4), profile=load_profile(profile_path))
    assert by_object["step_time_s"] == by_path["step_time_s"]
    assert by_object["provenance"]["profile"].startswith("given")


def test_sweep_rows_are_single_predictions(profile_path):
    table = api.sweep("mlp", nodes=[1, 4], per_node=[2], batches=[8, 32], gpus=True,
                      profile=profile_path, samples=5)  # fmt: skip
    assert len(table) == 4
    pairs = list(table[["nodes", "batch"]].itertuples(index=False, name=None))
    assert pairs == [(1, 8), (1, 32), (4, 8), (4, 32)]
    row = table.iloc[3]
    one = api.predict("mlp", api.Cluster.gpus(4, 2), batch=32, profile=profile_path, samples=5)
    assert row["step_time_s"] == one["step_time_s"]
    assert row["p90_s"] == one["band"]["p90_s"]


def test_unknown_option_names_the_valid_ones(profile_path):
    with pytest.raises(TypeError, match="unknown option.*bucket_size.*bucket_mb"):
        api.predict("mlp", profile=profile_path, bucket_size=4)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda p: api.predict(42, profile=p), "preset name, a file path or a dict, got int"),
        (lambda p: api.predict({"layers": []}, profile=p), "workload dict"),
        (lambda p: api.predict("no-such-net", profile=p), "no workload preset or file"),
        (lambda p: api.predict("mlp", batch=0, profile=p), "--batch must be positive"),
        (lambda p: api.sweep("mlp", nodes=[], profile=p), "nodes must be a non-empty list"),
        (lambda p: api.sweep("mlp", batches=[0], profile=p), "batches must be a non-empty"),
    ],
)
def test_bad_input_raises_the_command_lines_one_line_error(call, match, profile_path):
    with pytest.raises(UserError, match=match) as info:
        call(profile_path)
    assert "\n" not in str(info.value)


def test_cluster_must_be_a_cluster(profile_path):
    with pytest.raises(TypeError, match="pdlsim.Cluster"):
        api.predict("mlp", (4, 2), profile=profile_path)


def test_import_pdlsim_gives_the_api_without_loading_numpy_first():
    import pdlsim

    assert pdlsim.predict is api.predict and pdlsim.sweep is api.sweep
    assert pdlsim.Workload is Workload and pdlsim.load_profile is load_profile
    assert set(pdlsim.__all__) <= set(dir(pdlsim))
    with pytest.raises(AttributeError, match="no attribute 'predikt'"):
        pdlsim.predikt  # noqa: B018
    code = (
        "import sys, pdlsim; light = 'numpy' not in sys.modules; "
        "from pdlsim import Cluster, Workload, load_profile, predict, sweep; "
        "print(light, callable(predict), Cluster.gpus(2, 4).ranks)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["True", "True", "8"], run.stderr


def test_collective_answers_as_the_command_does(capsys):
    doc = api.collective("reduce-scatter", [2**20, 2**28], nodes=2, node="dgx-a100", gpus=4)
    assert main(["collective", "reduce-scatter", "--nodes", "2", "--node", "dgx-a100",
                 "--gpus", "4", "-b", "1M", "-e", "256M", "-f", "256", "--json"]) == 0  # fmt: skip
    assert doc == json.loads(capsys.readouterr().out)
    with pytest.raises(UserError, match="unknown collective 'alltoall'"):
        api.collective("alltoall", 2**20, nodes=2)
