"""The layernorm and GELU kernels against direct float64 definitions.

Every kernel runs on the numba kernels and on the array kernels (numpy), at 1 and 2 numba
threads, with the parallel threshold at 0 so that 2 threads take every loop's parallel driver
(the fixture checks which drivers ran). The float64 reference backwards are checked against
central differences of the reference forwards, and the kernels' backwards against directional
differences of the kernels' forwards. The recorder of a step's kernel calls catches the new
loops.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from microbench.kernels import ArrayKernels, NumbaKernels, policy
from microbench.kernels.record import CallRecorder, kernels_replaced, time_alone
from microbench.threads import set_threads
from tests.microbench.gradcheck import numeric_grad

KERNELS = {"numba": NumbaKernels(), "array": ArrayKernels(np)}
EPS = 1e-5
C = math.sqrt(2.0 / math.pi)
A = 0.044715

# (rows..., features): 2-D and 3-D, features 1, 7, 64 and 768, rows from 1 to 4096.
LN_SHAPES = [
    (1, 1),
    (4096, 1),
    (1, 7),
    (3000, 7),
    (3, 5, 7),
    (1, 64),
    (2, 33, 64),
    (2048, 64),
    (1, 768),
    (3, 768),
    (2, 40, 768),
]
GELU_SHAPES = [(1,), (7,), (1000, 1), (3, 5, 7), (2048, 64), (2, 3, 768)]
NEW_LOOPS = ("layernorm", "layernorm_backward", "gelu", "gelu_backward")


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0, shift: float = 0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def _nan(*shape: int) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def _within(ours: np.ndarray, reference: np.ndarray, bound) -> None:
    """``|ours - reference| <= bound`` elementwise (NaN where both are NaN)."""
    assert ours.shape == reference.shape and ours.dtype == np.float32
    diff = np.abs(ours.astype(np.float64) - reference)
    bad = ~(diff <= bound) & ~(np.isnan(ours) & np.isnan(reference))
    assert not bad.any(), (
        ours[bad][:5],
        reference[bad][:5],
        np.broadcast_to(bound, bad.shape)[bad][:5],
    )


# ---------------------------------------------------------------------------------------------
# float64 references


def _ref_layernorm(x, gamma, beta):
    """(y, xhat, inv_std) in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + EPS)
    xhat = (x - mean) * inv
    return xhat * gamma.astype(np.float64) + beta, xhat, inv


def _ref_layernorm_backward(dy, xhat, inv, gamma):
    """(dgamma, dbeta, dx, the size of dx's terms) in float64."""
    dy, xhat, inv = (a.astype(np.float64) for a in (dy, xhat, inv))
    f = dy.shape[-1]
    dgamma = (dy * xhat).reshape(-1, f).sum(axis=0)
    dbeta = dy.reshape(-1, f).sum(axis=0)
    g = dy * gamma.astype(np.float64)
    g_mean = g.mean(axis=-1, keepdims=True)
    gx_mean = (g * xhat).mean(axis=-1, keepdims=True)
    dx = (g - g_mean - xhat * gx_mean) * inv
    terms = (np.abs(g) + np.abs(g_mean) + np.abs(xhat * gx_mean)) * inv
    return dgamma, dbeta, dx, terms


def _ref_gelu(x):
    """(y, t) in float64."""
    x = x.astype(np.float64)
    t = np.tanh(C * (x + A * x**3))
    return 0.5 * x * (1.0 + t), t


def _ref_gelu_backward(dy, x, t):
    """(dx, the size of its terms) in float64, from the forward's ``t``."""
    dy, x, t = (a.astype(np.float64) for a in (dy, x, t))
    p = C * x * (1.0 + 3.0 * A * x * x)
    return dy * 0.5 * (1.0 + t + p * (1.0 - t * t)), np.abs(dy) * (1.0 + np.abs(t) + np.abs(p))


def _ln_inputs(rng, shape):
    """x (mean 1, std 3), gamma and beta, then the float32 xhat and inv_std of x."""
    f = shape[-1]
    x = _f32(rng, *shape, scale=3.0, shift=1.0)
    gamma, beta = _f32(rng, f, shift=1.0), _f32(rng, f)
    _, xhat, inv = _ref_layernorm(x, gamma, beta)
    return x, gamma, beta, xhat.astype(np.float32), inv.astype(np.float32)


def _layernorm(kern, x, gamma, beta):
    y, xhat, inv = _nan(*x.shape), _nan(*x.shape), _nan(*x.shape[:-1], 1)
    kern.layernorm_forward(x, gamma, beta, y, xhat, inv)
    return y, xhat, inv


