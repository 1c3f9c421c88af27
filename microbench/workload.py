"""One workload description for the compute benchmarks, the real network and the simulator.

A workload is a named list of layers with shapes. From it come, per layer, the output shape,
the parameter count, forward and backward FLOPs per sample, activation and gradient bytes; and
in total the gradient bytes that data parallelism must allreduce. :mod:`microbench.nn` builds
the real numpy/numba network from the same description.

It lives in microbench because the compute benchmarks time each layer at the shapes a workload
runs, and microbench must work on a cluster without pdlsim; pdlsim imports it from here.

Conventions (documented in the README):

* Shapes are per sample, channels first: ``[features]`` or ``[channels, height, width]``.
* Values are float32 (4 bytes). A multiply-add counts as 2 FLOPs.
* Backward FLOPs skip the gradient with respect to the network's input: the real network does
  not compute it either (nothing upstream of the first layer has parameters).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import DuplicateKeyError, loads_strict, special_kind

BYTES_PER_VALUE = 4  # float32 everywhere

LAYER_KINDS = ("dense", "conv2d", "relu", "maxpool2d", "flatten", "softmax_cross_entropy")

# The keys each layer kind accepts, with defaults (None means required).
_LAYER_KEYS: dict[str, dict[str, int | None]] = {
    "dense": {"units": None},
    "conv2d": {"filters": None, "kernel": None, "stride": 1, "padding": 0},
    "relu": {},
    "maxpool2d": {"size": 2, "stride": None},  # stride defaults to size
    "flatten": {},
    "softmax_cross_entropy": {},
}

# FLOPs per element for the loss: max, subtract, exp, sum, divide, log (forward); the
# gradient softmax - onehot scaled by 1/batch (backward). Small next to any real layer.
_SOFTMAX_FWD_FLOPS_PER_CLASS = 5
_SOFTMAX_BWD_FLOPS_PER_CLASS = 2


# The largest size a layer setting or an input dimension may have: numpy's index type holds
# it, so arrays built from a workload fail for want of memory (reported as such), never with
# an integer overflow.
MAX_DIM = 2**31 - 1


class WorkloadError(UserError):
    """A workload description that is malformed or inconsistent."""


@dataclass(frozen=True)
class Layer:
    """One layer as the user wrote it: a kind and its integer settings."""

    kind: str
    name: str
    settings: Mapping[str, int] = field(default_factory=dict)

    def get(self, key: str) -> int:
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
        return math.prod(self.input_shape) * BYTES_PER_VALUE

    @property
    def activation_bytes_per_sample(self) -> int:
        """Bytes of this layer's output for one sample (what backward keeps)."""
        return math.prod(self.output_shape) * BYTES_PER_VALUE


