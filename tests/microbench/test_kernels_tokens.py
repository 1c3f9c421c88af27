"""The batchnorm, attention, embedding, dropout and zero kernels: the numba kernels against the
array kernels (numpy), which :mod:`tests.microbench.test_nn_blocks` and ``test_nn_tokens``
check by finite differences, at 1 and 2 numba threads with every loop's parallel driver at 2
(the ``threads`` fixture checks which drivers ran)."""

from __future__ import annotations

import numpy as np
import pytest

from microbench.kernels import ArrayKernels, NumbaKernels
from microbench.kernels.callspec import call_features
from microbench.kernels.loops_tokens import _exp
from microbench.kernels.record import kernels_replaced

ARRAY = ArrayKernels(np)
NEW_LOOPS = ("batchnorm", "batchnorm_eval", "batchnorm_backward", "attention",
             "attention_backward", "dropout", "dropout_backward", "zero")  # fmt: skip


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _nan(*shape: int) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def _close(ours, reference, rtol=2e-5, atol=2e-6) -> None:
    np.testing.assert_allclose(ours, reference, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------- batchnorm


@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (2, 5, 5, 7), (16, 8, 8, 32), (3, 1, 1, 1)])
def test_batchnorm_matches_the_array_kernels(shape, threads):
    rng = np.random.default_rng(1)
    c = shape[-1]
    x = _f32(rng, *shape, scale=3.0) + 2.0
    gamma, beta = _f32(rng, c) + 1.0, _f32(rng, c)
    out = {}
    for name, kern in (("numba", NumbaKernels), ("array", ARRAY)):
        running = np.concatenate([_f32(rng, c) * 0 + 0.5, np.full(c, 2.0, np.float32)])
        y, xhat, mean, inv = _nan(*shape), _nan(*shape), _nan(c), _nan(c)
        kern.batchnorm_forward(x, gamma, beta, running, 0.1, y, xhat, mean, inv)
        dy = _f32(np.random.default_rng(2), *shape)
        dgamma, dbeta, dx = _nan(c), _nan(c), _nan(*shape)
        kern.batchnorm_backward(dy, xhat, gamma, inv, dgamma, dbeta, dx)
        ye = _nan(*shape)
        kern.batchnorm_eval(x, gamma, beta, running, ye)
        out[name] = (y, xhat, mean, inv, running, dgamma, dbeta, dx, ye)
    for ours, ref in zip(out["numba"], out["array"], strict=True):
        _close(ours, ref, rtol=1e-4, atol=1e-4)
    # dx is None: the parameter gradients alone
    dgamma, dbeta = _nan(c), _nan(c)
    NumbaKernels.batchnorm_backward(dy, out["numba"][1], gamma, out["numba"][3], dgamma, dbeta,
                                    None)  # fmt: skip
    _close(dgamma, out["numba"][5], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------- attention


def _attention(kern, x, w, b, heads, causal, with_dx=True):
    rows, d = x.shape
    batch = rows // T
    qkv, p = _nan(3, batch, T, d), _nan(batch, heads, T, T)
    o, y = _nan(batch, T, d), _nan(rows, d)
    kern.attention_forward(x, w, b, heads, causal, qkv, p, o, y)
    dy = _f32(np.random.default_rng(5), rows, d)
    do, dqkv, dw = _nan(batch, T, d), _nan(3, batch, T, d), _nan(4, d, d)
    db = None if b is None else _nan(4 * d)
    dx = _nan(rows, d) if with_dx else None
    kern.attention_backward(dy, x, w, heads, causal, qkv, p, o, do, dqkv, dw, db, dx)
    return y, p, dw, db, dx


T = 7


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("batch", "d", "heads", "bias"), [(1, 4, 1, True), (3, 12, 3, False),
                                                          (2, 16, 4, True)])  # fmt: skip
def test_attention_matches_the_array_kernels(batch, d, heads, bias, causal, threads):
    rng = np.random.default_rng(3)
    x, w = _f32(rng, batch * T, d), _f32(rng, 4, d, d, scale=d**-0.5)
    b = _f32(rng, 4 * d) if bias else None
    ours = _attention(NumbaKernels, x, w, b, heads, causal)
    reference = _attention(ARRAY, x, w, b, heads, causal)
    for a, r in zip(ours, reference, strict=True):
        if r is not None:
            _close(a, r, rtol=1e-4, atol=1e-5)
    p = ours[1]
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)
    if causal:
        assert not np.triu(p[0, 0], 1).any()  # no token sees those after it
    without = _attention(NumbaKernels, x, w, b, heads, causal, with_dx=False)
    _close(without[2], ours[2], rtol=0, atol=0)


# ------------------------------------------------------------------------------- embedding