def _layernorm_backward(kern, dy, xhat, inv, gamma, with_dx=True):
    f = dy.shape[-1]
    dgamma, dbeta = _nan(f), _nan(f)  # written, not added to: NaN would stay NaN
    dx = _nan(*dy.shape) if with_dx else None
    kern.layernorm_backward(dy, xhat, inv, gamma, dgamma, dbeta, dx)
    return dgamma, dbeta, dx


def _gelu_inputs(rng, shape):
    x = _f32(rng, *shape, scale=2.0)
    specials = np.float32([0.0, -0.0, 1e-30, -1e-3, 1e-3, 9.3, -9.3, 10.0, -12.0, 30.0, -30.0])
    flat = x.reshape(-1)
    flat[: min(flat.size, specials.size)] = specials[: flat.size]
    return x


# ---------------------------------------------------------------------------------------------
# layernorm


@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
@pytest.mark.parametrize("kind", KERNELS)
def test_layernorm_forward_matches_reference(shape, kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(10)
    x, gamma, beta, _, _ = _ln_inputs(rng, shape)
    y, xhat, inv = _layernorm(kern, x, gamma, beta)
    ref_y, ref_xhat, ref_inv = _ref_layernorm(x, gamma, beta)
    _within(inv, ref_inv, 2e-6 * ref_inv)
    # x - mean in float32 is off by the mean's rounding (times inv_std): an absolute term.
    _within(xhat, ref_xhat, 2e-6 * np.abs(ref_xhat) + 1e-6)
    _within(y, ref_y, 2e-6 * (np.abs(ref_xhat * gamma) + np.abs(beta)) + 2e-6 * np.abs(gamma))
    if shape[-1] == 1:  # one feature: xhat is 0, y is beta
        np.testing.assert_array_equal(xhat, 0.0)
        np.testing.assert_array_equal(y, np.broadcast_to(beta, y.shape))


@pytest.mark.parametrize("with_dx", [True, False], ids=["dx", "no-dx"])
@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
@pytest.mark.parametrize("kind", KERNELS)
def test_layernorm_backward_matches_reference(shape, kind, with_dx, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(11)
    _, gamma, _, xhat, inv = _ln_inputs(rng, shape)
    dy = _f32(rng, *shape)
    dgamma, dbeta, dx = _layernorm_backward(kern, dy, xhat, inv, gamma, with_dx)
    ref_dgamma, ref_dbeta, ref_dx, terms = _ref_layernorm_backward(dy, xhat, inv, gamma)
    f = shape[-1]
    abs_g = np.abs(dy * xhat.astype(np.float64)).reshape(-1, f).sum(axis=0)
    abs_b = np.abs(dy.astype(np.float64)).reshape(-1, f).sum(axis=0)
    if kind == "numba":  # float64 sums: the float32 rounding of the exact sum
        _within(dgamma, ref_dgamma, np.spacing(np.abs(ref_dgamma).astype(np.float32)) + 1e-12)
        _within(dbeta, ref_dbeta, np.spacing(np.abs(ref_dbeta).astype(np.float32)) + 1e-12)
    else:  # numpy sums float32 rows in order
        _within(dgamma, ref_dgamma, 2e-6 * abs_g)
        _within(dbeta, ref_dbeta, 2e-6 * abs_b)
    if with_dx:
        _within(dx, ref_dx, 4e-6 * terms)
        if f == 1:
            np.testing.assert_array_equal(dx, 0.0)
    else:
        assert dx is None


@pytest.mark.parametrize("kind", KERNELS)
def test_layernorm_backward_overwrites_and_may_write_dx_into_dy(kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(12)
    shape = (3, 50, 64)
    _, gamma, _, xhat, inv = _ln_inputs(rng, shape)
    dy = _f32(rng, *shape)
    dgamma, dbeta, dx = _layernorm_backward(kern, dy, xhat, inv, gamma)
    dy_copy = dy.copy()
    kern.layernorm_backward(dy, xhat, inv, gamma, dgamma, dbeta, None)  # again, into results
    once_g, once_b = dgamma.copy(), dbeta.copy()
    kern.layernorm_backward(dy, xhat, inv, gamma, dgamma, dbeta, dy)  # dx into dy
    np.testing.assert_array_equal(dgamma, once_g)  # not doubled
    np.testing.assert_array_equal(dbeta, once_b)
    np.testing.assert_array_equal(dy, dx)
    ref_dgamma, _, _, _ = _ref_layernorm_backward(dy_copy, xhat, inv, gamma)
    np.testing.assert_allclose(dgamma, ref_dgamma, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(3, 7), (2, 2, 5), (2, 1)], ids=str)
def test_layernorm_reference_gradients_matchnumeric_grad(shape):
    """The float64 reference backward is the derivative of the reference forward."""
    rng = np.random.default_rng(13)
    f = shape[-1]
    x, gamma, beta = (rng.standard_normal(s) for s in (shape, f, f))
    dy = rng.standard_normal(shape)
    _, xhat, inv = _ref_layernorm(x, gamma, beta)
    dgamma, dbeta, dx, _ = _ref_layernorm_backward(dy, xhat, inv, gamma)

    def loss():
        return (_ref_layernorm(x, gamma, beta)[0] * dy).sum()

    for param, grad in [(x, dx), (gamma, dgamma), (beta, dbeta)]:
        np.testing.assert_allclose(numeric_grad(loss, param), grad, atol=1e-7)


def test_gelu_reference_gradient_matchesnumeric_grad():
    rng = np.random.default_rng(14)
    x = np.concatenate([rng.standard_normal(20) * 2, [0.0, -0.5, 3.0, -3.0, 6.0]])
    dy = rng.standard_normal(x.shape)
    _, t = _ref_gelu(x)
    dx, _ = _ref_gelu_backward(dy, x, t)

    def loss():
        return (_ref_gelu(x)[0] * dy).sum()

    np.testing.assert_allclose(numeric_grad(loss, x), dx, atol=1e-7)


def _directional(loss, x: np.ndarray, v: np.ndarray, h: float) -> float:
    """(loss(x + h v) - loss(x - h v)) / 2h, ``x`` restored."""
    old = x.copy()
    x[...] = old + h * v
    up = loss()
    x[...] = old - h * v
    down = loss()
    x[...] = old
    return (up - down) / (2 * h)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 7)], ids=str)
