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
from microbench.kernels.fusion import channels_last
from microbench.nn.build import Graph, build_graph
from microbench.nn.layers import Buffers, Op, workspace_bytes
from microbench.workload import LayerInfo, Workload

INITS = ("he", "xavier", "glorot")
EMBEDDING_STD = numpy.float32(0.02)

# Workspaces kept at once: training batch and partial last batch, evaluation chunk and its last.
_MAX_WORKSPACES = 4
# logits() runs inputs through in chunks of at most this many samples, to bound its buffers.
_LOGITS_CHUNK = 256


def _fans(info: LayerInfo) -> tuple[int, int]:
    """(fan_in, fan_out) of a layer's weight matrices, as He and Glorot define them."""
    if info.kind == "conv2d":
        k = info.layer.get("kernel")
        return info.input_shape[0] * k * k, info.layer.get("filters") * k * k
    return info.input_shape[-1], info.output_shape[-1]  # dense, and each attention projection


def _matrices(rng: numpy.random.Generator, n: int, fans: tuple[int, int], init: str):
    fan_in, fan_out = fans
    if init == "he":
        return rng.standard_normal(n, dtype=numpy.float32) * numpy.float32(math.sqrt(2 / fan_in))
    limit = math.sqrt(6 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, n).astype(numpy.float32)


