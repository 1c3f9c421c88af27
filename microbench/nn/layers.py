"""The operations :class:`microbench.nn.Network` runs: one per layer, or one for a fused group.

Fusion: a dense or conv2d layer absorbs the relu and max-pool right after it, so that no pass
over the big pre-activation tensor is spent on the bias or the relu:

* dense/conv + relu: the GEMM writes ``z = x @ W``, one pass adds the bias and clips in place.
* conv + relu + maxpool (either order): pool first, then bias and relu on the 4x smaller pooled
  tensor, since ``pool(relu(z + b)) = relu(pool(z) + b)`` (``t -> relu(t + b)`` is monotone and
  ``b`` is constant over a window). Backward masks and sums the bias gradient on the pooled
  gradient too, and only the pool's scatter touches the big one.

An op owns no activations: each batch size gets a workspace (one dict of buffers per op),
allocated once and reused every step. What an op keeps between forward and backward lives in
its dict. 2-D activations are channels-last ``(batch, height, width, channels)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from microbench.kernels import Kernels, conv_output_hw, pool_output_hw
from microbench.kernels.calls import fused_ops
from microbench.workload import LayerInfo

Buffers = dict[str, Any]


def _empty(xp: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
    return xp.empty(shape, dtype=dtype)


class Op(ABC):
    """One layer (or a fused group led by ``info``), on per-sample ``in_shape`` activations."""

    weight_shape: tuple[int, ...] | None = None

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        self.info = info
        self.k = kernels
        self.in_shape = in_shape
        self.out_shape = in_shape
        self.w = self.b = self.dw = self.db = None

    def bind(self, w: Any, b: Any, dw: Any, db: Any) -> None:
        """Views of this op's parameters and gradients in the network's flat arrays."""
        self.w, self.b, self.dw, self.db = w, b, dw, db

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        """Buffers for ``batch`` samples; without ``training``, none for the backward pass."""
        return {}

    @abstractmethod
    def forward(self, x: Any, buf: Buffers) -> Any:
        """This op's output for ``x``, keeping in ``buf`` what backward needs."""

    @abstractmethod
    def backward(self, dy: Any, buf: Buffers) -> Any:
        """The input gradient; None where the op needs none (the first parametric layer)."""

    def _dx(self, xp: Any, batch: int, training: bool) -> Any:
        need = training and self.info.needs_input_grad
        return _empty(xp, (batch, *self.in_shape)) if need else None


