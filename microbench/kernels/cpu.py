"""CPU kernel set: numba loops (:mod:`microbench.kernels.loops`) and numpy's BLAS for GEMMs.

Thread pools. Importing this module makes numba's idle threads sleep rather than spin
(:func:`microbench.threads.prepare_numba_threads`), so that they leave the cores to OpenBLAS's
threads between loops.

OpenBLAS spins too, about 0.1 s after each GEMM, and that can only be changed before numpy
loads it: start processes with ``OPENBLAS_THREAD_TIMEOUT=4`` so that its idle threads sleep at
once. Otherwise, at 2 threads on 2 cores, the numba loops between GEMMs barely gain from the
second thread (see ``benchmarks/train_vs_torch.py --openblas-timeout``).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from microbench.kernels import loops
from microbench.kernels.callspec import call_features
from microbench.kernels.loops_tokens import attention_scale
from microbench.kernels.policy import conv_chunk_samples, runs_parallel
from microbench.kernels.shapes import conv_output_hw, pool_output_hw
from microbench.threads import prepare_numba_threads

prepare_numba_threads()


def _loop(name: str, work: int):
    """The parallel loop ``name`` of :mod:`~microbench.kernels.loops`, or its serial version
    for one thread or less ``work`` than pays for a parallel launch
    (:func:`~microbench.kernels.policy.runs_parallel`; ``work`` counted as
    :func:`microbench.kernels.calls.call_features` counts it)."""
    parallel = runs_parallel(work, numba.get_num_threads())
    return getattr(loops, name if parallel else name + "_serial")


def _attention_work(qkv: np.ndarray, heads: int, causal: bool) -> int:
    """The attention core's work, as :func:`~microbench.kernels.callspec.call_features`
    counts it for the call's dims."""
    _, batch, t, d = qkv.shape
    return call_features("attention", (batch, t, d, heads, int(causal)))[0]