@dataclass(frozen=True)
class Workload:
    """A named network: input shape, layers, and their derived costs."""

    name: str
    input_shape: tuple[int, ...]
    layers: tuple[LayerInfo, ...]

    @property
    def num_classes(self) -> int:
        return self.layers[-1].output_shape[0]

    @property
    def param_count(self) -> int:
        return sum(info.param_count for info in self.layers)

    @property
    def gradient_bytes(self) -> int:
        """Bytes that data parallelism allreduces each step (all gradients, float32)."""
        return sum(info.gradient_bytes for info in self.layers)

    @property
    def forward_flops_per_sample(self) -> int:
        return sum(info.forward_flops_per_sample for info in self.layers)

    @property
    def backward_flops_per_sample(self) -> int:
        return sum(info.backward_flops_per_sample for info in self.layers)

    @property
    def activation_bytes_per_sample(self) -> int:
        return sum(info.activation_bytes_per_sample for info in self.layers)

    @property
    def parametric_layers(self) -> tuple[LayerInfo, ...]:
        return tuple(info for info in self.layers if info.param_count > 0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON description this workload was built from (round-trips via from_dict)."""
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "layers": [
                {"kind": info.kind, "name": info.name, **dict(info.layer.settings)}
                for info in self.layers
            ],
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str = "workload") -> Workload:
        return _build(doc, source)

    @classmethod
    def load(cls, spec: str | Path | Mapping[str, Any] | Workload) -> Workload:
        """A workload from a preset name, a workload JSON file's path, a dict in that file's
        format, or a workload already built (returned as it is)."""
        if isinstance(spec, Workload):
            return spec
        if isinstance(spec, Mapping):
            return _build(spec, "workload dict")
        if not isinstance(spec, (str, Path)):
            raise WorkloadError(
                f"a workload is a preset name, a file path or a dict, got {type(spec).__name__}"
            )
        return load_workload(spec)


# ---------------------------------------------------------------------------------------------
# Presets


PRESETS: dict[str, dict[str, Any]] = {
    "mlp": {
        "name": "mlp",
        "input_shape": [784],
        "layers": [
            {"kind": "dense", "units": 256},
            {"kind": "relu"},
            {"kind": "dense", "units": 128},
            {"kind": "relu"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    },
    "cnn": {
        "name": "cnn",
        "input_shape": [3, 32, 32],
        "layers": [
            {"kind": "conv2d", "filters": 32, "kernel": 3, "padding": 1},
            {"kind": "relu"},
            {"kind": "maxpool2d", "size": 2},
            {"kind": "conv2d", "filters": 64, "kernel": 3, "padding": 1},
            {"kind": "relu"},
            {"kind": "maxpool2d", "size": 2},
            {"kind": "flatten"},
            {"kind": "dense", "units": 256},
            {"kind": "relu"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    },
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def load_workload(name_or_path: str | Path) -> Workload:
    """A preset by name, or a workload JSON file by path."""
    key = str(name_or_path)
    if key in PRESETS:
        return _build(PRESETS[key], f"preset '{key}'")
    if not key:
        raise WorkloadError(
            f"the workload name is empty; give a preset ({', '.join(preset_names())}) "
            "or the path of a workload JSON file"
        )
    path = Path(key)
    if not path.exists():
        raise WorkloadError(
            f"no workload preset or file named '{key}'; "
            f"use one of {', '.join(preset_names())} or the path of a workload JSON file"
        )
    kind = special_kind(path)
    if kind is not None:  # a directory, or a FIFO that would wait for a writer forever
        raise WorkloadError(f"workload '{key}' is {kind}; give the path of a JSON file")
    try:
        doc = loads_strict(path.read_text())
    except DuplicateKeyError as exc:
        raise WorkloadError(
            f"workload file {key}: the key '{exc.key}' is given twice in one object; keep one"
        ) from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(
            f"workload file {key}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload file {key}: cannot read it ({exc})") from None
    return _build(doc, f"workload file {key}")


# ---------------------------------------------------------------------------------------------
# Parsing and shape inference


def _build(doc: Any, source: str) -> Workload:
    if not isinstance(doc, Mapping):
        raise WorkloadError(f"{source}: expected a JSON object with 'input_shape' and 'layers'")
    unknown = set(doc) - {"name", "input_shape", "layers", "description"}
    if unknown:
        raise WorkloadError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
            "allowed: name, input_shape, layers, description"
        )
    name = doc.get("name", Path(source).stem if source.startswith("workload file") else "custom")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"{source}: 'name' must be a non-empty string")
    input_shape = _shape(doc.get("input_shape"), source)
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, Sequence) or isinstance(raw_layers, str) or not raw_layers:
        raise WorkloadError(f"{source}: 'layers' must be a non-empty list of layer objects")

    layers = [_parse_layer(i, raw, source) for i, raw in enumerate(raw_layers)]
    infos: list[LayerInfo] = []
    shape = input_shape
    seen_params = False
    for i, layer in enumerate(layers):
        where = f"{source}: layer {i} ({layer.name})"
        if layer.kind == "softmax_cross_entropy" and i != len(layers) - 1:
            raise WorkloadError(f"{where}: softmax_cross_entropy must be the last layer")
        info = _infer(i, layer, shape, needs_input_grad=seen_params, where=where)
        seen_params = seen_params or info.param_count > 0
        infos.append(info)
        shape = info.output_shape
    if layers[-1].kind != "softmax_cross_entropy":
        raise WorkloadError(
            f"{source}: the last layer must be softmax_cross_entropy (the loss), "
            f"got {layers[-1].kind}"
        )
    if not seen_params:
        raise WorkloadError(f"{source}: no layer has parameters; add a dense or conv2d layer")
    return Workload(name=name, input_shape=input_shape, layers=tuple(infos))


def _shape(value: Any, source: str) -> tuple[int, ...]:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) not in (1, 3)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise WorkloadError(
            f"{source}: 'input_shape' must be [features] or [channels, height, width] "
            f"(integers), got {value!r}"
        )
    if any(v <= 0 for v in value):
        raise WorkloadError(f"{source}: 'input_shape' sizes must be positive, got {list(value)}")
    if any(v > MAX_DIM for v in value):
        raise WorkloadError(f"{source}: 'input_shape' sizes must be at most {MAX_DIM:,}")
    return tuple(value)


def _parse_layer(index: int, raw: Any, source: str) -> Layer:
    if not isinstance(raw, Mapping):
        raise WorkloadError(f"{source}: layer {index} must be an object with a 'kind'")
    kind = raw.get("kind")
    if kind not in _LAYER_KEYS:
        raise WorkloadError(
            f"{source}: layer {index}: unknown kind {kind!r}; known kinds: {', '.join(LAYER_KINDS)}"
        )
    name = raw.get("name", f"{kind}{index}")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"{source}: layer {index} ({kind}): 'name' must be a string")
    where = f"{source}: layer {index} ({name})"
    allowed = _LAYER_KEYS[kind]
    unknown = set(raw) - set(allowed) - {"kind", "name"}
    if unknown:
        keys = ", ".join(sorted(allowed)) or "none besides kind and name"
        raise WorkloadError(
            f"{where}: unknown setting(s) {', '.join(sorted(unknown))} for {kind}; allowed: {keys}"
        )
    settings: dict[str, int] = {}
    for key, default in allowed.items():
        value = raw.get(key, default)
        if value is None:
            if key == "stride" and kind == "maxpool2d":
                continue  # filled from size below
            raise WorkloadError(f"{where}: {kind} needs '{key}'")
        if not isinstance(value, int) or isinstance(value, bool):
            raise WorkloadError(f"{where}: '{key}' must be an integer, got {value!r}")
        minimum = 0 if key == "padding" else 1
        if value < minimum:
            raise WorkloadError(f"{where}: '{key}' must be >= {minimum}, got {value}")
        if value > MAX_DIM:
            raise WorkloadError(f"{where}: '{key}' must be at most {MAX_DIM:,}, got {value:,}")
        settings[key] = value
    if kind == "maxpool2d":
        settings.setdefault("stride", settings["size"])
    return Layer(kind=kind, name=name, settings=settings)


def _infer(
    index: int, layer: Layer, shape: tuple[int, ...], needs_input_grad: bool, where: str
) -> LayerInfo:
    """Output shape, parameters and FLOPs of ``layer`` applied to a per-sample ``shape``."""
    n_in = math.prod(shape)
    weights = biases = 0
    if layer.kind == "dense":
        if len(shape) != 1:
            raise WorkloadError(
                f"{where}: shapes don't chain: dense needs a flat input, got {list(shape)}; "
                "add a flatten layer before it"
            )
        units = layer.get("units")
        out: tuple[int, ...] = (units,)
        weights, biases = shape[0] * units, units
        macs = shape[0] * units
        fwd = 2 * macs + units
        bwd = 2 * macs + units + (2 * macs if needs_input_grad else 0)
    elif layer.kind == "conv2d":
        if len(shape) != 3:
            raise WorkloadError(
                f"{where}: shapes don't chain: conv2d needs [channels, height, width], "
                f"got {list(shape)}"
            )
        c_in, h, w = shape
        k, s, p, f = (layer.get(key) for key in ("kernel", "stride", "padding", "filters"))
        if k > h + 2 * p or k > w + 2 * p:
            raise WorkloadError(
                f"{where}: kernel {k} is larger than the padded input {h + 2 * p}x{w + 2 * p}"
            )
        h_out, w_out = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        out = (f, h_out, w_out)
        weights, biases = f * c_in * k * k, f
        macs = c_in * k * k * f * h_out * w_out
        fwd = 2 * macs + f * h_out * w_out
        bwd = 2 * macs + f * h_out * w_out + (2 * macs if needs_input_grad else 0)
    elif layer.kind == "relu":
        out = shape
        fwd, bwd = n_in, n_in
    elif layer.kind == "maxpool2d":
        if len(shape) != 3:
            raise WorkloadError(
                f"{where}: shapes don't chain: maxpool2d needs [channels, height, width], "
                f"got {list(shape)}"
            )
        c, h, w = shape
        size, stride = layer.get("size"), layer.get("stride")
        if size > h or size > w:
            raise WorkloadError(f"{where}: pool size {size} is larger than the input {h}x{w}")
        out = (c, (h - size) // stride + 1, (w - size) // stride + 1)
        fwd = math.prod(out) * size * size  # one comparison per window element
        bwd = math.prod(out)  # one scatter per output
    elif layer.kind == "flatten":
        out = (n_in,)
        fwd = bwd = 0
    else:  # softmax_cross_entropy
        if len(shape) != 1:
            raise WorkloadError(
                f"{where}: shapes don't chain: softmax_cross_entropy needs flat logits, "
                f"got {list(shape)}; add a flatten and a dense layer before it"
            )
        if shape[0] < 2:
            raise WorkloadError(f"{where}: needs at least 2 classes, got {shape[0]}")
        out = shape
        fwd = _SOFTMAX_FWD_FLOPS_PER_CLASS * n_in
        bwd = _SOFTMAX_BWD_FLOPS_PER_CLASS * n_in
    return LayerInfo(
        index=index,
        layer=layer,
        input_shape=tuple(shape),
        output_shape=tuple(out),
        weight_count=weights,
        bias_count=biases,
        forward_flops_per_sample=fwd,
        backward_flops_per_sample=bwd,
        needs_input_grad=needs_input_grad,
    )


def sliced_dense(info: LayerInfo, units: int) -> LayerInfo:
    """The dense layer ``info`` with only ``units`` of its output neurons (one rank's slice):
    shapes, parameters and FLOPs derived by the workload description itself."""
    if info.kind != "dense":
        raise ValueError(f"only dense layers are split, not {info.kind} ({info.name})")
    layer = Layer("dense", info.name, {"units": units})
    return _infer(info.index, layer, info.input_shape, info.needs_input_grad, info.name)
