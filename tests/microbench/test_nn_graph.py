"""The numpy network on graphs: residual adds, concatenation, every new layer kind and tied
weights, checked whole against finite differences of its loss."""

from __future__ import annotations

import numpy as np
import pytest

from microbench.kernels import kernels_for
from microbench.nn import Network
from microbench.nn.layers import MaxPool2d
from microbench.workload import Workload
from tests.microbench import gradcheck

# A residual CNN with the image kinds: batchnorm, a padded average pool of overlapping
# windows, a concatenation, a 1x1 convolution without bias on the skip, global average
# pooling. (A max-pool's kinks would defeat finite differences: it is checked on its own.)
IMAGES = {
    "name": "graph-images",
    "input_shape": [3, 8, 8],
    "layers": [
        {"kind": "conv2d", "name": "stem", "filters": 4, "kernel": 3, "padding": 1},
        {"kind": "batchnorm2d", "name": "bn"},
        {"kind": "gelu", "name": "act"},
        {"kind": "avgpool2d", "name": "pool", "size": 3, "stride": 2, "padding": 1},
        {"kind": "conv2d", "name": "a", "filters": 4, "kernel": 3, "padding": 1},
        {"kind": "gelu", "name": "a.act"},
        {"kind": "conv2d", "name": "skip", "inputs": ["pool"], "filters": 4, "kernel": 1,
         "bias": False},
        {"kind": "add", "name": "add", "inputs": ["a.act", "skip"]},
        {"kind": "concat", "name": "cat", "inputs": ["add", "pool"]},
        {"kind": "avgpool2d", "name": "avg", "size": 2, "padding": 1},
        {"kind": "global_avgpool", "name": "gap"},
        {"kind": "dense", "name": "fc", "units": 3},
        {"kind": "softmax_cross_entropy", "name": "loss"},
    ],
}  # fmt: skip

# A causal decoder with tied output weights and a token-level loss, and a ViT-like classifier
# of patches with a class token.
TOKENS = {
    "name": "graph-tokens",
    "input_shape": [5],
    "layers": [
        {"kind": "embedding", "name": "embed", "vocab": 7, "dim": 8, "positions": 6,
         "token_types": 2},
        {"kind": "layernorm", "name": "ln1"},
        {"kind": "attention", "name": "attn", "heads": 2, "causal": True},
        {"kind": "add", "name": "res", "inputs": ["embed", "attn"]},
        {"kind": "layernorm", "name": "ln2"},
        {"kind": "dense", "name": "up", "units": 12},
        {"kind": "gelu", "name": "gelu"},
        {"kind": "dense", "name": "down", "units": 8},
        {"kind": "add", "name": "res2", "inputs": ["res", "down"]},
        {"kind": "dense", "name": "head", "units": 7, "bias": False, "tied_to": "embed"},
        {"kind": "token_cross_entropy", "name": "loss"},
    ],
}  # fmt: skip
PATCHES = {
    "name": "graph-patches",
    "input_shape": [3, 8, 8],
    "layers": [
        {"kind": "conv2d", "name": "patch", "filters": 8, "kernel": 4, "stride": 4},
        {"kind": "to_tokens", "name": "tokens", "cls_token": True, "positions": True},
        {"kind": "attention", "name": "attn", "heads": 2},
        {"kind": "layernorm", "name": "ln"},
        {"kind": "token_pool", "name": "cls", "mode": "first"},
        {"kind": "dense", "name": "head", "units": 3},
        {"kind": "softmax_cross_entropy", "name": "loss"},
    ],
}  # fmt: skip


