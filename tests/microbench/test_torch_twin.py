"""The workload's PyTorch twin has the description's parameters and shapes, and the layer timer
times every layer, the loss, the update and the step (on this machine's CPU; a GPU session
runs the same code on CUDA). Skipped where PyTorch is not installed (pip install -e '.[bench]')."""

from __future__ import annotations

import pytest

from microbench.workload import load_workload

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install -e '.[bench]'")

from microbench.layer_times import time_layers  # noqa: E402
from microbench.torch_twin import torch_twin, twin_inputs, twin_loss  # noqa: E402

ALL = ("mlp", "cnn", "rescnn", "transformer", "resnet18", "resnet50", "vgg16", "bert-base",
       "bert-large", "gpt2", "vit-b16")  # fmt: skip


@pytest.mark.parametrize("name", ALL)
def test_the_twin_has_the_descriptions_parameters(name):
    workload = load_workload(name)
    twin = torch_twin(workload, torch)
    assert sum(p.numel() for p in twin.parameters()) == workload.param_count


def test_tied_output_layers_share_the_embeddings_table():
    workload = load_workload("gpt2")
    twin = torch_twin(workload, torch)
    named = dict(zip((info.name for info in twin.body), twin.layers, strict=True))
    assert named["lm_head"].weight is named["wte"].table.weight


@pytest.mark.parametrize("name", ["mlp", "cnn", "rescnn", "transformer", "resnet18"])
def test_the_twin_maps_a_batch_to_the_descriptions_logits(name):
    workload = load_workload(name)
    x, y = twin_inputs(workload, 2, torch)
    logits = torch_twin(workload, torch)(x)
    assert tuple(logits.shape) == (2, *workload.layers[-1].input_shape)
    twin_loss(logits, y, torch).backward()


def test_every_layer_the_loss_the_update_and_the_step_are_timed():
    workload = load_workload("rescnn")
    doc = time_layers(workload, 2, "fp32", "cpu", torch, warmup=1, repeats=2)
    assert [r["name"] for r in doc["layers"]] == [info.name for info in workload.layers]
    for row in doc["layers"]:
        assert len(row["forward_samples"]) == 2 and row["forward_s"] > 0
    first = doc["layers"][0]  # reads the network input: nothing upstream, but it has weights
    assert first["backward_s"] > 0 and len(first["backward_samples"]) == 2
    assert doc["step_s"] > 0 and doc["update_s"] > 0 and len(doc["step_samples"]) == 2
    assert (doc["device"], doc["device_name"], doc["precision"]) == ("cpu", "cpu", "fp32")


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        time_layers(load_workload("mlp"), 2, "fp8", "cpu", torch)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "foo"], "--device foo: expected cpu, cuda or cuda:N"),
        (["--device", "cpu", "--quick"], "--quick is for the CPU microbenchmarks"),
        (["--device", "cpu", "--model", "nope"], "nope"),
    ],
)
def test_bench_layer_times_refuses_bad_input_in_one_line(capsys, argv, message):
    from pdlsim.cli.main import main

    assert main(["bench", "--layer-times", "--batch", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bench_layer_times_writes_one_file_per_model_and_batch(tmp_path, capsys):
    import json

    from pdlsim.cli.main import main

    argv = ["bench", "--layer-times", "--device", "cpu", "--model", "mlp", "--batch", "2,4",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    files = sorted(p.name for p in tmp_path.glob("layer_times-*.json"))
    assert files == ["layer_times-mlp-b2-fp32.json", "layer_times-mlp-b4-fp32.json"]
    doc = json.loads((tmp_path / files[0]).read_text())
    assert doc["batch"] == 2 and doc["machine"]["torch_version"] == torch.__version__
    assert "records:" in capsys.readouterr().out
