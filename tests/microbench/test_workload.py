import json

import pytest

from microbench.workload import (
    PRESETS,
    Workload,
    WorkloadError,
    load_workload,
)


def test_mlp_parameter_counts_match_the_published_figures():
    mlp = load_workload("mlp")
    assert [info.param_count for info in mlp.parametric_layers] == [200_960, 32_896, 1_290]
    assert mlp.param_count == 235_146
    assert mlp.gradient_bytes == 4 * 235_146
    assert mlp.num_classes == 10


def test_cnn_parameter_counts_and_shapes():
    cnn = load_workload("cnn")
    assert [info.param_count for info in cnn.parametric_layers] == [896, 18_496, 1_048_832, 2_570]
    assert cnn.param_count == 1_070_794
    shapes = [info.output_shape for info in cnn.layers]
    assert shapes[:7] == [
        (32, 32, 32),
        (32, 32, 32),
        (32, 16, 16),
        (64, 16, 16),
        (64, 16, 16),
        (64, 8, 8),
        (4096,),
    ]
    assert shapes[-1] == (10,)


def test_dense_flops_count_multiply_adds_twice_and_skip_the_data_gradient():
    mlp = load_workload("mlp")
    first, second = mlp.layers[0], mlp.layers[2]
    assert first.forward_flops_per_sample == 2 * 784 * 256 + 256
    # The first layer's input is data: no input gradient, so backward = dW + db only.
    assert not first.needs_input_grad
    assert first.backward_flops_per_sample == 2 * 784 * 256 + 256
    assert second.needs_input_grad
    assert second.backward_flops_per_sample == 4 * 256 * 128 + 128


def test_conv_flops_and_bytes():
    cnn = load_workload("cnn")
    conv2 = cnn.layers[3]
    macs = 32 * 9 * 64 * 16 * 16
    assert conv2.forward_flops_per_sample == 2 * macs + 64 * 16 * 16
    assert conv2.backward_flops_per_sample == 4 * macs + 64 * 16 * 16
    assert conv2.activation_bytes_per_sample == 64 * 16 * 16 * 4
    assert conv2.input_bytes_per_sample == 32 * 16 * 16 * 4
    assert conv2.gradient_bytes == 18_496 * 4


def test_strided_conv_and_pool_shapes():
    doc = {
        "input_shape": [1, 11, 11],
        "layers": [
            {"kind": "conv2d", "filters": 4, "kernel": 3, "stride": 2},
            {"kind": "maxpool2d", "size": 3, "stride": 2},
            {"kind": "flatten"},
            {"kind": "dense", "units": 3},
            {"kind": "softmax_cross_entropy"},
        ],
    }
    w = Workload.from_dict(doc)
    assert w.layers[0].output_shape == (4, 5, 5)
    assert w.layers[1].output_shape == (4, 2, 2)
    assert w.layers[2].output_shape == (16,)
    assert w.num_classes == 3


def test_round_trip_through_json(tmp_path):
    cnn = load_workload("cnn")
    path = tmp_path / "cnn.json"
    path.write_text(json.dumps(cnn.to_dict()))
    again = load_workload(path)
    assert again == cnn


def test_presets_are_listed_in_errors_for_unknown_names():
    with pytest.raises(WorkloadError, match="mlp, cnn|cnn, mlp"):
        load_workload("resnet")
    assert set(PRESETS) == {"mlp", "cnn", "rescnn", "transformer"}


def _write(tmp_path, doc):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def _mlp_doc(**changes):
    doc = json.loads(json.dumps(PRESETS["mlp"]))
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "expected a JSON object"),
        (_mlp_doc(input_shape=[0]), "must be positive"),
        (_mlp_doc(input_shape=[1, 28, 28, 1]), "input_shape"),
        (_mlp_doc(layers=[]), "non-empty list"),
        (_mlp_doc(extra=1), "unknown key"),
        (
            _mlp_doc(layers=[{"kind": "dense", "units": -5}, {"kind": "softmax_cross_entropy"}]),
            r"layer 0 \(dense0\).*'units' must be >= 1, got -5",
        ),
        (
            _mlp_doc(layers=[{"kind": "lstm"}, {"kind": "softmax_cross_entropy"}]),
            "layer 0: unknown kind 'lstm'",
        ),
        (
            _mlp_doc(layers=[{"kind": ["dense"], "units": 8}, {"kind": "softmax_cross_entropy"}]),
            r"layer 0: unknown kind \['dense'\]",
        ),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON .*nested too deeply"),
        (
            _mlp_doc(layers=[{"kind": "dense"}, {"kind": "softmax_cross_entropy"}]),
            "dense needs 'units'",
        ),
        (
            _mlp_doc(layers=[{"kind": "dense", "units": 2.5}, {"kind": "softmax_cross_entropy"}]),
            "'units' must be an integer",
        ),
        (
            _mlp_doc(
                layers=[
                    {"kind": "dense", "units": 4, "kernel": 3},
                    {"kind": "softmax_cross_entropy"},
                ]
            ),
            "unknown setting",
        ),
        (
            _mlp_doc(
                layers=[
                    {"kind": "conv2d", "filters": 4, "kernel": 3},
                    {"kind": "softmax_cross_entropy"},
                ]
            ),
            r"layer 0 \(conv2d0\): shapes don't chain: conv2d needs",
        ),
        (
            _mlp_doc(layers=[{"kind": "dense", "units": 10}]),
            r"last layer must be the loss \(softmax_cross_entropy or token_cross_entropy\)",
        ),
        (
            _mlp_doc(layers=[{"kind": "relu"}, {"kind": "softmax_cross_entropy"}]),
            "no layer has parameters",
        ),
        (
            _mlp_doc(
                layers=[
                    {"kind": "softmax_cross_entropy"},
                    {"kind": "dense", "units": 10},
                    {"kind": "softmax_cross_entropy"},
                ]
            ),
            "must be the last layer",
        ),
        (
            {
                "input_shape": [3, 8, 8],
                "layers": [
                    {"kind": "conv2d", "filters": 4, "kernel": 3},
                    {"kind": "dense", "units": 10, "name": "fc"},
                    {"kind": "softmax_cross_entropy"},
                ],
            },
            r"layer 1 \(fc\): shapes don't chain: dense needs a flat input, got \[4, 6, 6\]",
        ),
        (
            {
                "input_shape": [3, 4, 4],
                "layers": [
                    {"kind": "conv2d", "filters": 4, "kernel": 7},
                    {"kind": "flatten"},
                    {"kind": "dense", "units": 2},
                    {"kind": "softmax_cross_entropy"},
                ],
            },
            "kernel 7 is larger than the padded input 4x4",
        ),
        (
            {
                "input_shape": [8],
                "layers": [{"kind": "dense", "units": 1}, {"kind": "softmax_cross_entropy"}],
            },
            "at least 2 classes",
        ),
    ],
)
def test_bad_workload_files_get_one_line_errors_naming_the_problem(tmp_path, doc, message):
    path = _write(tmp_path, doc)
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(path)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_a_directory_is_not_a_workload(tmp_path):
    with pytest.raises(WorkloadError, match="is a directory"):
        load_workload(tmp_path)
