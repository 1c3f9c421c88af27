"""The workload language's graphs and new layer kinds, and the zoo pinned to published figures."""

import json
import math

import numpy as np
import pytest

from microbench.kernels.calls import step_calls
from microbench.nn import Network
from microbench.workload import ZOO, Workload, WorkloadError, load_workload
from pdlsim.prediction.memory import activation_bytes_per_sample
from tests.conftest import pdlsim_here, run_pdlsim

# Parameter counts as published by the reference implementations (torchvision; Hugging Face
# BertForMaskedLM of bert-base-uncased and bert-large-uncased; GPT-2 small with its output
# layer tied).
PUBLISHED_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "bert-base": 109_514_298,
    "bert-large": 335_174_458,
    "gpt2": 124_439_808,
    "vit-b16": 86_567_656,
}
# torchvision's published GFLOPS per image (multiply-adds of convolutions, dense layers and
# attention's products, at 224 x 224).
PUBLISHED_GMACS = {"resnet18": 1.814, "resnet50": 4.089, "vgg16": 15.470, "vit-b16": 17.564}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_zoo_networks_have_their_published_parameter_counts(name):
    workload = load_workload(name)
    assert workload.param_count == PUBLISHED_PARAMS[name]
    assert workload.gradient_bytes == 4 * PUBLISHED_PARAMS[name]
    assert set(ZOO) == set(PUBLISHED_PARAMS)


def _macs(workload: Workload) -> float:
    """Multiply-adds of the convolutions, dense layers and attention's products per sample."""
    total = 0
    for info in workload.layers:
        if info.kind in ("dense", "conv2d"):
            bias = math.prod(info.output_shape) if info.bias_count else 0
            total += (info.forward_flops_per_sample - bias) // 2
        elif info.kind == "attention":
            t, d = info.input_shape
            total += 4 * t * d * d + 2 * t * t * d
    return total


@pytest.mark.parametrize("name", sorted(PUBLISHED_GMACS))
def test_zoo_networks_have_their_published_multiply_adds(name):
    assert _macs(load_workload(name)) / 1e9 == pytest.approx(PUBLISHED_GMACS[name], abs=0.0006)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_zoo_descriptions_round_trip_through_json(tmp_path, name):
    workload = load_workload(name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(workload.to_dict()))
    assert load_workload(path) == workload
    assert workload.description and f"{PUBLISHED_PARAMS[name]:,}" in workload.description


def test_attention_keeps_its_probabilities_for_backward():
    gpt2 = load_workload("gpt2")
    attn = next(info for info in gpt2.layers if info.kind == "attention")
    t, d, h = 1024, 768, 12
    assert attn.output_shape == (t, d)
    assert attn.param_count == 4 * d * d + 4 * d
    assert attn.activation_bytes_per_sample == 4 * (t * d + 4 * t * d + h * t * t)
    causal = [info.layer.get("causal") for info in gpt2.layers if info.kind == "attention"]
    assert all(causal) and len(causal) == 12
    # the output layer shares the token embedding's table: no parameters of its own
    head = gpt2.layers[-2]
    assert head.kind == "dense" and head.param_count == 0 and head.tied_to == 0
    assert head.forward_flops_per_sample == 2 * t * d * 50257


def _doc(layers, input_shape=(3, 8, 8)):
    return {"name": "g", "input_shape": list(input_shape), "layers": layers}


_RESIDUAL = [
    {"kind": "conv2d", "name": "a", "filters": 4, "kernel": 3, "padding": 1},
    {"kind": "batchnorm2d", "name": "bn"},
    {"kind": "relu", "name": "r"},
    {"kind": "conv2d", "name": "b", "filters": 4, "kernel": 3, "padding": 1, "bias": False},
    {"kind": "add", "name": "skip", "inputs": ["r", "b"]},
    {"kind": "global_avgpool", "name": "gap"},
    {"kind": "dense", "name": "fc", "units": 3},
    {"kind": "softmax_cross_entropy", "name": "loss"},
]


def test_a_residual_graph_chains_its_shapes_and_gradients():
    w = Workload.from_dict(_doc(_RESIDUAL))
    by = {info.name: info for info in w.layers}
    assert by["skip"].inputs == (2, 3) and by["skip"].input_shapes == ((4, 8, 8), (4, 8, 8))
    assert by["skip"].input_bytes_per_sample == 2 * 4 * 64 * 4
    assert by["skip"].forward_flops_per_sample == 4 * 64  # one add per value
    assert not by["a"].needs_input_grad and by["b"].needs_input_grad
    assert by["bn"].param_count == 8 and by["b"].param_count == 4 * 4 * 9  # no bias
    assert by["gap"].output_shape == (4,)
    assert not w.is_chain
    assert Workload.from_dict(w.to_dict()) == w
    assert w.to_dict()["layers"][4]["inputs"] == ["r", "b"]
    assert "inputs" not in w.to_dict()["layers"][1]  # a chain's link is left implicit


