"""The kernel calls of the normalisation, activation, regularisation and token ops
(:mod:`microbench.nn.blocks`, :mod:`microbench.nn.tokens`), for
:func:`microbench.kernels.calls.step_calls`: batchnorm2d, layernorm, gelu, dropout, embedding,
attention, token_pool and to_tokens, each as the kernels of :mod:`microbench.kernels.cpu` run it.

:func:`forward` and :func:`backward` append an op's calls to a step under construction (any
object with the :class:`Step` interface) and return the buffer of its output, or of its input
gradient; both return :data:`NOT_HANDLED` for the kinds that :mod:`~microbench.kernels.calls`
itself enumerates.
"""

from __future__ import annotations

import math
from typing import Protocol

from microbench.kernels.callspec import KernelCall
from microbench.kernels.shapes import matrix_rows
from microbench.workload import BYTES_PER_VALUE, LayerInfo

__all__ = ["KINDS", "NOT_HANDLED", "Step", "backward", "forward"]

_F = BYTES_PER_VALUE
Operands = tuple[tuple[str, int], ...]
NOT_HANDLED = "-"  # no buffer has this name
KINDS = ("batchnorm2d", "layernorm", "gelu", "dropout", "embedding", "attention", "token_pool",
         "to_tokens")  # fmt: skip


class Step(Protocol):
    """What :func:`forward` and :func:`backward` need of the step they add to."""

    batch: int
    training: bool
    calls: list[KernelCall]
    tied: dict[int, LayerInfo]  # the embeddings an output layer shares its table with

    def loop(self, kernel: str, dims: tuple[int, ...], layer: int, phase: str,
             reads: Operands = (), writes: Operands = ()) -> None: ...  # fmt: skip

    def gemm(self, layout: str, m: int, n: int, k: int, layer: int, phase: str, a: str, b: str,
             c: str) -> None: ...  # fmt: skip


def _rows_cols(step: Step, info: LayerInfo) -> tuple[int, int]:
    """The (rows, last axis) an op's 2-D view of its input has, as the network lays it out:
    an image (a workload's ``[c, h, w]``) runs channels-last, ``(batch h w, c)``."""
    if info.kind == "batchnorm2d":
        c, h, w = info.input_shape
        return step.batch * h * w, c
    return matrix_rows(step.batch, info.input_shape), info.input_shape[-1]


def _attention_dims(step: Step, info: LayerInfo) -> tuple[int, ...]:
    """The dims of the attention core's call (:data:`~microbench.kernels.callspec.KERNEL_DIMS`)."""
    t, d = info.input_shape
    causal = int(bool(info.layer.get("causal")))
    return step.batch, t, d, info.layer.get("heads"), causal


def _dropout_active(step: Step, info: LayerInfo) -> bool:
    return step.training and float(info.layer.get("rate")) > 0


def forward(step: Step, info: LayerInfo, x: str) -> str:
    """Append the forward of ``info``'s op on input buffer ``x``; its output's buffer."""
    i, kind = info.index, info.kind
    y, n = f"y{i}", step.batch * math.prod(info.output_shape)
    out, inp = ((y, n * _F),), ((x, step.batch * info.input_bytes_per_sample),)
    if kind in ("batchnorm2d", "layernorm"):
        rows, cols = _rows_cols(step, info)
        params = ((f"W{i}", cols * _F), (f"b{i}", cols * _F))
        if kind == "batchnorm2d" and not step.training:
            step.loop("batchnorm_eval", (rows, cols), i, "forward", inp + params, out)
            return y
        kernel = "batchnorm" if kind == "batchnorm2d" else "layernorm"
        step.loop(kernel, (rows, cols), i, "forward", inp + params, (*out, (f"xhat{i}", n * _F)))
        return y
    if kind == "gelu":
        step.loop("gelu", (n,), i, "forward", inp, (*out, (f"t{i}", n * _F)))
        return y
    if kind == "dropout":
        if not _dropout_active(step, info):
            return x  # the identity: the input itself
        mask = ((f"mask{i}", n * _F),)
        step.calls.append(KernelCall("uniform", (n,), i, "forward", writes=mask))
        step.loop("dropout", (n,), i, "forward", inp + mask, out + mask)
        return y
    if kind == "embedding":
        t, dim = info.input_shape[0], info.output_shape[-1]
        table = ((f"W{i}", info.weight_count * _F),)
        ids = ((f"ids{i}", step.batch * t * 8),)
        step.calls.append(KernelCall("embedding", (step.batch, t, dim), i, "forward", False,
                                     inp + table, out + ids))  # fmt: skip
        return y
    if kind == "attention":
        return _attention_forward(step, info, x)
    if kind == "token_pool":
        t, d = info.input_shape
        if info.layer.get("mode") == "mean":
            step.loop("global_avgpool", (step.batch, t, 1, d), i, "forward", inp, out)
        else:
            step.calls.append(KernelCall("copy", (n,), i, "forward", False, inp, out))
        return y
    if kind == "to_tokens":
        return _to_tokens_forward(step, info, inp, out)
    return NOT_HANDLED


