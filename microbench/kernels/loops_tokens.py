"""The numba loops of token networks and of the ops that draw or clear: self-attention's core,
the embedding's gather and scatter, dropout, and zero-filling, behind
:class:`microbench.kernels.cpu.NumbaKernels`.

The conventions of :mod:`microbench.kernels.loops`, which imports these loops into its own
namespace (where :mod:`~microbench.kernels.cpu` looks every loop up by name and
:mod:`~microbench.kernels.record` finds them to wrap): ``NAME_serial`` and its parallel twin
``NAME`` under ``prange``; the embedding's loops are serial only (a scatter-add races).

Attention's core is one loop per (sample, head), which owns that head's slice of every array
it writes, so any parallel split is race-free. Per query row it forms the scores against the
keys it sees (all, or those up to itself when ``causal``), their softmax in place, and the
row's output ``sum_j p_ij v_j``. Every innermost loop runs along contiguous memory without a
reduction, so that it vectorizes with ``fastmath`` off: the scores and ``do v^T`` are built as
rank-1 updates over the head's keys and values transposed into ``(head width, T)`` scratch,
and the products with ``p`` run along the head's width. The backward uses
``sum_j p_ij dp_ij = do_i . o_i`` (since ``o = p v``): one dot product per row instead of a pass
over the probabilities. The scores are scaled by ``scale`` (``1 / sqrt(head dim)``); the
queries stay as projected.

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
def _columns(a, c0, dh):  # pragma: no cover - compiled
    """The ``(dh, T)`` transpose of columns ``c0 .. c0 + dh`` of the ``(T, d)`` rows ``a``: a
    head's keys or values laid out so that a loop over tokens runs along contiguous memory."""
    t = a.shape[0]
    out = np.empty((dh, t), a.dtype)
    for j in range(t):
        for c in range(dh):
            out[c, j] = a[j, c0 + c]
    return out


@njit(cache=True)
def _attention_head(qkv, b, h, heads, scale, causal, p, o):  # pragma: no cover - compiled
    t, d = qkv.shape[2], qkv.shape[3]
    dh = d // heads
    c0 = h * dh
    q, v = qkv[0, b], qkv[2, b]
    kt = _columns(qkv[1, b], c0, dh)
    out = o[b]
    zero = np.float32(0.0)
    for i in range(t):
        seen = i + 1 if causal else t
        row = p[b, h, i]
        for j in range(t):
            row[j] = zero
        for c in range(dh):  # the scores as rank-1 updates: every inner loop runs over keys
            qc, kc = q[i, c0 + c], kt[c]
            for j in range(seen):
                row[j] += qc * kc[j]
        top = -np.inf
        for j in range(seen):
            row[j] *= scale
            top = max(top, row[j])
        for j in range(seen):
            row[j] = np.float32(_exp(np.float64(row[j] - top)))
        inv = np.float32(1.0 / _sum(row[:seen]))
        for j in range(seen):
            row[j] *= inv
        oi = out[i, c0 : c0 + dh]
        for c in range(dh):
            oi[c] = zero
        for j in range(seen):
            pij, vj = row[j], v[j, c0 : c0 + dh]
            for c in range(dh):
                oi[c] += pij * vj[c]


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
    q, k = qkv[0, b], qkv[1, b]
    vt = _columns(qkv[2, b], c0, dh)
    dq, dk, dv = dqkv[0, b], dqkv[1, b], dqkv[2, b]
    ob, dob = o[b], do[b]
    ds = np.empty(t, np.float32)
    zero = np.float32(0.0)
    for j in range(t):
        for c in range(c0, c0 + dh):
            dk[j, c] = zero
            dv[j, c] = zero
    for i in range(t):
        seen = i + 1 if causal else t
        row = p[b, h, i]
        doi, qi, dqi = dob[i, c0 : c0 + dh], q[i, c0 : c0 + dh], dq[i, c0 : c0 + dh]
        rowdot = zero
        for c in range(dh):
            rowdot += doi[c] * ob[i, c0 + c]
        for j in range(seen):
            ds[j] = zero
        for c in range(dh):  # dp = do v^T as rank-1 updates, along the keys
            g, vc = doi[c], vt[c]
            for j in range(seen):
                ds[j] += g * vc[j]
        for j in range(seen):
            ds[j] = row[j] * (ds[j] - rowdot) * scale
        for c in range(dh):
            dqi[c] = zero
        for j in range(seen):
            sj, pj = ds[j], row[j]
            kj, dkj, dvj = k[j, c0 : c0 + dh], dk[j, c0 : c0 + dh], dv[j, c0 : c0 + dh]
            for c in range(dh):
                dqi[c] += sj * kj[c]
                dkj[c] += sj * qi[c]
                dvj[c] += pj * doi[c]


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
