"""The kernel calls one training step of a workload makes, enumerated from its description.

:class:`microbench.nn.Network` runs a step as a fixed sequence of kernel calls (GEMMs through
numpy's BLAS, numba loops, a few numpy copies); :func:`step_calls` lists that sequence without
running anything, by the same rules the network follows (:mod:`microbench.kernels.fusion`: a
dense or conv2d layer absorbs the relu and max-pool after it; :mod:`microbench.kernels.policy`:
which loops run in parallel, how a convolution is chunked). A compute model that knows what
each kernel costs at its shape then prices any workload of the supported layer kinds,
including one it never saw; the tests hold this list to a trace of the real network's calls.

Each :class:`~microbench.kernels.callspec.KernelCall` names its kernel and the dimensions that
kernel's cost depends on, the workload layer it is charged to (the lead layer of a fused group;
-1 for the step's own calls: the mini-batch gather) and the phase of the step it runs in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from microbench.kernels import calls_blocks
from microbench.kernels.callspec import (
    GEMM_LAYOUTS,
    KERNEL_DIMS,
    LABEL_BYTES,
    KernelCall,
    call_features,
)
from microbench.kernels.fusion import (
    FusedOp,
    backward_ops,
    channels_last,
    fused_ops,
    group_readers,
    group_sources,
)
from microbench.kernels.policy import conv_chunk_samples, runs_parallel
from microbench.kernels.shapes import conv_output_hw, matrix_rows, pool_output_hw
from microbench.workload import BYTES_PER_VALUE, CPU_MODEL_KINDS, LayerInfo, Workload

__all__ = [
    "GEMM_LAYOUTS",
    "KERNEL_DIMS",
    "LABEL_BYTES",
    "KernelCall",
    "FusedOp",
    "channels_last",
    "fused_ops",
    "call_features",
    "op_calls",
    "step_calls",
    "update_kernel",
]

_F = BYTES_PER_VALUE
Operands = tuple[tuple[str, int], ...]


def _loop(
    kernel: str,
    dims: tuple[int, ...],
    layer: int,
    phase: str,
    threads: int,
    reads: Operands = (),
    writes: Operands = (),
) -> KernelCall:
    parallel = runs_parallel(call_features(kernel, dims)[0], threads)
    return KernelCall(kernel, dims, layer, phase, parallel, reads, writes)


def _gemm(
    layout: str, m: int, n: int, k: int, layer: int, phase: str, a: str, b: str, c: str
) -> KernelCall:
    """``c (m x n) = a (m x k) @ b (k x n)``, ``a`` and ``b`` read as ``layout`` says."""
    return KernelCall(
        f"gemm_{layout}", (m, n, k), layer, phase, False, ((a, m * k * _F), (b, k * n * _F)),
        ((c, m * n * _F),),
    )  # fmt: skip


def _rows(batch: int, info: LayerInfo) -> int:
    """The rows of a layer's 2-D view of its input."""
    return matrix_rows(batch, info.input_shape)


def _hwc(shape: tuple[int, ...]) -> tuple[int, int, int]:
    c, h, w = shape
    return h, w, c


