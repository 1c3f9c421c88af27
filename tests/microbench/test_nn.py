"""The real network and SGD: gradients, parameter layout, initialisation, training behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from microbench.nn import SGD, Network, init_params
from microbench.workload import Workload, load_workload

TINY_DENSE = {
    "name": "tiny-dense",
    "input_shape": [6],
    "layers": [
        {"kind": "dense", "units": 5},
        {"kind": "relu"},
        {"kind": "dense", "units": 4},
        {"kind": "dense", "units": 3},
        {"kind": "softmax_cross_entropy"},
    ],
}
# conv + relu + pool (fused, pool stride != size), a stride-2 padding-0 conv + relu, dense.
TINY_CONV = {
    "name": "tiny-conv",
    "input_shape": [2, 9, 9],
    "layers": [
        {"kind": "conv2d", "filters": 3, "kernel": 3, "stride": 1, "padding": 1},
        {"kind": "relu"},
        {"kind": "maxpool2d", "size": 3, "stride": 2},
        {"kind": "conv2d", "filters": 4, "kernel": 2, "stride": 2, "padding": 0},
        {"kind": "relu"},
        {"kind": "flatten"},
        {"kind": "dense", "units": 5},
        {"kind": "relu"},
        {"kind": "dense", "units": 3},
        {"kind": "softmax_cross_entropy"},
    ],
}
# Standalone relu and pool on the input, conv then pool then relu, a conv with no activation.
TINY_CONV_UNFUSED = {
    "name": "tiny-conv-unfused",
    "input_shape": [2, 8, 8],
    "layers": [
        {"kind": "relu"},
        {"kind": "maxpool2d", "size": 2, "stride": 1},
        {"kind": "conv2d", "filters": 3, "kernel": 3, "stride": 2, "padding": 1},
        {"kind": "maxpool2d", "size": 2},
        {"kind": "relu"},
        {"kind": "conv2d", "filters": 2, "kernel": 1},
        {"kind": "flatten"},
        {"kind": "dense", "units": 3},
        {"kind": "softmax_cross_entropy"},
    ],
}


def _data(workload: Workload, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *workload.input_shape), dtype=np.float32)
    if workload.vocabulary is not None:
        x = rng.integers(0, workload.vocabulary, (batch, *workload.input_shape)).astype(np.float32)
    return x, rng.integers(0, workload.num_classes, batch)


# ---------------------------------------------------------------------------------------------
# Parameters


@pytest.mark.parametrize(("name", "count"), [("mlp", 235_146), ("cnn", 1_070_794)])
def test_preset_parameter_counts(name, count):
    net = Network(load_workload(name))
    assert net.param_count == net.params.size == net.grads.size == count
    assert net.params.dtype == net.grads.dtype == np.float32


def test_layer_params_are_views_in_layer_order():
    net = Network(load_workload("cnn"))
    layers = net.layer_params()
    assert [name for name, _, _ in layers] == ["conv2d0", "conv2d3", "dense7", "dense9"]
    assert [w.shape for _, w, _ in layers] == [
        (3, 3, 3, 32),
        (3, 3, 32, 64),
        (4096, 256),
        (256, 10),
    ]
    offset = 0
    for _, w, b in layers:
        assert np.shares_memory(w, net.params) and np.shares_memory(b, net.params)
        np.testing.assert_array_equal(net.params[offset : offset + w.size], w.reshape(-1))
        offset += w.size
        np.testing.assert_array_equal(net.params[offset : offset + b.size], b)
        offset += b.size
    assert offset == net.param_count


@pytest.mark.parametrize("init", ["he", "xavier"])
def test_same_seed_same_parameters(init):
    workload = load_workload("mlp")
    a, b = Network(workload, seed=3, init=init), Network(workload, seed=3, init=init)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, Network(workload, seed=4, init=init).params)


def test_init_distributions():
    workload = load_workload("mlp")
    he, xavier = init_params(workload, 0, "he"), init_params(workload, 0, "xavier")
    first = 784 * 256
    assert he[:first].std() == pytest.approx(np.sqrt(2 / 784), rel=0.02)
    limit = np.sqrt(6 / (784 + 256))
    assert np.abs(xavier[:first]).max() <= limit
    assert xavier[:first].std() == pytest.approx(limit / np.sqrt(3), rel=0.02)
    for params in (he, xavier):
        np.testing.assert_array_equal(params[first : first + 256], 0)  # biases
    with pytest.raises(ValueError, match="unknown init"):
        init_params(workload, 0, "normal")


# ---------------------------------------------------------------------------------------------
# Gradients of whole networks against central finite differences


@pytest.mark.parametrize("doc", [TINY_DENSE, TINY_CONV, TINY_CONV_UNFUSED], ids=lambda d: d["name"])
@pytest.mark.parametrize("backend", ["auto", "array"])
def test_network_gradient_matches_finite_differences(doc, backend):
    workload = Workload.from_dict(doc)
    net = Network(workload, seed=1, backend=backend)
    net.params[:] = net.params + np.random.default_rng(2).uniform(-0.1, 0.1, net.param_count)
    x, y = _data(workload, 3, seed=5)
    net.forward(x, y)
    net.backward()
    analytic = net.grads.copy()
    eps = 3e-3  # float32 network, float64 loss: small enough not to cross relu or pool kinks
    numeric = np.empty(net.param_count)
    for i in range(net.param_count):
        old = net.params[i]
        net.params[i] = old + eps
        up = net.forward(x, y)[0]
        net.params[i] = old - eps
        down = net.forward(x, y)[0]
        net.params[i] = old
        numeric[i] = (up - down) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-4)
    assert np.linalg.norm(analytic - numeric) <= 5e-3 * np.linalg.norm(numeric)


def _reference_logits(workload: Workload, net: Network, x: np.ndarray) -> np.ndarray:
    """Layer by layer as the workload says, unfused, in float64, from the network's weights."""
    params = iter(net.layer_params())
    a = x.astype(np.float64)
    if a.ndim == 4:
        a = a.transpose(0, 2, 3, 1)  # the network runs channels-last
    for info in workload.layers[:-1]:
        s = info.layer.settings
        if info.kind in ("dense", "conv2d"):
            _, w, b = next(params)
        if info.kind == "dense":
            a = a @ w + b
        elif info.kind == "relu":
            a = np.maximum(a, 0)
        elif info.kind == "flatten":
            a = a.reshape(len(a), -1)
        else:
            k, st = (
                (s["kernel"], s["stride"]) if info.kind == "conv2d" else (s["size"], s["stride"])
            )
            p = s.get("padding", 0)
            padded = np.pad(a, ((0, 0), (p, p), (p, p), (0, 0)))
            oh, ow = info.output_shape[1:]
            out = np.empty((len(a), oh, ow, info.output_shape[0]))
            for i in range(oh):
                for j in range(ow):
                    patch = padded[:, i * st : i * st + k, j * st : j * st + k, :]
                    if info.kind == "conv2d":
                        out[:, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2])) + b
                    else:
                        out[:, i, j] = patch.max(axis=(1, 2))
            a = out
    return a


