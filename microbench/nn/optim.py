"""Plain SGD with optional (heavy-ball) momentum, in place on the flat parameter array."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

from microbench.kernels import kernels_for


class SGD:
    """``v = momentum * v + g; p -= lr * v`` (with momentum 0: ``p -= lr * g``), in place.

    On numpy this is one fused numba pass over the arrays; on other array modules a few
    in-place array operations. The velocity (and, off numpy, one scratch array) is allocated
    on the first step, shaped like the gradients; later steps allocate nothing. Arithmetic
    stays float32.
    """

    def __init__(self, lr: float, momentum: float = 0.0, xp: ModuleType = numpy) -> None:
        if not lr >= 0.0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.xp = xp
        self.velocity: Any = None
        self._scratch: Any = None
        self._kernels = kernels_for(xp)

    def step(self, params: Any, grads: Any) -> None:
        if self.momentum and (self.velocity is None or self.velocity.shape != grads.shape):
            self.velocity = self.xp.zeros_like(grads)
        needs_scratch = self._kernels.name == "array"  # for lr * v; numba fuses it away
        if needs_scratch and (self._scratch is None or self._scratch.shape != grads.shape):
            self._scratch = self.xp.empty_like(grads)
        self._kernels.sgd_update(
            params, grads, self.velocity, self.lr, self.momentum, self._scratch
        )
