"""The ops of microbench.nn.blocks: gradients against finite differences, forward against
direct numpy formulas, batchnorm's running statistics, dropout's masks, the Op contract."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from microbench.kernels import ArrayKernels
from microbench.nn.blocks import (
    AvgPool2d,
    BatchNorm2d,
    Dropout,
    Gelu,
    GlobalAvgPool,
    LayerNorm,
)
from microbench.nn.layers import Op
from microbench.workload import Workload, WorkloadError
from tests import fake_cupy
from tests.microbench import gradcheck

KINDS: dict[str, type[Op]] = {
    "batchnorm2d": BatchNorm2d,
    "layernorm": LayerNorm,
    "gelu": Gelu,
    "dropout": Dropout,
    "avgpool2d": AvgPool2d,
    "global_avgpool": GlobalAvgPool,
}
# A conv first, so that every layer after it needs an input gradient.
IMAGE = {
    "input_shape": [2, 6, 6],
    "layers": [
        {"kind": "conv2d", "name": "conv", "filters": 3, "kernel": 3, "padding": 1},
        {"kind": "batchnorm2d", "name": "bn"},
        {"kind": "avgpool2d", "name": "pool", "size": 3, "stride": 2, "padding": 1},
        {"kind": "gelu", "name": "gelu"},
        {"kind": "dropout", "name": "drop", "rate": 0.25},
        {"kind": "global_avgpool", "name": "gap"},
        {"kind": "dense", "units": 3},
        {"kind": "softmax_cross_entropy"},
    ],
}
TOKENS = {
    "input_shape": [4, 6],
    "layers": [
        {"kind": "dense", "units": 8},
        {"kind": "layernorm", "name": "ln"},
        {"kind": "gelu", "name": "gelu"},
        {"kind": "dropout", "name": "drop", "rate": 0.5},
        {"kind": "token_pool"},
        {"kind": "dense", "name": "ln_flat_in", "units": 5},
        {"kind": "layernorm", "name": "ln_flat"},
        {"kind": "dense", "units": 3},
        {"kind": "softmax_cross_entropy"},
    ],
}


def _layout(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A workload's per-sample shape in the layout the network runs (images channels-last)."""
    return (*shape[1:], shape[0]) if len(shape) == 3 else shape


def _op(doc: dict, name: str, cls: type[Op] | None = None) -> Op:
    info = gradcheck.layer_info(Workload.from_dict(doc), name)
    return gradcheck.build(cls or KINDS[info.kind], info, _layout(info.input_shape))


def _first(kind: str, input_shape: list[int], **settings: Any) -> dict:
    """``kind`` right on the input (no parametric layer before it: no input gradient)."""
    flat = [] if kind == "global_avgpool" or len(input_shape) == 1 else [{"kind": "flatten"}]
    return {
        "input_shape": input_shape,
        "layers": [
            {"kind": kind, "name": "x", **settings},
            *flat,
            {"kind": "dense", "units": 3},
            {"kind": "softmax_cross_entropy"},
        ],
    }


def _x(op: Op, batch: int, seed: int = 1, loc: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, *op.in_shape)) + loc).astype(np.float32)


def _fixed_mask(op: Dropout, seed: int = 7) -> None:
    """Every forward of ``op`` draws the same mask (finite differences compare forwards)."""
    forward = op.forward

    def reseeded(x: np.ndarray, buf: dict) -> np.ndarray:
        op.set_rng(np.random.default_rng(seed))
        return forward(x, buf)

    op.forward = reseeded  # type: ignore[method-assign]


CASES = [(IMAGE, n) for n in ("bn", "pool", "gelu", "drop", "gap")]
CASES += [(TOKENS, n) for n in ("ln", "gelu", "drop", "ln_flat")]


@pytest.mark.parametrize(("doc", "name"), CASES, ids=[f"{d['input_shape']}-{n}" for d, n in CASES])
def test_gradients_match_finite_differences(doc: dict, name: str) -> None:
    op = _op(doc, name)
    assert op.info.needs_input_grad
    params, grads = gradcheck.bind_random(op, np.random.default_rng(0))
    if op.state_count:
        op.bind_state(op.initial_state())
    if isinstance(op, Dropout):
        _fixed_mask(op)
    gradcheck.check_op(op, _x(op, 3), params, grads)


def test_shapes_in_the_network_layout() -> None:
    shapes = {n: (_op(IMAGE, n).in_shape, _op(IMAGE, n).out_shape) for n in ("pool", "gap")}
    assert shapes == {"pool": ((6, 6, 3), (3, 3, 3)), "gap": ((3, 3, 3), (3,))}
    bn = _op(IMAGE, "bn")
    assert (bn.weight_shape, bn.state_count) == ((3,), 6)
    assert _op(TOKENS, "ln").weight_shape == (8,)


def _bn_with_state(doc: dict = IMAGE) -> tuple[BatchNorm2d, np.ndarray]:
    op = _op(doc, "bn", BatchNorm2d)
    assert isinstance(op, BatchNorm2d)
    gradcheck.bind_random(op, np.random.default_rng(0))
    state = op.initial_state()
    np.testing.assert_array_equal(state, [0, 0, 0, 1, 1, 1])
    assert state.dtype == np.float32
    op.bind_state(state)
    return op, state


