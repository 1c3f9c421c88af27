"""The numba loops behind :class:`microbench.kernels.cpu.NumbaKernels`.

Each loop that touches a whole activation runs with ``prange`` over the batch (times output
rows), so it scales with the thread count like the GEMMs do. The im2col inverse and the
pooling backwards are gathers ("each input element sums what lands on it"), race-free under any
parallel split and without a separate zeroing pass. Elementwise loops come in two drivers, a
serial one for small arrays (a parallel launch costs microseconds, more than the work) and a
parallel one that splits rows into chunks, over one serial body. The whole-activation loops
have serial twins too: with one thread, a parallel launch still hands the work to a worker
thread and waits (tens of microseconds, more on a loaded machine). ``NAME_serial`` is always
the serial version of the parallel ``NAME``.

``fastmath`` stays off so results match the array kernels to rounding.
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit, prange

# Chunks a parallel elementwise loop or reduction is split into: plenty for any thread count.
CHUNKS = 64


@njit(parallel=True, cache=True)
def im2col(x, k, stride, pad, out_h, out_w, cols):  # pragma: no cover - compiled
    """cols[(i, oh, ow), (kh, kw, c)] = x[i, oh*stride - pad + kh, ow*stride - pad + kw, c]."""
    n, h, w, c = x.shape
    xf = x.reshape(-1)
    kc = k * c
    for r in prange(n * out_h):
        i = r // out_h
        oh = r - i * out_h
        for ow in range(out_w):
            row = r * out_w + ow
            iw0 = ow * stride - pad
            inside_w = iw0 >= 0 and iw0 + k <= w
            for kh in range(k):
                ih = oh * stride - pad + kh
                col = kh * kc
                if ih < 0 or ih >= h:
                    for q in range(kc):
                        cols[row, col + q] = 0.0
                elif inside_w:  # the k * c values of this kernel row lie contiguous in x
                    base = ((i * h + ih) * w + iw0) * c
                    for q in range(kc):
                        cols[row, col + q] = xf[base + q]
                else:
                    for kw in range(k):
                        iw = iw0 + kw
                        if iw < 0 or iw >= w:
                            for ch in range(c):
                                cols[row, col + kw * c + ch] = 0.0
                        else:
                            base = ((i * h + ih) * w + iw) * c
                            for ch in range(c):
                                cols[row, col + kw * c + ch] = xf[base + ch]


@njit(parallel=True, cache=True)
def col2im(dcols, k, stride, pad, out_h, out_w, dx):  # pragma: no cover - compiled
    """The adjoint of :func:`im2col`: dx sums every column entry that copied from it."""
    n, h, w, c = dx.shape
    for r in prange(n * h):
        i = r // h
        ih = r - i * h
        for iw in range(w):
            for ch in range(c):
                dx[i, ih, iw, ch] = 0.0
            for kh in range(k):
                t = ih + pad - kh
                if t < 0 or t % stride != 0 or t // stride >= out_h:
                    continue
                oh = t // stride
                for kw in range(k):
                    u = iw + pad - kw
                    if u < 0 or u % stride != 0 or u // stride >= out_w:
                        continue
                    row = (i * out_h + oh) * out_w + u // stride
                    col = (kh * k + kw) * c
                    for ch in range(c):
                        dx[i, ih, iw, ch] += dcols[row, col + ch]


@njit(parallel=True, cache=True)
def maxpool(x, size, stride, out, argmax):  # pragma: no cover - compiled
    n, out_h, out_w, c = out.shape
    for r in prange(n * out_h):
        i = r // out_h
        oh = r - i * out_h
        for ow in range(out_w):
            ih0, iw0 = oh * stride, ow * stride
            for ch in range(c):
                out[i, oh, ow, ch] = x[i, ih0, iw0, ch]
                argmax[i, oh, ow, ch] = 0
            for di in range(size):
                for dj in range(size):
                    if di == 0 and dj == 0:
                        continue
                    tap = di * size + dj
                    for ch in range(c):
                        v = x[i, ih0 + di, iw0 + dj, ch]
                        if v > out[i, oh, ow, ch]:  # strict: ties keep the first tap
                            out[i, oh, ow, ch] = v
                            argmax[i, oh, ow, ch] = tap


@njit(parallel=True, cache=True)
def maxpool_backward(dout, argmax, size, stride, dx):  # pragma: no cover - compiled
    n, h, w, c = dx.shape
    out_h, out_w = dout.shape[1], dout.shape[2]
    for r in prange(n * h):
        i = r // h
        ih = r - i * h
        oh_lo = max(0, (ih - size + stride) // stride)  # ceil((ih - size + 1) / stride)
        oh_hi = min(out_h - 1, ih // stride)
        for iw in range(w):
            for ch in range(c):
                dx[i, ih, iw, ch] = 0.0
            ow_lo = max(0, (iw - size + stride) // stride)
            ow_hi = min(out_w - 1, iw // stride)
            for oh in range(oh_lo, oh_hi + 1):
                for ow in range(ow_lo, ow_hi + 1):
                    tap = (ih - oh * stride) * size + (iw - ow * stride)
                    for ch in range(c):
                        if argmax[i, oh, ow, ch] == tap:
                            dx[i, ih, iw, ch] += dout[i, oh, ow, ch]


@njit(parallel=True, cache=True)
def maxpool_backward_tiled(dout, argmax, size, dx):  # pragma: no cover - compiled
    """:func:`maxpool_backward` for stride == size: windows tile the input, so each input
    element gets its one window's gradient or 0, written in order (no search, no zeroing)."""
    n, h, w, c = dx.shape
    out_h, out_w = dout.shape[1], dout.shape[2]
    for r in prange(n * out_h):
        i = r // out_h
        oh = r - i * out_h
        last = h if oh == out_h - 1 else (oh + 1) * size  # the last window row takes the rest
        for ih in range(oh * size, last):
            di = ih - oh * size
            if di >= size:
                for iw in range(w):
                    for ch in range(c):
                        dx[i, ih, iw, ch] = 0.0
                continue
            for ow in range(out_w):
                for dj in range(size):
                    iw = ow * size + dj
                    tap = di * size + dj
                    for ch in range(c):
                        hit = argmax[i, oh, ow, ch] == tap
                        dx[i, ih, iw, ch] = dout[i, oh, ow, ch] if hit else 0.0
            for iw in range(out_w * size, w):
                for ch in range(c):
                    dx[i, ih, iw, ch] = 0.0