@pytest.mark.parametrize(
    "doc",
    [TINY_CONV, TINY_CONV_UNFUSED, "cnn"],
    ids=lambda d: d if isinstance(d, str) else d["name"],
)
def test_fused_network_computes_the_layers_as_written(doc):
    workload = load_workload(doc) if isinstance(doc, str) else Workload.from_dict(doc)
    net = Network(workload, seed=0)
    net.params[:] += np.random.default_rng(1).uniform(-0.05, 0.05, net.param_count)  # biases
    x, _ = _data(workload, 3)
    expected = _reference_logits(workload, net, x)
    np.testing.assert_allclose(net.logits(x), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["cnn", "rescnn", "transformer"])
def test_numba_and_array_networks_agree(name):
    """A chain, a residual graph and a transformer (token ids for it) compute the same step."""
    workload = load_workload(name)
    x, y = _data(workload, 4)
    results = []
    for backend in ("auto", "array"):
        net = Network(workload, seed=0, backend=backend)
        loss, correct = net.forward(x, y)
        net.backward()
        results.append((loss, correct, net.grads.copy(), net.logits(x)))
    (l1, c1, g1, z1), (l2, c2, g2, z2) = results
    assert l1 == pytest.approx(l2, rel=1e-5) and c1 == c2
    np.testing.assert_allclose(g1, g2, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(z1, z2, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Behaviour


def test_partial_last_batch_and_buffer_reuse():
    workload = Workload.from_dict(TINY_CONV)
    net = Network(workload, seed=0)
    grads_ptr = net.grads.__array_interface__["data"][0]
    x, y = _data(workload, 8)
    for batch in (8, 5, 8, 5):
        net.forward(x[:batch], y[:batch])
        net.backward()
    fresh = Network(workload, seed=0)
    fresh.forward(x[:5], y[:5])
    fresh.backward()
    np.testing.assert_array_equal(net.grads, fresh.grads)
    assert net.grads.__array_interface__["data"][0] == grads_ptr  # written in place


def test_logits_for_evaluation_leave_backward_alone():
    workload = load_workload("mlp")
    net = Network(workload, seed=0)
    x, y = _data(workload, 16)
    loss, correct = net.forward(x, y)
    logits = net.logits(np.concatenate([x, x[:3]]))  # another size, in between
    net.backward()
    with_logits = net.grads.copy()
    net.forward(x, y)
    net.backward()
    np.testing.assert_array_equal(with_logits, net.grads)
    assert logits.shape == (19, 10)
    assert int((logits[:16].argmax(axis=1) == y).sum()) == correct
    z = logits[:16].astype(np.float64)
    log_p = z - z.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    assert loss == pytest.approx(-log_p[np.arange(16), y].mean(), rel=1e-5)


def test_misuse_is_reported():
    net = Network(Workload.from_dict(TINY_DENSE))
    with pytest.raises(RuntimeError, match="forward"):
        net.backward()
    with pytest.raises(ValueError, match="does not match"):
        net.forward(np.zeros((2, 7), np.float32), np.zeros(2, int))
    with pytest.raises(ValueError, match="labels"):
        net.forward(np.zeros((2, 6), np.float32), np.zeros(3, int))
    with pytest.raises(ValueError, match="momentum"):
        SGD(0.1, momentum=1.0)


def test_sgd_reduces_loss_on_a_separable_problem():
    workload = Workload.from_dict(TINY_DENSE)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    centres = np.array([[2, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0], [0, 0, 2, 0, 0, 0]])
    x = (centres[y] + 0.3 * rng.standard_normal((60, 6))).astype(np.float32)
    net, opt = Network(workload, seed=0), SGD(0.1, momentum=0.5)
    first, _ = net.forward(x, y)
    for _ in range(60):
        loss, correct = net.forward(x, y)
        net.backward()
        opt.step(net.params, net.grads)
    assert loss < 0.2 * first and correct == 60


def test_sgd_momentum_matches_hand_computed_update():
    p = np.array([1.0, -2.0, 0.5], np.float32)
    g1, g2 = np.array([0.1, 0.2, -0.3], np.float32), np.array([0.4, -0.1, 0.2], np.float32)
    opt = SGD(0.5, momentum=0.9)
    opt.step(p, g1)
    np.testing.assert_allclose(p, [1.0 - 0.05, -2.0 - 0.1, 0.5 + 0.15], rtol=1e-6)
    opt.step(p, g2)
    v2 = 0.9 * g1.astype(np.float64) + g2
    expected = np.array([0.95, -2.1, 0.65]) - 0.5 * v2
    np.testing.assert_allclose(p, expected, rtol=1e-6)
    plain = np.array([1.0, 1.0, 1.0], np.float32)
    SGD(0.5).step(plain, g1)
    np.testing.assert_allclose(plain, 1.0 - 0.5 * g1, rtol=1e-7)
