"""Hardware presets from public data sheets: network links between nodes, and GPUs.

These are **data-sheet figures, not measurements**: peak rates as vendors publish them. A
profile measured on one node says nothing about the network between nodes or about a GPU it
did not have, so a prediction for such a cluster combines the measured profile with one of
these; the prediction's provenance says which numbers came from here.

Network presets give the per-direction signalling rate of one port (what a single NIC can move
per second) and a typical one-way small-message latency as published with the product family.
The bandwidth is the line rate: protocol overheads (encoding, headers) are not subtracted, so a
prediction with a preset is optimistic by the few percent those cost.

GPU presets give dense (no sparsity) FP32 peaks, HBM bandwidth, the host link (PCIe, per
direction, theoretical) and NVLink (total bidirectional bandwidth per GPU, as the data sheets
state it), and memory capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import read_json

__all__ = [
    "ASSUMPTIONS",
    "HARDWARE",
    "Assumption",
    "DEFAULT_GPU_PRESET",
    "DEFAULT_NETWORK_PRESET",
    "GPU_PRESETS",
    "NETWORK_PRESETS",
    "GpuPreset",
    "Hardware",
    "NetworkPreset",
    "gpu_preset",
    "load_hardware",
    "network_preset",
]


@dataclass(frozen=True)
class NetworkPreset:
    """One inter-node link (a NIC port): latency and per-direction bandwidth."""

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    source: str
    kind: str = "data sheet"  # or "given" (from --inter-bw/--inter-lat)

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_bytes_per_s > 0):
            raise UserError(
                f"network '{self.name}': latency must be >= 0 and bandwidth > 0, "
                f"got {self.latency_s} s and {self.bandwidth_bytes_per_s} B/s"
            )


@dataclass(frozen=True)
class GpuPreset:
    """One GPU from its data sheet (dense figures, no sparsity)."""

    name: str
    fp32_flops_per_s: float  # non-tensor-core FP32
    tf32_tensor_flops_per_s: float  # dense TF32 tensor core (0: none)
    hbm_bandwidth_bytes_per_s: float
    pcie_bytes_per_s: float  # host link, per direction, theoretical
    nvlink_bytes_per_s: float  # total bidirectional NVLink bandwidth per GPU
    memory_bytes: int
    source: str
    kind: str = "data sheet"
    bf16_tensor_flops_per_s: float = 0.0  # dense BF16 tensor core (0: none)
    fp16_tensor_flops_per_s: float = 0.0  # dense FP16 tensor core (0: none)


@dataclass(frozen=True)
class Assumption:
    """A figure the model takes where nothing measured says, with the range it may lie in:
    read as a 95% interval, the prediction band draws it there
    (:mod:`pdlsim.costmodel.uncertainty`)."""

    name: str
    value: float
    low: float
    high: float
    unit: str
    basis: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and self.low <= self.value <= self.high < math.inf):
            raise UserError(
                f"assumption '{self.name}': need low <= value <= high, all finite, "
                f"got {self.low}, {self.value}, {self.high}"
            )


@dataclass(frozen=True)
class Hardware:
    """The presets and assumptions a prediction may rest on: the packaged file
    (``pdlsim/costmodel/hardware.json``), optionally overlaid by a user's file of the same shape."""

    networks: Mapping[str, NetworkPreset]
    gpus: Mapping[str, GpuPreset]
    assumptions: Mapping[str, Assumption]
    source: str

    def network(self, name: str) -> NetworkPreset:
        if name not in self.networks:
            raise UserError(f"unknown network preset '{name}'; known: {', '.join(self.networks)}")
        return self.networks[name]

    def gpu(self, name: str) -> GpuPreset:
        if name not in self.gpus:
            raise UserError(f"unknown GPU preset '{name}'; known: {', '.join(self.gpus)}, none")
        return self.gpus[name]

    def overlaid(self, doc: Any, source: str) -> Hardware:
        """This catalogue with ``doc``'s presets added or replaced and its assumptions
        replaced, field by field (an assumption may give only a new ``value``); an empty
        catalogue takes ``doc``'s assumptions whole."""
        if not isinstance(doc, Mapping):
            raise UserError(f"{source}: expected a JSON object with networks, gpus, assumptions")
        unknown = set(doc) - {"about", "networks", "gpus", "assumptions"}
        if unknown:
            raise UserError(
                f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
                "allowed: about, networks, gpus, assumptions"
            )
        networks = {**self.networks, **_section(doc, "networks", source, NetworkPreset)}
        gpus = {**self.gpus, **_section(doc, "gpus", source, GpuPreset)}
        assumptions = dict(self.assumptions)
        for name, given in _entries(doc, "assumptions", source):
            if name not in assumptions and self.assumptions:
                raise UserError(
                    f"{source}: assumptions.{name}: no such assumption; "
                    f"known: {', '.join(assumptions)}"
                )
            old = asdict(assumptions[name]) if name in assumptions else {"name": name}
            assumptions[name] = _made(Assumption, {**old, **given}, f"{source}: assumptions.{name}")
        return Hardware(networks, gpus, assumptions, f"{self.source} + {source}")