def _replace(i, **changes):
    layers = json.loads(json.dumps(_RESIDUAL))
    layers[i].update(changes)
    return layers


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        (
            _replace(4, inputs=["r", "nowhere"]),
            r"layer 4 \(skip\): reads 'nowhere', which is no layer above",
        ),
        (_replace(4, inputs=["r", "loss"]), "reads 'loss', which is no layer above"),
        (_replace(4, inputs=["r", "a"]), "layer b is read by no later layer"),
        (_replace(4, inputs=["r"]), "add takes two or more inputs, got 1"),
        (_replace(2, inputs=["a", "bn"]), "relu takes one input, got 2"),
        (_replace(3, name="a"), "the name a is taken by layer 0"),
        (_replace(3, stride=2), r"add needs inputs of one shape, got \[4, 8, 8\], \[4, 4, 4\]"),
        (_replace(4, kind="concat"), None),
        (_replace(4, inputs=["bn", "b"]), None),
        (_replace(1, kind="layernorm"), "layernorm needs a flat input, got \\[4, 8, 8\\]"),
        (_replace(6, units=3, bias="no"), "'bias' must be true or false"),
        (_replace(6, tied_to="a"), "tied_to names 'a', which is no embedding above it"),
    ],
)
def test_graphs_that_do_not_chain_get_one_line_errors(layers, message):
    if message is None:  # a valid variation, to show the errors are about what they say
        Workload.from_dict(_doc(layers))
        return
    with pytest.raises(WorkloadError, match=message) as info:
        Workload.from_dict(_doc(layers))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("layers", "input_shape", "message"),
    [
        ([{"kind": "embedding", "vocab": 10, "dim": 8, "positions": 4},
          {"kind": "dense", "units": 10}, {"kind": "token_cross_entropy"}],
         (6,), "6 tokens need at least 6 positions, got 4"),
        ([{"kind": "dense", "units": 8}, {"kind": "attention", "heads": 3},
          {"kind": "token_cross_entropy"}], (4, 8), "8 features do not split over 3 heads"),
        ([{"kind": "dense", "units": 8}, {"kind": "embedding", "vocab": 4, "dim": 2},
          {"kind": "softmax_cross_entropy"}], (4,), "embedding reads the token ids"),
        ([{"kind": "embedding", "vocab": 10, "dim": 8, "name": "e"},
          {"kind": "dense", "units": 9, "tied_to": "e"}, {"kind": "token_cross_entropy"}],
         (6,), r"tied to e \(10 x 8\), so units must be 10, got 9"),
        ([{"kind": "dense", "units": 8}, {"kind": "dropout", "rate": 1.5},
          {"kind": "softmax_cross_entropy"}], (4,), r"'rate' must be a number in \[0, 1\)"),
        ([{"kind": "dense", "units": 8}, {"kind": "token_pool", "mode": "max"},
          {"kind": "softmax_cross_entropy"}], (4, 8), "'mode' must be one of first, mean"),
        ([{"kind": "dense", "units": 8}, {"kind": "softmax_cross_entropy"}], (4, 8),
         "softmax_cross_entropy needs flat logits"),
    ],
)  # fmt: skip
def test_token_layers_check_their_shapes_and_settings(layers, input_shape, message):
    with pytest.raises(WorkloadError, match=message):
        Workload.from_dict(_doc(layers, input_shape))


def test_the_cpu_model_prices_every_zoo_network_and_the_network_builds_it():
    vit = {c.kernel for c in step_calls(load_workload("vit-b16"), 2, 1)}  # patches as tokens
    assert vit >= {"copy_runs", "bias_act", "column_sum", "attention", "im2col"}
    gpt2 = {c.kernel for c in step_calls(load_workload("gpt2"), 1, 1)}  # a tied output layer
    assert gpt2 >= {"embedding", "attention", "gemm_nt", "embedding_backward"}
    resnet = load_workload("resnet18")  # batchnorm, convolutions without bias, a padded pool
    kernels = {c.kernel for c in step_calls(resnet, 2, 1)}
    assert kernels >= {"batchnorm", "batchnorm_backward", "maxpool", "im2col", "copy"}
    assert {c.kernel for c in step_calls(load_workload("vgg16"), 2, 1)} >= {"im2col", "gemm_nn"}
    net = Network(resnet)  # the numpy network runs every kind
    assert net.params.size == PUBLISHED_PARAMS["resnet18"] and np.isfinite(net.params).all()
    assert net.state.size == 2 * sum(i.output_shape[0] for i in resnet.layers
                                     if i.kind == "batchnorm2d")  # fmt: skip