class Dense(Op):
    """``y = x @ W + b`` (then relu if fused), ``W`` stored (in, out): the forward GEMM reads
    it as stored and both backward GEMMs (``x.T @ dy``, ``dy @ W.T``) only flag a transpose."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...], relu: bool = False
    ) -> None:
        super().__init__(info, kernels, in_shape)
        units = info.layer.get("units")
        self.relu = relu
        self.out_shape = (units,)
        self.weight_shape = (in_shape[0], units)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def forward(self, x: Any, buf: Buffers) -> Any:
        buf["x"], y = x, buf["y"]
        self.k.dense_forward(x, self.w, None if self.relu else self.b, y)
        if self.relu:
            self.k.bias_activation(y, self.b, True, y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if self.relu:
            self.k.relu_backward(dy, buf["y"], dy)
        self.k.dense_backward(buf["x"], self.w, dy, self.dw, self.db, buf["dx"])
        return buf["dx"]


class Conv2d(Op):
    """im2col + one GEMM over the whole batch, ``cols (batch*oh*ow, k*k*c) @ W (k*k*c, f)``,
    whose result is the channels-last output itself; ``W`` is stored (k, k, c_in, f), the
    GEMM's right operand as it lies. Optionally fused with a relu and a max-pool after it."""

    def __init__(
        self,
        info: LayerInfo,
        kernels: Kernels,
        in_shape: tuple[int, ...],
        relu: bool = False,
        pool: LayerInfo | None = None,
    ) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        s = info.layer.settings
        self.kernel, self.stride, self.padding = s["kernel"], s["stride"], s["padding"]
        oh, ow = conv_output_hw(h, w, self.kernel, self.stride, self.padding)
        self.conv_shape = (oh, ow, s["filters"])
        self.weight_shape = (self.kernel, self.kernel, c, s["filters"])
        self.cols_shape = (oh * ow, self.kernel * self.kernel * c)  # per sample
        self.relu = relu
        self.pool = None if pool is None else (pool.layer.get("size"), pool.layer.get("stride"))
        self.out_shape = self.conv_shape
        if self.pool is not None:
            self.out_shape = (*pool_output_hw(oh, ow, *self.pool), s["filters"])

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        rows, width = self.cols_shape
        dx = self._dx(xp, batch, training)
        buf = {
            "cols": _empty(xp, (batch * rows, width)),
            "z": _empty(xp, (batch, *self.conv_shape)),
            "dcols": None if dx is None else _empty(xp, (batch * rows, width)),
            "dx": dx,
        }
        if self.pool is not None:
            buf["y"] = _empty(xp, (batch, *self.out_shape))
            buf["argmax"] = _empty(xp, (batch, *self.out_shape), np.int32)
            buf["dz"] = _empty(xp, (batch, *self.conv_shape)) if training else None
        else:
            buf["y"] = buf["z"]
        return buf

    def forward(self, x: Any, buf: Buffers) -> Any:
        k, z, y = self.k, buf["z"], buf["y"]
        fused = self.relu or self.pool is not None
        k.conv2d_forward(
            x, self.w, None if fused else self.b, self.stride, self.padding, buf["cols"], z
        )
        if self.pool is not None:
            k.maxpool2d_forward(z, *self.pool, y, buf["argmax"])
        if fused:
            k.bias_activation(y, self.b, self.relu, y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        k = self.k
        if self.relu:
            k.relu_backward(dy, buf["y"], dy)
        dz, db = dy, self.db
        if self.pool is not None:
            k.channel_sum(dy, self.db)  # the bias was added after the pool
            k.maxpool2d_backward(dy, buf["argmax"], *self.pool, buf["dz"])
            dz, db = buf["dz"], None
        k.conv2d_backward(
            dz, buf["cols"], self.w, self.stride, self.padding, self.dw, db, buf["dcols"], buf["dx"]
        )
        return buf["dx"]


class ReLU(Op):
    """A relu that follows no dense or conv layer. In place when ``in_place`` (its input is a
    buffer of the network's, not the caller's ``x``); backward overwrites the incoming gradient."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...], in_place: bool
    ) -> None:
        super().__init__(info, kernels, in_shape)
        self.in_place = in_place

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": None if self.in_place else _empty(xp, (batch, *self.in_shape))}

    def forward(self, x: Any, buf: Buffers) -> Any:
        y = x if self.in_place else buf["y"]
        self.k.relu_forward(x, y)
        buf["kept"] = y
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        self.k.relu_backward(dy, buf["kept"], dy)
        return dy


class MaxPool2d(Op):
    """A max-pool that follows no conv layer (channels-last)."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        self.size, self.stride = info.layer.get("size"), info.layer.get("stride")
        self.out_shape = (*pool_output_hw(h, w, self.size, self.stride), c)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {
            "y": _empty(xp, (batch, *self.out_shape)),
            "argmax": _empty(xp, (batch, *self.out_shape), np.int32),
            "dx": self._dx(xp, batch, training),
        }

    def forward(self, x: Any, buf: Buffers) -> Any:
        self.k.maxpool2d_forward(x, self.size, self.stride, buf["y"], buf["argmax"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        self.k.maxpool2d_backward(dy, buf["argmax"], self.size, self.stride, buf["dx"])
        return buf["dx"]


class Flatten(Op):
    """A reshape (a view). Channels-last activations flatten in (height, width, channel)
    order, so the dense layer after it has its weight rows in that order."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        self.out_shape = (int(np.prod(in_shape)),)

    def forward(self, x: Any, buf: Buffers) -> Any:
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: Any, buf: Buffers) -> Any:
        return dy.reshape(dy.shape[0], *self.in_shape)


def build_ops(
    layers: tuple[LayerInfo, ...], kernels: Kernels, in_shape: tuple[int, ...], input_owned: bool
) -> list[Op]:
    """The ops for ``layers`` (the loss excluded), fusing relu/max-pool into the layer before
    (:func:`microbench.kernels.calls.fused_ops`, whose rule the compute model prices by).

    ``in_shape`` is the per-sample input in the layout the network runs (channels-last when
    the input goes through 2-D layers); ``input_owned`` says whether the network feeds its own
    copy of the input. A standalone relu works in place unless its input is the caller's."""
    ops: list[Op] = []
    shape = in_shape
    for fused in fused_ops(layers, input_owned):
        info = fused.lead
        op: Op
        if info.kind == "conv2d":
            op = Conv2d(info, kernels, shape, relu=fused.relu, pool=fused.pool)
        elif info.kind == "dense":
            op = Dense(info, kernels, shape, relu=fused.relu)
        elif info.kind == "relu":
            op = ReLU(info, kernels, shape, in_place=fused.in_place)
        elif info.kind == "maxpool2d":
            op = MaxPool2d(info, kernels, shape)
        else:
            op = Flatten(info, kernels, shape)
        ops.append(op)
        shape = op.out_shape
    return ops