def _batch(workload: Workload, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocabulary = workload.vocabulary
    if vocabulary is None:
        x = rng.standard_normal((batch, *workload.input_shape)).astype(np.float32)
    else:
        x = rng.integers(0, vocabulary, (batch, *workload.input_shape)).astype(np.float32)
    labels = (batch, *workload.layers[-1].input_shape[:-1])
    return x, rng.integers(0, workload.num_classes, labels)


@pytest.mark.parametrize("doc", [IMAGES, TOKENS, PATCHES], ids=lambda d: d["name"])
def test_the_whole_networks_gradient_matches_finite_differences(doc):
    workload = Workload.from_dict(doc)
    net = Network(workload, seed=1, init="xavier", backend="array")
    # Parameters of one scale: embeddings start at std 0.02, so small that a layernorm after
    # them is far from linear over a finite-difference step.
    net.params[...] = np.random.default_rng(1).standard_normal(net.params.size) * 0.4
    x, y = _batch(workload, 3)
    net.forward(x, y)
    net.backward()
    analytic = net.grads.copy()
    assert np.isfinite(analytic).all() and np.count_nonzero(analytic) > 0.9 * analytic.size
    state = net.state.copy()  # batchnorm's running statistics move with each forward

    def loss() -> float:
        net.state[...] = state
        return net.forward(x, y)[0]

    rng = np.random.default_rng(2)
    gradcheck.directional(loss, net.params, analytic, rng, 1e-3, 3e-2, doc["name"])


def test_a_skip_gets_the_sum_of_its_readers_gradients():
    """``relu(x) + x`` read twice: the network's input gradient path sums both branches, so
    the parameters of the layer before see ``(1 + relu'(z)) dL/dy``."""
    doc = {
        "input_shape": [4],
        "layers": [
            {"kind": "dense", "name": "d", "units": 4},
            {"kind": "relu", "name": "r"},
            {"kind": "add", "name": "s", "inputs": ["d", "r"]},
            {"kind": "dense", "name": "out", "units": 2},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
    net = Network(Workload.from_dict(doc), seed=0, backend="array")
    x, y = _batch(net.workload, 5)
    net.forward(x, y)
    net.backward()
    w1, b1 = net.params[:16].reshape(4, 4), net.params[16:20]
    w2 = net.params[20:28].reshape(4, 2)
    z = x @ w1 + b1
    h = z + np.maximum(z, 0)
    logits = h @ w2 + net.params[28:30]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(5), y] -= 1
    dz = (p / 5) @ w2.T * (1 + (z > 0))
    np.testing.assert_allclose(net.grads[:16].reshape(4, 4), x.T @ dz, rtol=1e-4, atol=1e-6)


def test_token_labels_must_have_a_label_per_token():
    workload = Workload.from_dict(TOKENS)
    net = Network(workload, backend="array")
    x, _ = _batch(workload, 2)
    with pytest.raises(ValueError, match=r"labels of shape \(2, 5\)"):
        net.forward(x, np.zeros(2, np.int64))


def test_batchnorm_evaluates_with_its_running_statistics():
    workload = Workload.from_dict(IMAGES)
    net = Network(workload, backend="array")
    x, y = _batch(workload, 4)
    before = net.logits(x)
    net.forward(x, y)  # moves the running statistics (no update of the parameters)
    after = net.logits(x)
    assert not np.allclose(before, after)
    np.testing.assert_array_equal(net.logits(x), after)  # evaluation moves nothing


@pytest.mark.parametrize("backend", ["auto", "array"])
@pytest.mark.parametrize(("size", "stride", "padding"), [(3, 2, 1), (2, 2, 1), (3, 1, 0)])
def test_a_max_pool_with_padding_and_overlapping_windows_against_a_loop(
    backend, size, stride, padding
):
    """ResNet's stem pool (3, stride 2, padding 1): pads never win, and backward sends each
    output's gradient to its window's winner (summed where windows overlap)."""
    doc = {
        "input_shape": [2, 7, 7],
        "layers": [
            {"kind": "conv2d", "name": "c", "filters": 2, "kernel": 1},
            {"kind": "maxpool2d", "name": "p", "size": size, "stride": stride,
             "padding": padding},
            {"kind": "flatten", "name": "f"},
            {"kind": "dense", "name": "d", "units": 2},
            {"kind": "softmax_cross_entropy", "name": "l"},
        ],
    }  # fmt: skip
    info = gradcheck.layer_info(Workload.from_dict(doc), "p")
    op = MaxPool2d(info, kernels_for(np, backend), (7, 7, 2))
    x = np.random.default_rng(0).standard_normal((2, 7, 7, 2)).astype(np.float32)
    buf = op.allocate(np, 2, True)
    y = op.forward(x, buf).copy()
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    dx = op.backward(dy, buf)
    padded = np.pad(x, ((0, 0), (padding,) * 2, (padding,) * 2, (0, 0)), constant_values=-np.inf)
    want, dwant = np.zeros_like(y), np.zeros_like(padded)
    for n, i, j, c in np.ndindex(*y.shape):
        window = padded[n, i * stride : i * stride + size, j * stride : j * stride + size, c]
        want[n, i, j, c] = window.max()
        a, b = np.unravel_index(np.argmax(window), window.shape)
        dwant[n, i * stride + a, j * stride + b, c] += dy[n, i, j, c]
    np.testing.assert_array_equal(y, want)
    inside = dwant[:, padding : padding + 7, padding : padding + 7]
    np.testing.assert_allclose(dx, inside, atol=1e-6)