def backward(step: Step, info: LayerInfo, x: str, y: str, dy: str) -> str | None:
    """Append the backward of ``info``'s op (forward input ``x``, output ``y``) on output
    gradient ``dy``; the buffer of its input gradient (None: none)."""
    i, kind, batch = info.index, info.kind, step.batch
    dx, n_in = f"dx{i}", batch * math.prod(info.input_shape)
    n_out = batch * math.prod(info.output_shape)
    grad = ((dy, n_out * _F),)
    into = ((dx, n_in * _F),) if info.needs_input_grad else ()
    if kind in ("batchnorm2d", "layernorm"):
        rows, cols = _rows_cols(step, info)
        kernel = "batchnorm_backward" if kind == "batchnorm2d" else "layernorm_backward"
        params = ((f"dW{i}", cols * _F), (f"db{i}", cols * _F))
        step.loop(kernel, (rows, cols), i, "backward", (*grad, (f"xhat{i}", n_in * _F)),
                  into + params)  # fmt: skip
        return dx if into else None
    if kind == "gelu":
        step.loop("gelu_backward", (n_in,), i, "backward",
                  (*grad, (x, n_in * _F), (f"t{i}", n_in * _F)), into)  # fmt: skip
        return dx
    if kind == "dropout":
        if not info.needs_input_grad:
            return None
        if not _dropout_active(step, info):
            return dy
        step.loop("dropout_backward", (n_in,), i, "backward",
                  (*grad, (f"mask{i}", n_in * _F)), into)  # fmt: skip
        return dx
    if kind == "embedding":
        t, dim = info.input_shape[0], info.output_shape[-1]
        vocab = info.layer.get("vocab")
        table = ((f"dW{i}", info.weight_count * _F),)
        if i not in step.tied:  # tied: onto the output layer's gradient instead
            step.loop("zero", (vocab * dim,), i, "backward", (), ((f"dW{i}", vocab * dim * _F),))
        step.calls.append(KernelCall("embedding_backward", (batch, t, dim), i, "backward", False,
                                     (*grad, (f"ids{i}", batch * t * 8)), table))  # fmt: skip
        return None
    if kind == "attention":
        return _attention_backward(step, info, x, dy)
    if kind == "token_pool":
        if not info.needs_input_grad:
            return None
        t, d = info.input_shape
        if info.layer.get("mode") == "mean":
            step.loop("global_avgpool_backward", (batch, t, 1, d), i, "backward", grad, into)
        else:
            step.loop("zero", (n_in,), i, "backward", (), into)
            step.calls.append(KernelCall("copy", (n_out,), i, "backward", False, grad, into))
        return dx
    if kind == "to_tokens":
        return _to_tokens_backward(step, info, grad, into)
    return NOT_HANDLED


def _cls_positions(info: LayerInfo) -> tuple[int, bool]:
    return int(bool(info.layer.get("cls_token"))), bool(info.layer.get("positions"))