class _Step:
    """Builds a step's calls, following which buffer holds each activation and gradient."""

    def __init__(
        self, batch: int, threads: int, training: bool, layers: Sequence[LayerInfo], nhwc: bool
    ) -> None:
        self.batch, self.threads, self.training, self.nhwc = batch, threads, training, nhwc
        # the embeddings an output layer shares its table with, by layer index
        self.tied = {i.tied_to: layers[i.tied_to] for i in layers if i.tied_to is not None}
        self.calls: list[KernelCall] = []
        self.outputs: list[str] = []  # per group, the buffer its forward output lives in

    def loop(self, kernel: str, dims: tuple[int, ...], layer: int, phase: str,
             reads: Operands = (), writes: Operands = ()) -> None:  # fmt: skip
        self.calls.append(_loop(kernel, dims, layer, phase, self.threads, reads, writes))

    def gemm(self, *args: Any) -> None:
        self.calls.append(_gemm(*args))

    # forward ---------------------------------------------------------------------------
    def forward(self, g: FusedOp, xs: list[str]) -> str:
        """Append ``g``'s forward on its input buffers ``xs``; the buffer of its output."""
        info, i, batch = g.lead, g.lead.index, self.batch
        x, x_bytes = xs[0], batch * info.input_bytes_per_sample
        y, out_bytes = f"y{i}", batch * math.prod(info.output_shape) * _F
        if info.kind in calls_blocks.KINDS:
            return calls_blocks.forward(self, info, x)
        if info.kind == "add":  # the first input copied into the output, the others added
            n = out_bytes // _F
            self.calls.append(KernelCall("copy", (n,), i, "forward", False, ((x, out_bytes),),
                                         ((y, out_bytes),)))  # fmt: skip
            for other in xs[1:]:
                self.loop("add", (n,), i, "forward", ((y, out_bytes), (other, out_bytes)),
                          ((y, out_bytes),))  # fmt: skip
            return y
        if info.kind == "concat":  # each input copied into its slice of the output
            for other, (rows, run) in zip(xs, self._concat_parts(info), strict=True):
                part = ((other, rows * run * _F),)
                self.calls.append(KernelCall("copy_runs", (rows, run), i, "forward", False, part,
                                             ((y, out_bytes),)))  # fmt: skip
            return y
        if info.kind == "avgpool2d":
            self.loop("avgpool", self._avgpool_dims(info), i, "forward", ((x, x_bytes),),
                      ((y, out_bytes),))  # fmt: skip
            return y
        if info.kind == "global_avgpool":
            self.loop("global_avgpool", (batch, *_hwc(info.input_shape)), i, "forward",
                      ((x, x_bytes),), ((y, out_bytes),))  # fmt: skip
            return y
        if info.kind == "dense":  # on tokens: on the (batch * tokens, features) rows
            rows, units = _rows(batch, info), info.output_shape[-1]
            if info.tied_to is not None:  # y = x @ E.T: the embedding's table, transposed
                self.gemm("nt", rows, units, info.input_shape[-1], i, "forward", x,
                          f"W{info.tied_to}", y)  # fmt: skip
            else:
                self.gemm("nn", rows, units, info.input_shape[-1], i, "forward", x, f"W{i}", y)
            self._bias_act(g, rows, units, y)
            return y
        if info.kind == "conv2d":
            h, w, c = _hwc(info.input_shape)
            k, s, p, f = (info.layer.get(key) for key in ("kernel", "stride", "padding", "filters"))
            oh, ow = conv_output_hw(h, w, k, s, p)
            z = f"z{i}" if g.pool is not None else f"y{i}"
            step = conv_chunk_samples(oh * ow, k * k * c, self.threads, _F)
            for first in range(0, batch, step):
                n = min(batch, first + step) - first
                part = (x, n * info.input_bytes_per_sample)
                cols = (f"cols{i}", n * oh * ow * k * k * c * _F)
                self.loop("im2col", (n, h, w, c, k, s, p), i, "forward", (part,), (cols,))
                self.gemm("nn", n * oh * ow, f, k * k * c, i, "forward", cols[0], f"W{i}", z)
            rows, y = batch * oh * ow, z
            if g.pool is not None:
                size, stride = g.pool.layer.get("size"), g.pool.layer.get("stride")
                ph, pw = pool_output_hw(oh, ow, size, stride)
                rows, y = batch * ph * pw, f"y{i}"
                pooled = ((y, rows * f * _F), (f"argmax{i}", rows * f * 4))
                zin = ((z, batch * oh * ow * f * _F),)
                self.loop("maxpool", (batch, oh, ow, f, size, stride), i, "forward", zin, pooled)
            self._bias_act(g, rows, f, y)
            return y
        if info.kind == "relu":
            n = batch * math.prod(info.input_shape)
            y = x
            if not g.in_place:
                y = f"y{i}"
                self.calls.append(
                    KernelCall("copy", (n,), i, "forward", False, ((x, n * _F),), ((y, n * _F),))
                )
            self.loop("relu", (n,), i, "forward", ((y, n * _F),), ((y, n * _F),))
            return y
        if info.kind == "maxpool2d":  # padded: the input copied inside a -inf border first
            h, w, c, p = *_hwc(info.input_shape), info.layer.settings.get("padding", 0)
            size, stride = info.layer.get("size"), info.layer.get("stride")
            out_bytes = batch * info.activation_bytes_per_sample
            y = f"y{i}"
            if p:
                n, pad = x_bytes // _F, f"xpad{i}"
                self.calls.append(KernelCall("copy", (n,), i, "forward", False, ((x, x_bytes),),
                                             ((pad, x_bytes),)))  # fmt: skip
                x, x_bytes = pad, batch * (h + 2 * p) * (w + 2 * p) * c * _F
            self.loop("maxpool", (batch, h + 2 * p, w + 2 * p, c, size, stride), i, "forward",
                      ((x, x_bytes),), ((y, out_bytes), (f"argmax{i}", out_bytes)))  # fmt: skip
            return y
        return x  # flatten: a view

    # backward --------------------------------------------------------------------------
    def _relu_mask(self, i: int, elements: int, dy: str, y: str) -> None:
        out = ((dy, elements * _F),)
        self.loop("relu_mask", (elements,), i, "backward", (*out, (y, elements * _F)), out)

    def _bias_act(self, g: FusedOp, rows: int, units: int, y: str) -> None:
        """The bias (and the fused relu) on a GEMM's output ``y``, in place: one pass with
        the bias, a relu alone without it."""
        out, i = ((y, rows * units * _F),), g.lead.index
        if g.lead.bias_count:
            self.loop("bias_act", (rows, units), i, "forward", (*out, (f"b{i}", units * _F)), out)
        elif g.relu:
            self.loop("relu", (rows * units,), i, "forward", out, out)

    def _bias_grad(self, info: LayerInfo, rows: int, units: int, dy: str) -> None:
        """The bias gradient, where the layer has a bias."""
        if not info.bias_count:
            return
        i = info.index
        grad = ((dy, rows * units * _F),)
        self.loop("column_sum", (rows, units), i, "backward", grad, ((f"db{i}", units * _F),))

    def _concat_parts(self, info: LayerInfo) -> list[tuple[int, int]]:
        """Per input of a concat, the (rows, run) of its slice of the output: images join
        their channels (the last axis channels-last, the first of a sample channels-first),
        other shapes their last axis (``Concat``)."""
        parts = []
        for shape in info.input_shapes or (info.input_shape,):
            if len(shape) == 3 and not self.nhwc:
                rows, run = self.batch, math.prod(shape)
            else:
                channels = shape[0] if len(shape) == 3 else shape[-1]
                rows, run = self.batch * math.prod(shape) // channels, channels
            parts.append((rows, run))
        return parts

    def _avgpool_dims(self, info: LayerInfo) -> tuple[int, ...]:
        s = info.layer.settings
        return (self.batch, *_hwc(info.input_shape), s["size"], s["stride"], s["padding"])

    def backward(self, g: FusedOp, xs: list[str], y: str, dy: str) -> list[str | None]:
        """Append ``g``'s backward, its forward inputs ``xs`` and output ``y`` kept, on the
        output gradient in buffer ``dy``; the buffer of each input's gradient (None: none)."""
        info, i, batch = g.lead, g.lead.index, self.batch
        dx, x_bytes = f"dx{i}", batch * info.input_bytes_per_sample
        if info.kind in calls_blocks.KINDS:
            return [calls_blocks.backward(self, info, xs[0], y, dy)]
        if info.kind == "add":  # the first input takes dy itself, the others a copy each
            n = batch * math.prod(info.output_shape)
            copies = [f"dx{i}.{j}" for j in range(1, len(xs))]
            for copy in copies:
                self.calls.append(KernelCall("copy", (n,), i, "backward", False,
                                             ((dy, n * _F),), ((copy, n * _F),)))  # fmt: skip
            return [dy, *copies]
        if info.kind == "concat":  # each input's slice of the gradient copied out
            if not info.needs_input_grad:
                return [None] * len(xs)
            out_bytes = batch * math.prod(info.output_shape) * _F
            dxs = [f"dx{i}.{j}" for j in range(len(xs))]
            for dx_j, (rows, run) in zip(dxs, self._concat_parts(info), strict=True):
                part = ((dx_j, rows * run * _F),)
                self.calls.append(KernelCall("copy_runs", (rows, run), i, "backward", False,
                                             ((dy, out_bytes),), part))  # fmt: skip
            return dxs
        if info.kind in ("avgpool2d", "global_avgpool"):
            out_bytes = batch * math.prod(info.output_shape) * _F
            if info.kind == "global_avgpool":
                kernel, dims = "global_avgpool_backward", (batch, *_hwc(info.input_shape))
            else:
                kernel, dims = "avgpool_backward", self._avgpool_dims(info)
            self.loop(kernel, dims, i, "backward", ((dy, out_bytes),), ((dx, x_bytes),))
            return [dx]
        return [self._chain_backward(g, xs[0], y, dy)]

    def _chain_backward(self, g: FusedOp, x: str, y: str, dy: str) -> str | None:
        info, i, batch = g.lead, g.lead.index, self.batch
        dx = f"dx{i}"
        x_bytes = batch * info.input_bytes_per_sample
        if info.kind == "dense" and info.tied_to is not None:
            return self._tied_backward(info, x, dy)
        if info.kind == "dense":
            rows, units, inputs = _rows(batch, info), info.output_shape[-1], info.input_shape[-1]
            if g.relu:
                self._relu_mask(i, rows * units, dy, y)
            self.gemm("tn", inputs, units, rows, i, "backward", x, dy, f"dW{i}")
            self._bias_grad(info, rows, units, dy)
            if not info.needs_input_grad:
                return None
            self.gemm("nt", rows, inputs, units, i, "backward", dy, f"W{i}", dx)
            return dx
        if info.kind == "conv2d":
            return self._conv_backward(g, x, y, dy)
        if info.kind == "relu":
            self._relu_mask(i, batch * math.prod(info.input_shape), dy, y)
            return dy
        if info.kind == "maxpool2d":  # padded: into a padded gradient, then its inside out
            h, w, c, p = *_hwc(info.input_shape), info.layer.settings.get("padding", 0)
            size, stride = info.layer.get("size"), info.layer.get("stride")
            kernel = "maxpool_backward_tiled" if stride == size else "maxpool_backward"
            out_bytes = batch * info.activation_bytes_per_sample
            into, into_bytes = (f"dxpad{i}", batch * (h + 2 * p) * (w + 2 * p) * c * _F) if p \
                else (dx, x_bytes)  # fmt: skip
            reads = ((dy, out_bytes), (f"argmax{i}", out_bytes))
            self.loop(kernel, (batch, h + 2 * p, w + 2 * p, c, size, stride), i, "backward",
                      reads, ((into, into_bytes),))  # fmt: skip
            if p:
                self.calls.append(KernelCall("copy", (x_bytes // _F,), i, "backward", False,
                                             ((into, into_bytes),), ((dx, x_bytes),)))  # fmt: skip
            return dx
        return dy  # flatten: a view

    def _tied_backward(self, info: LayerInfo, x: str, dy: str) -> str | None:
        """An output layer sharing embedding ``E``'s table: ``dE[:vocab] = dy.T @ x``, the bias
        gradient, ``dx = dy @ E[:vocab]``, then the table's other rows zeroed."""
        i, e = info.index, info.tied_to
        rows, units, inputs = _rows(self.batch, info), info.output_shape[-1], info.input_shape[-1]
        self.gemm("tn", units, inputs, rows, i, "backward", dy, x, f"dW{e}")
        self._bias_grad(info, rows, units, dy)
        dx = None
        if info.needs_input_grad:
            dx = f"dx{i}"
            self.gemm("nn", rows, inputs, units, i, "backward", dy, f"W{e}", dx)
        extra = self.tied[e].weight_count - units * inputs  # the position and type rows
        if extra:
            self.loop("zero", (extra,), i, "backward", (), ((f"dW{e}", extra * _F),))
        return dx

    def _conv_backward(self, g: FusedOp, x: str, y: str, dy: str) -> str | None:
        info, i, batch = g.lead, g.lead.index, self.batch
        h, w, c = _hwc(info.input_shape)
        k, s, p, f = (info.layer.get(key) for key in ("kernel", "stride", "padding", "filters"))
        oh, ow = conv_output_hw(h, w, k, s, p)
        out_rows, width = batch * oh * ow, k * k * c
        cols = f"cols{i}"
        dz = dy
        if g.pool is not None:
            size, stride = g.pool.layer.get("size"), g.pool.layer.get("stride")
            ph, pw = pool_output_hw(oh, ow, size, stride)
            pooled = batch * ph * pw
            out = ((dy, pooled * f * _F),)
            if g.relu:
                self._relu_mask(i, pooled * f, dy, y)
            self._bias_grad(info, pooled, f, dy)
            kernel = "maxpool_backward_tiled" if stride == size else "maxpool_backward"
            dz = f"dz{i}"
            self.loop(kernel, (batch, oh, ow, f, size, stride), i, "backward",
                      (*out, (f"argmax{i}", pooled * f * 4)),
                      ((dz, out_rows * f * _F),))  # fmt: skip
            self.gemm("tn", width, f, out_rows, i, "backward", cols, dz, f"dW{i}")
        else:
            if g.relu:
                self._relu_mask(i, out_rows * f, dy, y)
            self.gemm("tn", width, f, out_rows, i, "backward", cols, dz, f"dW{i}")
            self._bias_grad(info, out_rows, f, dy)
        if not info.needs_input_grad:
            return None
        step = conv_chunk_samples(oh * ow, width, self.threads, _F)
        for first in range(0, batch, step):
            n = min(batch, first + step) - first
            self.gemm("nt", n * oh * ow, width, f, i, "backward", dz, f"W{i}", f"dcols{i}")
            dx_part = (f"dx{i}", n * info.input_bytes_per_sample)
            self.loop("col2im", (n, h, w, c, k, s, p), i, "backward",
                      ((f"dcols{i}", n * oh * ow * width * _F),), (dx_part,))  # fmt: skip
        return f"dx{i}"


def _backward(
    step: _Step,
    groups: list[FusedOp],
    sources: list[tuple[int, ...]],
    inputs: list[list[str]],
    shapes: dict[int, tuple[int, ...]],
) -> None:
    """Each op's backward, as :meth:`microbench.nn.Network.backward` runs them: the output an
    op reads alone gets its reader's input gradient as it is; one that several ops read gets
    the first copied into its ``dsum`` and the others added there."""
    readers, batch = group_readers(sources), step.batch
    grads: list[str | None] = [None] * len(groups)
    grads[-1] = "dlogits"
    for k in backward_ops(groups, sources):
        g, dy = groups[k], grads[k]
        assert dy is not None
        dxs = step.backward(g, inputs[k], step.outputs[k], dy)
        for j, dx in zip(sources[k], dxs, strict=True):
            if dx is None or j < 0:
                continue
            if readers[j] == 1:
                grads[j] = dx
                continue
            lead = groups[j].lead.index
            n = batch * math.prod(shapes[groups[j].output_index])
            dsum, both = f"dsum{lead}", n * _F
            if grads[j] is None:
                grads[j] = dsum
                step.calls.append(KernelCall("copy", (n,), lead, "backward", False,
                                             ((dx, both),), ((dsum, both),)))  # fmt: skip
            else:
                step.loop("add", (n,), lead, "backward", ((dsum, both), (dx, both)),
                          ((dsum, both),))  # fmt: skip


def op_calls(
    workload: Workload, training: bool = True, layers: Sequence[LayerInfo] | None = None
) -> list[tuple[int, str]]:
    """The Python-level op calls of one step, as (lead layer, phase): each op's forward
    (a flatten's too: a call that computes nothing), the loss, then (``training``) the
    backward of each op that gets a gradient (:func:`~microbench.kernels.fusion.backward_ops`)
    and the update (layer -1)."""
    layers = tuple(workload.layers if layers is None else layers)
    groups = fused_ops(layers[:-1], channels_last(workload.input_shape, layers[:-1]))
    out = [(g.lead.index, "forward") for g in groups] + [(layers[-1].index, "loss")]
    if not training:
        return out
    backward = backward_ops(groups, group_sources(groups))
    return [*out, *((groups[k].lead.index, "backward") for k in backward), (-1, "update")]


def update_kernel(optimizer: str) -> str:
    """The loop that updates the parameters for ``optimizer`` (sgd, momentum, adam, adamw):
    one loop serves Adam and AdamW, whose decoupled decay is one more multiply."""
    kernels = {"sgd": "sgd", "momentum": "sgd_momentum", "adam": "adam", "adamw": "adam"}
    if optimizer not in kernels:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(kernels)}")
    return kernels[optimizer]


