"""The numba loops of layer normalisation and GELU, behind
:class:`microbench.kernels.cpu.NumbaKernels` (``layernorm_forward`` and the others).

The conventions of :mod:`microbench.kernels.loops`: ``NAME_serial`` runs over whole arrays and
the parallel ``NAME`` hands it contiguous chunks of rows (or of elements) under ``prange``.
:mod:`~microbench.kernels.loops` imports these loops into its own namespace, where
:mod:`~microbench.kernels.cpu` looks every loop up by name (and
:mod:`~microbench.kernels.record` finds them to wrap).

Layer normalisation works on 2-D ``(rows, features)`` views. The mean and the biased variance
of a row come from one pass that sums ``x`` and ``x^2`` in float64 (the squares of float32
values are exact; the cancellation in ``E[x^2] - mean^2`` costs float64 digits only, so the
statistics are as good as numpy's float32 two-pass ones until ``|mean| / std`` passes about
1e4, where numpy's own float32 ``x - mean`` has long lost them). The backward's row sums
(``g`` and ``g xhat``) and its sums over rows (``dgamma``, ``dbeta``) are float64 too. The two
row-sum helpers let LLVM reorder their float64 sums (``fastmath={"reassoc"}``, nothing else),
so that the sums vectorize: a sum in order is one chain of dependent adds, 4x slower; the order
moves a float64 sum by float64 rounding only, far below the float32 results.

GELU is the tanh form, ``0.5 x (1 + tanh(C (x + A x^3)))`` with ``C = sqrt(2 / pi)`` and
``A = 0.044715``, evaluated as :class:`microbench.nn.blocks.Gelu` orders it; the forward keeps
the tanh for the backward. numba's ``np.tanh`` is a scalar libm call (about 15 ns an element:
the forward ran 15x slower than numpy's nine vectorized passes), so :func:`_tanh` computes it
in float64 from multiplies, adds and one divide, which vectorize; rounded to float32 it is
correctly rounded in all but about 2 in 1e5 cases, 0.5 ulp at most (numpy's float32 tanh:
1.4 ulp at most).

``fastmath`` stays off everywhere else (but for ``contract`` in :func:`_tanh`: fused
multiply-adds in its polynomial), so results match the array kernels to rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = [
    "batchnorm",
    "batchnorm_backward",
    "batchnorm_backward_serial",
    "batchnorm_eval",
    "batchnorm_eval_serial",
    "batchnorm_serial",
    "gelu",
    "gelu_backward",
    "gelu_backward_serial",
    "gelu_serial",
    "layernorm",
    "layernorm_backward",
    "layernorm_backward_serial",
    "layernorm_serial",
]

# Chunks a parallel loop is split into, as in microbench.kernels.loops (which imports this
# module, so this one cannot import from it).
CHUNKS = 64
EPS = 1e-5  # both normalisations, as PyTorch's default
GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715

# _tanh: expm1(-2|u|) is expm1(-2|u| / 16) squared four times as 1 + e (e -> e (2 + e), which
# does not grow e's relative error); expm1 on [-1.15, 0] is its Taylor polynomial to degree 9.
# Beyond |u| = 9.2 float32's tanh is +-1: the argument stops there (NaN passes).
_TANH_SQUARINGS = 4
_TANH_SCALE = -2.0 / 2**_TANH_SQUARINGS
_TANH_FLOOR = 9.2 * _TANH_SCALE
_T2, _T3, _T4, _T5, _T6, _T7, _T8, _T9 = (1.0 / math.factorial(k) for k in range(2, 10))


@njit(cache=True)
def _chunk(n, t):  # pragma: no cover - compiled
    """Bounds [lo, hi) of chunk ``t`` of ``CHUNKS`` over ``n`` items."""
    return t * n // CHUNKS, (t + 1) * n // CHUNKS


@njit(cache=True, fastmath={"reassoc"})
def _row_moments(x):  # pragma: no cover - compiled
    """(sum of ``x``, sum of ``x^2``) of a 1-D float32 row, in float64 (in any order)."""
    s = 0.0
    q = 0.0
    for j in range(x.size):
        v = np.float64(x[j])
        s += v
        q += v * v
    return s, q


@njit(cache=True, fastmath={"reassoc"})
def _row_g_sums(dy, gamma, xhat):  # pragma: no cover - compiled
    """(sum of ``g``, sum of ``g xhat``) with ``g = dy gamma`` (float32, as numpy has it) of
    1-D float32 rows, in float64 (in any order)."""
    s = 0.0
    p = 0.0
    for j in range(dy.size):
        g = np.float64(dy[j] * gamma[j])
        s += g
        p += g * xhat[j]
    return s, p


@njit(cache=True, fastmath={"contract"}, error_model="numpy")
def _tanh(u):  # pragma: no cover - compiled
    """tanh of a float64 ``u`` to 1e-11 relative (1e-15 for ``|u| < 1``; see
    ``_TANH_SQUARINGS``); only multiplies, adds, one divide and selects, so that a loop of it
    vectorizes. ``contract`` lets the polynomial use fused multiply-adds (the GELU loop twice
    as fast; more accurate if anything); ``error_model`` drops the Python zero-divide check,
    which keeps a loop from vectorizing (the divisor is at least 1)."""
    y = abs(u) * _TANH_SCALE
    if y < _TANH_FLOOR:
        y = _TANH_FLOOR
    p = _T8 + y * _T9
    p = _T7 + y * p
    p = _T6 + y * p
    p = _T5 + y * p
    p = _T4 + y * p
    p = _T3 + y * p
    p = _T2 + y * p
    e = y * (1.0 + y * p)  # expm1(y)
    for _ in range(_TANH_SQUARINGS):
        e = e * (2.0 + e)
    t = -e / (2.0 + e)  # tanh(|u|) = -expm1(-2|u|) / (2 + expm1(-2|u|))
    return t if u >= 0.0 else -t


# ---------------------------------------------------------------------------------------------
# Layer normalisation


@njit(cache=True)
def layernorm_serial(x, gamma, beta, y, xhat, inv_std):  # pragma: no cover - compiled
    """Per row of the 2-D ``x``: ``inv_std = 1 / sqrt(var + EPS)`` (the biased variance;
    ``inv_std`` is ``(rows, 1)``), ``xhat = (x - mean) inv_std``, ``y = xhat gamma + beta``."""
    rows, f = x.shape
    inv_f = 1.0 / f
    for r in range(rows):
        xr, hr, yr = x[r], xhat[r], y[r]
        s, q = _row_moments(xr)
        mean = s * inv_f
        var = max(q * inv_f - mean * mean, 0.0)
        inv = np.float32(1.0 / math.sqrt(var + EPS))
        inv_std[r, 0] = inv
        m = np.float32(mean)
        for j in range(f):
            h = (xr[j] - m) * inv
            hr[j] = h
            yr[j] = h * gamma[j] + beta[j]


@njit(parallel=True, cache=True)
def layernorm(x, gamma, beta, y, xhat, inv_std):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(x.shape[0], t)
        layernorm_serial(x[lo:hi], gamma, beta, y[lo:hi], xhat[lo:hi], inv_std[lo:hi])


@njit(cache=True)
def layernorm_backward_serial(dy, xhat, inv_std, gamma, dgamma, dbeta, dx):  # pragma: no cover
    """``dgamma`` = the sum over the rows of 2-D ``dy xhat``, ``dbeta`` of ``dy`` (written, not
    added to; summed in float64, stored in their own dtype, float32 or float64); unless ``dx``
    is None, per row with ``g = dy gamma``: ``dx = (g - mean(g) - xhat mean(g xhat)) inv_std``."""
    rows, f = dy.shape
    sums = np.zeros((2, f))
    acc_g, acc_b = sums[0], sums[1]
    inv_f = 1.0 / f
    for r in range(rows):
        dr, hr = dy[r], xhat[r]
        for j in range(f):
            d = np.float64(dr[j])
            acc_g[j] += d * hr[j]
            acc_b[j] += d
        if dx is not None:
            s, p = _row_g_sums(dr, gamma, hr)
            g_mean, gx_mean = np.float32(s * inv_f), np.float32(p * inv_f)
            inv = inv_std[r, 0]
            out = dx[r]
            for j in range(f):
                out[j] = (dr[j] * gamma[j] - hr[j] * gx_mean - g_mean) * inv
    for j in range(f):
        dgamma[j] = acc_g[j]
        dbeta[j] = acc_b[j]


@njit(parallel=True, cache=True)
def layernorm_backward(dy, xhat, inv_std, gamma, dgamma, dbeta, dx):  # pragma: no cover
    """:func:`layernorm_backward_serial` on chunks of rows, each chunk into its own float64
    partial sums of ``dgamma`` and ``dbeta``, summed afterwards: race-free."""
    rows, f = dy.shape
    partial = np.empty((2, CHUNKS, f))
    for t in prange(CHUNKS):
        lo, hi = _chunk(rows, t)
        part_g, part_b = partial[0, t], partial[1, t]
        if dx is None:
            layernorm_backward_serial(
                dy[lo:hi], xhat[lo:hi], inv_std[lo:hi], gamma, part_g, part_b, None
            )
        else:
            layernorm_backward_serial(
                dy[lo:hi], xhat[lo:hi], inv_std[lo:hi], gamma, part_g, part_b, dx[lo:hi]
            )
    for j in range(f):
        sg = 0.0
        sb = 0.0
        for t in range(CHUNKS):
            sg += partial[0, t, j]
            sb += partial[1, t, j]
        dgamma[j] = sg
        dbeta[j] = sb


# ---------------------------------------------------------------------------------------------
# GELU (1-D arrays: the wrappers pass flat views)


@njit(cache=True)
def gelu_serial(x, y, t):  # pragma: no cover - compiled
    """``t = tanh(C (x + A x^3))`` (not kept if ``t`` is None), ``y = 0.5 x (1 + t)``."""
    c, a = np.float32(GELU_C), np.float32(GELU_A)
    half, one = np.float32(0.5), np.float32(1.0)
    for i in range(x.size):
        v = x[i]
        th = np.float32(_tanh(np.float64((v * v * a + one) * v * c)))
        if t is not None:
            t[i] = th
        y[i] = (th + one) * v * half


@njit(parallel=True, cache=True)
def gelu(x, y, t):  # pragma: no cover - compiled
    for k in prange(CHUNKS):
        lo, hi = _chunk(x.size, k)
        if t is None:
            gelu_serial(x[lo:hi], y[lo:hi], None)
        else:
            gelu_serial(x[lo:hi], y[lo:hi], t[lo:hi])


@njit(cache=True)
def gelu_backward_serial(dy, x, t, dx):  # pragma: no cover - compiled
    """``dx = dy 0.5 (1 + t + p (1 - t^2))`` with ``p = C x (1 + 3 A x^2)``: ``dy`` times
    ``0.5 (1 + t) + 0.5 x (1 - t^2) C (1 + 3 A x^2)``, the derivative of the forward."""
    c, a3 = np.float32(GELU_C), np.float32(3.0 * GELU_A)
    half, one = np.float32(0.5), np.float32(1.0)
    for i in range(x.size):
        v, th = x[i], t[i]
        p = (v * v * a3 + one) * v * c
        dx[i] = ((one - th * th) * p + one + th) * half * dy[i]


@njit(parallel=True, cache=True)
def gelu_backward(dy, x, t, dx):  # pragma: no cover - compiled
    for k in prange(CHUNKS):
        lo, hi = _chunk(x.size, k)
        gelu_backward_serial(dy[lo:hi], x[lo:hi], t[lo:hi], dx[lo:hi])


# ---------------------------------------------------------------------------------------------
# Batch normalisation: per channel of 2-D ``(rows, channels)`` views (channels-last images).
# Sums over rows in float64, per chunk of rows and then over the chunks (race-free), as the
# layer normalisation's; the biased variance from the sums of ``x`` and ``x^2``.


@njit(cache=True)
def _column_moments(x, sums):  # pragma: no cover - compiled
    """``sums[0] +=`` the column sums of 2-D ``x``, ``sums[1] +=`` those of ``x^2`` (float64)."""
    rows, c = x.shape
    for r in range(rows):
        for j in range(c):
            v = np.float64(x[r, j])
            sums[0, j] += v
            sums[1, j] += v * v


@njit(cache=True)
def _batch_stats(sums, count, running, momentum, mean, inv_std):  # pragma: no cover - compiled
    """Mean and ``1 / sqrt(var + EPS)`` per channel from the column sums of ``count`` rows;
    ``running`` (the running mean, then the running variance) moves by ``momentum`` towards
    the mean and the unbiased variance (the biased one for a single row)."""
    c = mean.size
    keep = 1.0 - momentum
    unbias = count / max(count - 1.0, 1.0)
    for j in range(c):
        m = sums[0, j] / count
        var = max(sums[1, j] / count - m * m, 0.0)
        mean[j] = m
        inv_std[j] = 1.0 / math.sqrt(var + EPS)
        running[j] = running[j] * keep + m * momentum
        running[c + j] = running[c + j] * keep + var * unbias * momentum


@njit(cache=True)
def _normalise(x, gamma, beta, mean, inv_std, y, xhat):  # pragma: no cover - compiled
    rows, c = x.shape
    for r in range(rows):
        for j in range(c):
            h = (x[r, j] - mean[j]) * inv_std[j]
            xhat[r, j] = h
            y[r, j] = h * gamma[j] + beta[j]


@njit(cache=True)
def batchnorm_serial(x, gamma, beta, running, momentum, y, xhat, mean, inv_std):  # pragma: no cover
    """Training batch normalisation of 2-D ``x`` over its rows: ``mean`` and ``inv_std`` per
    channel (written, float32), ``xhat = (x - mean) inv_std``, ``y = xhat gamma + beta``; the
    running statistics in ``running`` updated by ``momentum``."""
    sums = np.zeros((2, x.shape[1]))
    _column_moments(x, sums)
    _batch_stats(sums, x.shape[0], running, momentum, mean, inv_std)
    _normalise(x, gamma, beta, mean, inv_std, y, xhat)


@njit(parallel=True, cache=True)
def batchnorm(x, gamma, beta, running, momentum, y, xhat, mean, inv_std):  # pragma: no cover
    rows, c = x.shape
    partial = np.zeros((CHUNKS, 2, c))
    for t in prange(CHUNKS):
        lo, hi = _chunk(rows, t)
        _column_moments(x[lo:hi], partial[t])
    sums = np.zeros((2, c))
    for t in range(CHUNKS):
        sums += partial[t]
    _batch_stats(sums, rows, running, momentum, mean, inv_std)
    for t in prange(CHUNKS):
        lo, hi = _chunk(rows, t)
        _normalise(x[lo:hi], gamma, beta, mean, inv_std, y[lo:hi], xhat[lo:hi])


@njit(cache=True)
def batchnorm_eval_serial(x, gamma, beta, running, y):  # pragma: no cover - compiled
    """Evaluation: ``y = (x - running mean) / sqrt(running var + EPS) gamma + beta``."""
    rows, c = x.shape
    scale = np.empty(c, np.float32)
    shift = np.empty(c, np.float32)
    for j in range(c):
        scale[j] = gamma[j] / math.sqrt(running[c + j] + EPS)
        shift[j] = beta[j] - running[j] * scale[j]
    for r in range(rows):
        for j in range(c):
            y[r, j] = x[r, j] * scale[j] + shift[j]


@njit(parallel=True, cache=True)
def batchnorm_eval(x, gamma, beta, running, y):  # pragma: no cover - compiled
    for t in prange(CHUNKS):
        lo, hi = _chunk(x.shape[0], t)
        batchnorm_eval_serial(x[lo:hi], gamma, beta, running, y[lo:hi])


@njit(cache=True)
def _dgamma_dbeta(dy, xhat, sums):  # pragma: no cover - compiled
    """``sums[0] +=`` the column sums of ``dy xhat``, ``sums[1] +=`` those of ``dy`` (float64)."""
    rows, c = dy.shape
    for r in range(rows):
        for j in range(c):
            d = np.float64(dy[r, j])
            sums[0, j] += d * xhat[r, j]
            sums[1, j] += d


@njit(cache=True)
def _batchnorm_dx(dy, xhat, coef, dx):  # pragma: no cover - compiled
    """``dx = coef[0] (dy - coef[2] - xhat coef[1])`` per channel."""
    rows, c = dy.shape
    for r in range(rows):
        for j in range(c):
            dx[r, j] = (dy[r, j] - coef[2, j] - xhat[r, j] * coef[1, j]) * coef[0, j]


@njit(cache=True)
def _dx_coefficients(sums, count, gamma, inv_std, dgamma, dbeta):  # pragma: no cover
    c = gamma.size
    coef = np.empty((3, c), np.float32)
    for j in range(c):
        dgamma[j] = sums[0, j]
        dbeta[j] = sums[1, j]
        coef[0, j] = gamma[j] * inv_std[j]
        coef[1, j] = sums[0, j] / count
        coef[2, j] = sums[1, j] / count
    return coef


@njit(cache=True)
def batchnorm_backward_serial(dy, xhat, gamma, inv_std, dgamma, dbeta, dx):  # pragma: no cover
    """``dgamma``, ``dbeta`` = the column sums of ``dy xhat`` and ``dy`` (written); unless
    ``dx`` is None, ``dx = gamma inv_std (dy - mean(dy) - xhat mean(dy xhat))``, means over
    the rows."""
    sums = np.zeros((2, dy.shape[1]))
    _dgamma_dbeta(dy, xhat, sums)
    coef = _dx_coefficients(sums, dy.shape[0], gamma, inv_std, dgamma, dbeta)
    if dx is not None:
        _batchnorm_dx(dy, xhat, coef, dx)


@njit(parallel=True, cache=True)
def batchnorm_backward(dy, xhat, gamma, inv_std, dgamma, dbeta, dx):  # pragma: no cover
    rows, c = dy.shape
    partial = np.zeros((CHUNKS, 2, c))
    for t in prange(CHUNKS):
        lo, hi = _chunk(rows, t)
        _dgamma_dbeta(dy[lo:hi], xhat[lo:hi], partial[t])
    sums = np.zeros((2, c))
    for t in range(CHUNKS):
        sums += partial[t]
    coef = _dx_coefficients(sums, rows, gamma, inv_std, dgamma, dbeta)
    if dx is not None:
        for t in prange(CHUNKS):
            lo, hi = _chunk(rows, t)
            _batchnorm_dx(dy[lo:hi], xhat[lo:hi], coef, dx[lo:hi])