def _entries(doc: Mapping[str, Any], key: str, source: str) -> list[tuple[str, dict[str, Any]]]:
    section = doc.get(key, {})
    if not isinstance(section, Mapping):
        raise UserError(f"{source}: '{key}' must be an object of named entries")
    for name, entry in section.items():
        if not isinstance(entry, Mapping):
            raise UserError(f"{source}: {key}.{name} must be an object")
    return [(str(name), dict(entry)) for name, entry in section.items()]


def _section(doc: Mapping[str, Any], key: str, source: str, kind: type) -> dict[str, Any]:
    return {
        name: _made(kind, {"name": name, **entry}, f"{source}: {key}.{name}")
        for name, entry in _entries(doc, key, source)
    }


def _made(kind: type, values: dict[str, Any], where: str) -> Any:
    """``kind(**values)`` with its fields checked: each named field present, numbers finite."""
    names = {f.name for f in fields(kind)}
    required = {f.name for f in fields(kind) if f.default is MISSING}
    unknown, missing = set(values) - names, required - set(values)
    if unknown or missing:
        problem = (
            f"unknown field(s) {', '.join(sorted(unknown))}"
            if unknown
            else f"missing field(s) {', '.join(sorted(missing))}"
        )
        raise UserError(f"{where}: {problem}; fields: {', '.join(sorted(names))}")
    for f in fields(kind):
        if f.name not in values:
            continue
        value = values[f.name]
        numeric = f.type in ("float", "int")
        if numeric and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where}.{f.name}: expected a number, got {value!r}")
        if numeric and not math.isfinite(value):
            raise UserError(f"{where}.{f.name}: expected a finite number, got {value!r}")
        if f.type == "str" and not isinstance(value, str):
            raise UserError(f"{where}.{f.name}: expected a string, got {value!r}")
        if f.type == "int" and value != int(value):
            raise UserError(f"{where}.{f.name}: expected a whole number, got {value!r}")
        if f.type == "int":
            values[f.name] = int(value)
    try:
        return kind(**values)
    except UserError as exc:  # the kind's own checks, which do not know the file
        raise UserError(f"{where}: {exc}") from None


PACKAGED = Path(__file__).with_name("hardware.json")
_EMPTY = Hardware({}, {}, {}, str(PACKAGED))


def load_hardware(path: str | Path | None = None) -> Hardware:
    """The packaged presets and assumptions, overlaid by the file at ``path`` if given."""
    base = _EMPTY.overlaid(read_json(PACKAGED, str(PACKAGED)), str(PACKAGED))
    base = replace(base, source=str(PACKAGED))
    if path is None:
        return base
    return base.overlaid(read_json(path, f"--hardware {path}"), str(path))


HARDWARE = load_hardware()
NETWORK_PRESETS = HARDWARE.networks
GPU_PRESETS = HARDWARE.gpus
ASSUMPTIONS = HARDWARE.assumptions

DEFAULT_NETWORK_PRESET = "ib-hdr"
DEFAULT_GPU_PRESET = "h100-sxm"


def network_preset(name: str) -> NetworkPreset:
    """A packaged network preset by name."""
    return HARDWARE.network(name)


def gpu_preset(name: str) -> GpuPreset:
    """A packaged GPU preset by name."""
    return HARDWARE.gpu(name)
