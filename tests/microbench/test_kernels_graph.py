"""The kernels of graph networks (residual add, average pools) against direct numpy definitions.

Every kernel runs on the numba kernels and on the array kernels (numpy), at 1 and 2 numba
threads, with the parallel threshold at 0 so that 2 threads take every loop's parallel driver
(the fixture checks which drivers ran). The pool backwards are also checked to be the
transposes of their forwards.
"""

from __future__ import annotations

import numpy as np
import pytest

from microbench.kernels import ArrayKernels, NumbaKernels, conv_output_hw

KERNELS = {"numba": NumbaKernels(), "array": ArrayKernels(np)}

# (batch, height, width, channels, size, stride, padding): overlapping windows, tiling ones,
# stride 1, windows that do not tile the image (the last rows or columns in none), and padding
# wider than a stride.
AVG_CASES = [
    (2, 7, 7, 3, 3, 2, 1),
    (2, 6, 6, 4, 2, 2, 0),
    (2, 5, 6, 3, 3, 1, 1),
    (2, 7, 9, 2, 2, 2, 0),
    (1, 8, 7, 3, 3, 2, 0),
    (3, 3, 4, 2, 2, 1, 1),
    (1, 6, 5, 2, 4, 2, 2),
]


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _close(ours: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


def _windows(case):
    """Each window of ``case``: (out row, out column, padded-input row and column slices)."""
    _, h, w, _, size, stride, pad = case
    out_h, out_w = conv_output_hw(h, w, size, stride, pad)
    for oh in range(out_h):
        for ow in range(out_w):
            rows = slice(oh * stride, oh * stride + size)
            yield oh, ow, rows, slice(ow * stride, ow * stride + size)


def _reference_avgpool(x: np.ndarray, case) -> np.ndarray:
    n, h, w, c, size, stride, pad = case
    padded = np.zeros((n, h + 2 * pad, w + 2 * pad, c))
    padded[:, pad : pad + h, pad : pad + w] = x
    out = np.zeros((n, *conv_output_hw(h, w, size, stride, pad), c))
    for oh, ow, rows, columns in _windows(case):
        out[:, oh, ow] = padded[:, rows, columns].sum(axis=(1, 2)) / (size * size)
    return out


def _reference_avgpool_backward(dout: np.ndarray, case) -> np.ndarray:
    n, h, w, c, size, _, pad = case
    padded = np.zeros((n, h + 2 * pad, w + 2 * pad, c))
    for oh, ow, rows, columns in _windows(case):
        padded[:, rows, columns] += dout[:, oh, ow, None, None, :] / (size * size)
    return padded[:, pad : pad + h, pad : pad + w]


def _avgpool(kern, x: np.ndarray, case) -> np.ndarray:
    n, h, w, c, size, stride, pad = case
    out = np.full((n, *conv_output_hw(h, w, size, stride, pad), c), np.nan, np.float32)
    kern.avgpool2d_forward(x, size, stride, pad, out)
    return out


def _avgpool_backward(kern, dout: np.ndarray, case) -> np.ndarray:
    n, h, w, c, size, stride, pad = case
    dx = np.full((n, h, w, c), np.nan, np.float32)  # every entry must be written
    kern.avgpool2d_backward(dout, size, stride, pad, dx)
    return dx


def _global_avgpool(kern, x: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], x.shape[3]), np.nan, np.float32)
    kern.global_avgpool_forward(x, out)
    return out