def init_params(workload: Workload, seed: int, init: str = "he") -> numpy.ndarray:
    """All parameters, flat, float32, from ``numpy.random.default_rng(seed)``, layer by layer:
    the weight matrices of dense, conv2d and attention layers He (normal, std sqrt(2/fan_in))
    or Xavier/Glorot (uniform, limit sqrt(6/(fan_in+fan_out))); embedding tables, class tokens
    and learned positions normal with std :data:`EMBEDDING_STD` (GPT-2's and BERT's); norm
    scales one; biases and norm shifts zero. Bit-identical for the same seed on every machine
    (each MPI rank builds its own copy)."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; use one of {', '.join(INITS)}")
    rng = numpy.random.default_rng(seed)
    params = numpy.zeros(workload.param_count, dtype=numpy.float32)
    offset = 0
    for info in workload.parametric_layers:
        n = info.weight_count
        weights = params[offset : offset + n]
        if info.kind in ("dense", "conv2d", "attention"):
            weights[:] = _matrices(rng, n, _fans(info), init)
        elif info.kind in ("batchnorm2d", "layernorm"):
            weights[:] = 1
        else:  # embedding, to_tokens
            weights[:] = rng.standard_normal(n, dtype=numpy.float32) * EMBEDDING_STD
        offset += n + info.bias_count
    return params


class Network:
    """Forward, backward and inference of ``workload`` (see the module docstring for layouts).

    ``backend`` "auto" runs the numba kernels on numpy arrays and the array kernels otherwise;
    "array" forces the ``xp``-generic kernels (on numpy too, for testing). ``stream`` picks
    the random stream of layers that draw random numbers (dropout): each MPI rank its own.
    """

    def __init__(
        self,
        workload: Workload,
        seed: int = 0,
        init: str = "he",
        xp: ModuleType = numpy,
        backend: str = "auto",
        stream: int = 0,
    ) -> None:
        self.workload = workload
        self.xp = xp
        self.kernels = kernels_for(xp, backend)
        self.param_count = workload.param_count
        self.params = xp.asarray(init_params(workload, seed, init))
        self.grads = xp.zeros_like(self.params)
        self._nhwc = runs_channels_last(workload)
        self._graph = self._build_graph()
        self._ops = self._graph.ops
        self.state = self._bind_state()
        # Training forwards so far: with the seed and the stream, it seeds the random draws of
        # each step (dropout's masks), so a run resumed at step N draws what it would have.
        self.steps = 0
        self._draw_key = (seed, stream)
        self._drawing = [op for op in self._ops if op.draws_random]
        self._logits_shape = workload.layers[-1].input_shape
        self._workspaces: OrderedDict[tuple[bool, int], list[Buffers]] = OrderedDict()
        self._pending: tuple[list[Buffers], Any] | None = None

    def _build_graph(self) -> Graph:
        shape = self.workload.input_shape
        if self._nhwc:
            c, h, w = shape
            shape = (h, w, c)
        graph = build_graph(self.workload.layers[:-1], self.kernels, shape, self._nhwc)
        offset = 0
        for op in graph.ops:
            n_w, n_b = op.info.weight_count, op.info.bias_count
            if n_w + n_b == 0:
                continue
            w = self.params[offset : offset + n_w]
            dw = self.grads[offset : offset + n_w]
            if op.weight_shape is not None:
                w, dw = w.reshape(op.weight_shape), dw.reshape(op.weight_shape)
            else:
                w = dw = None
            b = db = None  # a layer without bias gets None, which the kernels skip
            if n_b:
                b = self.params[offset + n_w : offset + n_w + n_b]
                db = self.grads[offset + n_w : offset + n_w + n_b]
            op.bind(w, b, dw, db)
            offset += n_w + n_b
        return graph

    def _bind_state(self) -> Any:
        """The flat array of every op's state that is not trained (batchnorm's running
        statistics), each op bound to its view."""
        parts = [op.initial_state() for op in self._ops]
        state = self.xp.asarray(numpy.concatenate([numpy.zeros(0, numpy.float32), *parts]))
        offset = 0
        for op, part in zip(self._ops, parts, strict=True):
            if part.size:
                op.bind_state(state[offset : offset + part.size])
                offset += part.size
        return state

    # ---------------------------------------------------------------------------------------

    def _workspace(self, training: bool, batch: int) -> list[Buffers]:
        """Buffers of every op for ``batch`` samples (evaluation ones hold no gradients); an
        op whose output several ops read gets ``dsum``, where their gradients add up."""
        key = (training, batch)
        space = self._workspaces.get(key)
        if space is None:
            xp = self.xp
            space = [op.allocate(xp, batch, training) for op in self._ops]
            if training:
                for op, buf, readers in zip(self._ops, space, self._graph.readers, strict=True):
                    if readers > 1:
                        buf["dsum"] = xp.empty((batch, *op.out_shape), xp.float32)
            space.append({"dlogits": xp.empty((batch, *self._logits_shape), xp.float32)})
            if self._nhwc:
                c, h, w = self.workload.input_shape
                space[-1]["input"] = xp.empty((batch, h, w, c), xp.float32)
            self._workspaces[key] = space
            while len(self._workspaces) > _MAX_WORKSPACES:
                self._workspaces.popitem(last=False)
        else:
            self._workspaces.move_to_end(key)
        return space

    def _run(self, x: Any, space: list[Buffers], inputs: list[Any] | None = None) -> Any:
        """The logits of ``x`` (batch first), keeping in ``space`` what backward needs (and in
        ``inputs`` what each op was handed)."""
        x = self.first_op_input(x, space)
        outs: list[Any] = []
        for op, buf, reads in zip(self._ops, space, self._graph.sources, strict=False):
            xs = [x if k < 0 else outs[k] for k in reads]
            arg = xs[0] if len(xs) == 1 else xs
            if inputs is not None:
                inputs.append(arg)
            outs.append(op.forward(arg, buf))
        return outs[-1]

    def loss(self, logits: Any, labels: Any, dlogits: Any) -> tuple[float, int]:
        """The kernels' softmax cross-entropy of ``logits`` against int64 ``labels`` (mean loss,
        correct argmax count), its gradient into ``dlogits``: a row per sample, or per token
        for a token-level loss."""
        classes = logits.shape[-1]
        return self.kernels.softmax_cross_entropy(
            logits.reshape(-1, classes), labels.reshape(-1), dlogits.reshape(-1, classes)
        )

    def _labels(self, y: Any, batch: int) -> Any:
        """``y`` as int64 on the network's device, checked against the logits' shape."""
        labels = self.xp.asarray(y).astype(self.xp.int64, copy=False)
        wanted = (batch, *self._logits_shape[:-1])
        if labels.shape != wanted:
            raise ValueError(f"{batch} samples need labels of shape {wanted}, got {labels.shape}")
        return labels

    def forward(self, x: Any, y: Any) -> tuple[float, int]:
        """Mean cross-entropy over the batch (over every token, for a token-level loss) and
        the number of correct argmax predictions; keeps what :meth:`backward` needs
        (including a reference to ``x``)."""
        batch = x.shape[0]
        labels = self._labels(y, batch)
        space = self._workspace(True, batch)
        for op in self._drawing:
            op.set_rng(numpy.random.default_rng([*self._draw_key, op.info.index, self.steps]))
        self.steps += 1
        logits = self._run(x, space)
        dlogits = space[-1]["dlogits"]
        loss, correct = self.loss(logits, labels, dlogits)
        self._pending = (space, dlogits)
        return loss, correct

    def backward(self) -> None:
        """Gradient of the last forward's mean loss with respect to ``params``, into ``grads``.

        Ops run in reverse; an op whose output several ops read gets the sum of their input
        gradients. Where no layer upstream has parameters an op returns no input gradient and
        nothing above it runs: the gradient with respect to the network's input is never
        computed."""
        if self._pending is None:
            raise RuntimeError("backward() needs a forward() first")
        space, dlogits = self._pending
        self._pending = None
        self._backward(space, dlogits)

    def _backward(
        self, space: list[Buffers], dlogits: Any, handed: list[tuple[int, Any]] | None = None
    ) -> None:
        """:meth:`backward` from ``dlogits``; ``handed`` gets (op index, its incoming
        gradient) of each op in the order they run."""
        graph = self._graph
        grads: list[Any] = [None] * len(self._ops)
        grads[-1] = dlogits
        for k in graph.backward:  # the ops a gradient reaches that have a use for it
            if handed is not None:
                handed.append((k, grads[k]))
            dxs = self._ops[k].backward(grads[k], space[k])
            reads = graph.sources[k]
            for j, dx in zip(reads, dxs if len(reads) > 1 else [dxs], strict=True):
                if dx is None or j < 0:
                    continue
                if graph.readers[j] == 1:
                    grads[j] = dx
                elif grads[j] is None:
                    grads[j] = space[j]["dsum"]
                    self.kernels.copy(dx, grads[j])
                else:
                    self.kernels.add(grads[j], dx, grads[j])

    def logits(self, x: Any) -> Any:
        """Inference only (for evaluation): the logits of ``x``, a new (batch, classes) array
        ((batch, tokens, vocabulary) for a token-level loss). Leaves what the last
        :meth:`forward` kept for :meth:`backward` alone."""
        out = self.xp.empty((x.shape[0], *self._logits_shape), dtype=self.xp.float32)
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

    def step_arguments(self, x: Any, y: Any) -> tuple[list[Any], Any, Any, list[tuple[int, Any]]]:
        """One training step's forward, loss and backward on ``x``, ``y`` (the update left
        out), keeping what each op was handed, so that each can be timed again on the same
        arrays: each op's forward input (an array; a list for an op of several inputs) in op
        order, the logits, the loss gradient, and (op index, incoming gradient) in the order
        backward runs the ops."""
        space = self._workspace(True, x.shape[0])
        inputs: list[Any] = []
        logits = self._run(x, space, inputs)
        dlogits = space[-1]["dlogits"]
        self.loss(logits, self._labels(y, x.shape[0]), dlogits)
        handed: list[tuple[int, Any]] = []
        self._backward(space, dlogits, handed)
        return inputs, logits, dlogits, handed

    def workspace(self, batch: int) -> list[Buffers]:
        """The training buffers that :meth:`forward` and :meth:`backward` use at ``batch``:
        one dict per op, in op order, then the loss's (``dlogits``, and ``input``)."""
        return self._workspace(True, batch)

    def workspace_bytes(self, batch: int, training: bool = True) -> int:
        """Bytes of the buffers a step at ``batch`` uses (training: with backward's), each
        array once."""
        return workspace_bytes(self._workspace(training, batch))

    def first_op_input(self, x: Any, space: list[Buffers]) -> Any:
        """``x`` as the first op takes it: float32, contiguous, and transposed to channels-last
        into ``space`` when the network runs channels-last (what :meth:`forward` does first)."""
        return prepare_input(x, space, self.workload, self.xp, self.kernels, self._nhwc)

    def layer_params(self) -> list[tuple[str, Any, Any]]:
        """(layer name, weight view, bias view) of each parametric layer, in layer order."""
        return [(op.info.name, op.w, op.b) for op in self._ops if op.info.param_count]


def random_batch(
    workload: Workload, batch: int, rng: numpy.random.Generator
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Synthetic inputs and labels that a step of ``workload`` takes, for timing it:
    standard-normal values (token ids, where an embedding reads the input) and a label per
    sample (per token, for a token-level loss)."""
    shape = (batch, *workload.input_shape)
    ids = [i for i in workload.layers if i.kind == "embedding" and -1 in i.inputs]
    if ids:
        x = rng.integers(0, ids[0].layer.get("vocab"), shape).astype(numpy.float32)
    else:
        x = rng.standard_normal(shape, dtype=numpy.float32)
    labels = (batch, *workload.layers[-1].input_shape[:-1])
    return x, rng.integers(0, workload.num_classes, labels)


def runs_channels_last(workload: Workload) -> bool:
    """Whether a network of ``workload`` runs channels-last: an image input that a layer
    reading images (a convolution, a pool, batchnorm, patches as tokens) reads before any
    flatten (:func:`microbench.kernels.fusion.channels_last`)."""
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
