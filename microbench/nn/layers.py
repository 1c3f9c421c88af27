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
from microbench.workload import LayerInfo

Buffers = dict[str, Any]


def workspace_bytes(space: list[Buffers]) -> int:
    """Bytes of the arrays in a workspace (one dict of buffers per op; a buffer may be a list
    of arrays), each array once however many ops share it."""
    arrays: dict[int, Any] = {}
    for buf in space:
        for value in buf.values():
            for a in value if isinstance(value, list | tuple) else (value,):
                if hasattr(a, "nbytes"):
                    arrays[id(a)] = a
    return int(sum(a.nbytes for a in arrays.values()))


def _empty(xp: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
    return xp.empty(shape, dtype=dtype)


class Op(ABC):
    """One layer (or a fused group led by ``info``), on per-sample ``in_shape`` activations.

    The contract every op keeps, so that a graph of them runs forward and backward safely:

    * ``forward`` never writes into its input, unless the network built it ``in_place`` (the
      input then has no other reader); ``backward`` may overwrite the incoming gradient only
      where it says so (relu), since the network hands each op a gradient it alone reads.
    * Parameters: ``weight_shape`` (None: none) is the shape the network gives the weight view;
      the bias view is flat, ``info.bias_count`` long. ``backward`` *writes* (never adds to)
      ``dw`` and ``db``.
    * ``state_count`` values of state that is not trained (batchnorm's running statistics)
      live in the network's flat ``state`` array, bound by :meth:`bind_state`.
    * ``backward`` returns the input gradient, or None where ``info.needs_input_grad`` is
      false; an op of several inputs returns one per input.
    """

    weight_shape: tuple[int, ...] | None = None
    state_count = 0
    draws_random = False  # its forward draws from the generator :meth:`set_rng` gives it

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        self.info = info
        self.k = kernels
        self.xp = kernels.xp
        self.in_shape = in_shape
        self.out_shape = in_shape
        self.w = self.b = self.dw = self.db = self.state = None

    def bind(self, w: Any, b: Any, dw: Any, db: Any) -> None:
        """Views of this op's parameters and gradients in the network's flat arrays."""
        self.w, self.b, self.dw, self.db = w, b, dw, db

    def bind_state(self, state: Any) -> None:
        """A view of this op's ``state_count`` values in the network's flat state array."""
        self.state = state

    def initial_state(self) -> np.ndarray:
        """The ``state_count`` values this op's state starts from (float32, on the host)."""
        return np.zeros(self.state_count, np.float32)

    def set_rng(self, rng: np.random.Generator) -> None:  # noqa: B027 (most ops draw nothing)
        """The generator an op that draws random numbers (dropout) draws from; others ignore it."""

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        """Buffers for ``batch`` samples; without ``training``, none for the backward pass
        (an op that behaves differently in evaluation, such as dropout, keeps the flag)."""
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


def _bias_relu(k: Kernels, y: Any, b: Any, relu: bool) -> None:
    """In place: ``y + b`` (``b`` None: a layer without bias), then the relu if ``relu``."""
    if b is not None:
        k.bias_activation(y, b, relu, y)
    elif relu:
        k.relu_forward(y, y)


class Dense(Op):
    """``y = x @ W + b`` (then relu if fused), ``W`` stored (in, out): the forward GEMM reads
    it as stored and both backward GEMMs (``x.T @ dy``, ``dy @ W.T``) only flag a transpose.
    On tokens (``in_shape`` (tokens, features)) the GEMMs run on the (batch * tokens,
    features) views of the activations."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...], relu: bool = False
    ) -> None:
        super().__init__(info, kernels, in_shape)
        units = info.layer.get("units")
        self.relu = relu
        self.out_shape = (*in_shape[:-1], units)
        self.weight_shape = (in_shape[-1], units)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        return {"y": _empty(xp, (batch, *self.out_shape)), "dx": self._dx(xp, batch, training)}

    def _rows(self, a: Any) -> Any:
        return a if a is None or a.ndim == 2 else a.reshape(-1, a.shape[-1])

    def forward(self, x: Any, buf: Buffers) -> Any:
        buf["x"], y = self._rows(x), buf["y"]
        self.k.dense_forward(buf["x"], self.w, None if self.relu else self.b, self._rows(y))
        if self.relu:
            _bias_relu(self.k, y, self.b, True)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if self.relu:
            self.k.relu_backward(dy, buf["y"], dy)
        rows = self._rows
        self.k.dense_backward(buf["x"], self.w, rows(dy), self.dw, self.db, rows(buf["dx"]))
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
            _bias_relu(k, y, self.b, self.relu)
        return y

    def backward(self, dy: Any, buf: Buffers) -> Any:
        k = self.k
        if self.relu:
            k.relu_backward(dy, buf["y"], dy)
        dz, db = dy, self.db
        if self.pool is not None:
            if db is not None:
                k.channel_sum(dy, db)  # the bias was added after the pool
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
    """A max-pool that follows no conv layer (channels-last). With ``padding`` the input is
    copied into a buffer bordered by -inf (a pad never wins), pooled there, and backward
    scatters into the padded gradient and hands back its inside."""

    def __init__(self, info: LayerInfo, kernels: Kernels, in_shape: tuple[int, ...]) -> None:
        super().__init__(info, kernels, in_shape)
        h, w, c = in_shape
        self.size, self.stride = info.layer.get("size"), info.layer.get("stride")
        self.padding = info.layer.settings.get("padding", 0)
        p = self.padding
        self.padded_shape = (h + 2 * p, w + 2 * p, c)
        self.out_shape = (*pool_output_hw(h + 2 * p, w + 2 * p, self.size, self.stride), c)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        buf = {
            "y": _empty(xp, (batch, *self.out_shape)),
            "argmax": _empty(xp, (batch, *self.out_shape), np.int32),
            "dx": self._dx(xp, batch, training),
        }
        if self.padding:
            buf["xpad"] = xp.full((batch, *self.padded_shape), -np.inf, np.float32)
            if buf["dx"] is not None:
                buf["dxpad"] = _empty(xp, (batch, *self.padded_shape))
        return buf

    def _inside(self, a: Any) -> Any:
        p = self.padding
        return a[:, p:-p, p:-p, :]

    def forward(self, x: Any, buf: Buffers) -> Any:
        if self.padding:
            self.k.copy(x, self._inside(buf["xpad"]))
            x = buf["xpad"]
        self.k.maxpool2d_forward(x, self.size, self.stride, buf["y"], buf["argmax"])
        return buf["y"]

    def backward(self, dy: Any, buf: Buffers) -> Any:
        if buf["dx"] is None:
            return None
        if not self.padding:
            self.k.maxpool2d_backward(dy, buf["argmax"], self.size, self.stride, buf["dx"])
            return buf["dx"]
        self.k.maxpool2d_backward(dy, buf["argmax"], self.size, self.stride, buf["dxpad"])
        self.k.copy(self._inside(buf["dxpad"]), buf["dx"])
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
