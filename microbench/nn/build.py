"""A workload's layers as a graph of ops: which op runs each layer, and what each op reads.

:func:`microbench.kernels.fusion.fused_ops` groups the layers into ops; each op reads the ops
its lead layer names (or the network's input) and is built on their output shapes in the
layout the network runs (images channels-last). The two ops that join branches live here:
``add`` (a residual connection) and ``concat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from microbench.kernels import Kernels
from microbench.kernels.fusion import backward_ops, fused_ops, group_readers, group_sources
from microbench.nn.blocks import AvgPool2d, BatchNorm2d, Dropout, Gelu, GlobalAvgPool, LayerNorm
from microbench.nn.layers import Buffers, Conv2d, Dense, Flatten, MaxPool2d, Op, ReLU, _empty
from microbench.nn.tokens import Attention, Embedding, TiedDense, TokenPool, ToTokens
from microbench.workload import LayerInfo

__all__ = ["Add", "Concat", "Graph", "build_graph", "build_ops"]


class Add(Op):
    """The elementwise sum of two or more inputs of one shape (a residual connection). Each
    input's gradient is the output's: the first input takes the incoming array itself, the
    others a copy each, so that every op still owns the gradient it is handed."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shapes: Sequence[tuple[int, ...]]
    ) -> None:
        super().__init__(info, kernels, in_shapes[0])
        self.arity = len(in_shapes)

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        shape = (batch, *self.out_shape)
        copies = [_empty(xp, shape) for _ in range(self.arity - 1)] if training else []
        return {"y": _empty(xp, shape), "copies": copies}

    def forward(self, xs: Sequence[Any], buf: Buffers) -> Any:
        y = buf["y"]
        self.k.add(xs[0], xs[1], y)
        for x in xs[2:]:
            self.k.add(y, x, y)
        return y

    def backward(self, dy: Any, buf: Buffers) -> list[Any]:
        if not self.info.needs_input_grad:
            return [None] * self.arity
        for copy in buf["copies"]:
            self.k.copy(dy, copy)
        return [dy, *buf["copies"]]


class Concat(Op):
    """The inputs joined along the channels (last axis channels-last; ``axis`` 0 of a sample
    when the network runs channels-first) or the features; backward hands each input its
    slice of the gradient, copied out contiguous."""

    def __init__(
        self, info: LayerInfo, kernels: Kernels, in_shapes: Sequence[tuple[int, ...]], axis: int
    ) -> None:
        super().__init__(info, kernels, in_shapes[0])
        self.in_shapes = [tuple(s) for s in in_shapes]
        self.axis = axis % len(self.in_shape)
        joined = sum(s[self.axis] for s in self.in_shapes)
        first = self.in_shapes[0]
        self.out_shape = (*first[: self.axis], joined, *first[self.axis + 1 :])
        bounds = np.cumsum([0] + [s[self.axis] for s in self.in_shapes])
        self.spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))

    def _part(self, a: Any, span: tuple[int, int]) -> Any:
        index = [slice(None)] * a.ndim
        index[self.axis + 1] = slice(*span)
        return a[tuple(index)]

    def allocate(self, xp: Any, batch: int, training: bool) -> Buffers:
        dxs = [_empty(xp, (batch, *s)) for s in self.in_shapes] if training else []
        return {"y": _empty(xp, (batch, *self.out_shape)), "dxs": dxs}

    def forward(self, xs: Sequence[Any], buf: Buffers) -> Any:
        y = buf["y"]
        for x, span in zip(xs, self.spans, strict=True):
            self.k.copy(x, self._part(y, span))
        return y

    def backward(self, dy: Any, buf: Buffers) -> list[Any]:
        if not self.info.needs_input_grad:
            return [None] * len(self.spans)
        for dx, span in zip(buf["dxs"], self.spans, strict=True):
            self.k.copy(self._part(dy, span), dx)
        return list(buf["dxs"])


_SIMPLE = {
    "maxpool2d": MaxPool2d, "flatten": Flatten, "batchnorm2d": BatchNorm2d,
    "layernorm": LayerNorm, "gelu": Gelu, "dropout": Dropout, "avgpool2d": AvgPool2d,
    "global_avgpool": GlobalAvgPool, "embedding": Embedding, "to_tokens": ToTokens,
    "attention": Attention, "token_pool": TokenPool,
}  # fmt: skip


@dataclass(frozen=True)
class Graph:
    """The ops in forward order; per op, the ops it reads (-1: the network's input) and how
    many ops read its output (a residual's skip has two readers: its gradient is a sum); the
    ops whose backward runs, in the order it runs
    (:func:`microbench.kernels.fusion.backward_ops`, the rule the compute model prices by)."""

    ops: list[Op]
    sources: list[tuple[int, ...]]
    readers: list[int]
    backward: list[int]


def build_graph(
    layers: Sequence[LayerInfo], kernels: Kernels, in_shape: tuple[int, ...], nhwc: bool
) -> Graph:
    """The ops for ``layers`` (the loss excluded). ``in_shape`` is the per-sample input in the
    layout the network runs; ``nhwc``: the network runs images channels-last and feeds its own
    (transposed) copy of the input, so a relu reading the input may work in place."""
    groups = fused_ops(layers, nhwc)
    sources = group_sources(groups)
    ops: list[Op] = []
    by_lead: dict[int, Op] = {}
    for fused, reads in zip(groups, sources, strict=True):
        info = fused.lead
        shapes = [in_shape if k < 0 else ops[k].out_shape for k in reads]
        shape = shapes[0]
        op: Op
        if info.kind == "conv2d":
            op = Conv2d(info, kernels, shape, relu=fused.relu, pool=fused.pool)
        elif info.kind == "dense" and info.tied_to is not None:
            table = by_lead[info.tied_to]
            assert isinstance(table, Embedding)
            table.tied = True  # its backward adds to the gradient the dense layer wrote
            op = TiedDense(info, kernels, shape, table)
        elif info.kind == "dense":
            op = Dense(info, kernels, shape, relu=fused.relu)
        elif info.kind == "relu":
            op = ReLU(info, kernels, shape, in_place=fused.in_place)
        elif info.kind == "add":
            op = Add(info, kernels, shapes)
        elif info.kind == "concat":
            op = Concat(info, kernels, shapes, -1 if nhwc or len(shape) != 3 else 0)
        else:
            op = _SIMPLE[info.kind](info, kernels, shape)
        ops.append(op)
        by_lead[info.index] = op
    return Graph(ops, sources, group_readers(sources), backward_ops(groups, sources))


def build_ops(
    layers: Sequence[LayerInfo], kernels: Kernels, in_shape: tuple[int, ...], nhwc: bool
) -> list[Op]:
    """The ops of a chain of ``layers`` (:func:`build_graph`), in order."""
    return build_graph(layers, kernels, in_shape, nhwc).ops
