"""Parsing a workload description's parts: its input shape, its names and each layer's kind,
settings and inputs, each checked to its type and range with a one-line :class:`WorkloadError`
that names the part and how to fix it. :mod:`.graph` joins the layers and checks their shapes
(:mod:`.layers`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from microbench.errors import shown_names, shown_value, unprintable

from .layers import KIND_SETTINGS, LAYER_KINDS, MAX_DIM, Layer, Setting, WorkloadError, check_values

__all__ = ["MAX_NAME_CHARS", "checked_name", "name_problem", "parse_layer", "parse_shape"]


def parse_shape(value: Any, source: str) -> tuple[int, ...]:
    """A description's ``input_shape``: one to three positive sizes (:func:`check_values`
    bounds what they hold together)."""
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) not in (1, 2, 3)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise WorkloadError(
            f"{source}: 'input_shape' must be [features] (or token ids), [tokens, features] or "
            f"[channels, height, width] (integers), got {shown_value(value)}"
        )
    if any(v <= 0 for v in value):
        raise WorkloadError(f"{source}: 'input_shape' sizes must be positive, got {list(value)}")
    if any(v > MAX_DIM for v in value):
        raise WorkloadError(f"{source}: 'input_shape' sizes must be at most {MAX_DIM:,}")
    check_values(tuple(value), source, "'input_shape'")
    return tuple(value)


MAX_NAME_CHARS = 200  # a workload's or a layer's name: each error and table row prints it
_PATH_SEPARATORS = ("/", "\\")


def name_problem(name: Any, workload: bool = False) -> str | None:
    """What is wrong with ``name`` as a workload's (``workload``) or a layer's name, as a
    phrase after "'name'", with its fix; None where nothing is. A name is a non-empty string
    of at most :data:`MAX_NAME_CHARS` printable characters with no space at either end: each
    one-line error and table prints it, and a newline or a terminal escape would break them, a
    bidi override or a trailing space disguise it. A workload's has no path separator either:
    ``pdlsim bench --layer-times`` names its files after it."""
    if not isinstance(name, str) or not name:
        return f"must be a non-empty string, got {shown_value(name)}"
    problem = unprintable(name)
    if problem:
        return f"{problem}; use letters, digits and punctuation"
    if name != name.strip():
        return f"{shown_value(name)} starts or ends with a space; remove it"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name):,} characters long; give at most {MAX_NAME_CHARS}"
    if workload and any(sep in name for sep in _PATH_SEPARATORS):
        return (
            f"{shown_value(name)} holds a path separator, and files are named after the "
            "workload; use '-' or '_' in its place"
        )
    return None


def checked_name(name: Any, where: str, workload: bool = False) -> str:
    """``name`` (:func:`name_problem`), or a one-line :class:`WorkloadError` at ``where``."""
    problem = name_problem(name, workload)
    if problem:
        raise WorkloadError(f"{where}: 'name' {problem}")
    return name


def parse_layer(index: int, raw: Any, source: str) -> Layer:
    """Layer ``index`` of a description as written: its kind, its name (default kind and
    index), each setting of its kind checked to its type (defaults filled in; null only where
    it means "none" or "derived") and the names of the layers it reads; nothing about shapes,
    which :func:`.layers.infer` checks once the layers above it are known."""
    if not isinstance(raw, Mapping):
        raise WorkloadError(f"{source}: layer {index} must be an object with a 'kind'")
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in KIND_SETTINGS:
        raise WorkloadError(
            f"{source}: layer {index}: unknown kind {shown_value(kind)}; known kinds: "
            f"{', '.join(LAYER_KINDS)}"
        )
    name = checked_name(raw.get("name", f"{kind}{index}"), f"{source}: layer {index} ({kind})")
    where = f"{source}: layer {index} ({name})"
    allowed = KIND_SETTINGS[kind]
    unknown = set(raw) - set(allowed) - {"kind", "name", "inputs"}
    if unknown:
        keys = ", ".join(sorted(allowed)) or "none besides kind, name and inputs"
        raise WorkloadError(
            f"{where}: unknown setting(s) {shown_names(unknown)} for {kind}; allowed: {keys}"
        )
    settings: dict[str, Any] = {}
    for key, spec in allowed.items():
        value = raw.get(key, spec.default)
        if value is None:
            if key == "stride" and kind in ("maxpool2d", "avgpool2d"):
                continue  # filled from size below
            if spec.type == "layer":
                continue
            if spec.default is not None:  # null where leaving the key out gives a default
                raise WorkloadError(
                    f"{where}: '{key}' is null; give {_WANTED[spec.type]}, or leave it out "
                    f"for the default {json.dumps(spec.default)}"
                )
            raise WorkloadError(f"{where}: {kind} needs '{key}', {_WANTED[spec.type]}")
        settings[key] = _setting(value, key, spec, where)
    if kind in ("maxpool2d", "avgpool2d"):
        settings.setdefault("stride", settings["size"])
    return Layer(kind=kind, name=name, settings=settings, inputs=_input_names(raw, where))


# What each type of setting takes, as the errors ask for it (:class:`Setting`).
_WANTED = {"int": "an integer >= 1", "count": "an integer >= 0", "bool": "true or false",
           "fraction": "a number in [0, 1)", "layer": "a layer's name"}  # fmt: skip


def _setting(value: Any, key: str, spec: Setting, where: str) -> Any:
    """``value`` checked against its setting's type (:class:`Setting`)."""
    if isinstance(spec.type, tuple):
        if value not in spec.type:
            raise WorkloadError(
                f"{where}: '{key}' must be one of {', '.join(spec.type)}, got {shown_value(value)}"
            )
        return value
    if spec.type == "bool":
        if not isinstance(value, bool):
            raise WorkloadError(f"{where}: '{key}' must be true or false, got {shown_value(value)}")
        return value
    if spec.type == "layer":
        if not isinstance(value, str) or not value:
            raise WorkloadError(f"{where}: '{key}' must name a layer, got {shown_value(value)}")
        return value
    if spec.type == "fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise WorkloadError(
                f"{where}: '{key}' must be a number in [0, 1), got {shown_value(value)}"
            )
        return float(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WorkloadError(f"{where}: '{key}' must be an integer, got {shown_value(value)}")
    minimum = 0 if spec.type == "count" else 1
    if value < minimum:
        raise WorkloadError(f"{where}: '{key}' must be >= {minimum}, got {value}")
    if value > MAX_DIM:
        raise WorkloadError(f"{where}: '{key}' must be at most {MAX_DIM:,}, got {value:,}")
    return value


def _input_names(raw: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """A layer's ``inputs``: a name or a non-empty list of names (empty: the layer above)."""
    names = raw.get("inputs")
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    if (
        not isinstance(names, Sequence)
        or not names
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise WorkloadError(
            f"{where}: 'inputs' must be a list of layer names, got {shown_value(names)}"
        )
    return tuple(names)