def test_workload_list_names_every_preset_and_zoo_network_with_its_size():
    done = pdlsim_here("workload", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"mlp", "cnn", "rescnn", "transformer", *PUBLISHED_PARAMS}
    assert all(rows[n]["params"] == p for n, p in PUBLISHED_PARAMS.items())
    text = pdlsim_here("workload", "list").stdout
    assert "gpt2" in text and "124,439,808" in text


def test_a_zoo_network_written_out_by_show_is_a_workload_file(tmp_path):
    done = pdlsim_here("workload", "show", "resnet50", "--json")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(json.loads(done.stdout)["workload"]))
    assert load_workload(path) == load_workload("resnet50")
    table = pdlsim_here("workload", "show", str(path)).stdout
    assert "reads" in table.splitlines()[1] and "layer1.0.c.bn,layer1.0.down.bn" in table


def test_what_cannot_train_is_refused_before_any_work_and_predicts_on_gpus(tmp_path):
    argv = ("train", "--model", "resnet18", "--parallel", "model", "--out", str(tmp_path / "t"))
    done = run_pdlsim(*argv)
    assert done.returncode == 2, done.stderr
    assert "does not handle batchnorm2d" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # refused before its first folder
    done = pdlsim_here("predict", "--nodes", "2", "--gpus", "8", "--model", "gpt2", "--batch",
                       "4", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    gpt2 = load_workload("gpt2")
    saved = activation_bytes_per_sample(gpt2, "gpu")  # what autograd keeps on GPU ranks
    assert out["memory_breakdown_bytes"]["activations"] == 4 * saved


def test_the_trained_graph_presets_have_their_hand_counted_parameters():
    """rescnn: 3x3 convolutions 3->16 (448), 16->16 twice (2,320 each), 16->32 (4,640),
    32->32 twice (9,248 each), the classifier 32->10 (330): 28,554. transformer: tables
    (512 + 32) x 64 (34,816); per block two layernorms (128 each), attention 4 x 64^2 + 4 x 64
    (16,640), the MLP 64->256->64 (16,640 + 16,448); the last layernorm (128) and the head
    64->10 (650): 135,562."""
    assert load_workload("rescnn").param_count == 28_554
    assert load_workload("transformer").param_count == 135_562
    assert not load_workload("rescnn").is_chain and load_workload("transformer").vocabulary == 512


def test_a_token_network_at_another_sequence_length_keeps_its_weights():
    """BERT at 128 tokens: the same parameters; dense FLOPs scale with the tokens, attention's
    products with their square; past its position table, or on images, one-line refusals."""
    full, short = load_workload("bert-large"), load_workload("bert-large").with_tokens(128)
    assert short.param_count == full.param_count and short.input_shape == (128,)
    dense = [i for i in full.layers if i.kind == "dense"][0]
    same = [i for i in short.layers if i.name == dense.name][0]
    assert dense.forward_flops_per_sample == 4 * same.forward_flops_per_sample
    attention = [i for i in full.layers if i.kind == "attention"][0]
    scores = [i for i in short.layers if i.name == attention.name][0]
    assert 4 < attention.forward_flops_per_sample / scores.forward_flops_per_sample < 16
    with pytest.raises(WorkloadError, match="1024 tokens need at least 1024 positions, got 512"):
        full.with_tokens(1024)
    with pytest.raises(WorkloadError, match=r"reads \[3, 224, 224\], not token ids"):
        load_workload("resnet50").with_tokens(128)


def test_predict_takes_a_token_count():
    args = ("predict", "--nodes", "1", "--gpus", "1", "--model", "bert-base", "--batch", "8",
            "--json", "--dataset-samples", "1000")  # fmt: skip
    full, short = pdlsim_here(*args), pdlsim_here(*args, "--tokens", "128")
    assert full.returncode == short.returncode == 0, short.stderr
    assert json.loads(short.stdout)["config"]["tokens"] == 128
    assert json.loads(short.stdout)["step_time_s"] < json.loads(full.stdout)["step_time_s"] / 3
    bad = pdlsim_here("predict", "--nodes", "1", "--model", "cnn", "--tokens", "16")
    assert bad.returncode == 2 and "not token ids" in bad.stderr
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_workload_show_takes_a_token_count():
    out = pdlsim_here("workload", "show", "bert-large", "--tokens", "128", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["workload"]["input_shape"] == [128]
    assert doc["layers"][0]["output_shape"] == [128, 1024]


def test_a_sweeps_rows_say_their_token_count_and_accumulation():
    from pdlsim import api

    frame = api.sweep("gpt2", nodes=[1, 2], per_node=[8], gpus=True, batches=[2], tokens=128,
                      grad_accum=2)  # fmt: skip
    assert list(frame["tokens"]) == [128, 128] and list(frame["grad_accum"]) == [2, 2]
