"""The ops of token networks (BERT, GPT-2, ViT): embeddings, attention and token pooling (the
per-token loss is the kernels' softmax cross-entropy, a row per token). Token activations are
``(batch, tokens, features)``; image inputs run channels-last, ``(batch, height, width,
channels)``.

The ops keep :class:`~microbench.nn.layers.Op`'s contract, with one exception that weight
tying needs: an :class:`Embedding` whose table a :class:`TiedDense` also reads (``tied``)
*adds* its token-table gradient to the one the dense layer's backward wrote before it.
"""

from __future__ import annotations

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

    def forward(self, x: Any, buf: Buffers) -> Any:
        y = buf["y"]
        bad = self.k.embedding_forward(x, self.w, self.vocab, self.positions, self.types,
                                       buf["ids"], y)  # fmt: skip
        if bad >= 0:
            value = float(x.reshape(-1)[bad])
            raise UserError(
                f"layer {self.info.name}: token id {value:g} is not in the vocabulary; "
                f"ids are integers in [0, {self.vocab})"
            )
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        self.k.embedding_backward(dy, buf["ids"], self.vocab, self.positions, self.types,
                                  self.tied, self.dw)  # fmt: skip
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
        y = buf["y"]
        buf["x"] = x2 = x.reshape(-1, self.in_shape[-1])
        self.k.dense_forward(x2, self.table_op.w[: self.vocab].T, self.b, y.reshape(-1, self.vocab))
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        dw, dx, v = self.table_op.dw, buf["dx"], self.vocab
        dx2 = None if dx is None else dx.reshape(-1, self.in_shape[-1])
        self.k.tied_dense_backward(buf["x"], self.table_op.w[:v], dy.reshape(-1, v), dw[:v],
                                   self.db, dx2)  # fmt: skip
        if dw.shape[0] > v:  # the position and type rows: the embedding's backward writes them
            self.k.zero(dw[v:])
        return dx


class ToTokens(Op):
    """A channels-last ``(h, w, c)`` map as ``h w`` tokens of ``c`` features in (row, column)
    order (ViT's patches), a learned class token in front if ``cls_token`` and a learned
    position table added if ``positions``. The flat weights: the class token, then positions.

    Every step is a kernel call: the patches and the class token copied in, the positions
    added as a bias over each sample's ``tokens * c`` values; backward sums the positions'
    gradient over the batch as a bias gradient, the class token's over the class rows copied
    out contiguous, and copies the patches' gradient out past the class token."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        s = info.layer.settings
        self.cls = int(bool(s.get("cls_token")))
        self.positions = bool(s.get("positions"))
        self.out_shape = (h * w + self.cls, c)
        self.weight_shape = (info.weight_count,) if info.weight_count else None

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        c, grad = self.in_shape[2], training and self.cls
        return {
            "y": _empty(xp, (batch, *self.out_shape)),
            "dx": _empty(xp, (batch, *self.in_shape)) if grad and self.info.needs_input_grad
            else None,
            "dcls": _empty(xp, (batch, c)) if grad else None,
        }  # fmt: skip

    def forward(self, x: Any, buf: Buffers) -> Any:
        y, c = buf["y"], self.in_shape[2]
        self.k.copy(x.reshape(x.shape[0], -1, c), y[:, self.cls :])
        if self.cls:
            self.k.copy(self.w[:c], y[:, 0])
        if self.positions:
            rows = y.reshape(y.shape[0], -1)
            self.k.bias_activation(rows, self.w[self.cls * c :], False, rows)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        c = self.in_shape[2]
        if self.cls:
            self.k.copy(dy[:, 0], buf["dcls"])
            self.k.channel_sum(buf["dcls"], self.dw[:c])
        if self.positions:
            self.k.channel_sum(dy.reshape(dy.shape[0], -1), self.dw[self.cls * c :])
        if not self.info.needs_input_grad:
            return None
        pixels = dy[:, self.cls :].reshape(dy.shape[0], *self.in_shape)
        if buf["dx"] is None:
            return pixels  # a view of dy, which no one else reads
        self.k.copy(pixels, buf["dx"])
        return buf["dx"]


class Attention(Op):
    """Multi-head self-attention on ``(batch, T, d)``: ``q, k, v = x W + b``, per head
    ``softmax(q k^T / sqrt(dh))`` (``causal``: each token sees itself and those before),
    ``o = p v``, then ``y = o Wo + bo`` (the kernels' ``attention_forward``). Weights
    ``(4, d, d)`` (q, k, v, o, each stored (in, out)), the bias flat ``4 d`` in the same order.
    Backward keeps the queries, the keys, the values, the merged output and the
    probabilities, what the workload counts."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        d = in_shape[-1]
        self.heads = info.layer.get("heads")
        self.weight_shape = (4, d, d)
        self.causal = bool(info.layer.settings.get("causal"))

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        t, d = self.in_shape
        h = self.heads
        buf = {
            "qkv": _empty(xp, (3, batch, t, d)),
            "p": _empty(xp, (batch, h, t, t)),
            "o": _empty(xp, (batch, t, d)),
            "y": _empty(xp, (batch, t, d)),
        }
        if training:
            buf["dqkv"] = _empty(xp, (3, batch, t, d))
            buf["do"] = _empty(xp, (batch, t, d))
            buf["dx"] = self._dx(xp, batch, training)
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        d = self.in_shape[1]
        buf["x"] = x2 = x.reshape(-1, d)
        y = buf["y"]
        self.k.attention_forward(x2, self.w, self.b, self.heads, self.causal, buf["qkv"],
                                 buf["p"], buf["o"], y.reshape(-1, d))  # fmt: skip
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        d, dx = self.in_shape[1], buf["dx"]
        self.k.attention_backward(
            dy.reshape(-1, d), buf["x"], self.w, self.heads, self.causal, buf["qkv"], buf["p"],
            buf["o"], buf["do"], buf["dqkv"], self.dw, self.db,
            None if dx is None else dx.reshape(-1, d),
        )  # fmt: skip
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
            self.k.global_avgpool_forward(self._image(x), y)
        else:
            self.k.copy(x[:, 0], y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        dx = buf["dx"]
        if dx is None:
            return None
        if self.mean:
            self.k.global_avgpool_backward(dy, self._image(dx))
        else:
            self.k.zero(dx)
            self.k.copy(dy, dx[:, 0])
        return dx

    @staticmethod
    def _image(a: Any) -> Any:
        """``(batch, T, d)`` as the ``(batch, T, 1, d)`` image whose global average pool is
        the mean over the tokens."""
        return a.reshape(a.shape[0], a.shape[1], 1, a.shape[2])
