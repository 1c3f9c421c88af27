"""The ops of token networks (BERT, GPT-2, ViT): embeddings, attention, token pooling, and the
per-token loss. Token activations are ``(batch, tokens, features)``; image inputs run
channels-last, ``(batch, height, width, channels)``.

The ops keep :class:`~microbench.nn.layers.Op`'s contract, with one exception that weight
tying needs: an :class:`Embedding` whose table a :class:`TiedDense` also reads (``tied``)
*adds* its token-table gradient to the one the dense layer's backward wrote before it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from microbench.errors import UserError
from microbench.kernels import Kernels
from microbench.nn.layers import Buffers, Op, _empty
from microbench.workload import LayerInfo

_IDS = np.int64  # the index type the token ids are cast to


class Embedding(Op):
    """``y = E[ids] (+ P[:tokens]) (+ types[0])`` from token ids carried as float32 values.
    ``E``, the positions ``P`` and the token-type rows are stacked in one ``(rows, dim)``
    table, in that order; the network has no type ids, so every token is type 0."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        s = info.layer.settings
        self.vocab, self.dim = s["vocab"], s["dim"]
        self.positions, self.types = s.get("positions", 0), s.get("token_types", 0)
        self.weight_shape = (self.vocab + self.positions + self.types, self.dim)
        self.out_shape = (in_shape[0], self.dim)
        self.tied = False  # set by the network when a TiedDense shares the token table

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {
            "ids": _empty(xp, (batch, self.in_shape[0]), _IDS),
            "y": _empty(xp, (batch, *self.out_shape)),
        }

    def _check_ids(self, x: Any) -> None:
        xp = self.xp
        bad = (x < 0) | (x >= self.vocab) | (x != xp.floor(x))  # NaN fails the last test
        if bool(bad.any()):
            value = float(x[bad][0])
            raise UserError(
                f"layer {self.info.name}: token id {value:g} is not in the vocabulary; "
                f"ids are integers in [0, {self.vocab})"
            )

    def forward(self, x: Any, buf: Buffers) -> Any:
        xp, ids, y = self.xp, buf["ids"], buf["y"]
        self._check_ids(x)
        ids[...] = x  # exact: ids are integers below 2**24
        xp.take(self.w[: self.vocab], ids, axis=0, out=y)
        tokens = self.in_shape[0]
        if self.positions:
            xp.add(y, self.w[self.vocab : self.vocab + tokens], out=y)
        if self.types:
            xp.add(y, self.w[self.vocab + self.positions], out=y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        xp, v, p, dw = self.xp, self.vocab, self.positions, self.dw
        rows = dy.reshape(-1, self.dim)
        if not self.tied:
            dw[:v] = 0
        xp.add.at(dw[:v], buf["ids"].reshape(-1), rows)
        if p:
            tokens = self.in_shape[0]
            xp.sum(dy, axis=0, out=dw[v : v + tokens])
            dw[v + tokens : v + p] = 0
        if self.types:
            xp.sum(rows, axis=0, out=dw[v + p])
            dw[v + p + 1 :] = 0
        return None


class TiedDense(Op):
    """``y = x @ E.T + b`` on the last axis, ``E`` the token table of ``table_op`` (an
    :class:`Embedding`): the layer owns only its bias, bound by ``bind(None, b, None, db)``.
    Backward writes ``E``'s gradient into the embedding's ``dw`` (zeroing its other rows, which
    the embedding's backward fills after it, adding to the token rows)."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...], table_op: Embedding
    ) -> None:
        super().__init__(info, kernels, in_shape)
        self.table_op = table_op
        self.vocab = info.layer.get("units")
        if self.vocab != table_op.vocab or in_shape[-1] != table_op.dim:
            raise ValueError(
                f"layer {info.name}: a ({in_shape[-1]} -> {self.vocab}) dense layer cannot "
                f"share a ({table_op.vocab}, {table_op.dim}) embedding table"
            )
        self.out_shape = (*in_shape[:-1], self.vocab)
        self.weight_shape = None

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def forward(self, x: Any, buf: Buffers) -> Any:
        xp, y = self.xp, buf["y"]
        buf["x"] = x2 = x.reshape(-1, self.in_shape[-1])
        y2 = y.reshape(-1, self.vocab)
        xp.matmul(x2, self.table_op.w[: self.vocab].T, out=y2)
        if self.info.bias_count:
            xp.add(y2, self.b, out=y2)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        xp, dw = self.xp, self.table_op.dw
        dy2 = dy.reshape(-1, self.vocab)
        xp.matmul(dy2.T, buf["x"], out=dw[: self.vocab])
        dw[self.vocab :] = 0
        if self.info.bias_count:
            xp.sum(dy2, axis=0, out=self.db)
        dx = buf["dx"]
        if dx is not None:
            xp.matmul(dy2, self.table_op.w[: self.vocab], out=dx.reshape(-1, self.in_shape[-1]))
        return dx


class ToTokens(Op):
    """A channels-last ``(h, w, c)`` map as ``h w`` tokens of ``c`` features in (row, column)
    order (ViT's patches), a learned class token in front if ``cls_token`` and a learned
    position table added if ``positions``. The flat weights: the class token, then positions."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        s = info.layer.settings
        self.cls = int(bool(s.get("cls_token")))
        self.positions = bool(s.get("positions"))
        self.out_shape = (h * w + self.cls, c)
        self.weight_shape = (info.weight_count,) if info.weight_count else None

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        need = training and self.info.needs_input_grad and self.cls
        return {
            "y": _empty(xp, (batch, *self.out_shape)),
            "dx": _empty(xp, (batch, *self.in_shape)) if need else None,
        }

    def _pos(self, table: Any) -> Any:
        return table[self.cls * self.in_shape[2] :].reshape(self.out_shape)

    def forward(self, x: Any, buf: Buffers) -> Any:
        xp, y, c = self.xp, buf["y"], self.in_shape[2]
        y[:, self.cls :] = x.reshape(x.shape[0], -1, c)
        if self.cls:
            y[:, 0] = self.w[:c]
        if self.positions:
            xp.add(y, self._pos(self.w), out=y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        xp, c = self.xp, self.in_shape[2]
        if self.cls:
            xp.sum(dy[:, 0], axis=0, out=self.dw[:c])
        if self.positions:
            xp.sum(dy, axis=0, out=self._pos(self.dw))
        if not self.info.needs_input_grad:
            return None
        pixels = dy[:, self.cls :].reshape(dy.shape[0], *self.in_shape)
        if buf["dx"] is None:
            return pixels  # a view of dy, which no one else reads
        buf["dx"][...] = pixels
        return buf["dx"]


class Attention(Op):
    """Multi-head self-attention on ``(batch, T, d)``: ``q, k, v = x W + b`` (one batched GEMM
    of ``x`` against the three stored ``(d, d)`` matrices), per head ``softmax(q k^T /
    sqrt(dh))`` (``causal``: each token sees itself and those before), ``o = p v``, then
    ``y = o Wo + bo``. Weights ``(4, d, d)`` (q, k, v, o, each stored (in, out)), the bias
    flat ``4 d`` in the same order. Backward keeps the (pre-scaled) queries, the keys, the
    values, the merged output and the probabilities, what the workload counts."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        t, d = in_shape
        self.heads = info.layer.get("heads")
        self.dh = d // self.heads
        self.scale = 1.0 / math.sqrt(self.dh)
        self.weight_shape = (4, d, d)
        self.mask = None
        if info.layer.settings.get("causal"):
            future = np.triu(np.ones((t, t), dtype=bool), 1)
            self.mask = self.xp.asarray(np.where(future, -np.inf, 0.0).astype(np.float32))

    def _heads(self, a: Any) -> Any:
        """``(batch, T, d)`` as the ``(batch, heads, T, dh)`` view batched matmul runs on."""
        return a.reshape(a.shape[0], a.shape[1], self.heads, self.dh).transpose(0, 2, 1, 3)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        t, d = self.in_shape
        h = self.heads
        buf = {
            "qkv": _empty(xp, (3, batch, t, d)),
            "p": _empty(xp, (batch, h, t, t)),
            "stat": _empty(xp, (batch, h, t, 1)),
            "o": _empty(xp, (batch, t, d)),
            "y": _empty(xp, (batch, t, d)),
        }
        if training:
            buf["dqkv"] = _empty(xp, (3, batch, t, d))
            buf["do"] = _empty(xp, (batch, t, d))
            buf["dp"] = _empty(xp, (batch, h, t, t))
            buf["rowdot"] = _empty(xp, (batch, t, h))
            buf["dx"] = self._dx(xp, batch, training)
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        xp, d = self.xp, self.in_shape[1]
        qkv, p, stat, o, y = buf["qkv"], buf["p"], buf["stat"], buf["o"], buf["y"]
        batch = x.shape[0]
        buf["x"] = x2 = x.reshape(-1, d)
        flat = qkv.reshape(3, -1, d)
        xp.matmul(x2[None], self.w[:3], out=flat)
        if self.info.bias_count:
            xp.add(flat, self.b[: 3 * d].reshape(3, 1, d), out=flat)
        xp.multiply(qkv[0], self.scale, out=qkv[0])  # T d values scaled, not h T^2 scores
        q, k, v = (self._heads(a) for a in qkv)
        xp.matmul(q, k.transpose(0, 1, 3, 2), out=p)
        if self.mask is not None:
            xp.add(p, self.mask, out=p)
        xp.max(p, axis=-1, keepdims=True, out=stat)
        xp.subtract(p, stat, out=p)
        xp.exp(p, out=p)
        xp.sum(p, axis=-1, keepdims=True, out=stat)
        xp.divide(p, stat, out=p)
        xp.matmul(p, v, out=self._heads(o))
        y2 = y.reshape(batch * self.in_shape[0], d)
        xp.matmul(o.reshape(y2.shape), self.w[3], out=y2)
        if self.info.bias_count:
            xp.add(y2, self.b[3 * d :], out=y2)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        xp, d = self.xp, self.in_shape[1]
        p, o, do, dp, dqkv = buf["p"], buf["o"], buf["do"], buf["dp"], buf["dqkv"]
        q, k, v = (self._heads(a) for a in buf["qkv"])
        dq, dk, dv = (self._heads(a) for a in dqkv)
        x2, dy2, o2 = buf["x"], dy.reshape(-1, d), o.reshape(-1, d)
        bias = self.info.bias_count
        # output projection
        xp.matmul(o2.T, dy2, out=self.dw[3])
        if bias:
            xp.sum(dy2, axis=0, out=self.db[3 * d :])
        do2 = do.reshape(-1, d)
        xp.matmul(dy2, self.w[3].T, out=do2)
        doh = self._heads(do)
        # through o = p v and the softmax: ds = p * (dp - rowsum(dp * p)), where
        # rowsum(dp * p) = rowsum(do * o) per head, T d values instead of h T^2
        xp.matmul(p.transpose(0, 1, 3, 2), doh, out=dv)
        xp.matmul(doh, v.transpose(0, 1, 3, 2), out=dp)
        scratch = dqkv[0]  # dq is written after the scratch is spent
        xp.multiply(do, o, out=scratch)
        rowdot = buf["rowdot"]
        xp.sum(scratch.reshape(*rowdot.shape, self.dh), axis=-1, out=rowdot)
        xp.subtract(dp, rowdot.transpose(0, 2, 1)[..., None], out=dp)
        xp.multiply(dp, p, out=dp)
        # through the scores (q pre-scaled)
        xp.matmul(dp, k, out=dq)
        xp.multiply(dqkv[0], self.scale, out=dqkv[0])
        xp.matmul(dp.transpose(0, 1, 3, 2), q, out=dk)
        # input projections
        flat = dqkv.reshape(3, -1, d)
        xp.matmul(x2.T[None], flat, out=self.dw[:3])
        if bias:
            xp.sum(flat, axis=1, out=self.db[: 3 * d].reshape(3, d))
        dx = buf["dx"]
        if dx is not None:
            dx2 = dx.reshape(-1, d)
            xp.matmul(flat[0], self.w[0].T, out=dx2)
            for i in (1, 2):
                xp.matmul(flat[i], self.w[i].T, out=do2)  # do2 is spent: scratch
                xp.add(dx2, do2, out=dx2)
        return dx


class TokenPool(Op):
    """``(batch, T, d)`` to ``(batch, d)``: the first token (the class token), or the mean."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        self.mean = info.layer.get("mode") == "mean"
        self.out_shape = (in_shape[-1],)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def forward(self, x: Any, buf: Buffers) -> Any:
        y = buf["y"]
        if self.mean:
            self.xp.mean(x, axis=1, out=y)
        else:
            y[...] = x[:, 0]
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        dx = buf["dx"]
        if dx is None:
            return None
        if self.mean:
            self.xp.multiply(dy[:, None, :], 1.0 / self.in_shape[0], out=dx)
        else:
            dx[:, 1:] = 0
            dx[:, 0] = dy
        return dx


def token_cross_entropy(xp: Any, logits: Any, labels: Any, dlogits: Any) -> tuple[float, int]:
    """The mean softmax cross-entropy over every token of ``logits`` ``(batch, T, vocab)``
    against integer ``labels`` ``(batch, T)``, and how many tokens' argmax is the label;
    ``dlogits`` gets ``(softmax - onehot) / (batch T)``. No ``(batch T, vocab)`` temporary:
    the softmax is formed in ``dlogits`` itself, the loss summed in float64."""
    vocab = logits.shape[-1]
    z, g = logits.reshape(-1, vocab), dlogits.reshape(-1, vocab)
    y = labels.reshape(-1)
    if y.dtype.kind not in "iu":
        y = y.astype(_IDS)
    n = z.shape[0]
    rows = xp.arange(n)
    top = z.max(axis=1, keepdims=True)
    xp.subtract(z, top, out=g)
    picked = g[rows, y].astype(xp.float64)
    xp.exp(g, out=g)
    total = g.sum(axis=1, keepdims=True)
    loss = xp.log(total[:, 0].astype(xp.float64)) - picked
    correct = (xp.argmax(z, axis=1) == y).sum()
    xp.divide(g, total, out=g)
    g[rows, y] -= 1
    xp.multiply(g, 1.0 / n, out=g)
    return float(loss.mean()), int(correct)