@pytest.mark.parametrize("kind", KERNELS)
def test_layernorm_backward_is_the_derivative_of_the_forward(kind, shape):
    """In float32, along random directions: <grad, v> against central differences."""
    kern = KERNELS[kind]
    rng = np.random.default_rng(15)
    x, gamma, beta, _, _ = _ln_inputs(rng, shape)
    dy = _f32(rng, *shape)
    y, xhat, inv = _layernorm(kern, x, gamma, beta)
    dgamma, dbeta, dx = _layernorm_backward(kern, dy, xhat, inv, gamma)

    def loss():
        return np.multiply(_layernorm(kern, x, gamma, beta)[0], dy, dtype=np.float64).sum()

    for param, grad, h in [(x, dx, 3e-2), (gamma, dgamma, 1e-2), (beta, dbeta, 1e-2)]:
        v = _f32(rng, *param.shape)
        exact = np.multiply(grad, v, dtype=np.float64).sum()
        numeric = _directional(loss, param, v, h)
        assert abs(numeric - exact) <= 2e-3 * (abs(exact) + 1.0), (numeric, exact)


@pytest.mark.parametrize("kind", KERNELS)
def test_gelu_backward_is_the_derivative_of_the_forward(kind):
    kern = KERNELS[kind]
    rng = np.random.default_rng(16)
    x = _f32(rng, 3, 100, scale=2.0)
    dy = _f32(rng, *x.shape)
    y, t = _nan(*x.shape), _nan(*x.shape)
    kern.gelu_forward(x, y, t)
    dx = _nan(*x.shape)
    kern.gelu_backward(dy, x, t, dx)

    def loss():
        out = _nan(*x.shape)
        kern.gelu_forward(x, out, None)
        return np.multiply(out, dy, dtype=np.float64).sum()

    for _ in range(3):
        v = _f32(rng, *x.shape)
        exact = np.multiply(dx, v, dtype=np.float64).sum()
        numeric = _directional(loss, x, v, 1e-2)
        assert abs(numeric - exact) <= 2e-3 * (abs(exact) + 1.0), (numeric, exact)


# ---------------------------------------------------------------------------------------------
# gelu


