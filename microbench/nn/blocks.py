"""Ops for the normalisation, activation, regularisation and pooling kinds of modern networks:
``batchnorm2d``, ``layernorm``, ``gelu``, ``dropout``, ``avgpool2d`` and ``global_avgpool``.

Each keeps the contract of :class:`microbench.nn.layers.Op`, is written against ``self.xp``
(numpy or cupy) and works in float32 with ``out=`` into the buffers of its workspace, so that a
step allocates no activation-sized array. Images are channels-last ``(batch, h, w, c)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from microbench.kernels import Kernels, conv_output_hw
from microbench.nn.layers import Buffers, Op, _empty
from microbench.workload import LayerInfo

__all__ = ["AvgPool2d", "BatchNorm2d", "Dropout", "Gelu", "GlobalAvgPool", "LayerNorm"]


class BatchNorm2d(Op):
    """Normalisation of each channel over (batch, height, width), then ``gamma x + beta``.

    ``w`` is gamma and ``b`` beta, ``(channels,)`` each (the network starts them at 1 and 0);
    ``state`` holds the running mean, then the running variance (start: 0 and 1, from
    :meth:`initial_state`). Training normalises with the batch's statistics (biased variance)
    and moves the running ones by ``MOMENTUM`` with the unbiased variance, as PyTorch does (the
    biased one where a channel has a single value, where PyTorch refuses); evaluation
    normalises with the running ones."""

    MOMENTUM = 0.1

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        if len(in_shape) != 3:
            raise ValueError(f"batchnorm2d needs (height, width, channels), got {in_shape}")
        self.channels = in_shape[-1]
        self.weight_shape = (self.channels,)
        self.state_count = 2 * self.channels

    def initial_state(self) -> np.ndarray:
        """Running mean 0, running variance 1 (float32, on the host)."""
        c = self.channels
        return np.concatenate([np.zeros(c, np.float32), np.ones(c, np.float32)])

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        shape, c = (batch, *self.in_shape), self.channels
        buf: Buffers = {"training": training, "y": _empty(xp, shape)}
        if training:
            buf.update(mean=_empty(xp, (c,)), inv_std=_empty(xp, (c,)), xhat=_empty(xp, shape),
                       dx=self._dx(xp, batch, training))  # fmt: skip
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        y = buf["y"]
        if not buf["training"]:
            self.k.batchnorm_eval(x, self.w, self.b, self.state, y)
            return y
        self.k.batchnorm_forward(x, self.w, self.b, self.state, self.MOMENTUM, y, buf["xhat"],
                                 buf["mean"], buf["inv_std"])  # fmt: skip
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        """``dx = gamma / std * (dy - mean(dy) - xhat * mean(dy * xhat))``, per channel."""
        self.k.batchnorm_backward(dy, buf["xhat"], self.w, buf["inv_std"], self.dw, self.db,
                                  buf["dx"])  # fmt: skip
        return buf["dx"]


class LayerNorm(Op):
    """Normalisation over the last axis of ``(batch, features)`` or ``(batch, tokens,
    features)``, then ``gamma x + beta``; ``w`` is gamma, ``b`` beta, ``(features,)`` each
    (the network starts them at 1 and 0)."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        if len(in_shape) not in (1, 2):
            raise ValueError(f"layernorm needs (features,) or (tokens, features), got {in_shape}")
        self.features = in_shape[-1]
        self.weight_shape = (self.features,)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        shape, stat = (batch, *self.in_shape), (batch, *self.in_shape[:-1], 1)
        return {"y": _empty(xp, shape), "xhat": _empty(xp, shape),
                "inv_std": _empty(xp, stat), "dx": self._dx(xp, batch, training)}  # fmt: skip

    def forward(self, x: Any, buf: Buffers) -> Any:
        self.k.layernorm_forward(x, self.w, self.b, buf["y"], buf["xhat"], buf["inv_std"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        """With ``g = dy * gamma``: ``dx = (g - mean(g) - xhat * mean(g * xhat)) / std``."""
        self.k.layernorm_backward(dy, buf["xhat"], buf["inv_std"], self.w, self.dw, self.db,
                                  buf["dx"])  # fmt: skip
        return buf["dx"]


class Gelu(Op):
    """``0.5 x (1 + tanh(C (x + A x^3)))`` (the tanh form, GPT-2's and BERT's). Training keeps
    the tanh for backward, only where an input gradient is wanted (gelu has no parameters)."""

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        shape = (batch, *self.in_shape)
        keep = training and self.info.needs_input_grad
        return {"y": _empty(xp, shape), "dx": self._dx(xp, batch, training),
                "t": _empty(xp, shape) if keep else None}  # fmt: skip

    def forward(self, x: Any, buf: Buffers) -> Any:
        buf["x"] = x
        self.k.gelu_forward(x, buf["y"], buf["t"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if buf["dx"] is None:
            return None
        self.k.gelu_backward(dy, buf["x"], buf["t"], buf["dx"])
        return buf["dx"]


class Dropout(Op):
    """Inverted dropout: in training each value is kept with probability ``1 - rate`` and
    scaled by ``1 / (1 - rate)``; in evaluation (or at rate 0) the identity, its output the
    input itself. The mask is drawn on the host from ``self.rng`` (:meth:`set_rng`) and copied
    to the device, so that numpy and cupy runs of one seed drop the same values."""

    draws_random = True

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        self.rate = float(info.layer.get("rate"))
        self.rng = np.random.default_rng(0)

    def set_rng(self, rng: np.random.Generator) -> None:
        """The generator the masks are drawn from (the network's, for reproducible runs)."""
        self.rng = rng

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        active = training and self.rate > 0
        buf: Buffers = {"training": training, "active": active}
        if active:
            shape = (batch, *self.in_shape)
            host = np.empty(shape, np.float32)
            buf.update(host=host, mask=host if xp is np else _empty(xp, shape))
            buf.update(y=_empty(xp, shape), dx=self._dx(xp, batch, training))
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        if not buf["active"]:
            return x
        self.k.dropout_forward(x, self.rng, self.rate, buf["host"], buf["mask"], buf["y"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if not self.info.needs_input_grad:
            return None
        if not buf["active"]:
            return dy
        self.k.dropout_backward(dy, buf["mask"], buf["dx"])
        return buf["dx"]


class AvgPool2d(Op):
    """Average over ``size`` x ``size`` windows (channels-last), zero padding counted in the
    divisor (PyTorch's ``count_include_pad=True``): one kernel call each way."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        s = info.layer.settings
        self.size = s["size"]
        self.stride, self.padding = s.get("stride") or self.size, s.get("padding", 0)
        oh, ow = conv_output_hw(h, w, self.size, self.stride, self.padding)
        self.out_shape = (oh, ow, c)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def forward(self, x: Any, buf: Buffers) -> Any:
        self.k.avgpool2d_forward(x, self.size, self.stride, self.padding, buf["y"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        dx = buf["dx"]
        if dx is None:
            return None
        self.k.avgpool2d_backward(dy, self.size, self.stride, self.padding, dx)
        return dx


class GlobalAvgPool(Op):
    """The mean over height and width: ``(batch, h, w, c)`` to ``(batch, c)``."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        if len(in_shape) != 3:
            raise ValueError(f"global_avgpool needs (height, width, channels), got {in_shape}")
        self.out_shape = (in_shape[-1],)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def forward(self, x: Any, buf: Buffers) -> Any:
        self.k.global_avgpool_forward(x, buf["y"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        dx = buf["dx"]
        if dx is None:
            return None
        self.k.global_avgpool_backward(dy, dx)
        return dx