@njit(parallel=True, cache=True)
def nchw_to_nhwc(x, out):  # pragma: no cover - compiled
    n, c, h, w = x.shape
    for r in prange(n * h):
        i = r // h
        ih = r - i * h
        for iw in range(w):
            for ch in range(c):
                out[i, ih, iw, ch] = x[i, ch, ih, iw]


@njit(parallel=True, cache=True)
def avgpool(x, size, stride, pad, out):  # pragma: no cover - compiled
    """out[i, oh, ow] = the mean of x's window at (oh*stride - pad, ow*stride - pad); padding
    counts as zeros in the divisor (always size * size)."""
    n, h, w, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    inv = out.dtype.type(1.0 / (size * size))  # the array's type: float32 stays vectorized
    for r in prange(n * out_h):
        i = r // out_h
        oh = r - i * out_h
        for ow in range(out_w):
            acc = out[i, oh, ow]
            acc[:] = 0.0
            for di in range(size):
                ih = oh * stride - pad + di
                if ih < 0 or ih >= h:
                    continue
                for dj in range(size):
                    iw = ow * stride - pad + dj
                    if iw < 0 or iw >= w:
                        continue
                    src = x[i, ih, iw]
                    for ch in range(c):
                        acc[ch] += src[ch]
            for ch in range(c):
                acc[ch] *= inv


