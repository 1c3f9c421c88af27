"""The real network a workload describes, in float32, on numpy (numba kernels) or cupy.

All parameters live in one flat float32 array and all gradients in another with the same
layout (per parametric layer, in layer order: weights, then bias), so that the data-parallel
trainer allreduces the gradients in one call and updates the parameters in one call, with no
copies. Each layer's weights and bias are views into these arrays.

Layouts (chosen so every layer is one large GEMM on contiguous operands, see
:mod:`microbench.kernels`): dense weights are ``(in, out)`` (forward is ``x @ W``); convolution
weights are ``(k, k, c_in, filters)``; 2-D activations run channels-last, so the input
``(batch, c, h, w)`` is transposed once on entry, and a flatten after a convolution orders its
features (height, width, channel). The network is the same function class as a channels-first
one, with the following dense layer's weight rows permuted.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from types import ModuleType
from typing import Any

import numpy

from microbench.kernels import kernels_for
from microbench.kernels.calls import channels_last
from microbench.nn.layers import Buffers, Op, build_ops
from microbench.workload import TRAINED_KINDS, LayerInfo, Workload

INITS = ("he", "xavier", "glorot")

# Workspaces kept at once: training batch and partial last batch, evaluation chunk and its last.
_MAX_WORKSPACES = 4
# logits() runs inputs through in chunks of at most this many samples, to bound its buffers.
_LOGITS_CHUNK = 256


def _fans(info: LayerInfo) -> tuple[int, int]:
    """(fan_in, fan_out) of a parametric layer, as He and Glorot define them."""
    if info.kind == "dense":
        return info.input_shape[0], info.output_shape[0]
    k = info.layer.get("kernel")
    return info.input_shape[0] * k * k, info.layer.get("filters") * k * k


def init_params(workload: Workload, seed: int, init: str = "he") -> numpy.ndarray:
    """All parameters, flat, float32, from ``numpy.random.default_rng(seed)``: He (normal, std
    sqrt(2/fan_in)) or Xavier/Glorot (uniform, limit sqrt(6/(fan_in+fan_out))); biases zero.
    Bit-identical for the same seed on every machine (each MPI rank builds its own copy)."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; use one of {', '.join(INITS)}")
    rng = numpy.random.default_rng(seed)
    params = numpy.zeros(workload.param_count, dtype=numpy.float32)
    offset = 0
    for info in workload.parametric_layers:
        fan_in, fan_out = _fans(info)
        n = info.weight_count
        if init == "he":
            w = rng.standard_normal(n, dtype=numpy.float32) * numpy.float32(math.sqrt(2 / fan_in))
        else:
            limit = math.sqrt(6 / (fan_in + fan_out))
            w = rng.uniform(-limit, limit, n).astype(numpy.float32)
        params[offset : offset + n] = w
        offset += n + info.bias_count
    return params