def step_calls(
    workload: Workload,
    batch: int,
    threads: int,
    training: bool = True,
    momentum: float = 0.0,
    gather: bool = True,
    layers: Sequence[LayerInfo] | None = None,
    optimizer: str = "sgd",
) -> list[KernelCall]:
    """Every kernel call of one step of ``workload`` at ``batch`` per rank and ``threads``, in
    the order the network makes them: the mini-batch gather (``gather``), the input's
    transpose to channels-last where the network runs so, each op's forward, the loss, then
    (``training``) the backward of each op that gets a gradient (a skip's gradients summed
    where two ops read it) and the ``optimizer``'s update (:func:`update_kernel`; SGD with
    ``momentum`` is ``momentum``: the velocity too). ``layers``: the workload's layers with some
    replaced (a rank's slices of a layer-wise split); default the workload's own."""
    if batch < 1 or threads < 1:
        raise ValueError(f"batch and threads must be >= 1, got {batch} and {threads}")
    workload.require(CPU_MODEL_KINDS, "the CPU kernel model", "; predict it on GPUs (--gpus N)")
    layers = tuple(workload.layers if layers is None else layers)
    body, loss = layers[:-1], layers[-1]
    nhwc = channels_last(workload.input_shape, body)
    step = _Step(batch, threads, training, layers, nhwc)
    input_bytes = batch * math.prod(workload.input_shape) * _F
    if gather:
        row_bytes = math.prod(workload.input_shape) * _F
        writes = (("input", input_bytes), ("labels", batch * LABEL_BYTES))
        step.calls.append(KernelCall("gather", (batch, row_bytes), -1, "data", writes=writes))
    groups = fused_ops(body, nhwc)
    sources = group_sources(groups)
    x = "input"
    if nhwc:
        c, h, w = workload.input_shape
        step.loop("nchw_to_nhwc", (batch, c, h, w), groups[0].lead.index, "forward",
                  ((x, input_bytes),), (("input_nhwc", input_bytes),))  # fmt: skip
        x = "input_nhwc"
    inputs: list[list[str]] = []
    for g, reads in zip(groups, sources, strict=True):
        inputs.append([x if k < 0 else step.outputs[k] for k in reads])
        step.outputs.append(step.forward(g, inputs[-1]))
    rows, classes = _rows(batch, loss), loss.input_shape[-1]  # token-level: a row per token
    logits = ((step.outputs[-1], rows * classes * _F), ("labels", rows * LABEL_BYTES))
    step.calls.append(KernelCall("softmax_xent", (rows, classes), loss.index, "loss", False,
                                 logits, (("dlogits", rows * classes * _F),)))  # fmt: skip
    if not training:
        return step.calls
    _backward(step, groups, sources, inputs, {info.index: info.output_shape for info in body})
    parametric = [info for info in layers if info.param_count > 0]
    params = sum(info.param_count for info in parametric)
    tensors = [
        (f"{role}{info.index}", count * _F)
        for info in parametric
        for role, count in (("W", info.weight_count), ("b", info.bias_count))
    ]
    grads = [(f"d{name}", n) for name, n in tensors]
    kernel = update_kernel("momentum" if momentum and optimizer == "sgd" else optimizer)
    buffers = {"sgd": (), "sgd_momentum": ("v",), "adam": ("m", "v")}[kernel]
    state = [(f"{b}{name}", n) for name, n in tensors for b in buffers]
    step.loop(kernel, (params,), -1, "update", (*tensors, *grads, *state),
              (*tensors, *state))  # fmt: skip
    return step.calls
