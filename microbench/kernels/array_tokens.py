"""The batch-normalisation, attention, embedding, dropout and zero-filling kernels of
:class:`microbench.kernels.array.ArrayKernels`, written against an array module ``xp`` (numpy
or cupy) as whole-array operations.

Same signatures and results (to rounding) as :class:`microbench.kernels.cpu.NumbaKernels`;
:mod:`microbench.kernels` describes the methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from microbench.kernels.loops_norm import EPS
from microbench.kernels.loops_tokens import attention_scale

__all__ = ["ArrayTokenKernels", "normalise"]


def normalise(xp: Any, var: Any, centred: Any, gamma: Any, beta: Any, y: Any) -> None:
    """In place: ``var`` becomes ``1 / sqrt(var + EPS)``, ``centred`` (``x - mean``) becomes
    ``xhat = centred / std``, and ``y = xhat gamma + beta`` (both normalisations)."""
    xp.add(var, EPS, out=var)
    xp.sqrt(var, out=var)
    xp.reciprocal(var, out=var)
    xp.multiply(centred, var, out=centred)
    xp.multiply(centred, gamma, out=y)
    xp.add(y, beta, out=y)


class ArrayTokenKernels:
    """Mixed into :class:`~microbench.kernels.array.ArrayKernels`, which sets ``xp``."""

    xp: Any

    # batchnorm2d ---------------------------------------------------------------------------

    def batchnorm_forward(self, x: Any, gamma: Any, beta: Any, running: Any, momentum: float,
                          y: Any, xhat: Any, mean: Any, inv_std: Any) -> None:  # fmt: skip
        xp, c = self.xp, x.shape[-1]
        rows = x.size // c
        xp.mean(x.reshape(-1, c), axis=0, out=mean)
        xp.subtract(x, mean, out=xhat)
        xp.multiply(xhat, xhat, out=y)  # y as scratch for the squares
        xp.mean(y.reshape(-1, c), axis=0, out=inv_std)  # the biased variance, for now
        keep, unbias = 1.0 - momentum, rows / max(rows - 1, 1)
        xp.multiply(running[:c], keep, out=running[:c])
        running[:c] += mean * momentum
        xp.multiply(running[c:], keep, out=running[c:])
        running[c:] += inv_std * (momentum * unbias)
        normalise(xp, inv_std, xhat, gamma, beta, y)

    def batchnorm_eval(self, x: Any, gamma: Any, beta: Any, running: Any, y: Any) -> None:
        xp, c = self.xp, x.shape[-1]
        scale = gamma / xp.sqrt(running[c:] + EPS)
        shift = beta - running[:c] * scale
        xp.multiply(x, scale, out=y)
        xp.add(y, shift, out=y)

    def batchnorm_backward(self, dy: Any, xhat: Any, gamma: Any, inv_std: Any, dgamma: Any,
                           dbeta: Any, dx: Any) -> None:  # fmt: skip
        xp, c = self.xp, dy.shape[-1]
        count = dy.size // c
        xp.sum(dy.reshape(-1, c), axis=0, out=dbeta)
        work = xp.multiply(dy, xhat)
        xp.sum(work.reshape(-1, c), axis=0, out=dgamma)
        if dx is None:
            return
        xp.multiply(xhat, dgamma / count, out=dx)
        xp.subtract(dy, dx, out=dx)
        xp.subtract(dx, dbeta / count, out=dx)
        xp.multiply(dx, gamma * inv_std, out=dx)

    # attention -----------------------------------------------------------------------------

    @staticmethod
    def _heads(a: Any, heads: int) -> Any:
        """``(batch, T, d)`` as the ``(batch, heads, T, dh)`` view batched matmul runs on."""
        batch, t, d = a.shape
        return a.reshape(batch, t, heads, d // heads).transpose(0, 2, 1, 3)

    def attention_forward(self, x: Any, w: Any, b: Any, heads: int, causal: bool, qkv: Any,
                          p: Any, o: Any, y: Any) -> None:  # fmt: skip
        xp, d, t = self.xp, x.shape[-1], qkv.shape[2]
        flat = qkv.reshape(3, -1, d)
        xp.matmul(x[None], w[:3], out=flat)
        if b is not None:
            xp.add(flat, b[: 3 * d].reshape(3, 1, d), out=flat)
        q, k, v = (self._heads(a, heads) for a in qkv)
        xp.matmul(q, k.transpose(0, 1, 3, 2), out=p)
        xp.multiply(p, attention_scale(d, heads), out=p)
        if causal:
            future = np.triu(np.ones((t, t), dtype=bool), 1)
            xp.add(p, xp.asarray(np.where(future, -np.inf, 0.0).astype(np.float32)), out=p)
        p -= p.max(axis=-1, keepdims=True)
        xp.exp(p, out=p)
        p /= p.sum(axis=-1, keepdims=True)
        xp.matmul(p, v, out=self._heads(o, heads))
        xp.matmul(o.reshape(-1, d), w[3], out=y)
        if b is not None:
            xp.add(y, b[3 * d :], out=y)

    def attention_backward(self, dy: Any, x: Any, w: Any, heads: int, causal: bool, qkv: Any,
                           p: Any, o: Any, do: Any, dqkv: Any, dw: Any, db: Any,
                           dx: Any) -> None:  # fmt: skip
        """Through ``o = p v`` and the softmax: ``ds = p (dp - rowsum(dp p))``, where
        ``rowsum(dp p) = rowsum(do o)`` per head."""
        xp, d = self.xp, x.shape[-1]
        scale = attention_scale(d, heads)
        xp.matmul(o.reshape(-1, d).T, dy, out=dw[3])
        if db is not None:
            xp.sum(dy, axis=0, out=db[3 * d :])
        do2 = do.reshape(-1, d)
        xp.matmul(dy, w[3].T, out=do2)
        q, k, v = (self._heads(a, heads) for a in qkv)
        dq, dk, dv = (self._heads(a, heads) for a in dqkv)
        doh = self._heads(do, heads)
        xp.matmul(p.transpose(0, 1, 3, 2), doh, out=dv)
        dp = xp.matmul(doh, v.transpose(0, 1, 3, 2))
        rowdot = (do * o).reshape(*o.shape[:2], heads, -1).sum(axis=-1)  # (batch, T, heads)
        dp -= rowdot.transpose(0, 2, 1)[..., None]
        dp *= p
        dp *= scale
        xp.matmul(dp, k, out=dq)
        xp.matmul(dp.transpose(0, 1, 3, 2), q, out=dk)
        flat = dqkv.reshape(3, -1, d)
        xp.matmul(x.T[None], flat, out=dw[:3])
        if db is not None:
            xp.sum(flat, axis=1, out=db[: 3 * d].reshape(3, d))
        if dx is not None:
            xp.matmul(flat[0], w[0].T, out=dx)
            for i in (1, 2):
                xp.matmul(flat[i], w[i].T, out=do2)  # do is spent: scratch
                xp.add(dx, do2, out=dx)

    # embedding, dropout, zero --------------------------------------------------------------

    def embedding_forward(self, x: Any, table: Any, vocab: int, positions: int, types: int,
                          ids: Any, y: Any) -> int:  # fmt: skip
        xp = self.xp
        bad = (x < 0) | (x >= vocab) | (x != xp.floor(x))  # NaN fails the last test
        if bool(bad.any()):
            return int(xp.argmax(bad.reshape(-1)))
        ids[...] = x  # exact: ids are integers below 2**24
        xp.take(table[:vocab], ids, axis=0, out=y)
        if positions:
            xp.add(y, table[vocab : vocab + x.shape[1]], out=y)
        if types:
            xp.add(y, table[vocab + positions], out=y)
        return -1

    def embedding_backward(self, dy: Any, ids: Any, vocab: int, positions: int, types: int,
                           tied: bool, dw: Any) -> None:  # fmt: skip
        xp, t = self.xp, dy.shape[1]
        rows = dy.reshape(-1, dy.shape[-1])
        if not tied:
            dw[:vocab] = 0
        xp.add.at(dw[:vocab], ids.reshape(-1), rows)
        if positions:
            xp.sum(dy, axis=0, out=dw[vocab : vocab + t])
            dw[vocab + t : vocab + positions] = 0
        if types:
            xp.sum(rows, axis=0, out=dw[vocab + positions])
            dw[vocab + positions + 1 : vocab + positions + types] = 0

    def dropout_forward(self, x: Any, rng: Any, rate: float, host: Any, mask: Any,
                        y: Any) -> None:  # fmt: skip
        rng.random(dtype=np.float32, out=host)
        np.greater_equal(host, rate, out=host)  # 1 kept, 0 dropped
        np.multiply(host, 1.0 / (1.0 - rate), out=host)
        if mask is not host:
            mask.set(host)  # cupy: a host-to-device copy into the buffer
        self.xp.multiply(x, mask, out=y)

    def dropout_backward(self, dy: Any, mask: Any, dx: Any) -> None:
        self.xp.multiply(dy, mask, out=dx)

    def zero(self, a: Any) -> None:
        a[...] = 0