def _matrix(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) view of a C-contiguous array; never a silent copy, which would lose writes."""
    if not a.flags.c_contiguous:
        raise ValueError("kernel arrays must be C-contiguous")
    return a.reshape(rows, cols)


def _flat(a: np.ndarray) -> np.ndarray:
    return _matrix(a, 1, a.size)[0]


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` as (everything but the last axis, last axis)."""
    return _matrix(a, a.size // a.shape[-1], a.shape[-1])


class NumbaKernels:
    """The kernel set for numpy arrays on the CPU (see :mod:`microbench.kernels` for layouts)."""

    name = "numba"
    xp = np

    # dense ---------------------------------------------------------------------------------

    @staticmethod
    def dense_forward(x, w, b, out) -> None:
        np.matmul(x, w, out=out)
        if b is not None:
            NumbaKernels.bias_activation(out, b, False, out)

    @staticmethod
    def dense_backward(x, w, dout, dw, db, dx) -> None:
        np.matmul(x.T, dout, out=dw)
        if db is not None:
            NumbaKernels.channel_sum(dout, db)
        if dx is not None:
            np.matmul(dout, w.T, out=dx)

    @staticmethod
    def tied_dense_backward(x, table, dout, dtable, db, dx) -> None:
        """The backward of ``out = x @ table.T + b`` (an output layer sharing an embedding's
        ``(vocab, d)`` table): ``dtable = dout.T @ x`` and ``db`` written; ``dx = dout @
        table`` unless None."""
        np.matmul(dout.T, x, out=dtable)
        if db is not None:
            NumbaKernels.channel_sum(dout, db)
        if dx is not None:
            np.matmul(dout, table, out=dx)

    # conv2d --------------------------------------------------------------------------------

    @staticmethod
    def conv2d_forward(x, w, b, stride: int, padding: int, cols, out) -> None:
        """im2col and one GEMM a chunk of samples (:func:`~microbench.kernels.policy.
        conv_chunk_samples`), so that the GEMM reads the columns from cache; ``cols`` keeps
        every chunk's columns for the weight gradient."""
        n, h, wd, c = x.shape
        k, f = w.shape[0], w.shape[3]
        out_h, out_w = conv_output_hw(h, wd, k, stride, padding)
        rows, width = out_h * out_w, k * k * c  # per sample
        w2d, out2d = _matrix(w, width, f), _rows(out)
        step = conv_chunk_samples(rows, width, numba.get_num_threads(), cols.itemsize)
        for first in range(0, n, step):
            last = min(n, first + step)
            part = cols[first * rows : last * rows]
            _loop("im2col", part.size)(x[first:last], k, stride, padding, out_h, out_w, part)
            np.matmul(part, w2d, out=out2d[first * rows : last * rows])
        if b is not None:
            NumbaKernels.bias_activation(out, b, False, out)

    @staticmethod
    def conv2d_backward(dout, cols, w, stride: int, padding: int, dw, db, dcols, dx) -> None:
        n, out_h, out_w, f = dout.shape
        k, c = w.shape[0], w.shape[2]
        dout2d = _rows(dout)
        np.matmul(cols.T, dout2d, out=_matrix(dw, k * k * c, f))
        if db is not None:
            NumbaKernels.channel_sum(dout, db)
        if dx is None:
            return
        w_t = _matrix(w, k * k * c, f).T
        rows = out_h * out_w  # per sample
        step = conv_chunk_samples(rows, k * k * c, numba.get_num_threads(), dcols.itemsize)
        for first in range(0, n, step):
            last = min(n, first + step)
            chunk = dcols[: (last - first) * rows]
            np.matmul(dout2d[first * rows : last * rows], w_t, out=chunk)
            _loop("col2im", chunk.size)(chunk, k, stride, padding, out_h, out_w, dx[first:last])

    # elementwise and reductions ------------------------------------------------------------

    @staticmethod
    def bias_activation(x, b, relu: bool, out) -> None:
        """``out = x + b`` (``b`` along the last axis), then ``max(out, 0)`` if ``relu``."""
        if out is not x:
            np.copyto(out, x)
        _loop("bias_act", out.size)(_rows(out), b, relu)

    @staticmethod
    def channel_sum(x, out) -> None:
        """``out`` = the sum of ``x`` over every axis but the last (a bias gradient)."""
        _loop("column_sum", x.size)(_rows(x), out)

    @staticmethod
    def relu_forward(x, out) -> None:
        if out is not x:
            np.copyto(out, x)
        _loop("relu", out.size)(_flat(out))

    @staticmethod
    def relu_backward(dout, y, dx) -> None:
        if dx is not dout:
            np.copyto(dx, dout)
        _loop("relu_mask", dx.size)(_flat(dx), _flat(y))

    @staticmethod
    def copy(src, dst) -> None:
        np.copyto(dst, src)

    @staticmethod
    def add(a, b, out) -> None:
        """``out = a + b`` elementwise; ``out`` may be ``a`` or ``b`` (in place)."""
        if out is b:
            a, b = b, a  # float addition commutes: add in place into out
        elif out is not a:
            np.copyto(out, a)
        _loop("add", out.size)(_flat(out), _flat(b))

    # layernorm and gelu (loops: microbench.kernels.loops_norm) -----------------------------

    @staticmethod
    def layernorm_forward(x, gamma, beta, y, xhat, inv_std) -> None:
        """Normalisation over the last axis: per row, ``inv_std = 1 / sqrt(var + 1e-5)``
        (biased variance; ``inv_std`` is ``(rows..., 1)``), ``xhat = (x - mean) inv_std``,
        ``y = xhat gamma + beta``."""
        rows = x.size // x.shape[-1]
        xhat2d, inv = _rows(xhat), _matrix(inv_std, rows, 1)
        _loop("layernorm", x.size)(_rows(x), gamma, beta, _rows(y), xhat2d, inv)

    @staticmethod
    def layernorm_backward(dy, xhat, inv_std, gamma, dgamma, dbeta, dx) -> None:
        """``dgamma``, ``dbeta`` = the sums over rows of ``dy xhat`` and ``dy`` (written); unless
        ``dx`` is None, with ``g = dy gamma``: ``dx = (g - mean(g) - xhat mean(g xhat))
        inv_std``, the means over the last axis."""
        rows = dy.size // dy.shape[-1]
        inv, dx2d = _matrix(inv_std, rows, 1), None if dx is None else _rows(dx)
        _loop("layernorm_backward", dy.size)(
            _rows(dy), _rows(xhat), inv, gamma, dgamma, dbeta, dx2d
        )

    @staticmethod
    def gelu_forward(x, y, t) -> None:
        """``t = tanh(sqrt(2 / pi) (x + 0.044715 x^3))`` (kept for the backward; None: not
        kept), ``y = 0.5 x (1 + t)``."""
        _loop("gelu", x.size)(_flat(x), _flat(y), None if t is None else _flat(t))

    @staticmethod
    def gelu_backward(dy, x, t, dx) -> None:
        """``dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 0.044715 x^2))``."""
        _loop("gelu_backward", x.size)(_flat(dy), _flat(x), _flat(t), _flat(dx))

    # batchnorm2d (loops: microbench.kernels.loops_norm) ------------------------------------

    @staticmethod
    def batchnorm_forward(x, gamma, beta, running, momentum: float, y, xhat, mean, inv_std):
        """Training batch normalisation over every axis but the last: ``mean`` and
        ``inv_std = 1 / sqrt(var + 1e-5)`` per channel (written; the biased variance),
        ``xhat = (x - mean) inv_std``, ``y = xhat gamma + beta``; ``running`` (the running
        mean, then the running variance) moves by ``momentum`` towards the batch's mean and
        unbiased variance."""
        _loop("batchnorm", x.size)(_rows(x), gamma, beta, running, momentum, _rows(y),
                                   _rows(xhat), mean, inv_std)  # fmt: skip

    @staticmethod
    def batchnorm_eval(x, gamma, beta, running, y) -> None:
        """``y = (x - running mean) / sqrt(running var + 1e-5) gamma + beta``."""
        _loop("batchnorm_eval", x.size)(_rows(x), gamma, beta, running, _rows(y))

    @staticmethod
    def batchnorm_backward(dy, xhat, gamma, inv_std, dgamma, dbeta, dx) -> None:
        """``dgamma``, ``dbeta`` = the sums of ``dy xhat`` and ``dy`` per channel (written);
        unless ``dx`` is None, ``dx = gamma inv_std (dy - mean(dy) - xhat mean(dy xhat))``."""
        _loop("batchnorm_backward", dy.size)(_rows(dy), _rows(xhat), gamma, inv_std, dgamma,
                                             dbeta, None if dx is None else _rows(dx))  # fmt: skip

    # attention (loops: microbench.kernels.loops_tokens) ------------------------------------

    @staticmethod
    def attention_forward(x, w, b, heads: int, causal: bool, qkv, p, o, y) -> None:
        """Self-attention on the ``(batch * T, d)`` rows ``x``: ``qkv[i] = x w[i] + b_i`` (q, k,
        v; ``qkv`` is ``(3, batch, T, d)``, ``b`` the flat ``4 d`` biases or None), per head
        ``p = softmax(q k^T / sqrt(d / heads))`` (``(batch, heads, T, T)``; ``causal``: each
        token sees itself and those before) and ``o = p v``, then ``y = o w[3] + b_3``."""
        d, batch, t = x.shape[-1], qkv.shape[1], qkv.shape[2]
        rows = batch * t
        for i in range(3):
            bias = None if b is None else b[i * d : (i + 1) * d]
            NumbaKernels.dense_forward(x, w[i], bias, _matrix(qkv[i], rows, d))
        work = _attention_work(qkv, heads, causal)
        _loop("attention", work)(qkv, heads, attention_scale(d, heads), causal, p, o)
        bias = None if b is None else b[3 * d :]
        NumbaKernels.dense_forward(_matrix(o, rows, d), w[3], bias, _matrix(y, rows, d))

    @staticmethod
    def attention_backward(dy, x, w, heads: int, causal: bool, qkv, p, o, do, dqkv, dw, db, dx):
        """The gradients of :meth:`attention_forward` from ``dy`` (``(batch * T, d)`` rows):
        ``dw`` (``(4, d, d)``) and ``db`` (or None) written; unless ``dx`` is None, the input
        gradient into it. ``do`` (``o``'s shape) and ``dqkv`` (``qkv``'s) are workspaces."""
        d, batch, t = x.shape[-1], qkv.shape[1], qkv.shape[2]
        rows = batch * t
        do2 = _matrix(do, rows, d)

        def bias(i: int):
            return None if db is None else db[i * d : (i + 1) * d]

        NumbaKernels.dense_backward(_matrix(o, rows, d), w[3], dy, dw[3], bias(3), do2)
        scale = attention_scale(d, heads)
        work = _attention_work(qkv, heads, causal)
        _loop("attention_backward", work)(qkv, p, o, do, heads, scale, causal, dqkv)
        for i in range(3):  # dx = the sum over q, k, v of dqkv[i] w[i]^T; do is spent: scratch
            into = None if dx is None else (dx if i == 0 else do2)
            NumbaKernels.dense_backward(x, w[i], _matrix(dqkv[i], rows, d), dw[i], bias(i), into)
            if i and dx is not None:
                NumbaKernels.add(dx, do2, dx)

    # embedding, dropout, zero (loops: microbench.kernels.loops_tokens) ---------------------

    @staticmethod
    def embedding_forward(x, table, vocab: int, positions: int, types: int, ids, y) -> int:
        """``ids`` (int64) = the token ids ``x`` (float32 ``(batch, T)``), ``y = table[ids]``
        plus the position rows (``positions``: their count, 0 for none) and the first type row
        (``types``: their count); the flat index of the first id that is not an integer in
        ``[0, vocab)``, or -1."""
        return int(loops.embedding(x, table, vocab, positions, types, ids, y))

    @staticmethod
    def embedding_backward(dy, ids, vocab: int, positions: int, types: int, tied: bool, dw):
        """``dw``'s token rows: each token's gradient summed into its row, onto zeros (or, if
        ``tied``, onto the gradient a tied output layer wrote there); its position and type rows
        written (:func:`~microbench.kernels.loops_tokens.embedding_backward`)."""
        if not tied:
            NumbaKernels.zero(dw[:vocab])
        loops.embedding_backward(dy, ids, vocab, positions, types, dw)

    @staticmethod
    def dropout_forward(x, rng, rate: float, host, mask, y) -> None:
        """Inverted dropout: ``mask`` = ``1 / (1 - rate)`` where a uniform draw from ``rng`` is
        at least ``rate``, else 0 (drawn into ``host``, which on the CPU is ``mask``), and
        ``y = x mask``."""
        m = _flat(mask)
        loops.uniform(rng, m)
        scale = np.float32(1.0 / (1.0 - rate))
        _loop("dropout", x.size)(_flat(x), m, np.float32(rate), scale, _flat(y))

    @staticmethod
    def dropout_backward(dy, mask, dx) -> None:
        """``dx = dy mask``."""
        _loop("dropout_backward", dy.size)(_flat(dy), _flat(mask), _flat(dx))

    @staticmethod
    def zero(a) -> None:
        """``a = 0``."""
        _loop("zero", a.size)(_flat(a))

    # maxpool2d -----------------------------------------------------------------------------

    @staticmethod
    def maxpool2d_forward(x, size: int, stride: int, out, argmax) -> None:
        pool_output_hw(x.shape[1], x.shape[2], size, stride)  # validates the window fits
        _loop("maxpool", out.size * size * size)(x, size, stride, out, argmax)

    @staticmethod
    def maxpool2d_backward(dout, argmax, size: int, stride: int, dx) -> None:
        if stride == size:
            _loop("maxpool_backward_tiled", dx.size)(dout, argmax, size, dx)
        else:
            taps = dx.size * math.ceil(size / stride) ** 2  # windows covering each input
            _loop("maxpool_backward", taps)(dout, argmax, size, stride, dx)

    # avgpool2d and global average pool -----------------------------------------------------

    @staticmethod
    def avgpool2d_forward(x, size: int, stride: int, padding: int, out) -> None:
        """The mean of each ``size`` x ``size`` window, zero padding counted in the divisor."""
        conv_output_hw(x.shape[1], x.shape[2], size, stride, padding)  # validates the fit
        _loop("avgpool", out.size * size * size)(x, size, stride, padding, out)

    @staticmethod
    def avgpool2d_backward(dout, size: int, stride: int, padding: int, dx) -> None:
        _loop("avgpool_backward", dx.size)(dout, size, stride, padding, dx)

    @staticmethod
    def global_avgpool_forward(x, out) -> None:
        """(batch, h, w, c) -> (batch, c): the mean over h * w."""
        _loop("global_avgpool", x.size)(x, out)

    @staticmethod
    def global_avgpool_backward(dout, dx) -> None:
        _loop("global_avgpool_backward", dx.size)(dout, dx)

    # layout, loss, update ------------------------------------------------------------------

    @staticmethod
    def nchw_to_nhwc(x, out) -> None:
        _loop("nchw_to_nhwc", x.size)(x, out)

    @staticmethod
    def softmax_cross_entropy(logits, labels, dlogits) -> tuple[float, int]:
        loss, correct = loops.softmax_xent(logits, labels, dlogits)
        return float(loss), int(correct)

    @staticmethod
    def adam_update(params, grads, m, v, scalars, scratch) -> None:
        """One Adam/AdamW step in one pass (:func:`~microbench.kernels.loops.adam_serial`;
        ``scalars``: its eight float32 figures); ``scratch`` is unused."""
        p = _flat(params)
        _loop("adam", p.size)(p, _flat(grads), _flat(m), _flat(v), scalars)

    @staticmethod
    def sgd_update(params, grads, velocity, lr: float, momentum: float, scratch) -> None:
        """``v = momentum * v + g; p -= lr * v`` in one pass (float32 arithmetic throughout);
        ``velocity`` is unused (may be None) when ``momentum`` is 0; ``scratch`` is unused."""
        p, g = _flat(params), _flat(grads)
        v = g if velocity is None else _flat(velocity)
        _loop("sgd", p.size)(p, g, v, np.float32(lr), np.float32(momentum))
