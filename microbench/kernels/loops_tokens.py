"""The numba loops of token networks and of the ops that draw or clear: self-attention's core,
the embedding's gather and scatter, dropout, and zero-filling, behind
:class:`microbench.kernels.cpu.NumbaKernels`.

The conventions of :mod:`microbench.kernels.loops`, which imports these loops into its own
namespace (where :mod:`~microbench.kernels.cpu` looks every loop up by name and
:mod:`~microbench.kernels.record` finds them to wrap): ``NAME_serial`` and its parallel twin
``NAME`` under ``prange``; the embedding's loops are serial only (a scatter-add races).

Attention's core is one loop per (sample, head), which owns that head's slice of every array
it writes, so any parallel split is race-free. A head's queries, keys and values are copied to
contiguous ``(T, head width)`` blocks and its products (``q k^T``, ``p v``; backward ``p^T do``,
``do v^T``, ``ds k``, ``ds^T q``) run as BLAS GEMMs (numba's ``np.dot``, scipy's BLAS, which
:func:`microbench.threads.set_threads` keeps at one thread so that it does not nest inside
numba's): at a transformer's head sizes a GEMM is about twice as fast as the best loop order
numba compiles. Each query row's softmax runs in place between them, over the keys it sees
(all, or those up to itself when ``causal``; the others are set to 0). The backward uses
``sum_j p_ij dp_ij = do_i . o_i`` (since ``o = p v``): one dot product per row instead of a pass
over the probabilities. The scores are scaled by ``scale`` (``1 / sqrt(head dim)``); the
queries stay as projected. The serial and parallel loops run the same head function, so they
give the same bits.

:func:`uniform` is the one entry that is not compiled: the host generator's fill of a mask,
which runs through numpy's ``Generator`` so that every execution mode and kernel set draws the
same values from one seed. It sits with the loops so that it is recorded and timed as a kernel.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = [
    "attention", "attention_backward", "attention_backward_serial", "attention_scale",
    "attention_serial",
    "dropout", "dropout_backward", "dropout_backward_serial", "dropout_serial", "embedding",
    "embedding_backward", "uniform", "zero", "zero_serial",
]  # fmt: skip

CHUNKS = 64  # as microbench.kernels.loops.CHUNKS (which imports this module)
# _exp: e^u = (e^(u / 2^10))^(2^10), e^(u / 2^10) its Taylor polynomial to degree 7 (|u / 2^10|
# <= 0.102: a remainder below 3e-13, which ten squarings make 3e-10); below -104 float32's
# e^u is 0.
_EXP_SQUARINGS = 10
_EXP_FLOOR = -104.0
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7 = (1.0 / math.factorial(k) for k in range(8))


@njit(cache=True)
def _chunk(n, t):  # pragma: no cover - compiled
    return t * n // CHUNKS, (t + 1) * n // CHUNKS


# ---------------------------------------------------------------------------------------------
# Attention: qkv (3, batch, T, d) as projected; p (batch, heads, T, T); o, do (batch, T, d)


def attention_scale(width: int, heads: int) -> np.float32:
    """The factor on attention's scores: ``1 / sqrt(head width)``, as float32."""
    return np.float32(1.0 / math.sqrt(width // heads))


@njit(cache=True, fastmath={"contract"}, error_model="numpy")
def _exp(u):  # pragma: no cover - compiled
    """e^u of a float64 ``u <= 0`` (a softmax's shifted score) to 3e-10 relative; multiplies
    and adds only, so that a loop of it vectorizes (numba's ``np.exp`` is a scalar libm call,
    4x slower over a softmax's rows), and rounded to float32 as exact as libm's."""
    y = max(u, _EXP_FLOOR) * (1.0 / 2**_EXP_SQUARINGS)
    p = _E6 + y * _E7
    p = _E5 + y * p
    p = _E4 + y * p
    p = _E3 + y * p
    p = _E2 + y * p
    p = _E1 + y * p
    p = _E0 + y * p
    for _ in range(_EXP_SQUARINGS):
        p = p * p
    return p


@njit(cache=True, fastmath={"reassoc"})
def _sum(a):  # pragma: no cover - compiled
    """The float64 sum of a 1-D float32 array, in any order (so that it vectorizes)."""
    s = 0.0
    for j in range(a.size):
        s += a[j]
    return s


@njit(cache=True)
def _head_block(a, c0, dh):  # pragma: no cover - compiled
    """Columns ``c0 .. c0 + dh`` of the ``(T, d)`` rows ``a`` as a contiguous ``(T, dh)``
    array: one head's queries, keys or values as BLAS takes them."""
    t = a.shape[0]
    out = np.empty((t, dh), a.dtype)
    for j in range(t):
        for c in range(dh):
            out[j, c] = a[j, c0 + c]
    return out


@njit(cache=True)
def _put_head(block, c0, a):  # pragma: no cover - compiled
    """``block`` (``(T, dh)``) into columns ``c0 ..`` of the ``(T, d)`` rows ``a``."""
    for j in range(block.shape[0]):
        for c in range(block.shape[1]):
            a[j, c0 + c] = block[j, c]


@njit(cache=True)
def _attention_head(qkv, b, h, heads, scale, causal, p, o):  # pragma: no cover - compiled
    t, d = qkv.shape[2], qkv.shape[3]
    dh = d // heads
    c0 = h * dh
    qh, kh = _head_block(qkv[0, b], c0, dh), _head_block(qkv[1, b], c0, dh)
    scores = np.dot(qh, kh.T)
    ph = p[b, h]
    zero = np.float32(0.0)
    for i in range(t):
        seen = i + 1 if causal else t
        row, si = ph[i], scores[i]
        top = -np.inf
        for j in range(seen):
            row[j] = si[j] * scale
            top = max(top, row[j])
        for j in range(seen):
            row[j] = np.float32(_exp(np.float64(row[j] - top)))
        inv = np.float32(1.0 / _sum(row[:seen]))
        for j in range(seen):
            row[j] *= inv
        for j in range(seen, t):
            row[j] = zero
    _put_head(np.dot(ph, _head_block(qkv[2, b], c0, dh)), c0, o[b])


@njit(cache=True)
def attention_serial(qkv, heads, scale, causal, p, o):  # pragma: no cover - compiled
    """Per (sample, head): ``p = softmax(scale q k^T)`` (masked to ``j <= i`` if ``causal``;
    masked entries 0) and that head's columns of ``o = p v``."""
    for bh in range(qkv.shape[1] * heads):
        _attention_head(qkv, bh // heads, bh % heads, heads, scale, causal, p, o)


@njit(parallel=True, cache=True)
def attention(qkv, heads, scale, causal, p, o):  # pragma: no cover - compiled
    for bh in prange(qkv.shape[1] * heads):
        _attention_head(qkv, bh // heads, bh % heads, heads, scale, causal, p, o)


@njit(cache=True)
def _attention_head_backward(qkv, p, o, do, b, h, heads, scale, causal, dqkv):  # pragma: no cover
    t, d = qkv.shape[2], qkv.shape[3]
    dh = d // heads
    c0 = h * dh
    doh, ob = _head_block(do[b], c0, dh), o[b]
    ph = p[b, h]
    _put_head(np.dot(ph.T, doh), c0, dqkv[2, b])  # dv = p^T do
    ds = np.dot(doh, _head_block(qkv[2, b], c0, dh).T)  # dp = do v^T, then the softmax's
    for i in range(t):
        rowdot = np.float32(0.0)
        for c in range(dh):
            rowdot += doh[i, c] * ob[i, c0 + c]
        row, di = ph[i], ds[i]
        for j in range(t):  # masked entries have p = 0, so their ds is 0
            di[j] = row[j] * (di[j] - rowdot) * scale
    _put_head(np.dot(ds, _head_block(qkv[1, b], c0, dh)), c0, dqkv[0, b])  # dq = ds k
    _put_head(np.dot(ds.T, _head_block(qkv[0, b], c0, dh)), c0, dqkv[1, b])  # dk = ds^T q


@njit(cache=True)
def attention_backward_serial(qkv, p, o, do, heads, scale, causal, dqkv):  # pragma: no cover
    """Given the forward's ``qkv``, ``p`` and ``o`` and the output gradient ``do``, each head's
    columns of ``dq``, ``dk``, ``dv`` in ``dqkv`` (written)."""
    for bh in range(qkv.shape[1] * heads):
        _attention_head_backward(qkv, p, o, do, bh // heads, bh % heads, heads, scale, causal,
                                 dqkv)  # fmt: skip


@njit(parallel=True, cache=True)
def attention_backward(qkv, p, o, do, heads, scale, causal, dqkv):  # pragma: no cover
    for bh in prange(qkv.shape[1] * heads):
        _attention_head_backward(qkv, p, o, do, bh // heads, bh % heads, heads, scale, causal,
                                 dqkv)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Embedding: ids as float32 values (batch, T); table rows: tokens, then positions, then types


@njit(cache=True)
def embedding(x, table, vocab, positions, types, ids, y):  # pragma: no cover - compiled
    """``ids = x`` as integers and ``y[b, t] = table[ids] (+ table[vocab + t] if positions)
    (+ table[vocab + positions] if types)``; returns the flat index of the first id that is
    not an integer in ``[0, vocab)`` (nothing written past it), or -1."""
    n, t = x.shape
    dim = table.shape[1]
    for b in range(n):
        for s in range(t):
            v = x[b, s]
            if not (v >= 0.0 and v < vocab and v == np.floor(v)):  # NaN fails too
                return b * t + s
            r = np.int64(v)
            ids[b, s] = r
            out, src = y[b, s], table[r]
            for c in range(dim):
                out[c] = src[c]
            if positions:
                pos = table[vocab + s]
                for c in range(dim):
                    out[c] += pos[c]
            if types:
                typ = table[vocab + positions]
                for c in range(dim):
                    out[c] += typ[c]
    return -1


@njit(cache=True)
def embedding_backward(dy, ids, vocab, positions, types, dw):  # pragma: no cover - compiled
    """Adds each token's gradient into its row of ``dw`` (whose token rows the caller has set:
    zeroed, or a tied output layer's gradient); writes the position rows (summed over the
    batch; rows past the sequence 0) and the type rows (row 0: the sum of every token, others
    0)."""
    n, t, dim = dy.shape
    for b in range(n):
        for s in range(t):
            acc, src = dw[ids[b, s]], dy[b, s]
            for c in range(dim):
                acc[c] += src[c]
    zero = np.float32(0.0)
    if positions:
        for s in range(positions):
            acc = dw[vocab + s]
            for c in range(dim):
                acc[c] = zero
            if s < t:
                for b in range(n):
                    src = dy[b, s]
                    for c in range(dim):
                        acc[c] += src[c]
    if types:
        for r in range(vocab + positions, vocab + positions + types):
            for c in range(dim):
                dw[r, c] = zero
        acc = dw[vocab + positions]
        for b in range(n):
            for s in range(t):
                src = dy[b, s]
                for c in range(dim):
                    acc[c] += src[c]


# ---------------------------------------------------------------------------------------------
# Dropout and zero-filling (1-D arrays: the wrappers pass flat views)


def uniform(rng, out):
    """``out`` (float32) filled with uniform draws in [0, 1) from numpy generator ``rng``."""
    rng.random(dtype=np.float32, out=out)


@njit(cache=True)
def dropout_serial(x, mask, rate, scale, y):  # pragma: no cover - compiled
    """``mask`` (uniform draws in, in place) becomes ``scale`` where the draw is at least
    ``rate`` and 0 elsewhere; ``y = x mask``."""
    zero = np.float32(0.0)
    for i in range(x.size):
        m = scale if mask[i] >= rate else zero
        mask[i] = m
        y[i] = x[i] * m


@njit(parallel=True, cache=True)
def dropout(x, mask, rate, scale, y):  # pragma: no cover - compiled
    for k in prange(CHUNKS):
        lo, hi = _chunk(x.size, k)
        dropout_serial(x[lo:hi], mask[lo:hi], rate, scale, y[lo:hi])


@njit(cache=True)
def dropout_backward_serial(dy, mask, dx):  # pragma: no cover - compiled
    """``dx = dy mask``."""
    for i in range(dy.size):
        dx[i] = dy[i] * mask[i]


@njit(parallel=True, cache=True)
def dropout_backward(dy, mask, dx):  # pragma: no cover - compiled
    for k in prange(CHUNKS):
        lo, hi = _chunk(dy.size, k)
        dropout_backward_serial(dy[lo:hi], mask[lo:hi], dx[lo:hi])


@njit(cache=True)
def zero_serial(a):  # pragma: no cover - compiled
    """``a = 0``."""
    for i in range(a.size):
        a[i] = 0.0


@njit(parallel=True, cache=True)
def zero(a):  # pragma: no cover - compiled
    for k in prange(CHUNKS):
        lo, hi = _chunk(a.size, k)
        zero_serial(a[lo:hi])
