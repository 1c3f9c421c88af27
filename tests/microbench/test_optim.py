"""Adam and AdamW against a float64 reference of their definition, on both kernel backends."""

import numpy as np
import pytest

from microbench.kernels import kernels_for
from microbench.nn.optim import Adam, make_optimizer


def _reference(p, grads, lr, wd, decoupled, scale, betas=(0.9, 0.999), eps=1e-8):
    """PyTorch's Adam (L2 on the gradient) or AdamW (decoupled decay), in float64."""
    p = p.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64) * scale
        if decoupled:
            p *= 1 - lr * wd
        else:
            g = g + wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p -= lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return p


@pytest.mark.parametrize("backend", ["numba", "array"])
@pytest.mark.parametrize(("decoupled", "wd"), [(False, 0.0), (False, 0.05), (True, 0.05)])
def test_adam_and_adamw_follow_their_definition(backend, decoupled, wd):
    rng = np.random.default_rng(3)
    p = rng.standard_normal(300_000).astype(np.float32)  # above the parallel loops' threshold
    grads = [rng.standard_normal(p.size).astype(np.float32) for _ in range(6)]
    opt = Adam(1e-2, weight_decay=wd, decoupled=decoupled, grad_scale=0.5)
    opt._kernels = kernels_for(np, backend)
    mine = p.copy()
    for g in grads:
        opt.step(mine, g)
    expected = _reference(p, grads, 1e-2, wd, decoupled, 0.5)
    np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6)
    assert opt.steps == 6 and set(opt.state) == {"adam_m", "adam_v"}
    assert mine.dtype == np.float32


def test_the_optimizers_by_name_and_what_they_refuse():
    assert make_optimizer("sgd", 0.1, 0.9, ranks=4).lr == pytest.approx(0.025)
    adam = make_optimizer("adamw", 1e-3, weight_decay=0.01, ranks=4)
    assert (adam.name, adam.grad_scale, adam.decoupled) == ("adamw", 0.25, True)
    for kwargs, message in (
        ({"name": "adam", "lr": 1e-3, "momentum": 0.9}, "keeps its own moments"),
        ({"name": "sgd", "lr": 0.1, "weight_decay": 0.1}, "weight decay is for adam"),
        ({"name": "lion", "lr": 0.1}, "unknown optimizer 'lion'"),
    ):
        with pytest.raises(ValueError, match=message):
            make_optimizer(**kwargs)
