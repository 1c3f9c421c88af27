"""The token ops of :mod:`microbench.nn.tokens`: gradients by finite differences, forwards
against direct numpy references, the id checks, weight tying and the per-token loss."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from microbench.errors import UserError
from microbench.kernels import ArrayKernels, NumbaKernels
from microbench.nn import Network
from microbench.nn.layers import Buffers, Op
from microbench.nn.tokens import (
    Attention,
    Embedding,
    TiedDense,
    TokenPool,
    ToTokens,
)
from microbench.workload import LayerInfo, Workload
from tests.microbench import gradcheck

T, D, BATCH, VOCAB = 5, 6, 3, 11


def _info(input_shape: list[int], layer: dict, pre: list[dict] | None = None) -> LayerInfo:
    """``layer`` (named "op") in a small workload: ``pre`` before it (a parametric layer makes
    it need an input gradient), a loss after it that fits its output (token_pool's is flat)."""
    tail: list[dict[str, Any]] = [{"kind": "token_cross_entropy"}]
    if layer["kind"] == "token_pool":
        tail = [{"kind": "dense", "units": 3}, {"kind": "softmax_cross_entropy"}]
    layers = [*(pre or []), {**layer, "name": "op"}, *tail]
    workload = Workload.from_dict({"input_shape": input_shape, "layers": layers})
    return gradcheck.layer_info(workload, "op")


def _attention(
    heads: int = 2, causal: bool = False, bias: bool = True, grad: bool = True
) -> tuple[Attention, np.ndarray, np.ndarray]:
    layer = {"kind": "attention", "heads": heads, "causal": causal, "bias": bias}
    info = _info([T, D], layer, [{"kind": "layernorm"}] if grad else None)
    op = gradcheck.build(Attention, info, (T, D))
    params, grads = gradcheck.bind_random(op, np.random.default_rng(1), scale=0.3)
    return op, params, grads


def _run(op: Op, x: np.ndarray, training: bool = True) -> tuple[np.ndarray, Buffers]:
    buf = op.allocate(np, x.shape[0], training)
    return np.array(op.forward(x, buf), copy=True), buf


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ids(*shape: int, vocab: int = VOCAB, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.float32)


# attention


@pytest.mark.parametrize("heads", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_attention_gradients(heads, causal, bias):
    op, params, grads = _attention(heads, causal, bias)
    assert op.info.bias_count == (4 * D if bias else 0)
    # the softmax's curvature needs a small step (the gradients agree with float64 central
    # differences of the per-head reference to 4e-5; eps 1e-2 leaves O(eps^2) errors of ~2%)
    gradcheck.check_op(op, _x(BATCH, T, D), params, grads, eps=3e-3)


def _attention_reference(op: Attention, x: np.ndarray, causal: bool) -> np.ndarray:
    w = op.w.astype(np.float64)
    b = op.b.astype(np.float64) if op.info.bias_count else np.zeros(4 * D)
    x = x.astype(np.float64)
    q, k, v = (x @ w[i] + b[i * D : (i + 1) * D] for i in range(3))
    dh = D // op.heads
    o = np.zeros_like(q)
    for n in range(x.shape[0]):
        for h in range(op.heads):
            cols = slice(h * dh, (h + 1) * dh)
            s = q[n, :, cols] @ k[n, :, cols].T / math.sqrt(dh)
            if causal:
                s[np.triu_indices(T, 1)] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o[n, :, cols] = (p / p.sum(axis=1, keepdims=True)) @ v[n, :, cols]
    return o @ w[3] + b[3 * D :]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_attention_matches_a_per_head_loop(causal, bias):
    op, _, _ = _attention(3, causal, bias)
    x = _x(BATCH, T, D)
    y, _ = _run(op, x, training=False)
    np.testing.assert_allclose(y, _attention_reference(op, x, causal), rtol=1e-4, atol=1e-5)


def test_causal_attention_does_not_look_ahead():
    op, _, _ = _attention(2, causal=True)
    x = _x(BATCH, T, D)
    y, _ = _run(op, x)
    for t in range(T - 1):
        later = x.copy()
        later[:, t + 1 :] = _x(BATCH, T - t - 1, D, seed=t + 1)
        y2, _ = _run(op, later)
        np.testing.assert_allclose(y2[:, : t + 1], y[:, : t + 1], rtol=1e-5, atol=1e-6)
        assert not np.allclose(y2[:, t + 1 :], y[:, t + 1 :])
    full, _, _ = _attention(2, causal=False)
    full.bind(op.w, op.b, op.dw, op.db)
    assert not np.allclose(_run(full, x)[0][:, 0], y[:, 0])  # the non-causal one does look


def test_attention_without_input_gradient_returns_none():
    op, _, _ = _attention(grad=False)
    assert not op.info.needs_input_grad
    y, buf = _run(op, _x(BATCH, T, D))
    assert op.backward(_x(*y.shape, seed=1), buf) is None
    assert np.abs(op.dw).sum() > 0


# embedding


def _embedding(positions: int = 0, types: int = 0, vocab: int = VOCAB) -> Embedding:
    layer = {"kind": "embedding", "vocab": vocab, "dim": D, "positions": positions,
             "token_types": types}  # fmt: skip
    op = gradcheck.build(Embedding, _info([T], layer), (T,))
    gradcheck.bind_random(op, np.random.default_rng(2))
    return op


@pytest.mark.parametrize(("positions", "types"), [(0, 0), (T, 0), (T + 3, 2), (0, 3)])
def test_embedding_forward_and_gradients(positions, types):
    op = _embedding(positions, types)
    assert op.weight_shape == (VOCAB + positions + types, D)
    params, grads = gradcheck.bind_random(op, np.random.default_rng(3))
    ids = _ids(BATCH, T)
    y, _ = _run(op, ids)
    expect = op.w[ids.astype(int)]
    if positions:
        expect = expect + op.w[VOCAB : VOCAB + T]
    if types:
        expect = expect + op.w[VOCAB + positions]
    np.testing.assert_allclose(y, expect, rtol=1e-6)
    gradcheck.check_op(op, ids, params, grads, check_inputs=False)


def test_embedding_repeated_ids_accumulate():
    op = _embedding(positions=T + 2, types=2)
    ids = np.array([[1, 1, 4, 1, 0], [4, 4, 4, 1, 9]], np.float32)
    dy = _x(2, T, D, seed=4)
    op.dw[...] = np.nan  # backward writes every row
    _, buf = _run(op, ids)
    assert op.backward(dy.copy(), buf) is None
    expect = np.zeros((VOCAB + T + 4, D))
    for n in range(2):
        for t in range(T):
            expect[int(ids[n, t])] += dy[n, t]
            expect[VOCAB + t] += dy[n, t]
            expect[VOCAB + T + 2] += dy[n, t]
    np.testing.assert_allclose(op.dw, expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [VOCAB, -1.0, 2.5, np.nan, np.inf, 1e9])
def test_embedding_rejects_bad_ids(bad):
    op = _embedding()
    ids = _ids(BATCH, T)
    ids[1, 2] = bad
    with pytest.raises(UserError, match=r"layer op: token id .* \[0, 11\)") as err:
        _run(op, ids)
    assert "\n" not in str(err.value)


# weight tying


class _TiedPair(Op):
    """An embedding and the dense layer tied to it, as one op: parameters the table then the
    dense layer's bias, backward in the network's order (the dense layer first)."""

    def __init__(self, emb: Embedding, dense: TiedDense) -> None:
        info = dataclasses.replace(emb.info, bias_count=dense.info.bias_count)
        super().__init__(info, emb.k, emb.in_shape)
        self.emb, self.dense, self.weight_shape = emb, dense, emb.weight_shape
        self.out_shape = dense.out_shape

    def bind(self, w: Any, b: Any, dw: Any, db: Any) -> None:
        self.emb.bind(w, None, dw, None)
        self.dense.bind(None, b, None, db)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"e": self.emb.allocate(xp, batch, training),
                "d": self.dense.allocate(xp, batch, training)}  # fmt: skip

    def forward(self, x: Any, buf: Buffers) -> Any:
        return self.dense.forward(self.emb.forward(x, buf["e"]), buf["d"])

    def backward(self, dy: Any, buf: Buffers) -> Any:
        return self.emb.backward(self.dense.backward(dy, buf["d"]), buf["e"])


def _tied(bias: bool = True, positions: int = T, types: int = 2) -> _TiedPair:
    layers = [
        {"kind": "embedding", "name": "emb", "vocab": VOCAB, "dim": D, "positions": positions,
         "token_types": types},
        {"kind": "dense", "name": "out", "units": VOCAB, "bias": bias, "tied_to": "emb"},
        {"kind": "token_cross_entropy"},
    ]  # fmt: skip
    w = Workload.from_dict({"input_shape": [T], "layers": layers})
    emb = gradcheck.build(Embedding, gradcheck.layer_info(w, "emb"), (T,))
    emb.tied = True
    dense = gradcheck.build(TiedDense, gradcheck.layer_info(w, "out"), (T, D), table_op=emb)
    return _TiedPair(emb, dense)


@pytest.mark.parametrize("bias", [False, True])
def test_tied_table_gradient_is_the_sum_of_both_uses(bias):
    pair = _tied(bias)
    params, grads = gradcheck.bind_random(pair, np.random.default_rng(5))
    gradcheck.check_op(pair, _ids(BATCH, T), params, grads, check_inputs=False)


def test_tied_gradient_directly():
    pair = _tied(positions=T + 1, types=2)
    gradcheck.bind_random(pair, np.random.default_rng(6))
    emb, dense = pair.emb, pair.dense
    ids = _ids(BATCH, T)
    emb.dw[...] = np.nan
    y, buf = _run(pair, ids)
    h = buf["e"]["y"].astype(np.float64)
    table = emb.w.astype(np.float64)
    np.testing.assert_allclose(y, h @ table[:VOCAB].T + dense.b, rtol=1e-5, atol=1e-5)
    dy = _x(*y.shape, seed=7)
    pair.backward(dy.copy(), buf)
    dh = dy.astype(np.float64) @ table[:VOCAB]
    expect = np.zeros_like(table)
    expect[:VOCAB] = dy.reshape(-1, VOCAB).T.astype(np.float64) @ h.reshape(-1, D)
    np.add.at(expect, ids.astype(int).ravel(), dh.reshape(-1, D))
    expect[VOCAB : VOCAB + T] = dh.sum(axis=0)
    expect[VOCAB + T + 1] = dh.sum(axis=(0, 1))
    np.testing.assert_allclose(emb.dw, expect, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dense.db, dy.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)


def test_tied_dense_input_gradient():
    pair = _tied()
    gradcheck.bind_random(pair, np.random.default_rng(8))
    dense = pair.dense
    assert dense.weight_shape is None and dense.info.needs_input_grad
    bias = np.array(dense.b, copy=True)
    dense.bind(None, bias, None, np.zeros_like(bias))
    gradcheck.check_op(dense, _x(BATCH, T, D), bias, dense.db)


# to_tokens and token_pool


@pytest.mark.parametrize("cls", [False, True])
@pytest.mark.parametrize("positions", [False, True])
def test_to_tokens(cls, positions):
    c, h, w = 4, 2, 3
    layer = {"kind": "to_tokens", "cls_token": cls, "positions": positions}
    info = _info([c, h, w], layer, [{"kind": "batchnorm2d"}])
    op = gradcheck.build(ToTokens, info, (h, w, c))
    tokens = h * w + cls
    assert op.out_shape == (tokens, c)
    params, grads = gradcheck.bind_random(op, np.random.default_rng(9))
    assert params.size == c * cls + tokens * c * positions
    x = _x(BATCH, h, w, c)
    y, _ = _run(op, x)
    pos = params[c * cls :].reshape(tokens, c) if positions else np.zeros((tokens, c))
    for i in range(h):
        for j in range(w):
            np.testing.assert_allclose(y[:, cls + i * w + j], x[:, i, j] + pos[cls + i * w + j])
    if cls:
        np.testing.assert_allclose(y[:, 0], np.broadcast_to(params[:c] + pos[0], (BATCH, c)))
    gradcheck.check_op(op, x, params, grads)


@pytest.mark.parametrize("mode", ["first", "mean"])
def test_token_pool(mode):
    info = _info([T, D], {"kind": "token_pool", "mode": mode}, [{"kind": "layernorm"}])
    op = gradcheck.build(TokenPool, info, (T, D))
    x = _x(BATCH, T, D)
    y, _ = _run(op, x)
    np.testing.assert_allclose(y, x[:, 0] if mode == "first" else x.mean(axis=1), rtol=1e-6)
    gradcheck.check_op(op, x)


# the contract: no op writes its input or the gradient it is given


def _ops() -> list[tuple[Op, np.ndarray]]:
    tt = _info([4, 2, 3], {"kind": "to_tokens", "cls_token": True, "positions": True},
               [{"kind": "batchnorm2d"}])  # fmt: skip
    pool = _info([T, D], {"kind": "token_pool", "mode": "mean"}, [{"kind": "layernorm"}])
    ops = [
        (_attention(2, causal=True)[0], _x(BATCH, T, D)),
        (_embedding(T, 2), _ids(BATCH, T)),
        (gradcheck.build(ToTokens, tt, (2, 3, 4)), _x(BATCH, 2, 3, 4)),
        (gradcheck.build(TokenPool, pool, (T, D)), _x(BATCH, T, D)),
        (_tied(), _ids(BATCH, T)),
    ]
    for op, _ in ops[2:]:
        gradcheck.bind_random(op, np.random.default_rng(10))
    return ops


@pytest.mark.parametrize("case", range(5))
def test_ops_write_neither_input_nor_incoming_gradient(case):
    op, x = _ops()[case]
    x0 = x.copy()
    y, buf = _run(op, x)
    dy = _x(*y.shape, seed=11)
    dy0 = dy.copy()
    op.backward(dy, buf)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


# token_cross_entropy


def _reference_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    log_total = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)) + z.max(axis=1)
    return float((log_total - z[np.arange(len(y)), y]).mean())