def test_batchnorm_training_uses_batch_statistics_and_updates_running_ones() -> None:
    op, state = _bn_with_state()
    x = _x(op, 4, loc=2.0)
    y = op.forward(x, op.allocate(np, 4, True))
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    expected = (x - mean) / np.sqrt(var + 1e-5) * op.w + op.b
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    unbiased = x.var(axis=(0, 1, 2), ddof=1)
    np.testing.assert_allclose(state[:3], 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(state[3:], 0.9 + 0.1 * unbiased, rtol=1e-5)
    op.forward(x, op.allocate(np, 4, True))  # a second step moves them again
    np.testing.assert_allclose(state[:3], 0.19 * mean, rtol=1e-5)


def test_batchnorm_evaluation_uses_the_running_statistics() -> None:
    op, state = _bn_with_state()
    state[:] = [0.5, -1.0, 2.0, 4.0, 0.25, 1.5]
    x = _x(op, 2)
    y = op.forward(x, op.allocate(np, 2, False))
    expected = (x - state[:3]) / np.sqrt(state[3:] + 1e-5) * op.w + op.b
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state, [0.5, -1.0, 2.0, 4.0, 0.25, 1.5])  # left as it was


@pytest.mark.parametrize("name", ["ln", "ln_flat"])
def test_layernorm_forward_matches_the_formula(name: str) -> None:
    op = _op(TOKENS, name, LayerNorm)
    gradcheck.bind_random(op, np.random.default_rng(0))
    x = _x(op, 3, loc=-1.5)
    y = op.forward(x, op.allocate(np, 3, False))
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * op.w + op.b, atol=1e-5)


def test_gelu_forward_matches_the_tanh_form() -> None:
    op = _op(TOKENS, "gelu", Gelu)
    x = _x(op, 2) * 3
    c = np.sqrt(2 / np.pi)
    expected = 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(op.forward(x, op.allocate(np, 2, True)), expected, atol=1e-6)


def test_dropout_evaluation_is_the_identity() -> None:
    op = _op(TOKENS, "drop", Dropout)
    x = _x(op, 2)
    buf = op.allocate(np, 2, False)
    assert op.forward(x, buf) is x
    dy = _x(op, 2, seed=2)
    assert op.backward(dy, buf) is dy
    at_zero = _op(_first("dropout", [6], rate=0.0), "x", Dropout)
    x = _x(at_zero, 2)
    assert at_zero.forward(x, at_zero.allocate(np, 2, True)) is x  # rate 0: even in training


def test_dropout_training_drops_about_rate_and_scales_the_rest() -> None:
    op = _op(IMAGE, "drop", Dropout)  # rate 0.25
    batch = 400
    x = _x(op, batch) + 10.0  # no zeros of its own
    buf = op.allocate(np, batch, True)
    y = op.forward(x, buf).copy()
    dropped = y == 0
    assert abs(dropped.mean() - 0.25) < 0.02
    np.testing.assert_allclose(y[~dropped], x[~dropped] / 0.75, rtol=1e-6)
    dy = _x(op, batch, seed=3)
    np.testing.assert_allclose(op.backward(dy, buf), np.where(dropped, 0, dy / 0.75), rtol=1e-6)
    assert not np.array_equal(op.forward(x, buf) == 0, dropped)  # the next step draws anew


def test_dropout_masks_follow_the_generator_seed() -> None:
    def outputs(seed: int) -> list[np.ndarray]:
        op = _op(TOKENS, "drop", Dropout)
        op.set_rng(np.random.default_rng(seed))
        buf, x = op.allocate(np, 5, True), _x(op, 5)
        return [op.forward(x, buf).copy() for _ in range(2)]

    first, again, other = outputs(11), outputs(11), outputs(12)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])


