"""The layer kernels: gradients against finite differences, numba against array kernels.

Gradients are checked in float64 on the array kernels (exact enough for tight tolerances);
the numba kernels are then checked against the array kernels in float32, so both are right.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from microbench.kernels import (
    ArrayKernels,
    NumbaKernels,
    conv_output_hw,
    kernels_for,
    pool_output_hw,
)
from microbench.kernels.shapes import window_range
from tests.microbench.gradcheck import numeric_grad

A = ArrayKernels(np)
N = NumbaKernels()

# (batch, height, width, channels, filters, kernel, stride, padding)
CONV_CASES = [
    (2, 5, 5, 2, 3, 3, 1, 1),
    (2, 7, 6, 3, 4, 3, 2, 1),
    (3, 6, 6, 2, 2, 3, 2, 0),
    (1, 5, 7, 1, 2, 2, 1, 0),
    (2, 4, 4, 3, 2, 1, 1, 0),
    (2, 5, 5, 2, 3, 5, 1, 2),
]
# (batch, height, width, channels, size, stride)
POOL_CASES = [(2, 4, 4, 3, 2, 2), (2, 7, 7, 2, 3, 2), (1, 5, 6, 2, 2, 1), (2, 6, 5, 1, 3, 3)]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _close(a: np.ndarray, b: np.ndarray, rtol: float = 1e-6, atol: float = 1e-8) -> None:
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# Shapes


def test_output_sizes_and_window_ranges():
    assert conv_output_hw(32, 32, 3, 1, 1) == (32, 32)
    assert conv_output_hw(7, 6, 3, 2, 1) == (4, 3)
    assert pool_output_hw(7, 7, 3, 2) == (3, 3)
    with pytest.raises(ValueError):
        conv_output_hw(2, 2, 5, 1, 0)
    for out_size, in_size, stride, offset in [(4, 7, 2, -1), (3, 6, 2, 2), (5, 5, 1, -2)]:
        lo, hi = window_range(out_size, in_size, stride, offset)
        inside = [o for o in range(out_size) if 0 <= o * stride + offset < in_size]
        assert list(range(lo, hi)) == inside


# ---------------------------------------------------------------------------------------------
# Forward semantics against direct definitions (float64)


def _direct_conv(x, w, b, stride, pad):
    n, h, wd, c = x.shape
    k, f = w.shape[0], w.shape[3]
    oh, ow = conv_output_hw(h, wd, k, stride, pad)
    xp = np.zeros((n, h + 2 * pad, wd + 2 * pad, c))
    xp[:, pad : pad + h, pad : pad + wd] = x
    out = np.empty((n, oh, ow, f))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * stride : i * stride + k, j * stride : j * stride + k, :]
            out[:, i, j, :] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2])) + b
    return out


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_matches_direct_convolution(case):
    n, h, wd, c, f, k, s, p = case
    rng = _rng(1)
    x, w, b = rng.standard_normal((n, h, wd, c)), rng.standard_normal((k, k, c, f)), rng.random(f)
    oh, ow = conv_output_hw(h, wd, k, s, p)
    out = np.empty((n, oh, ow, f))
    A.conv2d_forward(x, w, b, s, p, np.empty((n * oh * ow, k * k * c)), out)
    _close(out, _direct_conv(x, w, b, s, p), rtol=1e-12)


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_forward_matches_direct_max(case):
    n, h, wd, c, size, stride = case
    x = _rng(2).standard_normal((n, h, wd, c))
    oh, ow = pool_output_hw(h, wd, size, stride)
    out, argmax = np.empty((n, oh, ow, c)), np.empty((n, oh, ow, c), np.int32)
    A.maxpool2d_forward(x, size, stride, out, argmax)
    for i in range(oh):
        for j in range(ow):
            window = x[:, i * stride : i * stride + size, j * stride : j * stride + size, :]
            flat = window.reshape(n, size * size, c)
            _close(out[:, i, j], flat.max(axis=1), rtol=0)
            np.testing.assert_array_equal(argmax[:, i, j], flat.argmax(axis=1))


# ---------------------------------------------------------------------------------------------
# Gradients against central finite differences (array kernels, float64)


def test_dense_gradients():
    rng = _rng(3)
    x, w, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    r = rng.standard_normal((4, 3))  # loss = sum(out * r), so dout = r
    out = np.empty((4, 3))

    def loss():
        A.dense_forward(x, w, b, out)
        return float((out * r).sum())

    dw, db, dx = np.empty_like(w), np.empty_like(b), np.empty_like(x)
    A.dense_backward(x, w, r, dw, db, dx)
    for analytic, wrt in ((dx, x), (dw, w), (db, b)):
        _close(analytic, numeric_grad(loss, wrt))


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_gradients(case):
    n, h, wd, c, f, k, s, p = case
    rng = _rng(4)
    x, w, b = rng.standard_normal((n, h, wd, c)), rng.standard_normal((k, k, c, f)), rng.random(f)
    oh, ow = conv_output_hw(h, wd, k, s, p)
    cols, out = np.empty((n * oh * ow, k * k * c)), np.empty((n, oh, ow, f))
    r = rng.standard_normal(out.shape)

    def loss():
        A.conv2d_forward(x, w, b, s, p, cols, out)
        return float((out * r).sum())

    loss()
    dw, db, dx = np.empty_like(w), np.empty_like(b), np.empty_like(x)
    A.conv2d_backward(r, cols, w, s, p, dw, db, np.empty_like(cols), dx)
    for analytic, wrt in ((dx, x), (dw, w), (db, b)):
        _close(analytic, numeric_grad(loss, wrt), rtol=1e-6, atol=1e-7)


def test_relu_and_bias_activation_gradients():
    rng = _rng(5)
    x = rng.uniform(0.05, 1.0, (3, 4)) * rng.choice([-1.0, 1.0], (3, 4))  # away from the kink
    b = np.zeros(4)
    r = rng.standard_normal(x.shape)
    out = np.empty_like(x)

    def loss():
        A.relu_forward(x, out)
        return float((out * r).sum())

    loss()
    dx = np.empty_like(x)
    A.relu_backward(r, out, dx)
    _close(dx, numeric_grad(loss, x))

    def loss_bias():
        A.bias_activation(x, b, True, out)
        return float((out * r).sum())

    loss_bias()
    masked = r * (out > 0)
    db = np.empty_like(b)
    A.channel_sum(masked, db)
    _close(db, numeric_grad(loss_bias, b))


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_gradients(case):
    n, h, wd, c, size, stride = case
    rng = _rng(6)
    x = rng.permutation(n * h * wd * c).reshape(n, h, wd, c) / 7.0  # distinct: no ties
    oh, ow = pool_output_hw(h, wd, size, stride)
    out, argmax = np.empty((n, oh, ow, c)), np.empty((n, oh, ow, c), np.int32)
    r = rng.standard_normal(out.shape)

    def loss():
        A.maxpool2d_forward(x, size, stride, out, argmax)
        return float((out * r).sum())

    loss()
    dx = np.empty_like(x)
    A.maxpool2d_backward(r, argmax, size, stride, dx)
    _close(dx, numeric_grad(loss, x, eps=1e-4))


def test_softmax_cross_entropy_loss_and_gradient():
    rng = _rng(7)
    logits, labels = rng.standard_normal((5, 4)) * 3, rng.integers(0, 4, 5)
    d = np.empty_like(logits)

    def loss():
        return A.softmax_cross_entropy(logits, labels, d)[0]

    value, correct = A.softmax_cross_entropy(logits, labels, d)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    assert value == pytest.approx(-log_p[np.arange(5), labels].mean(), rel=1e-12)
    assert correct == int((logits.argmax(axis=1) == labels).sum())
    analytic = d.copy()
    _close(analytic, numeric_grad(loss, logits))


# ---------------------------------------------------------------------------------------------
# numba kernels against array kernels (float32)


@pytest.fixture(params=["serial", "parallel"])
def numba_threads(request):
    """Runs a test with one numba thread (the serial loops) and with all of them."""
    before = numba.get_num_threads()
    numba.set_num_threads(1 if request.param == "serial" else numba.config.NUMBA_NUM_THREADS)
    yield
    numba.set_num_threads(before)


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _agree(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# The last case's input gradient goes through dcols in several chunks of samples.
@pytest.mark.parametrize(
    "case", CONV_CASES + [(3, 12, 12, 8, 16, 3, 1, 1), (5, 32, 32, 16, 8, 3, 1, 1)]
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_numba_conv_matches_array(case, with_bias, numba_threads):
    n, h, wd, c, f, k, s, p = case
    rng = _rng(8)
    x, w, b = _f32(rng, n, h, wd, c), _f32(rng, k, k, c, f), _f32(rng, f)
    oh, ow = conv_output_hw(h, wd, k, s, p)
    dout = _f32(rng, n, oh, ow, f)
    results = []
    for kern in (N, A):
        cols = np.empty((n * oh * ow, k * k * c), np.float32)
        out = np.empty((n, oh, ow, f), np.float32)
        kern.conv2d_forward(x, w, b if with_bias else None, s, p, cols, out)
        dw, db, dx = np.empty_like(w), np.empty_like(b), np.empty_like(x)
        kern.conv2d_backward(dout, cols, w, s, p, dw, db, np.empty_like(cols), dx)
        results.append((out, cols, dw, db, dx))
    for ours, theirs in zip(*results, strict=True):
        _agree(ours, theirs)


@pytest.mark.parametrize("case", POOL_CASES + [(4, 32, 32, 16, 2, 2)])
def test_numba_maxpool_matches_array(case, numba_threads):
    n, h, wd, c, size, stride = case
    rng = _rng(9)
    x = _f32(rng, n, h, wd, c)
    x[0, 0, :2, 0] = 1.5  # a tie: both kernels pick the first tap
    oh, ow = pool_output_hw(h, wd, size, stride)
    dout = _f32(rng, n, oh, ow, c)
    results = []
    for kern in (N, A):
        out, argmax = np.empty((n, oh, ow, c), np.float32), np.empty((n, oh, ow, c), np.int32)
        kern.maxpool2d_forward(x, size, stride, out, argmax)
        dx = np.empty_like(x)
        kern.maxpool2d_backward(dout, argmax, size, stride, dx)
        results.append((out, argmax, dx))
    for ours, theirs in zip(*results, strict=True):
        _agree(ours, theirs)


@pytest.mark.parametrize("size", [100, 1 << 16])  # serial and parallel paths
def test_numba_elementwise_matches_array(size, numba_threads):
    rng = _rng(10)
    x, d, b = _f32(rng, size // 4, 4), _f32(rng, size // 4, 4), _f32(rng, 4)
    for relu in (True, False):
        outs = []
        for kern in (N, A):
            out = np.empty_like(x)
            kern.bias_activation(x, b, relu, out)
            inplace = x.copy()
            kern.bias_activation(inplace, b, relu, inplace)
            outs.append((out, inplace))
        _agree(*[o[0] for o in outs])
        _agree(outs[0][1], outs[0][0])
    results = []
    for kern in (N, A):
        y, dx, total = np.empty_like(x), np.empty_like(x), np.empty(4, np.float32)
        kern.relu_forward(x, y)
        kern.relu_backward(d, y, dx)
        inplace = d.copy()
        kern.relu_backward(inplace, y, inplace)
        kern.channel_sum(d, total)
        results.append((y, dx, inplace, total))
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_numba_dense_layout_and_softmax_match_array(numba_threads):
    rng = _rng(11)
    x, w, b = _f32(rng, 6, 5), _f32(rng, 5, 4), _f32(rng, 4)
    nchw = _f32(rng, 2, 3, 4, 5)
    logits, labels = _f32(rng, 6, 4), rng.integers(0, 4, 6)
    dout = _f32(rng, 6, 4)
    results = []
    for kern in (N, A):
        out = np.empty((6, 4), np.float32)
        kern.dense_forward(x, w, b, out)
        dw, db, dx = np.empty_like(w), np.empty_like(b), np.empty_like(x)
        kern.dense_backward(x, w, dout, dw, db, dx)
        nhwc = np.empty((2, 4, 5, 3), np.float32)
        kern.nchw_to_nhwc(nchw, nhwc)
        dlogits = np.empty_like(logits)
        loss, correct = kern.softmax_cross_entropy(logits, labels, dlogits)
        results.append((out, dw, db, dx, nhwc, dlogits, np.float64(loss), np.int64(correct)))
    for ours, theirs in zip(*results, strict=True):
        _agree(ours, theirs)
    np.testing.assert_array_equal(results[0][4], nchw.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("size", [1000, 1 << 17])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_numba_sgd_matches_array(size, momentum, numba_threads):
    rng = _rng(12)
    p0, g = _f32(rng, size), _f32(rng, size)
    results = []
    for kern in (N, A):
        p, v = p0.copy(), np.full(size, 0.5, np.float32) if momentum else None
        for _ in range(3):
            kern.sgd_update(p, g, v, 0.1, momentum, np.empty_like(p))
        results.append(p)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_kernel_selection():
    assert isinstance(kernels_for(np), NumbaKernels)
    assert isinstance(kernels_for(np, "array"), ArrayKernels)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels_for(np, "cuda")


def test_non_contiguous_outputs_are_refused():
    x = np.zeros((2, 4, 4, 2), np.float32)
    w = np.zeros((3, 3, 2, 4), np.float32)
    out = np.zeros((2, 4, 4, 8), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        N.conv2d_forward(x, w, None, 1, 1, np.empty((32, 18), np.float32), out)
