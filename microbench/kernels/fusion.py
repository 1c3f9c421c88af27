"""Which layers the network runs as one op, and which activations an op may overwrite.

A dense layer absorbs a relu right after it (unless it is tied to an embedding's table); a
conv2d the relu and max-pool after it, in either order (:mod:`microbench.nn.layers` says how
the fused op computes them). In a graph a layer is absorbed only where it alone reads the
layer before it: a convolution whose output a residual skip also reads keeps its own op. A
standalone relu works in place where nothing else reads what it overwrites. The network
(:mod:`microbench.nn.build`) and the kernel-call enumeration (:mod:`microbench.kernels.calls`)
both follow these rules, so the compute model prices the calls the network makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from microbench.workload import LayerInfo

__all__ = [
    "IMAGE_KINDS", "FusedOp", "backward_ops", "channels_last", "fused_ops", "group_readers",
    "group_sources",
]  # fmt: skip

# Kinds that read an image as an image: a network whose input one of them reads runs
# channels-last (relu, flatten and the other per-value kinds take any layout).
IMAGE_KINDS = ("conv2d", "maxpool2d", "avgpool2d", "batchnorm2d", "global_avgpool", "to_tokens")

# Kinds whose output may be their input itself or a view of it (in evaluation, for dropout).
_VIEW_KINDS = ("flatten", "dropout", "token_pool")
# Kinds whose backward never reads their own output (or, for a relu fused into a dense or
# conv2d, reads it only through the relu, which a relu applied again leaves as it is): a relu
# may overwrite their output in place.
_OVERWRITABLE = (
    "conv2d", "dense", "relu", "maxpool2d", "avgpool2d", "global_avgpool", "add", "concat",
    "batchnorm2d", "layernorm", "gelu",
)  # fmt: skip


@dataclass(frozen=True)
class FusedOp:
    """One op of the network: a lead layer and the relu / max-pool fused into it; a standalone
    relu works ``in_place`` unless another reader or the caller owns its input."""

    lead: LayerInfo
    relu: bool = False
    pool: LayerInfo | None = None
    in_place: bool = True
    last: int = -1  # the index of the layer whose output the op produces (default: the lead's)

    @property
    def output_index(self) -> int:
        return self.lead.index if self.last < 0 else self.last


def _readers(layers: Sequence[LayerInfo]) -> dict[int, list[int]]:
    """For each layer index (and -1, the network's input), the indices of the layers reading it."""
    readers: dict[int, list[int]] = {-1: []}
    for info in layers:
        readers.setdefault(info.index, [])
        for j in info.inputs:
            readers.setdefault(j, []).append(info.index)
    return readers


def fused_ops(layers: Sequence[LayerInfo], input_owned: bool) -> list[FusedOp]:
    """The ops a network makes of ``layers`` (the loss excluded; module docstring).
    ``input_owned``: the network feeds its own copy of the input (it runs channels-last), so a
    relu reading the input may work in place."""
    readers = _readers(layers)
    by_index = {info.index: info for info in layers}

    def sole_next(info: LayerInfo, kinds: tuple[str, ...]) -> LayerInfo | None:
        """The layer that alone reads ``info``, if it reads nothing else and is of ``kinds``."""
        nxt = by_index.get(info.index + 1)
        if nxt is None or nxt.kind not in kinds or readers[info.index] != [nxt.index]:
            return None
        if nxt.layer.settings.get("padding"):  # a padded max-pool runs on its own
            return None
        return nxt if nxt.inputs == (info.index,) else None

    def owned(j: int) -> bool:
        """Whether the buffer holding layer ``j``'s output may be overwritten by its reader."""
        if j < 0:
            return input_owned
        if len(readers[j]) != 1:
            return False
        info = by_index[j]
        if info.kind in _VIEW_KINDS:
            return owned(info.inputs[0])
        return info.kind in _OVERWRITABLE

    groups: list[FusedOp] = []
    i = 0
    while i < len(layers):
        info = layers[i]
        if info.kind == "conv2d":
            relu, pool, tail = False, None, info
            while (nxt := sole_next(tail, ("relu", "maxpool2d"))) is not None:
                if nxt.kind == "relu" and not relu:
                    relu = True
                elif nxt.kind == "maxpool2d" and pool is None:
                    pool = nxt
                else:
                    break
                tail = nxt
            groups.append(FusedOp(info, relu, pool, last=tail.index))
        elif (
            info.kind == "dense" and info.tied_to is None and (nxt := sole_next(info, ("relu",)))
        ):  # a dense layer tied to an embedding's table runs alone
            groups.append(FusedOp(info, True, last=nxt.index))
        elif info.kind == "relu":
            groups.append(FusedOp(info, in_place=owned(info.inputs[0]), last=info.index))
        else:
            groups.append(FusedOp(info, last=info.index))
        i = groups[-1].output_index - layers[0].index + 1
    return groups


def group_sources(groups: Sequence[FusedOp]) -> list[tuple[int, ...]]:
    """For each op, the ops whose outputs it reads, by position in ``groups`` (-1: the
    network's input), in the order of its lead layer's inputs."""
    producer = {g.output_index: k for k, g in enumerate(groups)}
    return [tuple(-1 if j < 0 else producer[j] for j in g.lead.inputs) for g in groups]


def group_readers(sources: Sequence[tuple[int, ...]]) -> list[int]:
    """How many ops read each op's output (:func:`group_sources`' ``sources``)."""
    readers = [0] * len(sources)
    for reads in sources:
        for k in reads:
            if k >= 0:
                readers[k] += 1
    return readers


def backward_ops(groups: Sequence[FusedOp], sources: Sequence[tuple[int, ...]]) -> list[int]:
    """The ops whose backward runs, in the order it runs (last op first): an op runs where
    some op that reads it hands it a gradient (one whose lead layer needs its input gradient;
    the last op gets the loss's) and it has parameters or its own input needs a gradient.
    Nothing upstream of every parameter runs."""
    gets = [False] * len(groups)
    gets[-1] = True
    order = []
    for k in reversed(range(len(groups))):
        lead = groups[k].lead
        if not gets[k] or not (lead.param_count or lead.needs_input_grad):
            continue
        order.append(k)
        if lead.needs_input_grad:
            for j in sources[k]:
                if j >= 0:
                    gets[j] = True
    return order


def channels_last(input_shape: tuple[int, ...], layers: Sequence[LayerInfo]) -> bool:
    """Whether a network runs channels-last: its image input reaches a layer of
    :data:`IMAGE_KINDS` through nothing but per-value layers (a flatten first keeps the
    input's channels-first order)."""
    if len(input_shape) != 3:
        return False
    image = {-1}  # layers whose output is the input image, transformed value by value
    for info in layers:
        if not any(j in image for j in info.inputs):
            continue
        if info.kind in IMAGE_KINDS:
            return True
        if info.kind != "flatten" and len(info.output_shape) == 3:
            image.add(info.index)
    return False