def _avgpool_loop(x: np.ndarray, size: int, stride: int, padding: int) -> np.ndarray:
    batch, h, w, c = x.shape
    padded = np.zeros((batch, h + 2 * padding, w + 2 * padding, c))
    padded[:, padding : padding + h, padding : padding + w] = x
    oh, ow = (h + 2 * padding - size) // stride + 1, (w + 2 * padding - size) // stride + 1
    y = np.zeros((batch, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            window = padded[:, i * stride : i * stride + size, j * stride : j * stride + size]
            y[:, i, j] = window.sum(axis=(1, 2)) / size**2
    return y


@pytest.mark.parametrize(
    ("size", "stride", "padding"), [(3, 2, 1), (2, 2, 1), (3, 1, 1), (2, 3, 0)]
)
def test_avgpool_matches_a_direct_loop_and_its_gradient(size: int, stride: int, padding: int):
    pool = {"kind": "avgpool2d", "name": "pool", "size": size, "stride": stride, "padding": padding}
    doc = {**IMAGE, "input_shape": [2, 7, 6]}
    doc["layers"] = [IMAGE["layers"][0], pool, *IMAGE["layers"][-3:]]
    op = _op(doc, "pool", AvgPool2d)
    x = _x(op, 2)
    expected = _avgpool_loop(x, size, stride, padding)
    assert op.out_shape == expected.shape[1:]
    np.testing.assert_allclose(op.forward(x, op.allocate(np, 2, False)), expected, atol=1e-6)
    # The backward is the forward's transpose: <dy, pool(x)> = <unpool(dy), x>.
    buf = op.allocate(np, 2, True)
    y = op.forward(x, buf).copy()
    dy = np.random.default_rng(5).standard_normal(y.shape).astype(np.float32)
    assert np.isclose(np.vdot(dy, y), np.vdot(op.backward(dy, buf), x), rtol=1e-5)


def test_global_avgpool_is_the_spatial_mean() -> None:
    op = _op(IMAGE, "gap", GlobalAvgPool)
    x = _x(op, 2)
    np.testing.assert_allclose(op.forward(x, op.allocate(np, 2, False)), x.mean(axis=(1, 2)))


FIRST = [
    ("batchnorm2d", [2, 4, 4], {}),
    ("layernorm", [6], {}),
    ("layernorm", [3, 5], {}),
    ("gelu", [6], {}),
    ("dropout", [6], {"rate": 0.5}),
    ("avgpool2d", [2, 4, 4], {"size": 2}),
    ("global_avgpool", [2, 4, 4], {}),
]


@pytest.mark.parametrize(("kind", "shape", "settings"), FIRST, ids=[f[0] for f in FIRST])
def test_no_input_gradient_without_parameters_upstream(kind: str, shape: list, settings: dict):
    doc = _first(kind, shape, **settings)
    if kind == "layernorm" and len(shape) == 2:  # [T, n] needs a token_pool before the dense
        doc["layers"][1] = {"kind": "token_pool"}
    op = _op(doc, "x")
    assert not op.info.needs_input_grad
    params, grads = gradcheck.bind_random(op, np.random.default_rng(0))
    buf = op.allocate(np, 3, True)
    y = op.forward(_x(op, 3), buf)
    assert op.backward(np.ones_like(y), buf) is None
    if op.info.param_count:  # parameter gradients are still computed
        gradcheck.check_op(op, _x(op, 3), params, grads, check_inputs=False)


@pytest.mark.parametrize(("doc", "name"), CASES, ids=[f"{d['input_shape']}-{n}" for d, n in CASES])
def test_contract_inputs_untouched_and_parameter_gradients_written(doc: dict, name: str) -> None:
    op = _op(doc, name)
    _, grads = gradcheck.bind_random(op, np.random.default_rng(0))
    x = _x(op, 3)
    x_saved = x.copy()
    results = []
    for _ in range(2):  # the second step reuses the workspace, and grads hold stale values
        grads[:] = np.nan
        buf = op.allocate(np, 3, True)
        if isinstance(op, Dropout):
            op.set_rng(np.random.default_rng(3))
        y = op.forward(x, buf)
        dy = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
        dy_saved = dy.copy()
        dx = op.backward(dy, buf)
        np.testing.assert_array_equal(dy, dy_saved)
        np.testing.assert_array_equal(x, x_saved)
        assert dx.shape == x.shape and dx.dtype == np.float32 and y.dtype == np.float32
        assert not np.isnan(grads).any()
        results.append((y.copy(), dx.copy(), grads.copy()))
    for first, second in zip(*results, strict=True):
        np.testing.assert_array_equal(first, second)


def test_layernorm_on_an_image_is_refused_by_the_workload() -> None:
    """Its last axis would be the width channels-first and the channels channels-last: the
    workload language takes layernorm on features only."""
    with pytest.raises(WorkloadError, match="layernorm needs a flat input"):
        Workload.from_dict(_first("layernorm", [2, 4, 4]))


@pytest.mark.parametrize(("doc", "name"), CASES, ids=[f"{d['input_shape']}-{n}" for d, n in CASES])
def test_array_module_path_gives_numpy_results_and_masks(doc: dict, name: str) -> None:
    """On a stand-in for CuPy (numpy posing as a device module, no CUDA): the ``xp`` path,
    dropout's host-drawn mask copied to the device included, gives numpy's results."""
    xp = fake_cupy.make_module()
    reference = _op(doc, name)
    results = []
    for op in (reference, type(reference)(reference.info, ArrayKernels(xp), reference.in_shape)):
        _, grads = gradcheck.bind_random(op, np.random.default_rng(0))
        if isinstance(op, Dropout):
            op.set_rng(np.random.default_rng(9))
        buf = op.allocate(op.xp, 3, True)
        y = op.forward(op.xp.asarray(_x(op, 3)), buf)
        dx = op.backward(np.ones(y.shape, np.float32), buf)
        results.append((np.asarray(y).copy(), np.asarray(dx).copy(), grads.copy()))
    for on_numpy, on_xp in zip(*results, strict=True):
        np.testing.assert_array_equal(on_numpy, on_xp)
