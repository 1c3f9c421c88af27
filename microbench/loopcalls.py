"""The loop calls the kernel sweep times: a call of each numba loop (and the gather and the
copies) at a chosen size, on views into the sweep's buffers.

:func:`loop_dims` picks a kernel's dimensions for about ``elements`` of work and an inner run
(:func:`microbench.kernels.calls.call_features`), in typical layer settings; :func:`loop_fn`
builds the call, as :mod:`microbench.kernels.cpu` makes it. Data-dependent loops (the
max-pools) cycle through :data:`FRESH_DATA` inputs so that no branch predictor learns them.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from microbench.kernels.callspec import KERNEL_DIMS, ROW_KERNELS
from microbench.kernels.loops_tokens import attention_scale
from microbench.kernels.shapes import conv_output_hw

__all__ = ["FRESH_DATA", "MAX_ELEMENTS", "fresh_views", "im2col_dims", "loop_dims", "loop_fn"]

MAX_ELEMENTS = 2**24  # per operand: 64 MiB of float32
# Attention's sweep calls: this many heads of this width; a block's size (the run) sets the
# tokens, and the elements the samples.
ATTENTION_HEADS = 2
ATTENTION_HEAD_WIDTH = 16
# Embedding's sweep calls: sequences of this many tokens, ids drawn from a vocabulary of this
# many rows (a table of some MiB: the rows a step gathers come from the caches or beyond).
EMBEDDING_TOKENS = 16
EMBEDDING_VOCAB = 4096


def loop_dims(
    kernel: str, elements: int, run: int, window: tuple[int, int] = (2, 2)
) -> tuple[int, ...]:
    """A call of ``kernel`` with about ``elements`` elements and inner run ``run``
    (:func:`~microbench.kernels.calls.call_features`), in typical layer settings; a max-pool
    with ``window`` (size, stride)."""
    if len(KERNEL_DIMS[kernel]) == 1:
        return (elements,)
    if kernel in ROW_KERNELS:
        return (max(1, elements // run), run)
    if kernel.startswith("attention"):  # run: a (sample, head) block's pairs x head width
        t = max(2, math.isqrt(max(1, run // ATTENTION_HEAD_WIDTH)))
        d = ATTENTION_HEADS * ATTENTION_HEAD_WIDTH
        return (max(1, elements // (t * t * d)), t, d, ATTENTION_HEADS, 0)
    if kernel.startswith("embedding"):  # run: the width
        return (max(1, elements // (EMBEDDING_TOKENS * run)), EMBEDDING_TOKENS, run)
    if kernel == "gather":
        return (max(1, elements // run), run * 4)
    if kernel == "col2im":  # run: the channels
        side = 16 if elements // (9 * run) >= 256 else 4
        return (max(1, elements // (side * side * 9 * run)), side, side, run, 3, 1, 1)
    side = 16 if elements // run >= 256 else 4
    n = max(1, elements // (side * side * run))
    if kernel == "nchw_to_nhwc":
        return (n, run, side, side)
    if kernel.startswith("global_avgpool"):
        return (n, side, side, run)
    size, stride = window
    if kernel.startswith("avgpool"):
        return (n, side, side, run, size, stride, 0)
    return (n, side, side, run, size, stride)


def im2col_dims(elements: int, shape: tuple[int, int, int]) -> tuple[int, ...]:
    """An im2col call of about ``elements`` column values with (kernel, padding, channels)
    ``shape`` on 16 x 16 images."""
    k, p, c = shape
    side = 16  # one image size: a shape's run (how many windows overhang) stays one value
    oh = side + 2 * p - k + 1
    return (max(1, elements // (oh * oh * k * k * c)), side, side, c, k, 1, p)


def loop_fn(pool: Any, kernel: str, variant: str, dims: tuple[int, ...]) -> Any:
    """One call of ``variant`` at ``dims`` on pool views (a parallel driver: the prange loop;
    the elementwise loops run over flat or (rows, cols) views, as the kernels hand them)."""
    from microbench.kernels import loops

    def view(i: int, shape: tuple[int, ...]) -> np.ndarray:
        return pool.view(i + 3, shape)  # loops write: they keep off the GEMMs' operands

    if kernel == "gather":
        batch, row_bytes = dims
        width = row_bytes // 4
        rows = max(batch, 4 * MAX_ELEMENTS // max(width, 1) // 4)  # a data set beyond the caches
        data = view(0, (rows, width))
        labels = np.zeros(rows, dtype=np.int64)
        out, out_y = view(1, (batch, width)), np.empty(batch, dtype=np.int64)
        order = np.random.default_rng(0).permutation(rows)
        cursor = [0]

        def gather() -> None:
            start = cursor[0] if cursor[0] + batch <= rows else 0
            index = order[start : start + batch]
            cursor[0] = start + batch
            np.take(data, index, axis=0, out=out)
            np.take(labels, index, axis=0, out=out_y)

        return gather
    if kernel == "copy":
        src, dst = view(0, dims), view(1, dims)
        return lambda: np.copyto(dst, src)
    if kernel == "copy_runs":  # into one of two equal slices of each row (a concat's half):
        rows, run = dims  # a destination of its own, twice the largest view
        src, dst = view(0, dims), np.empty((rows, 2 * run), np.float32)[:, :run]
        return lambda: np.copyto(dst, src)
    if kernel in _BLOCK_KERNELS:
        return _block_fn(kernel, loops, variant, dims, view)
    fn = getattr(loops, variant.replace("sgd_momentum", "sgd"))  # one loop, momentum on
    if kernel == "adam":  # state of its own: moments that stay finite over any repeats
        p, g = view(0, dims).copy(), view(1, dims)
        m, v = np.zeros(dims, np.float32), np.full(dims, 1e-4, np.float32)
        scalars = np.array([1.0, 0.0, 0.9, 0.999, 1.0, 1e-9, 1.0, 1e-8], dtype=np.float32)
        return lambda: fn(p, g, m, v, scalars)
    if kernel in ("relu", "sgd", "sgd_momentum", "relu_mask"):
        x = view(0, dims)
        if kernel == "relu":
            return lambda: fn(x)
        if kernel == "relu_mask":
            y = view(1, dims)
            return lambda: fn(x, y)
        g, v = view(1, dims), view(2, dims)
        momentum = np.float32(0.9 if kernel == "sgd_momentum" else 0.0)
        return lambda: fn(x, g, v, np.float32(1e-9), momentum)
    if kernel == "bias_act":
        x, b = view(0, dims), view(1, (dims[1],))
        return lambda: fn(x, b, True)
    if kernel == "column_sum":
        x, out = view(0, dims), view(1, (dims[1],))
        return lambda: fn(x, out)
    if kernel == "softmax_xent":
        logits, d = view(0, dims), view(1, dims)
        labels = np.zeros(dims[0], dtype=np.int64)
        return lambda: fn(logits, labels, d)
    if kernel in ("im2col", "col2im"):
        n, h, w, c, k, s, p = dims
        oh, ow = conv_output_hw(h, w, k, s, p)
        x, cols = view(0, (n, h, w, c)), view(1, (n * oh * ow, k * k * c))
        if kernel == "im2col":
            return lambda: fn(x, k, s, p, oh, ow, cols)
        return lambda: fn(cols, k, s, p, oh, ow, x)
    if kernel == "nchw_to_nhwc":
        n, c, h, w = dims
        x, out = view(0, dims), view(1, (n, h, w, c))
        return lambda: fn(x, out)
    if kernel == "add":  # in place, as the network sums a skip's gradients
        acc, b = view(0, dims), view(1, dims)
        return lambda: fn(acc, b)
    if kernel.startswith("global_avgpool"):
        image, channels = view(0, dims), view(1, (dims[0], dims[3]))
        if kernel == "global_avgpool":
            return lambda: fn(image, channels)
        return lambda: fn(channels, image)
    if kernel.startswith("avgpool"):
        n, h, w, c, size, stride, p = dims
        oh, ow = conv_output_hw(h, w, size, stride, p)
        image, pooled = view(0, (n, h, w, c)), view(1, (n, oh, ow, c))
        if kernel == "avgpool":
            return lambda: fn(image, size, stride, p, pooled)
        return lambda: fn(pooled, size, stride, p, image)
    n, h, w, c, size, stride = dims
    oh, ow = (h - size) // stride + 1, (w - size) // stride + 1
    big, small = view(0, (n, h, w, c)), view(1, (n, oh, ow, c))
    # Max-pools branch on their data. In training each step brings new data; a call repeated on
    # the same data lets the branch predictor learn its outcomes, which it does for calls of up
    # to some 10^5 taps (a max-pool over 5 channels then ran 3x faster than on fresh data). So
    # each call reads the next of several random inputs (random data that no loop writes, in a
    # GEMM operand's buffer) and random winning taps (the backward's branches).
    taps = np.random.default_rng(0).integers(0, size * size, 2 * n * oh * ow * c, dtype=np.int32)
    argmaxes = fresh_views(taps, (n, oh, ow, c))
    turn = itertools.count()
    if kernel == "maxpool":
        inputs = fresh_views(pool.buffers[0], (n, h, w, c))
        return lambda: fn(inputs[next(turn) % FRESH_DATA], size, stride, small, argmaxes[0])
    if kernel == "maxpool_backward_tiled":
        return lambda: fn(small, argmaxes[next(turn) % FRESH_DATA], size, big)
    return lambda: fn(small, argmaxes[next(turn) % FRESH_DATA], size, stride, big)


# The loops of microbench.kernels.loops_norm and loops_tokens (and numpy's draw), which
# _block_fn calls.
_BLOCK_KERNELS = {
    "layernorm", "layernorm_backward", "batchnorm", "batchnorm_eval", "batchnorm_backward",
    "gelu", "gelu_backward", "dropout", "dropout_backward", "zero", "uniform", "attention",
    "attention_backward", "embedding", "embedding_backward",
}  # fmt: skip


def _block_fn(kernel: str, loops: Any, variant: str, dims: tuple[int, ...], view: Any) -> Any:
    """A call of ``variant`` of a normalisation, activation, dropout, zeroing, attention or
    embedding loop of module ``loops`` (:mod:`microbench.kernels.loops_norm`,
    :mod:`~microbench.kernels.loops_tokens`) at ``dims``, as :mod:`microbench.kernels.cpu`
    makes it."""
    fn, rng = getattr(loops, variant), np.random.default_rng(1)
    if kernel.startswith(("layernorm", "batchnorm")):
        rows, cols = dims
        x, y, xhat = view(0, dims), view(1, dims), view(2, dims)
        ones, zeros = np.ones(cols, np.float32), np.zeros(cols, np.float32)
        if kernel.startswith("layernorm"):
            inv = np.ones((rows, 1), np.float32)
            if kernel == "layernorm":
                return lambda: fn(x, ones, zeros, y, xhat, inv)
            return lambda: fn(x, xhat, inv, ones, ones.copy(), zeros.copy(), y)
        running = np.concatenate([zeros, ones])
        mean, inv = zeros.copy(), ones.copy()
        if kernel == "batchnorm":
            return lambda: fn(x, ones, zeros, running, 0.1, y, xhat, mean, inv)
        if kernel == "batchnorm_eval":
            return lambda: fn(x, ones, zeros, running, y)
        return lambda: fn(x, xhat, ones, inv, ones.copy(), zeros.copy(), y)
    if kernel.startswith("attention"):
        n, t, d, heads, causal = dims
        qkv = rng.standard_normal((3, n, t, d), np.float32)
        p, o = np.empty((n, heads, t, t), np.float32), np.empty((n, t, d), np.float32)
        scale = attention_scale(d, heads)
        loops.attention_serial(qkv, heads, scale, bool(causal), p, o)  # real probabilities
        if kernel == "attention":
            return lambda: fn(qkv, heads, scale, bool(causal), p, o)
        do, dqkv = rng.standard_normal(o.shape, np.float32), np.empty_like(qkv)
        return lambda: fn(qkv, p, o, do, heads, scale, bool(causal), dqkv)
    if kernel.startswith("embedding"):
        n, t, dim = dims
        table = rng.standard_normal((EMBEDDING_VOCAB + t, dim), np.float32)
        ids = rng.integers(0, EMBEDDING_VOCAB, (n, t))
        y = view(0, (n, t, dim))
        if kernel == "embedding":
            x = ids.astype(np.float32)
            return lambda: fn(x, table, EMBEDDING_VOCAB, t, 0, ids, y)
        return lambda: fn(y, ids, EMBEDDING_VOCAB, t, 0, table)
    x, y, z = view(0, dims), view(1, dims), view(2, dims)
    if kernel == "gelu":
        return lambda: fn(x, y, z)
    if kernel == "gelu_backward":
        t = np.tanh(view(2, dims))  # tanh values in [-1, 1]
        return lambda: fn(x, y, t, z)
    if kernel == "dropout":
        return lambda: fn(x, y, np.float32(0.1), np.float32(1 / 0.9), z)  # y: the draws
    if kernel == "dropout_backward":
        return lambda: fn(x, y, z)
    if kernel == "uniform":
        return lambda: fn(rng, z)
    return lambda: fn(z)  # zero


FRESH_DATA = 4  # distinct inputs a data-dependent loop cycles through (fresh_views)


def fresh_views(flat: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
    """:data:`FRESH_DATA` views of ``shape`` into ``flat``, each shifted by a quarter of its
    size (a shift makes a different sequence of values at every position), or the one view
    where ``flat`` holds no room for shifts (a call that large outruns any branch predictor)."""
    size = math.prod(shape)
    step = size // FRESH_DATA + 1
    if size + step * (FRESH_DATA - 1) > flat.size:
        return [flat[:size].reshape(shape)] * FRESH_DATA
    return [flat[k * step : k * step + size].reshape(shape) for k in range(FRESH_DATA)]