def _token_loss(kernels, logits, labels, dlogits):
    """The network's per-token loss: the kernels' cross-entropy over every token's row."""
    v = logits.shape[-1]
    return kernels.softmax_cross_entropy(
        logits.reshape(-1, v), labels.reshape(-1), dlogits.reshape(-1, v)
    )


@pytest.mark.parametrize("kernels", [NumbaKernels(), ArrayKernels(np)], ids=["numba", "array"])
def test_token_cross_entropy(kernels):
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal((BATCH, T, VOCAB)) * 3).astype(np.float32)
    logits[0, 0] += 80.0  # large logits stay finite
    labels = rng.integers(0, VOCAB, (BATCH, T))
    labels[1] = logits[1].argmax(axis=1)  # some right answers
    before = logits.copy()
    dlogits = np.empty_like(logits)
    loss, correct = _token_loss(kernels, logits, labels, dlogits)
    np.testing.assert_array_equal(logits, before)
    assert loss == pytest.approx(_reference_loss(logits, labels), rel=1e-6)
    assert correct == int((logits.argmax(axis=2) == labels).sum()) >= T
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    p[np.arange(BATCH)[:, None], np.arange(T), labels] -= 1
    np.testing.assert_allclose(dlogits, p / (BATCH * T), rtol=1e-4, atol=1e-7)
    # and by finite differences of the function itself (float32 logits, float64 loss)
    scratch = np.empty_like(logits)
    for _ in range(3):
        v = rng.standard_normal(logits.shape).astype(np.float32)
        eps = 1e-2
        up = _token_loss(kernels, logits + eps * v, labels, scratch)[0]
        down = _token_loss(kernels, logits - eps * v, labels, scratch)[0]
        numeric = (up - down) / (2 * eps)
        assert float(np.vdot(dlogits, v)) == pytest.approx(numeric, rel=1e-2, abs=1e-5)


def test_a_relu_after_a_tied_output_layer_is_not_fused_away():
    """A dense layer tied to an embedding runs alone: the relu after it is an op of its own,
    so the logits are clipped (fused into the tied layer, it was silently dropped)."""
    workload = Workload.from_dict({"input_shape": [4], "layers": [
        {"kind": "embedding", "name": "e", "vocab": 11, "dim": 8},
        {"kind": "dense", "name": "head", "units": 11, "tied_to": "e"},
        {"kind": "relu", "name": "r"},
        {"kind": "token_cross_entropy"},
    ]})  # fmt: skip
    net = Network(workload)
    logits = net.logits(np.array([[1, 2, 3, 4]], np.float32))
    assert logits.min() == 0.0 and logits.max() > 0.0
