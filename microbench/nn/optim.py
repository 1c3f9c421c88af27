"""The optimizers of the real network, in place on the flat parameter array: SGD with optional
(heavy-ball) momentum, and Adam / AdamW.

Each keeps its state in arrays shaped like the gradients, allocated on the first step
(:attr:`state`: name -> array, what a checkpoint saves; :meth:`load_state` puts it back), and
updates in one fused numba pass on numpy (a few in-place array operations on other array
modules, with one scratch array). Arithmetic stays float32.

``grad_scale`` multiplies the gradients as they are read: a data-parallel run allreduces the
sum of its ranks' mean gradients, and 1 / ranks makes that the global mean without another pass
(:func:`make_optimizer`; SGD divides its learning rate instead, which is the same for it).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy

from microbench.kernels import kernels_for

OPTIMIZERS = ("sgd", "adam", "adamw")


class SGD:
    """``v = momentum * v + g; p -= lr * v`` (with momentum 0: ``p -= lr * g``), in place."""

    name = "sgd"

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

    @property
    def state(self) -> dict[str, Any]:
        return {} if self.velocity is None else {"velocity": self.velocity}

    def state_names(self) -> tuple[str, ...]:
        """The arrays :attr:`state` holds once the optimizer has stepped."""
        return ("velocity",) if self.momentum else ()

    def load_state(self, arrays: dict[str, Any], steps: int) -> None:
        if "velocity" in arrays:
            self.velocity = self.xp.asarray(arrays["velocity"])

    def step(self, params: Any, grads: Any) -> None:
        if self.momentum and (self.velocity is None or self.velocity.shape != grads.shape):
            self.velocity = self.xp.zeros_like(grads)
        needs_scratch = self._kernels.name == "array"  # for lr * v; numba fuses it away
        if needs_scratch and (self._scratch is None or self._scratch.shape != grads.shape):
            self._scratch = self.xp.empty_like(grads)
        self._kernels.sgd_update(
            params, grads, self.velocity, self.lr, self.momentum, self._scratch
        )


class Adam:
    """Adam (Kingma and Ba 2015) as PyTorch's ``torch.optim.Adam`` computes it, with
    ``weight_decay`` as an L2 term added to the gradient; ``decoupled``: AdamW (Loshchilov and
    Hutter 2019), the weights shrunk by ``lr * weight_decay`` each step instead."""

    def __init__(
        self,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = False,
        grad_scale: float = 1.0,
        xp: ModuleType = numpy,
    ) -> None:
        if not lr > 0.0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not (eps > 0.0 and weight_decay >= 0.0 and grad_scale > 0.0):
            raise ValueError("eps and grad_scale must be > 0 and weight_decay >= 0")
        self.name = "adamw" if decoupled else "adam"
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.weight_decay, self.decoupled = float(weight_decay), decoupled
        self.grad_scale = float(grad_scale)
        self.xp = xp
        self.steps = 0
        self.m: Any = None
        self.v: Any = None
        self._scratch: Any = None
        self._kernels = kernels_for(xp)

    @property
    def state(self) -> dict[str, Any]:
        return {} if self.m is None else {"adam_m": self.m, "adam_v": self.v}

    def state_names(self) -> tuple[str, ...]:
        return ("adam_m", "adam_v")

    def load_state(self, arrays: dict[str, Any], steps: int) -> None:
        self.m, self.v = (self.xp.asarray(arrays[k]) for k in ("adam_m", "adam_v"))
        self.steps = int(steps)

    def scalars(self) -> numpy.ndarray:
        """The eight float32 figures of this step (:func:`microbench.kernels.loops.adam_serial`)."""
        b1, b2 = self.betas
        t = self.steps
        l2 = 0.0 if self.decoupled else self.weight_decay
        decay = 1.0 - self.lr * self.weight_decay if self.decoupled else 1.0
        step = self.lr / (1.0 - b1**t)
        rsq = 1.0 / math.sqrt(1.0 - b2**t)
        return numpy.array([self.grad_scale, l2, b1, b2, decay, step, rsq, self.eps],
                           dtype=numpy.float32)  # fmt: skip

    def step(self, params: Any, grads: Any) -> None:
        if self.m is None or self.m.shape != grads.shape:
            self.m, self.v = self.xp.zeros_like(grads), self.xp.zeros_like(grads)
        if self._kernels.name == "array" and (
            self._scratch is None or self._scratch.shape != grads.shape
        ):
            self._scratch = self.xp.empty_like(grads)
        self.steps += 1
        self._kernels.adam_update(params, grads, self.m, self.v, self.scalars(), self._scratch)


def make_optimizer(
    name: str,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    ranks: int = 1,
    xp: ModuleType = numpy,
) -> SGD | Adam:
    """The optimizer ``name`` (:data:`OPTIMIZERS`) for gradients summed over ``ranks`` ranks'
    means: SGD divides its learning rate by ``ranks``, Adam scales the gradients it reads."""
    if name == "sgd":
        if weight_decay:
            raise ValueError("weight decay is for adam and adamw here")
        return SGD(lr / ranks, momentum, xp=xp)
    if name not in ("adam", "adamw"):
        raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    if momentum:
        raise ValueError(f"{name} keeps its own moments: momentum is for sgd")
    return Adam(lr, weight_decay=weight_decay, decoupled=name == "adamw",
                grad_scale=1.0 / ranks, xp=xp)  # fmt: skip