def _global_avgpool_backward(kern, dout: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    dx = np.full(shape, np.nan, np.float32)
    kern.global_avgpool_backward(dout, dx)
    return dx


def _adjoint(forward_x: np.ndarray, dy: np.ndarray, x: np.ndarray, dx: np.ndarray) -> None:
    """<forward(x), dy> == <x, backward(dy)> to float32 rounding."""
    left = np.multiply(forward_x, dy, dtype=np.float64)
    right = np.multiply(x, dx, dtype=np.float64)
    scale = np.abs(left).sum() + np.abs(right).sum()
    assert abs(left.sum() - right.sum()) <= 1e-6 * scale


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KERNELS)
def test_add_out_of_place_and_in_place(kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(0)
    for shape in [(3, 5, 7, 2), (1000,), (2, 65)]:
        a, b = _f32(rng, *shape), _f32(rng, *shape)
        a0, b0 = a.copy(), b.copy()
        expected = a0 + b0  # float32 addition rounds the same everywhere: equality
        out = np.full(shape, np.nan, np.float32)
        kern.add(a, b, out)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(a, a0)
        np.testing.assert_array_equal(b, b0)
        kern.add(a, b, a)  # acc += b
        np.testing.assert_array_equal(a, expected)
        np.testing.assert_array_equal(b, b0)
        a = a0.copy()
        kern.add(a, b, b)  # the output is the second operand
        np.testing.assert_array_equal(b, expected)
        np.testing.assert_array_equal(a, a0)


def test_numba_add_refuses_non_contiguous_arrays():
    a = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        NumbaKernels.add(a[:, ::2], a[:, 1::2], np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("case", AVG_CASES)
@pytest.mark.parametrize("kind", KERNELS)
def test_avgpool_matches_direct_mean(case, kind, threads):
    kern = KERNELS[kind]
    n, h, w, c, size, stride, pad = case
    rng = np.random.default_rng(1)
    x = _f32(rng, n, h, w, c)
    y = _avgpool(kern, x, case)
    _close(y, _reference_avgpool(x, case))
    dy = _f32(rng, *y.shape)
    dx = _avgpool_backward(kern, dy, case)
    _close(dx, _reference_avgpool_backward(dy, case))
    _adjoint(y, dy, x, dx)


def test_avgpool_counts_padding_in_the_divisor():
    x = np.ones((1, 2, 2, 1), np.float32)
    for kern in KERNELS.values():
        y = _avgpool(kern, x, (1, 2, 2, 1, 3, 1, 1))
        # Window sums of ones over a zero-padded 2x2 image: 4 taps inside, of 9.
        np.testing.assert_allclose(y, np.full((1, 2, 2, 1), 4 / 9), rtol=1e-6)


def test_avgpool_refuses_a_window_larger_than_the_padded_input():
    x = np.zeros((1, 2, 2, 1), np.float32)
    out = np.zeros((1, 1, 1, 1), np.float32)
    for kern in KERNELS.values():
        with pytest.raises(ValueError, match="does not fit"):
            kern.avgpool2d_forward(x, 5, 1, 1, out)


@pytest.mark.parametrize("shape", [(2, 7, 5, 3), (3, 1, 1, 4), (1, 4, 4, 130)])
@pytest.mark.parametrize("kind", KERNELS)
def test_global_avgpool_matches_mean(shape, kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(2)
    x = _f32(rng, *shape)
    y = _global_avgpool(kern, x)
    _close(y, x.astype(np.float64).mean(axis=(1, 2)))
    dy = _f32(rng, *y.shape)
    dx = _global_avgpool_backward(kern, dy, shape)
    expected = np.broadcast_to(dy[:, None, None, :] / (shape[1] * shape[2]), shape)
    _close(dx, expected)
    _adjoint(y, dy, x, dx)


def test_numba_work_counts_window_taps(loop_work):
    """The ``work`` each wrapper hands ``_loop``: what decides its driver."""
    seen = loop_work
    n, h, w, c, size, stride, pad = 2, 7, 7, 3, 3, 2, 1
    x = np.zeros((n, h, w, c), np.float32)
    y = _avgpool(NumbaKernels, x, (n, h, w, c, size, stride, pad))
    _avgpool_backward(NumbaKernels, y, (n, h, w, c, size, stride, pad))
    g = _global_avgpool(NumbaKernels, x)
    _global_avgpool_backward(NumbaKernels, g, x.shape)
    NumbaKernels.add(x, x, np.empty_like(x))
    assert seen == {
        "avgpool": y.size * size * size,
        "avgpool_backward": x.size,
        "global_avgpool": x.size,
        "global_avgpool_backward": x.size,
        "add": x.size,
    }
