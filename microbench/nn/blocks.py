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

EPS = 1e-5  # both normalisations, as PyTorch's default


def _inv_std(xp: Any, var: Any) -> None:
    """``var`` becomes ``1 / sqrt(var + EPS)``, in place."""
    xp.add(var, EPS, out=var)
    xp.sqrt(var, out=var)
    xp.reciprocal(var, out=var)


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
        buf.update({key: _empty(xp, (c,)) for key in ("mean", "inv_std", "tmp")})
        if training:
            dx = self._dx(xp, batch, training)
            # ``work`` holds dy * xhat for gamma's gradient: dx's buffer where there is one.
            buf.update(xhat=_empty(xp, shape), dx=dx, work=_empty(xp, shape) if dx is None else dx)
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        xp, c, y = self.xp, self.channels, buf["y"]
        mean, inv = buf["mean"], buf["inv_std"]
        if not buf["training"]:  # y = x * scale + shift, per channel
            xp.copyto(inv, self.state[c:])
            _inv_std(xp, inv)
            xp.multiply(inv, self.w, out=inv)
            xp.multiply(self.state[:c], inv, out=mean)
            xp.subtract(self.b, mean, out=mean)
            xp.multiply(x, inv, out=y)
            xp.add(y, mean, out=y)
            return y
        xhat = buf["xhat"]
        xp.mean(x.reshape(-1, c), axis=0, out=mean)
        xp.subtract(x, mean, out=xhat)
        xp.multiply(xhat, xhat, out=y)  # y as scratch for the squares
        xp.mean(y.reshape(-1, c), axis=0, out=inv)  # the biased variance, for now
        self._update_running(mean, inv, x.size // c, buf["tmp"])
        _inv_std(xp, inv)
        xp.multiply(xhat, inv, out=xhat)
        xp.multiply(xhat, self.w, out=y)
        xp.add(y, self.b, out=y)
        return y

    def _update_running(self, mean: Any, var: Any, count: int, tmp: Any) -> None:
        xp, c, m = self.xp, self.channels, self.MOMENTUM
        running_mean, running_var = self.state[:c], self.state[c:]
        xp.multiply(running_mean, 1.0 - m, out=running_mean)
        xp.multiply(mean, m, out=tmp)
        xp.add(running_mean, tmp, out=running_mean)
        xp.multiply(running_var, 1.0 - m, out=running_var)
        xp.multiply(var, m * count / max(count - 1, 1), out=tmp)
        xp.add(running_var, tmp, out=running_var)

    def backward(self, dy: Any, buf: Buffers) -> Any:
        """``dx = gamma / std * (dy - mean(dy) - xhat * mean(dy * xhat))``, per channel."""
        xp, c = self.xp, self.channels
        xhat, work, dx, tmp = buf["xhat"], buf["work"], buf["dx"], buf["tmp"]
        count = dy.size // c
        xp.sum(dy.reshape(-1, c), axis=0, out=self.db)
        xp.multiply(dy, xhat, out=work)
        xp.sum(work.reshape(-1, c), axis=0, out=self.dw)
        if dx is None:
            return None
        xp.multiply(self.dw, 1.0 / count, out=tmp)
        xp.multiply(xhat, tmp, out=dx)
        xp.subtract(dy, dx, out=dx)
        xp.multiply(self.db, 1.0 / count, out=tmp)
        xp.subtract(dx, tmp, out=dx)
        xp.multiply(self.w, buf["inv_std"], out=tmp)
        xp.multiply(dx, tmp, out=dx)
        return dx


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
        host, mask = buf["host"], buf["mask"]
        self.rng.random(dtype=np.float32, out=host)
        np.greater_equal(host, self.rate, out=host)  # 1 kept, 0 dropped
        np.multiply(host, 1.0 / (1.0 - self.rate), out=host)
        if mask is not host:
            mask.set(host)  # cupy: a host-to-device copy into the buffer
        self.xp.multiply(x, mask, out=buf["y"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if not self.info.needs_input_grad:
            return None
        if not buf["active"]:
            return dy
        self.xp.multiply(dy, buf["mask"], out=buf["dx"])
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