@pytest.mark.parametrize(("positions", "types", "tied"), [(0, 0, False), (9, 2, False),
                                                          (T, 0, True)])  # fmt: skip
def test_embedding_matches_the_array_kernels(positions, types, tied):
    rng = np.random.default_rng(4)
    vocab, dim, batch = 11, 6, 3
    table = _f32(rng, vocab + positions + types, dim)
    x = rng.integers(0, vocab, (batch, T)).astype(np.float32)
    x[0, :3] = 5  # a repeated token: its gradients add up
    dy = _f32(rng, batch, T, dim)
    prior = _f32(rng, *table.shape)  # a tied output layer's gradient, where tied
    out = []
    for kern in (NumbaKernels, ARRAY):
        ids, y = np.zeros((batch, T), np.int64), _nan(batch, T, dim)
        assert kern.embedding_forward(x, table, vocab, positions, types, ids, y) == -1
        dw = prior.copy()
        kern.embedding_backward(dy, ids, vocab, positions, types, tied, dw)
        out.append((ids, y, dw))
    for a, r in zip(*out, strict=True):
        _close(a, r)
    np.testing.assert_array_equal(out[0][0], x.astype(np.int64))


@pytest.mark.parametrize("bad", [-1.0, 11.0, 2.5, np.nan])
def test_embedding_finds_the_first_bad_id(bad):
    x = np.zeros((2, T), np.float32)
    x[1, 3] = bad
    table = np.zeros((11, 4), np.float32)
    for kern in (NumbaKernels, ARRAY):
        ids, y = np.zeros((2, T), np.int64), np.zeros((2, T, 4), np.float32)
        assert kern.embedding_forward(x, table, 11, 0, 0, ids, y) == T + 3


# ------------------------------------------------------------------------------- dropout, zero


def test_dropout_draws_what_the_array_kernels_draw(threads):
    rng = np.random.default_rng(6)
    x, dy = _f32(rng, 40, 33), _f32(rng, 40, 33)
    out = []
    for kern in (NumbaKernels, ARRAY):
        mask, y, dx = _nan(40, 33), _nan(40, 33), _nan(40, 33)
        kern.dropout_forward(x, np.random.default_rng(9), 0.25, mask, mask, y)
        kern.dropout_backward(dy, mask, dx)
        out.append((mask, y, dx))
    for a, r in zip(*out, strict=True):
        np.testing.assert_array_equal(a, r)
    mask = out[0][0]
    assert set(np.unique(mask)) == {0.0, np.float32(1 / 0.75)}
    assert 0.15 < (mask == 0).mean() < 0.35


def test_zero(threads):
    a = _f32(np.random.default_rng(7), 3, 50)
    NumbaKernels.zero(a)
    assert not a.any()


# ------------------------------------------------------------------------------- drivers


def test_the_work_each_wrapper_hands_its_driver_is_the_call_features(loop_work):
    """The ``work`` a wrapper decides its driver by is what
    :func:`~microbench.kernels.callspec.call_features` counts for the call."""
    rng = np.random.default_rng(8)
    batch, d, heads = 2, 8, 2
    x, w = _f32(rng, batch * T, d), _f32(rng, 4, d, d)
    _attention(NumbaKernels, x, w, None, heads, True)
    assert loop_work["attention"] == call_features("attention", (batch, T, d, heads, 1))[0]
    assert loop_work["attention_backward"] == loop_work["attention"]
    x, y, ones = _f32(rng, 4, 3, 3, 5), _nan(4, 3, 3, 5), np.ones(5, np.float32)
    running = np.ones(10, np.float32)
    NumbaKernels.batchnorm_forward(x, ones, ones, running, 0.1, y, y.copy(), _nan(5), _nan(5))
    assert loop_work["batchnorm"] == call_features("batchnorm", (36, 5))[0]


def test_the_call_recorder_catches_the_new_loops():
    replaced = []
    with kernels_replaced(lambda name, fn: replaced.append(name) or fn):
        pass
    for name in NEW_LOOPS:
        assert {name, name + "_serial"} <= set(replaced)
    assert {"embedding", "embedding_backward", "uniform"} <= set(replaced)


def test_the_softmax_exp_is_float32_exact():
    """The vectorizable exp of attention's softmax, rounded to float32, is within one float32
    rounding of e^u over every shifted score a softmax meets, and 0 where float32's e^u is."""
    u = np.concatenate([-np.geomspace(1e-9, 104, 20000), [0.0, -1e-30, -103.9, -104.0, -500.0]])
    ours = np.array([np.float32(_exp(v)) for v in u], np.float32)
    exact = np.exp(u)
    normal = exact > np.finfo(np.float32).tiny
    rel = np.abs(ours[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= 2.0**-24 * 1.01  # one float32 rounding
    assert ours[-1] == 0.0 and ours[u == 0.0] == 1.0