class Network:
    """Forward, backward and inference of ``workload`` (see the module docstring for layouts).

    ``backend`` "auto" runs the numba kernels on numpy arrays and the array kernels otherwise;
    "array" forces the ``xp``-generic kernels (on numpy too, for testing).
    """

    def __init__(
        self,
        workload: Workload,
        seed: int = 0,
        init: str = "he",
        xp: ModuleType = numpy,
        backend: str = "auto",
    ) -> None:
        workload.require(TRAINED_KINDS, "the numpy network")
        self.workload = workload
        self.xp = xp
        self.kernels = kernels_for(xp, backend)
        self.param_count = workload.param_count
        self.params = xp.asarray(init_params(workload, seed, init))
        self.grads = xp.zeros_like(self.params)
        self._nhwc = runs_channels_last(workload)
        self._ops = self._build_ops()
        self._workspaces: OrderedDict[tuple[bool, int], list[Buffers]] = OrderedDict()
        self._pending: tuple[list[Buffers], Any] | None = None

    def _build_ops(self) -> list[Op]:
        shape = self.workload.input_shape
        if self._nhwc:
            c, h, w = shape
            shape = (h, w, c)
        ops = build_ops(self.workload.layers[:-1], self.kernels, shape, input_owned=self._nhwc)
        offset = 0
        for op in ops:
            if op.weight_shape is None:
                continue
            n_w, n_b = op.info.weight_count, op.info.bias_count
            op.bind(
                self.params[offset : offset + n_w].reshape(op.weight_shape),
                self.params[offset + n_w : offset + n_w + n_b],
                self.grads[offset : offset + n_w].reshape(op.weight_shape),
                self.grads[offset + n_w : offset + n_w + n_b],
            )
            offset += n_w + n_b
        return ops

    # ---------------------------------------------------------------------------------------

    def _workspace(self, training: bool, batch: int) -> list[Buffers]:
        """Buffers of every op for ``batch`` samples (evaluation ones hold no gradients)."""
        key = (training, batch)
        space = self._workspaces.get(key)
        if space is None:
            xp = self.xp
            space = [op.allocate(xp, batch, training) for op in self._ops]
            space.append({"dlogits": xp.empty((batch, self.workload.num_classes), xp.float32)})
            if self._nhwc:
                c, h, w = self.workload.input_shape
                space[-1]["input"] = xp.empty((batch, h, w, c), xp.float32)
            self._workspaces[key] = space
            while len(self._workspaces) > _MAX_WORKSPACES:
                self._workspaces.popitem(last=False)
        else:
            self._workspaces.move_to_end(key)
        return space

    def _run(self, x: Any, space: list[Buffers]) -> Any:
        """The logits of ``x`` (batch first), keeping in ``space`` what backward needs."""
        x = self.first_op_input(x, space)
        for op, buf in zip(self._ops, space, strict=False):
            x = op.forward(x, buf)
        return x

    def forward(self, x: Any, y: Any) -> tuple[float, int]:
        """Mean softmax cross-entropy over the batch and the number of correct argmax
        predictions; keeps what :meth:`backward` needs (including a reference to ``x``)."""
        batch = x.shape[0]
        labels = self.xp.asarray(y).astype(self.xp.int64, copy=False)
        if labels.shape != (batch,):
            raise ValueError(f"{batch} samples but labels of shape {labels.shape}")
        space = self._workspace(True, batch)
        logits = self._run(x, space)
        dlogits = space[-1]["dlogits"]
        loss, correct = self.kernels.softmax_cross_entropy(logits, labels, dlogits)
        self._pending = (space, dlogits)
        return loss, correct

    def backward(self) -> None:
        """Gradient of the last forward's mean loss with respect to ``params``, into ``grads``.

        Stops at the first parametric layer: nothing upstream of it has parameters, so the
        gradient with respect to the network's input is never computed."""
        if self._pending is None:
            raise RuntimeError("backward() needs a forward() first")
        space, grad = self._pending
        self._pending = None
        for op, buf in zip(reversed(self._ops), reversed(space[:-1]), strict=True):
            grad = op.backward(grad, buf)
            if grad is None:
                break

    def logits(self, x: Any) -> Any:
        """Inference only (for evaluation): the logits of ``x``, a new (batch, classes) array.
        Leaves what the last :meth:`forward` kept for :meth:`backward` alone."""
        out = self.xp.empty((x.shape[0], self.workload.num_classes), dtype=self.xp.float32)
        for begin in range(0, x.shape[0], _LOGITS_CHUNK):
            chunk = x[begin : begin + _LOGITS_CHUNK]
            out[begin : begin + chunk.shape[0]] = self._run(
                chunk, self._workspace(False, chunk.shape[0])
            )
        return out

    # Accessors for the compute benchmark, which times each op on its own buffers. -----------

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops :meth:`forward` runs, in order (a dense or conv2d absorbs the relu and
        max-pool after it; the loss is not an op)."""
        return tuple(self._ops)

    def workspace(self, batch: int) -> list[Buffers]:
        """The training buffers that :meth:`forward` and :meth:`backward` use at ``batch``:
        one dict per op, in op order, then the loss's (``dlogits``, and ``input``)."""
        return self._workspace(True, batch)

    def first_op_input(self, x: Any, space: list[Buffers]) -> Any:
        """``x`` as the first op takes it: float32, contiguous, and transposed to channels-last
        into ``space`` when the network runs channels-last (what :meth:`forward` does first)."""
        return prepare_input(x, space, self.workload, self.xp, self.kernels, self._nhwc)

    def layer_params(self) -> list[tuple[str, Any, Any]]:
        """(layer name, weight view, bias view) of each parametric layer, in layer order."""
        return [(op.info.name, op.w, op.b) for op in self._ops if op.w is not None]


def runs_channels_last(workload: Workload) -> bool:
    """Whether a network of ``workload`` runs channels-last: an image input that a convolution
    or a pool reads before the first flatten."""
    return channels_last(workload.input_shape, workload.layers)


def prepare_input(
    x: Any, space: list[Buffers], workload: Workload, xp: Any, kernels: Any, nhwc: bool
) -> Any:
    """``x`` as a network's first op takes it: float32, contiguous, its per-sample shape
    checked, and transposed into ``space[-1]["input"]`` when the network runs channels-last."""
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    if x.shape[1:] != workload.input_shape:
        raise ValueError(
            f"input of shape {x.shape} does not match the workload's per-sample input "
            f"{workload.input_shape}"
        )
    if nhwc:
        kernels.nchw_to_nhwc(x, space[-1]["input"])
        x = space[-1]["input"]
    return x
