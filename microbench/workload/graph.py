"""A workload: a named graph of layers, parsed from its JSON description and checked.

Each layer names the layers it reads (``"inputs": ["conv3", "add1"]``; ``"input"`` is the
network's input); without ``inputs`` a layer reads the one before it, so a chain needs none.
Layers are listed so that each reads only layers above it (a topological order: the order the
forward pass runs them, backward in reverse), every layer but the loss is read by some later
layer, and the loss comes last. A layer whose output two layers read (a residual's skip) gets
the sum of their gradients.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbench.errors import shown_names, shown_value
from microbench.fileio import (
    TRAILING_SLASH,
    DuplicateKeyError,
    json_problem,
    loads_strict,
    special_kind,
)

from .layers import (
    KIND_SETTINGS,
    LOSS_KINDS,
    MULTI_INPUT_KINDS,
    Layer,
    LayerInfo,
    Shape,
    WorkloadError,
    infer,
)
from .parse import checked_name, name_problem, parse_layer, parse_shape
from .zoo import PRESETS, ZOO

__all__ = ["Workload", "load_workload", "preset_names", "sliced_dense", "split_columns"]

NETWORK_INPUT = "input"  # the name a layer's ``inputs`` gives the network's input


@dataclass(frozen=True)
class Workload:
    """A named network: input shape, layers (in forward order), and their derived costs."""

    name: str
    input_shape: tuple[int, ...]
    layers: tuple[LayerInfo, ...]
    description: str = ""  # what the network is and where it comes from

    @property
    def num_classes(self) -> int:
        return self.layers[-1].output_shape[-1]

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

    @property
    def vocabulary(self) -> int | None:
        """The token vocabulary where the network's input is token ids (an embedding reads
        it), else None."""
        for info in self.layers:
            if info.kind == "embedding":
                return int(info.layer.get("vocab"))
        return None

    def with_tokens(self, tokens: int) -> Workload:
        """The same network reading ``tokens`` tokens per sample (a sequence length other
        than its description's): every shape, FLOP and byte follows; its weights do not
        change. A one-line :class:`WorkloadError` for a network whose input is not token ids
        or whose position table is shorter."""
        if self.vocabulary is None:
            raise WorkloadError(
                f"workload {self.name} reads {list(self.input_shape)}, not token ids: a token "
                "count applies to networks whose first layer is an embedding"
            )
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise WorkloadError(f"a token count is a positive integer, got {shown_value(tokens)}")
        doc = {**self.to_dict(), "input_shape": [tokens]}
        return _build(doc, f"workload {self.name} at {tokens} tokens")

    @property
    def is_chain(self) -> bool:
        """Every layer reads the one before it (and only it)."""
        return all(info.inputs == (info.index - 1,) for info in self.layers)

    def require(self, kinds: Sequence[str] | Mapping[str, Sequence[str]], who: str,
                hint: str = "") -> None:  # fmt: skip
        """A one-line :class:`WorkloadError` unless this workload is made of ``kinds`` with
        their settings as the first workload language had them (biases on, no pool padding,
        no tied weights), but for the settings ``kinds`` names per kind where it is a mapping:
        ``who`` (say, "the numpy network") names the part of pdlsim that handles only those,
        ``hint`` what to do instead. (Without a layer that joins two inputs, a graph is a
        chain.)"""
        other = [info for info in self.layers if info.kind not in kinds]
        if other:
            found = ", ".join(dict.fromkeys(info.kind for info in other))
            self._refuse(who, f"{found} yet (layer {other[0].name})", kinds, hint)
        for info in self.layers:
            spec = KIND_SETTINGS[info.kind]
            handled = kinds[info.kind] if isinstance(kinds, Mapping) else ()
            for key, value in info.layer.settings.items():
                if spec[key].quiet and value != spec[key].default and key not in handled:
                    found = f"{info.kind} with {key} {json.dumps(value)}"
                    self._refuse(who, f"{found} yet (layer {info.name})", kinds, hint)

    def _refuse(self, who: str, what: str, kinds: Sequence[str], hint: str) -> None:
        raise WorkloadError(
            f"workload {self.name}: {who} does not handle {what}; it handles "
            f"{', '.join(kinds)}{hint}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON description this workload was built from (round-trips via from_dict)."""
        layers = []
        for info in self.layers:
            spec = KIND_SETTINGS[info.kind]
            settings = {
                k: v
                for k, v in info.layer.settings.items()
                if not (spec[k].quiet and v == spec[k].default)
            }
            entry = {"kind": info.kind, "name": info.name, **settings}
            if info.inputs != (info.index - 1,):
                entry["inputs"] = [
                    NETWORK_INPUT if i < 0 else self.layers[i].name for i in info.inputs
                ]
            layers.append(entry)
        doc: dict[str, Any] = {"name": self.name, "input_shape": list(self.input_shape)}
        if self.description:
            doc["description"] = self.description
        return {**doc, "layers": layers}

    @classmethod
    def from_dict(cls, doc: Any, source: str = "workload") -> Workload:
        return _build(doc, source)

    @classmethod
    def load(
        cls, spec: str | Path | Mapping[str, Any] | Workload, tokens: int | None = None
    ) -> Workload:
        """A workload from a preset or zoo name, a workload JSON file's path, a dict in that
        file's format, or a workload already built (returned as it is); at ``tokens`` tokens
        per sample if given (:meth:`with_tokens`)."""
        if isinstance(spec, Workload):
            workload = spec
        elif isinstance(spec, Mapping):
            workload = _build(spec, "workload dict")
        elif isinstance(spec, (str, Path)):
            workload = load_workload(spec)
        else:
            raise WorkloadError(
                f"a workload is a preset name, a file path or a dict, got {type(spec).__name__}"
            )
        return workload if tokens is None else workload.with_tokens(tokens)


def preset_names() -> list[str]:
    """The workloads known by name: the presets pdlsim trains, then the zoo."""
    return sorted(PRESETS) + sorted(ZOO)


def load_workload(name_or_path: str | Path) -> Workload:
    """A preset or zoo network by name, or a workload JSON file by path."""
    key = str(name_or_path)
    if key in PRESETS:
        return _build(PRESETS[key], f"preset '{key}'")
    if key in ZOO:
        return _build(ZOO[key](), f"zoo network '{key}'")
    if not key:
        raise WorkloadError(
            f"the workload name is empty; give a preset ({', '.join(sorted(PRESETS))}), a "
            "zoo network (pdlsim workload list) or the path of a workload JSON file"
        )
    path = Path(key)
    if not path.exists():
        raise WorkloadError(
            f"no workload preset or file named '{key}'; use a preset ({', '.join(PRESETS)}), "
            f"a zoo network ({', '.join(ZOO)}) or the path of a workload JSON file"
        )
    kind = special_kind(path)
    if kind is not None:  # a directory, or a FIFO that would wait for a writer forever
        raise WorkloadError(f"workload '{key}' is {kind}; give the path of a JSON file")
    if key.endswith(os.sep):  # Path would drop the slash and read the file
        raise WorkloadError(f"workload file {key}: {TRAILING_SLASH}")
    try:
        doc = loads_strict(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise WorkloadError(
            f"workload file {key}: the key '{exc.key}' is given twice in one object; keep one"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload file {key}: {json_problem(exc)}") from None
    except OSError as exc:
        raise WorkloadError(f"workload file {key}: cannot read it ({exc})") from None
    return _build(doc, f"workload file {key}", path.stem)


def split_columns(units: int, parts: int) -> list[tuple[int, int]]:
    """The column range ``[lo, hi)`` of each of ``parts`` ranks over ``units`` output neurons:
    contiguous, in rank order, the first ``units % parts`` ranks one more."""
    base, extra = divmod(units, parts)
    bounds = [0]
    for r in range(parts):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def sliced_dense(info: LayerInfo, units: int) -> LayerInfo:
    """The dense layer ``info`` with only ``units`` of its output neurons (one rank's slice):
    shapes, parameters and FLOPs derived by the workload description itself."""
    if info.kind != "dense":
        raise ValueError(f"only dense layers are split, not {info.kind} ({info.name})")
    layer = Layer("dense", info.name, {**info.layer.settings, "units": units}, info.layer.inputs)
    shapes = list(info.input_shapes or (info.input_shape,))
    return infer(info.index, layer, shapes, info.needs_input_grad, info.name, info.inputs)


# ---------------------------------------------------------------------------------------------
# Parsing and shape inference


def _build(doc: Any, source: str, file_stem: str | None = None) -> Workload:
    """The workload ``doc`` describes, checked; ``source`` begins each error, and a file's
    ``file_stem`` names a workload whose description has no ``name``."""
    if not isinstance(doc, Mapping):
        raise WorkloadError(f"{source}: expected a JSON object with 'input_shape' and 'layers'")
    unknown = set(doc) - {"name", "input_shape", "layers", "description"}
    if unknown:
        raise WorkloadError(
            f"{source}: unknown key(s) {shown_names(unknown)}; "
            "allowed: name, input_shape, layers, description"
        )
    if "name" in doc or file_stem is None:
        name = checked_name(doc.get("name", "custom"), source, workload=True)
    else:
        problem = name_problem(file_stem, workload=True)
        if problem:
            raise WorkloadError(
                f"{source}: the workload has no 'name', and its file's name cannot stand in for "
                f"one (it {problem}); give the workload a 'name'"
            )
        name = file_stem
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise WorkloadError(f"{source}: 'description' must be a string")
    input_shape = parse_shape(doc.get("input_shape"), source)
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, Sequence) or isinstance(raw_layers, str) or not raw_layers:
        raise WorkloadError(f"{source}: 'layers' must be a non-empty list of layer objects")

    layers = [parse_layer(i, raw, source) for i, raw in enumerate(raw_layers)]
    index: dict[str, int] = {NETWORK_INPUT: -1}
    infos: list[LayerInfo] = []
    upstream_params = {-1: False}  # per layer: some layer at or above it has parameters
    read: set[int] = set()
    for i, layer in enumerate(layers):
        where = f"{source}: layer {i} ({layer.name})"
        if layer.name in index:
            first = "the network's input" if index[layer.name] < 0 else f"layer {index[layer.name]}"
            raise WorkloadError(f"{where}: the name {layer.name} is taken by {first}; rename it")
        if layer.kind in LOSS_KINDS and i != len(layers) - 1:
            raise WorkloadError(
                f"{where}: {layer.kind} must be the last layer (a network has one loss); "
                "move it to the end or remove it"
            )
        inputs = _inputs(layer, i, index, where)
        read.update(inputs)
        shapes = [input_shape if j < 0 else infos[j].output_shape for j in inputs]
        grad = any(upstream_params[j] for j in inputs)
        tied = _tied(layer, index, infos, shapes[0], where)
        info = infer(i, layer, shapes, grad, where, inputs, tied)
        upstream_params[i] = grad or info.param_count > 0 or tied is not None
        infos.append(info)
        index[layer.name] = i
    last = infos[-1]
    if last.kind not in LOSS_KINDS:
        raise WorkloadError(
            f"{source}: the last layer must be the loss ({' or '.join(LOSS_KINDS)}), "
            f"got {last.kind}"
        )
    unread = [info.name for info in infos[:-1] if info.index not in read]
    if unread:
        raise WorkloadError(
            f"{source}: layer {unread[0]} is read by no later layer; every layer but the loss "
            "must feed another (name it in a later layer's inputs, or remove it)"
        )
    if not any(info.param_count for info in infos):
        raise WorkloadError(f"{source}: no layer has parameters; add a dense or conv2d layer")
    return Workload(name, input_shape, tuple(infos), description)


def _inputs(layer: Layer, i: int, index: dict[str, int], where: str) -> tuple[int, ...]:
    """The indices of the layers ``layer`` reads (module docstring)."""
    names = layer.inputs or ((NETWORK_INPUT,) if i == 0 else ())
    missing = [n for n in names if n not in index]
    if missing:
        raise WorkloadError(
            f"{where}: reads {shown_value(missing[0])}, which is no layer above it; inputs "
            f"name earlier layers or '{NETWORK_INPUT}' (the layers run in the order listed)"
        )
    read = tuple(index[n] for n in names) or (i - 1,)
    wanted = "two or more inputs" if layer.kind in MULTI_INPUT_KINDS else "one input"
    if (len(read) >= 2) != (layer.kind in MULTI_INPUT_KINDS):
        fix = "name them in its 'inputs'" if len(read) < 2 else "join them with an add or concat"
        raise WorkloadError(f"{where}: {layer.kind} takes {wanted}, got {len(read)}; {fix}")
    if layer.kind == "embedding" and read != (-1,):
        raise WorkloadError(
            f"{where}: embedding reads the token ids of the network's input; give it "
            f'"inputs": ["{NETWORK_INPUT}"], or make it the first layer'
        )
    return read


def _tied(
    layer: Layer, index: dict[str, int], infos: list[LayerInfo], shape: Shape, where: str
) -> int | None:
    """The embedding a dense layer's ``tied_to`` names, checked against its shapes: the layer
    multiplies its input of ``shape`` by the transposed ``vocab x dim`` table, so it reads
    ``dim`` features and puts out ``vocab``."""
    target = layer.settings.get("tied_to")
    if not target:
        return None
    j = index.get(target, -1)
    if j < 0 or infos[j].kind != "embedding":
        raise WorkloadError(
            f"{where}: tied_to names {shown_value(target)}, which is no embedding above it; "
            "name an embedding layer listed before this one"
        )
    vocab, dim = infos[j].layer.get("vocab"), infos[j].layer.get("dim")
    if layer.get("units") != vocab:
        raise WorkloadError(
            f"{where}: tied to {target} ({vocab} x {dim}), so units must be {vocab}, "
            f"got {layer.get('units')}"
        )
    if len(shape) in (1, 2) and shape[-1] != dim:  # another rank: infer names the problem
        raise WorkloadError(
            f"{where}: tied to {target} ({vocab} x {dim}), so it must read {dim} features, "
            f"got {list(shape)}; give the layer before it {dim} units"
        )
    return j