@pytest.mark.parametrize("shape", GELU_SHAPES, ids=str)
@pytest.mark.parametrize("kind", KERNELS)
def test_gelu_forward_matches_reference(shape, kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(20)
    x = _gelu_inputs(rng, shape)
    y, t = _nan(*shape), _nan(*shape)
    kern.gelu_forward(x, y, t)
    ref_y, ref_t = _ref_gelu(x)
    # The tanh's argument is rounded to float32 (a few ulp): t moves by less than as much.
    _within(t, ref_t, 1e-6 * np.abs(ref_t) + 1e-37)
    _within(y, ref_y, 1e-6 * (np.abs(ref_y) + np.abs(x)) + 1e-37)
    y_only = _nan(*shape)
    kern.gelu_forward(x, y_only, None)  # the tanh not kept
    np.testing.assert_array_equal(y_only, y)


def test_gelu_forward_saturates_and_passes_nan():
    x = np.float32([np.nan, 1e20, -1e20, 9.3, -9.3, 0.0, -0.0])
    for kern in KERNELS.values():
        y, t = _nan(x.size), _nan(x.size)
        with np.errstate(over="ignore"):  # x^3 overflows to inf: tanh(inf) is 1
            kern.gelu_forward(x, y, t)
        np.testing.assert_array_equal(t, [np.nan, 1, -1, 1, -1, 0, 0])
        np.testing.assert_array_equal(y, np.float32([np.nan, 1e20, 0, 9.3, 0, 0, 0]))


@pytest.mark.parametrize("shape", GELU_SHAPES, ids=str)
@pytest.mark.parametrize("kind", KERNELS)
def test_gelu_backward_matches_reference(shape, kind, threads):
    kern = KERNELS[kind]
    rng = np.random.default_rng(21)
    x = _gelu_inputs(rng, shape)
    t = _ref_gelu(x)[1].astype(np.float32)
    dy = _f32(rng, *shape)
    dx = _nan(*shape)
    kern.gelu_backward(dy, x, t, dx)
    ref_dx, terms = _ref_gelu_backward(dy, x, t)
    _within(dx, ref_dx, 2e-6 * terms)
    kern.gelu_backward(dy, x, t, dy)  # dx into dy
    np.testing.assert_array_equal(dy, dx)


# ---------------------------------------------------------------------------------------------
# drivers and recording


def test_numba_work_counts_elements(loop_work):
    """The ``work`` each wrapper hands ``_loop``: what decides its driver."""
    seen = loop_work
    rng = np.random.default_rng(30)
    x, gamma, beta, _, _ = _ln_inputs(rng, (2, 5, 7))
    y, xhat, inv = _layernorm(NumbaKernels, x, gamma, beta)
    _layernorm_backward(NumbaKernels, y, xhat, inv, gamma)
    t = _nan(*x.shape)
    NumbaKernels.gelu_forward(x, y, t)
    NumbaKernels.gelu_backward(y, x, t, xhat)
    assert seen == {name: x.size for name in NEW_LOOPS}


def test_numba_refuses_non_contiguous_arrays():
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        NumbaKernels.gelu_forward(x[:, ::2], np.zeros((4, 3), np.float32), None)
    ones, out = np.ones(3, np.float32), np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        NumbaKernels.layernorm_forward(x[:, ::2], ones, ones, out, out.copy(), x[:, :1].copy())


def test_the_call_recorder_catches_the_new_loops(monkeypatch):
    replaced = []
    with kernels_replaced(lambda name, fn: replaced.append(name) or fn):
        pass
    for name in NEW_LOOPS:
        assert {name, name + "_serial"} <= set(replaced)

    monkeypatch.setattr(policy, "PARALLEL_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(31)
    x, gamma, beta, _, _ = _ln_inputs(rng, (64, 16))
    buffers = [_nan(*x.shape) for _ in range(5)]
    inv, dgamma, dbeta = _nan(64, 1), _nan(16), _nan(16)

    def step():
        y, xhat, t, g, dx = buffers
        NumbaKernels.layernorm_forward(x, gamma, beta, y, xhat, inv)
        NumbaKernels.gelu_forward(y, g, t)
        NumbaKernels.gelu_backward(g, y, t, dx)
        NumbaKernels.layernorm_backward(dx, xhat, inv, gamma, dgamma, dbeta, dx)

    counts = [1] + ([2] if numba.config.NUMBA_NUM_THREADS >= 2 else [])
    before = numba.get_num_threads()
    try:
        for count in counts:
            set_threads(count)
            step()
            order = ("layernorm", "gelu", "gelu_backward", "layernorm_backward")
            expected = [name if count > 1 else name + "_serial" for name in order]
            results = [b.copy() for b in (*buffers, inv, dgamma, dbeta)]
            with CallRecorder() as recorder:
                recorder.keep = True
                step()
            assert [fn.__name__ for fn, _, _ in recorder.calls] == expected
            assert len(recorder.times) == len(expected)
            for ours, theirs in zip((*buffers, inv, dgamma, dbeta), results, strict=True):
                np.testing.assert_array_equal(ours, theirs)  # recorded calls did the work
            assert time_alone(recorder.calls[:1], repeats=1) > 0
    finally:
        set_threads(before)
