"""Finite-difference gradient checks of :mod:`microbench.nn` ops and networks.

A scalar loss ``L = sum(r * f(x, w))`` with a fixed random ``r``; the analytic gradients (the
op's backward of ``r``) are compared with central differences along random directions, which
float32 resolves far better than per-element differences: for a direction ``v``,
``(L(x + eps v) - L(x - eps v)) / (2 eps)`` against ``<grad, v>``. A direction moves every
value, so ops with kinks (relu, max-pool) need an ``eps`` below the inputs' distance to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from microbench.kernels import kernels_for
from microbench.nn.layers import Op
from microbench.workload import LayerInfo, Workload

DIRECTIONS = 4


def bind_random(op: Op, rng: np.random.Generator, scale: float = 0.5) -> tuple[Any, Any]:
    """Random float32 parameters for ``op`` in one flat array (weights, then bias) and a
    gradient array of the same layout, both bound to the op as the network binds them;
    ``(params, grads)``."""
    n_w, n_b = op.info.weight_count, op.info.bias_count
    params = (rng.standard_normal(n_w + n_b) * scale).astype(np.float32)
    grads = np.zeros_like(params)
    w = dw = b = db = None  # as the network binds them: None where there are none
    if op.weight_shape is not None:
        w, dw = params[:n_w].reshape(op.weight_shape), grads[:n_w].reshape(op.weight_shape)
    if n_b:
        b, db = params[n_w:], grads[n_w:]
    if n_w + n_b:
        op.bind(w, b, dw, db)
    if op.state_count:
        op.bind_state(np.zeros(op.state_count, np.float32))
    return params, grads


def layer_info(workload: Workload, name: str) -> LayerInfo:
    """The layer called ``name`` in ``workload``."""
    return next(info for info in workload.layers if info.name == name)


def build(op_class: type[Op], info: LayerInfo, in_shape: tuple[int, ...], **kw: Any) -> Op:
    """``op_class`` on the numpy array kernels (the same results as numba's, to rounding)."""
    return op_class(info, kernels_for(np, "array"), in_shape, **kw)


def numeric_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``f()`` with respect to every entry of ``x`` (for
    float64 references and small arrays; ``x`` restored)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


def directional(
    loss: Callable[[], float], target: np.ndarray, grad: np.ndarray, rng: np.random.Generator,
    eps: float, rtol: float, what: str,
) -> None:  # fmt: skip
    saved = target.copy()
    for _ in range(DIRECTIONS):
        v = rng.standard_normal(target.shape).astype(np.float32)
        v /= np.linalg.norm(v) / math.sqrt(v.size)  # unit rms: every value moves by ~eps
        target[...] = saved + eps * v
        up = loss()
        target[...] = saved - eps * v
        down = loss()
        target[...] = saved
        numeric = (up - down) / (2 * eps)
        analytic = float(np.vdot(grad.astype(np.float64), v.astype(np.float64)))
        scale = max(abs(numeric), abs(analytic), 1e-3 * math.sqrt(v.size))
        assert abs(numeric - analytic) <= rtol * scale, (
            f"{what}: finite difference {numeric:.6g} vs backward {analytic:.6g}"
        )


def check_op(
    op: Op,
    inputs: Sequence[np.ndarray] | np.ndarray,
    params: np.ndarray | None = None,
    grads: np.ndarray | None = None,
    seed: int = 0,
    eps: float = 1e-2,
    rtol: float = 2e-2,
    check_inputs: bool = True,
) -> None:
    """``op``'s backward against central differences of ``sum(r * forward(inputs))``, for its
    inputs (float ones; token ids are not differentiable: ``check_inputs=False``) and for
    ``params`` (the flat array :func:`bind_random` returned, with its ``grads``).

    The op runs in float32 with a fresh training workspace per evaluation, so that
    nothing one forward keeps leaks into the next."""
    rng = np.random.default_rng(seed)
    many = not isinstance(inputs, np.ndarray)
    xs = [np.ascontiguousarray(x) for x in (inputs if many else [inputs])]
    batch = xs[0].shape[0]

    def run() -> tuple[np.ndarray, dict]:
        buf = op.allocate(np, batch, True)
        y = op.forward(tuple(xs) if many else xs[0], buf)
        return np.array(y, copy=True), buf

    y, buf = run()
    r = rng.standard_normal(y.shape).astype(np.float32)
    dxs = op.backward(r.copy(), buf)
    dxs = list(dxs) if many else [dxs]
    analytic_params = None if grads is None else grads.copy()

    def loss() -> float:
        out, _ = run()
        return float(np.vdot(out.astype(np.float64), r.astype(np.float64)))

    if check_inputs:
        for i, (x, dx) in enumerate(zip(xs, dxs, strict=True)):
            assert dx is not None, f"input {i}: backward returned no gradient"
            assert dx.shape == x.shape, f"input {i}: gradient shape {dx.shape} vs {x.shape}"
            directional(loss, x, np.asarray(dx), rng, eps, rtol, f"input {i}")
    if params is not None and analytic_params is not None and params.size:
        directional(loss, params, analytic_params, rng, eps, rtol, "parameters")
