"""The layer kinds of a workload: their settings, and what each derives from its input shapes.

Shapes are per sample: ``[features]``, ``[tokens, features]`` or ``[channels, height, width]``
(channels first). Values are float32 (:data:`BYTES_PER_VALUE`); token ids are int32, the same
four bytes. A multiply-add counts as 2 FLOPs. For each layer, :func:`infer` gives the output
shape, the weights and biases, forward and backward FLOPs per sample and the values backward
keeps beyond the layer's output. Backward FLOPs include the gradient with respect to the
layer's input only where some layer upstream has parameters (``needs_input_grad``): nothing
upstream of the first such layer needs a gradient, and the real network does not compute it.

Per kind (``T`` the tokens or 1, ``n`` the input features, ``E`` the output's elements):

* ``dense`` (``units``; ``bias``; ``tied_to``: an embedding whose table it shares, as GPT-2's
  and BERT's output layers do): on the last axis. ``n u + u`` parameters (none for the weights
  when tied); forward ``2 T n u + T u``; backward ``2 T n u`` for the weight gradient, ``T u``
  for the bias's, ``2 T n u`` more for the input gradient.
* ``conv2d`` (``filters``, ``kernel``, ``stride``, ``padding``, ``bias``): ``f c k^2 + f``
  parameters; forward ``2 c k^2 f h' w'`` plus the bias; backward the same for the weight
  gradient and again for the input gradient.
* ``attention`` (``heads``, ``causal``, ``bias``): multi-head self-attention with its query,
  key, value and output projections, ``4 d^2 + 4 d`` parameters. Forward ``8 T d^2`` in the
  projections, ``4 T^2 d`` in the scores and the weighted sum, ``5 h T^2`` in the softmax.
  Backward ``10 T d^2 + 8 T^2 d + 3 h T^2`` (the projections' weight gradients, the output
  projection's input gradient, the gradients through the scores), ``6 T d^2`` more for the
  input gradient. The full ``T x T`` scores are counted whether or not ``causal`` masks half of
  them, as an implementation that forms the scores computes them; backward keeps the queries,
  keys, values, the weighted sum and the ``h T^2`` probabilities.
* ``embedding`` (``vocab``, ``dim``; ``positions``, ``token_types``: more tables added to it, as
  BERT's are): reads the token ids of the network input; ``(vocab + positions + token_types)
  dim`` parameters; one add per extra table per value forward, one scatter-add per table
  backward.
* ``to_tokens`` (``cls_token``, ``positions``): a ``[c, h, w]`` map as ``h w`` tokens of ``c``
  features (ViT's patches), with a learned class token in front and learned positions added.
* ``batchnorm2d``, ``layernorm`` (over the channels, over the last axis): ``2 c`` parameters;
  forward 7 FLOPs per value (the statistics, the normalisation, the scale and shift), backward
  10.
* ``relu`` 1 FLOP per value each way; ``gelu`` (tanh form) 9 forward, 14 backward; ``dropout``
  (``rate``) 1 each way.
* ``maxpool2d``, ``avgpool2d`` (``size``, ``stride``, ``padding``): one operation per window
  tap forward; one per output (max) or per tap (average) backward. ``global_avgpool``:
  ``[c, h, w]`` to ``[c]``, one add per value each way.
* ``add`` (two or more inputs of one shape): ``(k - 1) E`` adds forward, none backward (each
  input gets the gradient as it is). ``concat``: along the channels (``[c, h, w]``) or the
  features (``[n]``, ``[T, n]``), no FLOPs.
* ``flatten``; ``token_pool`` (``mode``: ``first``, the class token, or ``mean``):
  ``[T, d]`` to ``[d]``.
* ``softmax_cross_entropy`` (flat logits) and ``token_cross_entropy`` (a ``[T, vocab]`` map,
  every token scored): the loss, last; 5 FLOPs per logit forward, 2 backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from microbench.errors import UserError

BYTES_PER_VALUE = 4  # float32 everywhere (token ids: int32)

# The largest size a layer setting or an input dimension may have: numpy's index type holds
# it, so arrays built from a workload fail for want of memory (reported as such), never with
# an integer overflow.
MAX_DIM = 2**31 - 1

# The most values one sample may hold in the network's input or in any layer's output: 2^36
# (256 GiB of float32), past any machine's memory for one sample, yet above the 7e9 of a
# 405B-parameter transformer's MLP at 128k tokens. Times the largest batch (MAX_BATCH, 2^24)
# it stays below 2^63, so the sizes the cost models derive from it (rows times columns of a
# kernel call) are int64s, never an overflow.
MAX_VALUES_PER_SAMPLE = 2**36

LOSS_KINDS = ("softmax_cross_entropy", "token_cross_entropy")

Shape = tuple[int, ...]  # per sample
Settings = Mapping[str, Any]

# FLOPs per value of the kinds that work value by value (module docstring).
_PER_VALUE_FLOPS = {
    "relu": (1, 1),
    "gelu": (9, 14),
    "dropout": (1, 1),
    "batchnorm2d": (7, 10),
    "layernorm": (7, 10),
}
_LOSS_FWD_FLOPS_PER_LOGIT = 5  # max, subtract, exp, sum, divide-and-log
_LOSS_BWD_FLOPS_PER_LOGIT = 2  # softmax - onehot, scaled by 1 / batch
_SOFTMAX_FLOPS_PER_SCORE = 5  # scale, max, exp, sum, divide
_SOFTMAX_BWD_FLOPS_PER_SCORE = 3


class WorkloadError(UserError):
    """A workload description that is malformed or inconsistent."""


@dataclass(frozen=True)
class Setting:
    """One setting of a layer kind: its type (``int``, ``count`` (>= 0), ``bool``,
    ``fraction`` (0 <= x < 1), ``layer`` (another layer's name) or a tuple of choices), its
    default (None: required, or derived) and whether ``to_dict`` leaves it out at its default
    (``quiet``: the settings files written before it existed did not carry)."""

    type: Any
    default: Any = None
    quiet: bool = False


_REQ = Setting("int")
_BIAS = Setting("bool", True, quiet=True)
_POOL = {"size": Setting("int", 2), "stride": Setting("int"), "padding": Setting("count", 0, True)}

KIND_SETTINGS: dict[str, dict[str, Setting]] = {
    "dense": {"units": _REQ, "bias": _BIAS, "tied_to": Setting("layer", None, quiet=True)},
    "conv2d": {
        "filters": _REQ,
        "kernel": _REQ,
        "stride": Setting("int", 1),
        "padding": Setting("count", 0),
        "bias": _BIAS,
    },  # fmt: skip
    "relu": {},
    "gelu": {},
    "dropout": {"rate": Setting("fraction")},
    "batchnorm2d": {},
    "layernorm": {},
    "maxpool2d": dict(_POOL),
    "avgpool2d": dict(_POOL),
    "global_avgpool": {},
    "flatten": {},
    "add": {},
    "concat": {},
    "embedding": {
        "vocab": _REQ,
        "dim": _REQ,
        "positions": Setting("count", 0, True),
        "token_types": Setting("count", 0, True),
    },  # fmt: skip
    "to_tokens": {
        "cls_token": Setting("bool", False, True),
        "positions": Setting("bool", False, True),
    },
    "attention": {"heads": _REQ, "causal": Setting("bool", False, True), "bias": _BIAS},
    "token_pool": {"mode": Setting(("first", "mean"), "first")},
    "softmax_cross_entropy": {},
    "token_cross_entropy": {},
}
LAYER_KINDS = tuple(KIND_SETTINGS)
MULTI_INPUT_KINDS = ("add", "concat")


@dataclass(frozen=True)
class Layer:
    """One layer as the user wrote it: a kind, its settings and the layers it reads (names;
    empty: the layer before it)."""

    kind: str
    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()

    def get(self, key: str) -> Any:
        return self.settings[key]


@dataclass(frozen=True)
class LayerInfo:
    """A layer with everything derived from its shapes. Per-sample figures scale with batch."""

    index: int
    layer: Layer
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    weight_count: int
    bias_count: int
    forward_flops_per_sample: int
    backward_flops_per_sample: int
    needs_input_grad: bool
    inputs: tuple[int, ...] = ()  # the layers it reads, by index (-1: the network's input)
    input_shapes: tuple[tuple[int, ...], ...] = ()  # every input's shape (default: input_shape)
    saved_values_per_sample: int = 0  # what backward keeps beyond the output (attention's)
    tied_to: int | None = None  # the embedding whose table it shares (not counted again)

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def kind(self) -> str:
        return self.layer.kind

    @property
    def param_count(self) -> int:
        return self.weight_count + self.bias_count

    @property
    def gradient_bytes(self) -> int:
        return self.param_count * BYTES_PER_VALUE

    @property
    def input_bytes_per_sample(self) -> int:
        shapes = self.input_shapes or (self.input_shape,)
        return sum(math.prod(s) for s in shapes) * BYTES_PER_VALUE

    @property
    def activation_bytes_per_sample(self) -> int:
        """Bytes of this layer's output for one sample, and of what else backward keeps."""
        return (math.prod(self.output_shape) + self.saved_values_per_sample) * BYTES_PER_VALUE


@dataclass(frozen=True)
class _Derived:
    """What a kind derives: output shape, weights, biases, FLOPs, values kept."""

    out: tuple[int, ...]
    weights: int = 0
    biases: int = 0
    fwd: int = 0
    bwd: int = 0
    saved: int = 0


def check_values(shape: Shape, where: str, what: str) -> None:
    """A one-line :class:`WorkloadError` at ``where`` when ``what`` (say, "its output") of
    ``shape`` holds more than :data:`MAX_VALUES_PER_SAMPLE` values per sample."""
    values = math.prod(shape)
    if values > MAX_VALUES_PER_SAMPLE:
        raise WorkloadError(
            f"{where}: {what} {list(shape)} holds {values:,} values per sample, more than the "
            f"{MAX_VALUES_PER_SAMPLE:,} one sample may hold; give smaller sizes"
        )


def _need_rank(where: str, kind: str, shape: tuple[int, ...], ranks: tuple[int, ...]) -> None:
    if len(shape) in ranks:
        return
    names = {1: "[features]", 2: "[tokens, features]", 3: "[channels, height, width]"}
    wanted = "a flat input" if ranks == (1, 2) else " or ".join(names[r] for r in ranks)
    hint = "; add a flatten layer before it" if len(shape) == 3 else ""
    raise WorkloadError(
        f"{where}: shapes don't chain: {kind} needs {wanted}, got {list(shape)}{hint}"
    )


def _dense(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "dense", shape, (1, 2))
    t, n, u = math.prod(shape[:-1]), shape[-1], s["units"]
    macs = t * n * u
    bias = u if s.get("bias", True) else 0
    weights = 0 if s.get("tied_to") else n * u
    fwd = 2 * macs + t * bias
    return _Derived((*shape[:-1], u), weights, bias, fwd, fwd + (2 * macs if grad else 0))


def _conv2d(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "conv2d", shape, (3,))
    c, h, w = shape
    k, st, p, f = (s[key] for key in ("kernel", "stride", "padding", "filters"))
    if k > h + 2 * p or k > w + 2 * p:
        raise WorkloadError(
            f"{where}: kernel {k} is larger than the padded input {h + 2 * p}x{w + 2 * p}; "
            f"give a kernel of at most {min(h, w) + 2 * p} or more padding"
        )
    out = (f, (h + 2 * p - k) // st + 1, (w + 2 * p - k) // st + 1)
    macs = c * k * k * math.prod(out)
    bias = f if s.get("bias", True) else 0
    per_bias = math.prod(out) if bias else 0
    fwd = 2 * macs + per_bias
    return _Derived(out, f * c * k * k, bias, fwd, fwd + (2 * macs if grad else 0))


def _pool(kind: str) -> Callable[..., _Derived]:
    def derive(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
        _need_rank(where, kind, shape, (3,))
        c, h, w = shape
        size, stride, p = s["size"], s["stride"], s.get("padding", 0)
        if size > h + 2 * p or size > w + 2 * p:
            raise WorkloadError(
                f"{where}: pool size {size} is larger than the padded input "
                f"{h + 2 * p}x{w + 2 * p}; give a size of at most {min(h, w) + 2 * p}"
            )
        if 2 * p > size:
            raise WorkloadError(
                f"{where}: padding {p} is more than half the pool size {size}; give a padding "
                f"of at most {size // 2}"
            )
        out = (c, (h + 2 * p - size) // stride + 1, (w + 2 * p - size) // stride + 1)
        taps = math.prod(out) * size * size
        return _Derived(out, fwd=taps, bwd=math.prod(out) if kind == "maxpool2d" else taps)

    return derive


def _per_value(kind: str) -> Callable[..., _Derived]:
    def derive(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
        fwd, bwd = _PER_VALUE_FLOPS[kind]
        n = math.prod(shape)
        params = {"batchnorm2d": shape[0], "layernorm": shape[-1]}.get(kind, 0)
        if kind == "batchnorm2d":
            _need_rank(where, kind, shape, (3,))
        if kind == "layernorm":
            _need_rank(where, kind, shape, (1, 2))
        return _Derived(shape, params, params, fwd * n, bwd * n)

    return derive


def _global_avgpool(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "global_avgpool", shape, (3,))
    n = math.prod(shape)
    return _Derived((shape[0],), fwd=n, bwd=n)


def _flatten(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    return _Derived((math.prod(shape),))


def _embedding(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "embedding", shape, (1,))
    tokens, dim = shape[0], s["dim"]
    positions, types = s.get("positions", 0), s.get("token_types", 0)
    if positions and positions < tokens:
        raise WorkloadError(
            f"{where}: {tokens} tokens need at least {tokens} positions, got {positions}; give "
            f"positions >= {tokens} or fewer tokens"
        )
    tables = 1 + bool(positions) + bool(types)
    values = tokens * dim
    return _Derived((tokens, dim), (s["vocab"] + positions + types) * dim, 0,
                    (tables - 1) * values, tables * values)  # fmt: skip


def _to_tokens(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "to_tokens", shape, (3,))
    c, h, w = shape
    tokens = h * w + int(bool(s.get("cls_token")))
    params = c * int(bool(s.get("cls_token"))) + (tokens * c if s.get("positions") else 0)
    added = tokens * c if s.get("positions") else 0
    return _Derived((tokens, c), params, 0, added, added)


def _attention(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "attention", shape, (2,))
    t, d = shape
    h = s["heads"]
    if d % h:
        raise WorkloadError(f"{where}: {d} features do not split over {h} heads; give a divisor")
    bias = 4 * d if s.get("bias", True) else 0
    fwd = 8 * t * d * d + 4 * t * t * d + _SOFTMAX_FLOPS_PER_SCORE * h * t * t + t * bias
    bwd = 10 * t * d * d + 8 * t * t * d + _SOFTMAX_BWD_FLOPS_PER_SCORE * h * t * t + t * bias
    bwd += 6 * t * d * d if grad else 0
    return _Derived(shape, 4 * d * d, bias, fwd, bwd, saved=4 * t * d + h * t * t)


def _token_pool(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
    _need_rank(where, "token_pool", shape, (2,))
    n = math.prod(shape) if s["mode"] == "mean" else 0
    return _Derived((shape[-1],), fwd=n, bwd=n)


def _loss(kind: str) -> Callable[..., _Derived]:
    def derive(s: Settings, shape: Shape, grad: bool, where: str) -> _Derived:
        if kind == "softmax_cross_entropy" and len(shape) != 1:
            raise WorkloadError(
                f"{where}: shapes don't chain: softmax_cross_entropy needs flat logits, "
                f"got {list(shape)}; add a flatten and a dense layer before it"
            )
        if kind == "token_cross_entropy":
            _need_rank(where, kind, shape, (2,))
        if shape[-1] < 2:
            raise WorkloadError(
                f"{where}: needs at least 2 classes, got {shape[-1]}; give the layer before it "
                "2 or more units"
            )
        n = math.prod(shape)
        return _Derived(shape, fwd=_LOSS_FWD_FLOPS_PER_LOGIT * n, bwd=_LOSS_BWD_FLOPS_PER_LOGIT * n)

    return derive


_DERIVE: dict[str, Callable[..., _Derived]] = {
    "dense": _dense,
    "conv2d": _conv2d,
    "maxpool2d": _pool("maxpool2d"),
    "avgpool2d": _pool("avgpool2d"),
    "global_avgpool": _global_avgpool,
    "flatten": _flatten,
    "embedding": _embedding,
    "to_tokens": _to_tokens,
    "attention": _attention,
    "token_pool": _token_pool,
    **{kind: _per_value(kind) for kind in _PER_VALUE_FLOPS},
    **{kind: _loss(kind) for kind in LOSS_KINDS},
}


def _merge(kind: str, shapes: list[tuple[int, ...]], where: str) -> tuple[tuple[int, ...], int]:
    """The output shape of an ``add`` or ``concat`` of ``shapes``, and its forward FLOPs."""
    first = shapes[0]
    if kind == "add":
        if any(s != first for s in shapes):
            listed = ", ".join(str(list(s)) for s in shapes)
            raise WorkloadError(
                f"{where}: add needs inputs of one shape, got {listed}; make them agree, or "
                "join them with a concat"
            )
        return first, (len(shapes) - 1) * math.prod(first)
    axis = 0 if len(first) in (1, 3) else len(first) - 1
    rest = [s[:axis] + s[axis + 1 :] for s in shapes]
    if any(len(s) != len(first) for s in shapes) or any(r != rest[0] for r in rest):
        listed = ", ".join(str(list(s)) for s in shapes)
        raise WorkloadError(
            f"{where}: concat joins along the channels or features; the other sizes must "
            f"agree, got {listed}; make them agree (pool, flatten or project the inputs)"
        )
    total = sum(s[axis] for s in shapes)
    return first[:axis] + (total,) + first[axis + 1 :], 0


def infer(
    index: int,
    layer: Layer,
    shapes: list[tuple[int, ...]],
    needs_input_grad: bool,
    where: str,
    inputs: tuple[int, ...] = (),
    tied_to: int | None = None,
) -> LayerInfo:
    """Output shape, parameters, FLOPs and kept values of ``layer`` applied to per-sample
    input ``shapes`` (one per input, in order)."""
    if layer.kind in MULTI_INPUT_KINDS:
        out, fwd = _merge(layer.kind, shapes, where)
        d = _Derived(out, fwd=fwd)
    else:
        d = _DERIVE[layer.kind](layer.settings, shapes[0], needs_input_grad, where)
    check_values(d.out, where, "its output")
    return LayerInfo(
        index=index,
        layer=layer,
        input_shape=tuple(shapes[0]),
        output_shape=tuple(d.out),
        weight_count=d.weights,
        bias_count=d.biases,
        forward_flops_per_sample=d.fwd,
        backward_flops_per_sample=d.bwd,
        needs_input_grad=needs_input_grad,
        inputs=inputs,
        input_shapes=tuple(tuple(s) for s in shapes) if len(shapes) > 1 else (),
        saved_values_per_sample=d.saved,
        tied_to=tied_to,
    )