@njit(parallel=True, cache=True)
def avgpool_backward(dout, size, stride, pad, dx):  # pragma: no cover - compiled
    """The adjoint of :func:`avgpool`: dx sums dout / (size * size) over the windows covering it."""
    n, h, w, c = dx.shape
    out_h, out_w = dout.shape[1], dout.shape[2]
    inv = dx.dtype.type(1.0 / (size * size))
    for r in prange(n * h):
        i = r // h
        ih = r - i * h
        t = ih + pad  # the row in the padded input
        oh_lo = max(0, (t - size + stride) // stride)  # ceil((t - size + 1) / stride)
        oh_hi = min(out_h - 1, t // stride)
        for iw in range(w):
            u = iw + pad
            ow_lo = max(0, (u - size + stride) // stride)
            ow_hi = min(out_w - 1, u // stride)
            acc = dx[i, ih, iw]
            acc[:] = 0.0
            for oh in range(oh_lo, oh_hi + 1):
                for ow in range(ow_lo, ow_hi + 1):
                    src = dout[i, oh, ow]
                    for ch in range(c):
                        acc[ch] += src[ch]
            for ch in range(c):
                acc[ch] *= inv


@njit(parallel=True, cache=True)
def global_avgpool(x, out):  # pragma: no cover - compiled
    """out[i, ch] = the mean of x[i, :, :, ch]."""
    n, h, w, c = x.shape
    inv = out.dtype.type(1.0 / (h * w))
    for i in prange(n):
        acc = out[i]
        acc[:] = 0.0
        for ih in range(h):
            for iw in range(w):
                src = x[i, ih, iw]
                for ch in range(c):
                    acc[ch] += src[ch]
        for ch in range(c):
            acc[ch] *= inv


@njit(parallel=True, cache=True)
def global_avgpool_backward(dout, dx):  # pragma: no cover - compiled
    """dx[i, ih, iw, ch] = dout[i, ch] / (h * w)."""
    n, h, w, c = dx.shape
    inv = dx.dtype.type(1.0 / (h * w))
    for r in prange(n * h):
        i = r // h
        ih = r - i * h
        src = dout[i]
        for iw in range(w):
            dst = dx[i, ih, iw]
            for ch in range(c):
                dst[ch] = src[ch] * inv


def _serial_twin(parallel):
    """The same loop compiled without ``parallel`` (``prange`` runs as ``range``).

    It is a renamed copy of the Python function: numba names its on-disk cache after the
    function's qualified name and line and does not key it on ``parallel``, so the twin would
    otherwise load the parallel machine code."""
    f = parallel.py_func
    twin = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__)
    twin.__qualname__ = f.__qualname__ + "_serial"
    twin.__doc__ = f.__doc__
    return njit(cache=True)(twin)


im2col_serial = _serial_twin(im2col)
col2im_serial = _serial_twin(col2im)
maxpool_serial = _serial_twin(maxpool)
maxpool_backward_serial = _serial_twin(maxpool_backward)
maxpool_backward_tiled_serial = _serial_twin(maxpool_backward_tiled)
nchw_to_nhwc_serial = _serial_twin(nchw_to_nhwc)
avgpool_serial = _serial_twin(avgpool)
avgpool_backward_serial = _serial_twin(avgpool_backward)
global_avgpool_serial = _serial_twin(global_avgpool)
global_avgpool_backward_serial = _serial_twin(global_avgpool_backward)


# ---------------------------------------------------------------------------------------------
# Elementwise loops and reductions: ``NAME_serial`` loops over whole arrays (``range(size)``
# from 0, so LLVM sees non-negative indices and vectorizes) and ``NAME`` hands it contiguous
# chunks in parallel. They work in place: with two arguments that may alias, LLVM's runtime
# overlap check sends an in-place call down its scalar path (10x slower).


@njit(cache=True)
def _chunk(n, t):  # pragma: no cover - compiled
    """Bounds [lo, hi) of chunk ``t`` of ``CHUNKS`` over ``n`` items."""
    return t * n // CHUNKS, (t + 1) * n // CHUNKS


@njit(cache=True)
def bias_act_serial(x, b, relu):  # pragma: no cover - compiled
    """``x = x + b`` (rows of a 2-D ``x``), then ``max(x, 0)`` if ``relu``; in place."""
    rows, f = x.shape
    for r in range(rows):
        for j in range(f):
            v = x[r, j] + b[j]
            if relu:
                v = v if v > 0.0 else 0.0
            x[r, j] = v


@njit(parallel=True, cache=True)
def bias_act(x, b, relu):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(x.shape[0], t)
        bias_act_serial(x[lo:hi], b, relu)


@njit(cache=True)
def relu_serial(x):  # pragma: no cover - compiled
    for i in range(x.size):
        v = x[i]
        x[i] = v if v > 0.0 else 0.0


@njit(parallel=True, cache=True)
def relu(x):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(x.size, t)
        relu_serial(x[lo:hi])


@njit(cache=True)
def add_serial(acc, b):  # pragma: no cover - compiled
    """``acc += b``; in place."""
    for i in range(acc.size):
        acc[i] += b[i]


@njit(parallel=True, cache=True)
def add(acc, b):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(acc.size, t)
        add_serial(acc[lo:hi], b[lo:hi])


@njit(cache=True)
def relu_mask_serial(d, y):  # pragma: no cover - compiled
    """``d = d`` where ``y > 0``, else 0; in place (the relu backward)."""
    for i in range(d.size):
        d[i] = d[i] if y[i] > 0.0 else 0.0


@njit(parallel=True, cache=True)
def relu_mask(d, y):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(d.size, t)
        relu_mask_serial(d[lo:hi], y[lo:hi])


@njit(cache=True)
def column_sum_serial(a, out):  # pragma: no cover - compiled
    """``out`` = the sum of the rows of ``a``."""
    rows, f = a.shape
    out[:] = 0.0
    for r in range(rows):
        for j in range(f):
            out[j] += a[r, j]


@njit(parallel=True, cache=True)
def column_sum(a, out):  # pragma: no cover - compiled
    partial = np.empty((CHUNKS, a.shape[1]), dtype=a.dtype)
    for t in prange(CHUNKS):
        lo, hi = _chunk(a.shape[0], t)
        column_sum_serial(a[lo:hi], partial[t])
    column_sum_serial(partial, out)


@njit(cache=True)
def sgd_serial(params, grads, velocity, lr, momentum):  # pragma: no cover - compiled
    """``v = momentum * v + g; p -= lr * v`` (``velocity`` unused when momentum is 0)."""
    if momentum == 0.0:
        for i in range(params.size):
            params[i] -= lr * grads[i]
    else:
        for i in range(params.size):
            v = momentum * velocity[i] + grads[i]
            velocity[i] = v
            params[i] -= lr * v


@njit(parallel=True, cache=True)
def sgd(params, grads, velocity, lr, momentum):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(params.size, t)
        sgd_serial(params[lo:hi], grads[lo:hi], velocity[lo:hi], lr, momentum)


@njit(cache=True)
def adam_serial(params, grads, m, v, scalars):  # pragma: no cover - compiled
    """One Adam (or AdamW) step in place; ``scalars`` (float32): grad scale, L2 weight decay,
    beta1, beta2, decoupled decay factor, step size (lr over beta1's bias correction), one over
    the square root of beta2's bias correction, eps. ``g = scale grads + l2 params``,
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``params = decay params - step m / (sqrt(v) rsq + eps)``."""
    scale, l2, b1, b2 = scalars[0], scalars[1], scalars[2], scalars[3]
    decay, step, rsq, eps = scalars[4], scalars[5], scalars[6], scalars[7]
    for i in range(params.size):
        g = grads[i] * scale + l2 * params[i]
        mi = b1 * m[i] + (1 - b1) * g
        vi = b2 * v[i] + (1 - b2) * g * g
        m[i] = mi
        v[i] = vi
        params[i] = decay * params[i] - step * mi / (np.sqrt(vi) * rsq + eps)


@njit(parallel=True, cache=True)
def adam(params, grads, m, v, scalars):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(params.size, t)
        adam_serial(params[lo:hi], grads[lo:hi], m[lo:hi], v[lo:hi], scalars)


@njit(cache=True)
def softmax_xent(logits, labels, dlogits):  # pragma: no cover - compiled
    """Mean cross-entropy, correct argmax count, and its gradient (softmax - onehot) / batch."""
    batch, classes = logits.shape
    inv = 1.0 / batch
    loss = 0.0
    correct = 0
    for i in range(batch):
        best = 0
        m = logits[i, 0]
        for j in range(1, classes):
            if logits[i, j] > m:
                m = logits[i, j]
                best = j
        label = labels[i]
        if best == label:
            correct += 1
        total = 0.0  # float64 accumulators: the loss is reported, keep it accurate
        for j in range(classes):
            total += np.exp(np.float64(logits[i, j] - m))
        loss += np.log(total) - np.float64(logits[i, label] - m)
        for j in range(classes):
            dlogits[i, j] = np.exp(np.float64(logits[i, j] - m)) / total * inv
        dlogits[i, label] -= inv
    return loss * inv, correct


# The normalisation, GELU and token loops live in modules of their own; here they are loops
# like the others, where cpu.py (and record.py's kernels_replaced) look every loop up by name.
from microbench.kernels.loops_norm import (  # noqa: E402, F401
    batchnorm,
    batchnorm_backward,
    batchnorm_backward_serial,
    batchnorm_eval,
    batchnorm_eval_serial,
    batchnorm_serial,
    gelu,
    gelu_backward,
    gelu_backward_serial,
    gelu_serial,
    layernorm,
    layernorm_backward,
    layernorm_backward_serial,
    layernorm_serial,
)
from microbench.kernels.loops_tokens import (  # noqa: E402, F401
    attention,
    attention_backward,
    attention_backward_serial,
    attention_serial,
    dropout,
    dropout_backward,
    dropout_backward_serial,
    dropout_serial,
    embedding,
    embedding_backward,
    uniform,
    zero,
    zero_serial,
)