def _to_tokens_forward(step: Step, info: LayerInfo, inp: Operands, out: Operands) -> str:
    """The patches copied in (past the class token: a slice of each sample), the class token
    copied into each sample's first row, the position table added as a bias over each
    sample's values (``ToTokens.forward``)."""
    i, batch, c, patches = info.index, step.batch, info.input_shape[0], math.prod(info.input_shape)
    cls, positions = _cls_positions(info)
    if cls:
        step.calls.append(KernelCall("copy_runs", (batch, patches), i, "forward", False, inp,
                                     out))  # fmt: skip
        step.calls.append(KernelCall("copy_runs", (batch, c), i, "forward", False,
                                     ((f"W{i}", c * _F),), out))  # fmt: skip
    else:
        step.calls.append(KernelCall("copy", (batch * patches,), i, "forward", False, inp, out))
    if positions:
        table = ((f"W{i}", info.weight_count * _F),)
        step.loop("bias_act", (batch, math.prod(info.output_shape)), i, "forward", out + table,
                  out)  # fmt: skip
    return out[0][0]


def _to_tokens_backward(step: Step, info: LayerInfo, grad: Operands, into: Operands) -> str | None:
    """The class token's gradient (its rows copied out, then summed), the positions' (summed
    over the batch), the patches' copied out past the class token (``ToTokens.backward``)."""
    i, batch, c = info.index, step.batch, info.input_shape[0]
    cls, positions = _cls_positions(info)
    table = ((f"dW{i}", info.weight_count * _F),)
    if cls:
        rows = ((f"dcls{i}", batch * c * _F),)
        step.calls.append(KernelCall("copy_runs", (batch, c), i, "backward", False, grad, rows))
        step.loop("column_sum", (batch, c), i, "backward", rows, table)
    if positions:
        step.loop("column_sum", (batch, math.prod(info.output_shape)), i, "backward", grad, table)
    if not into:
        return None
    if not cls:
        return grad[0][0]  # a view of the output's gradient
    step.calls.append(KernelCall("copy_runs", (batch, math.prod(info.input_shape)), i,
                                 "backward", False, grad, into))  # fmt: skip
    return into[0][0]


def _attention_forward(step: Step, info: LayerInfo, x: str) -> str:
    """Three projections, the core loop, the output projection (``attention_forward``)."""
    i, dims = info.index, _attention_dims(step, info)
    _, t, d, heads, _ = dims
    rows, bias = step.batch * t, info.bias_count > 0
    for role in ("q", "k", "v", "o"):
        if role == "o":
            step.loop("attention", dims, i, "forward",
                      tuple((f"{r}{i}", rows * d * _F) for r in "qkv"),
                      ((f"p{i}", step.batch * heads * t * t * _F),
                       (f"o{i}", rows * d * _F)))  # fmt: skip
        src, dst = (f"o{i}", f"y{i}") if role == "o" else (x, f"{role}{i}")
        step.gemm("nn", rows, d, d, i, "forward", src, f"W{i}.{role}", dst)
        if bias:
            out = ((dst, rows * d * _F),)
            step.loop("bias_act", (rows, d), i, "forward", (*out, (f"b{i}.{role}", d * _F)), out)
    return f"y{i}"


def _attention_backward(step: Step, info: LayerInfo, x: str, dy: str) -> str | None:
    """The output projection's gradients, the core's, then each input projection's, their
    input gradients summed (``attention_backward``)."""
    i, (t, d) = info.index, info.input_shape
    rows = step.batch * t
    bias, size = info.bias_count > 0, rows * d * _F
    dx = f"dx{i}" if info.needs_input_grad else None

    def projection(role: str, src: str, grad: str, into: str | None) -> None:
        step.gemm("tn", d, d, rows, i, "backward", src, grad, f"dW{i}.{role}")
        if bias:
            step.loop("column_sum", (rows, d), i, "backward", ((grad, size),),
                      ((f"db{i}.{role}", d * _F),))  # fmt: skip
        if into is not None:
            step.gemm("nt", rows, d, d, i, "backward", grad, f"W{i}.{role}", into)

    projection("o", f"o{i}", dy, f"do{i}")
    step.loop("attention_backward", _attention_dims(step, info), i, "backward",
              tuple((f"{r}{i}", size) for r in ("q", "k", "v", "o", "do")),
              tuple((f"d{r}{i}", size) for r in "qkv"))  # fmt: skip
    for role in "qkv":
        scratch = dx if role == "q" or dx is None else f"do{i}"
        projection(role, x, f"d{role}{i}", scratch)
        if role != "q" and dx is not None:
            step.loop("add", (rows * d,), i, "backward", ((dx, size), (f"do{i}", size)),
                      ((dx, size),))  # fmt: skip
    return dx
