"""Hardware presets from public data sheets: GPUs, nodes of GPUs, and the networks between nodes.

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

Node presets say which GPU a node holds and how many, the fabric between them (``nvlink``:
NVLink, through NVSwitches or a mesh; ``xgmi``: AMD Infinity Fabric; ``pcie``) with each GPU's
line rate into it per direction, whether the switches reduce in the network (NVLink SHARP,
``nvls``), and the NICs of the node's compute fabric with their network. They are what the
GPU collectives (:mod:`pdlsim.sim.nccl`) run on.

Each kind may also come from a file holding one entry (:meth:`Hardware.resolve`), so a user
describes a machine not packaged here by copying one (``pdlsim hardware show NAME``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from microbench.errors import UserError, shown_names, shown_text, shown_value
from microbench.fileio import read_json

__all__ = [
    "ASSUMPTIONS",
    "FLOPS_RANGE",
    "MAX_TIME_S",
    "MIN_FRACTION",
    "MIN_TIME_S",
    "MIN_WATTS",
    "MAX_WATTS",
    "watts_problem",
    "RATE_RANGE_BYTES_PER_S",
    "HARDWARE",
    "Assumption",
    "DEFAULT_GPU_PRESET",
    "DEFAULT_NETWORK_PRESET",
    "DEFAULT_NODE_PRESET",
    "FABRICS",
    "GPU_PRESETS",
    "NETWORK_PRESETS",
    "NODE_PRESETS",
    "GpuPreset",
    "Hardware",
    "NetworkPreset",
    "NodePreset",
    "gpu_preset",
    "load_hardware",
    "network_preset",
]


from pdlsim.costmodel.limits import (
    FLOPS_RANGE,
    MAX_LEAF_NODES,
    MAX_OVERSUBSCRIPTION,
    MAX_TIME_S,
    MAX_WATTS,
    MEMORY_RANGE_BYTES,
    MIN_FRACTION,
    MIN_TIME_S,
    MIN_WATTS,
    RATE_RANGE_BYTES_PER_S,
    check_ranges,
    check_text,
    watts_problem,
)


@dataclass(frozen=True)
class NetworkPreset:
    """One inter-node link (a NIC port): latency and per-direction bandwidth."""

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    source: str
    kind: str = "data sheet"  # or "given" (from --inter-bw/--inter-lat)
    oversubscription: float = 1.0  # a leaf switch's downlink : uplink bandwidth (fat tree)
    leaf_nodes: int = 0  # nodes under one leaf switch; 0: all nodes on one switch

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_bytes_per_s > 0):
            raise UserError(
                f"network '{self.name}': latency must be >= 0 and bandwidth > 0, "
                f"got {self.latency_s} s and {self.bandwidth_bytes_per_s} B/s"
            )
        if not (self.oversubscription >= 1 and self.leaf_nodes >= 0):
            raise UserError(
                f"network '{self.name}': need oversubscription >= 1 and leaf_nodes >= 0, "
                f"got {self.oversubscription} and {self.leaf_nodes}"
            )
        ranges = {
            "latency_s": (MIN_TIME_S, MAX_TIME_S),
            "bandwidth_bytes_per_s": RATE_RANGE_BYTES_PER_S,
            "oversubscription": (1.0, MAX_OVERSUBSCRIPTION),
            "leaf_nodes": (0, MAX_LEAF_NODES),
        }
        check_ranges(f"network '{self.name}'", self, ranges, optional=("latency_s",))


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
    board_power_w: float = 0.0  # the data sheet's maximum board power (TDP; 0: not given)
    # the names the driver reports for this part (nvidia-smi, torch.cuda.get_device_name), by
    # which a profile measured on one finds its preset (:meth:`Hardware.node_for_device`)
    device_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        positive = ("fp32_flops_per_s", "hbm_bandwidth_bytes_per_s", "pcie_bytes_per_s",
                    "memory_bytes")  # fmt: skip
        optional = ("tf32_tensor_flops_per_s", "bf16_tensor_flops_per_s",
                    "fp16_tensor_flops_per_s", "nvlink_bytes_per_s", "board_power_w")  # fmt: skip
        for name in positive + optional:
            value = getattr(self, name)
            if value < 0 or (value == 0 and name in positive):
                need = "above 0" if name in positive else "0 (none) or above"
                raise UserError(f"GPU '{self.name}': {name} must be {need}, got {value:g}")
        ranges = {
            name: FLOPS_RANGE if "flops" in name else RATE_RANGE_BYTES_PER_S
            for name in positive + optional
            if name.endswith("_per_s")
        }
        ranges.update(memory_bytes=MEMORY_RANGE_BYTES, board_power_w=(MIN_WATTS, MAX_WATTS))
        check_ranges(f"GPU '{self.name}'", self, ranges, optional)


FABRICS = ("nvlink", "xgmi", "pcie")
MAX_GPUS_PER_NODE = 64  # the densest nodes hold 8 to 16; more is a typo
MAX_NICS_PER_NODE = 256  # a NIC or two per GPU at most, storage ones besides


@dataclass(frozen=True)
class NodePreset:
    """One node of GPUs: which GPU and how many, the fabric between them and its line rate per
    GPU and direction, NVLink SHARP or not, and the NICs of its compute fabric."""

    name: str
    gpu: str  # a GPU preset's name
    gpus_per_node: int
    fabric: str  # nvlink, xgmi or pcie
    gpu_link_bytes_per_s: float  # one GPU into the fabric, per direction, line rate
    nvls: bool  # the switches reduce (NVLink SHARP)
    nics: int  # NICs of the compute fabric per node
    network: str  # a network preset's name: the NICs' kind
    source: str
    kind: str = "data sheet"

    def __post_init__(self) -> None:
        if self.fabric not in FABRICS:
            raise UserError(
                f"node '{self.name}': unknown fabric '{self.fabric}'; known: {', '.join(FABRICS)}"
            )
        if not (
            1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE
            and 1 <= self.nics <= MAX_NICS_PER_NODE
            and self.gpu_link_bytes_per_s > 0
        ):
            raise UserError(
                f"node '{self.name}': need gpus_per_node in 1..{MAX_GPUS_PER_NODE}, nics in "
                f"1..{MAX_NICS_PER_NODE} and gpu_link_bytes_per_s > 0, got {self.gpus_per_node}, "
                f"{self.nics} and {self.gpu_link_bytes_per_s}"
            )
        ranges = {"gpu_link_bytes_per_s": RATE_RANGE_BYTES_PER_S}
        check_ranges(f"node '{self.name}'", self, ranges)
        if self.nvls and self.fabric != "nvlink":
            raise UserError(f"node '{self.name}': nvls (NVLink SHARP) needs the nvlink fabric")


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
        fraction = self.unit.startswith("fraction")
        if fraction and not (MIN_FRACTION <= self.low and self.high <= 1):
            raise UserError(
                f"assumption '{self.name}' is a {self.unit}: need {MIN_FRACTION:g} <= low and "
                f"high <= 1, got {self.low}..{self.high}"
            )
        if not fraction and self.low < 0:
            raise UserError(
                f"assumption '{self.name}' ({self.unit}) cannot be negative, got low {self.low}"
            )
        if self.unit.split()[:1] == ["s"] and self.high > MAX_TIME_S:
            raise UserError(
                f"assumption '{self.name}' is in seconds: need high <= {MAX_TIME_S:g}, "
                f"got {self.high:g}"
            )
        tiny = [v for v in (self.low, self.value, self.high) if 0 < v < MIN_TIME_S]
        if self.unit.split()[:1] == ["s"] and tiny:
            raise UserError(
                f"assumption '{self.name}' is in seconds: each figure 0 or at least "
                f"{MIN_TIME_S:g} s, got {tiny[0]:g}"
            )


@dataclass(frozen=True)
class Hardware:
    """The presets and assumptions a prediction may rest on: the packaged file
    (``pdlsim/costmodel/hardware.json``), optionally overlaid by a user's file of the same shape."""

    networks: Mapping[str, NetworkPreset]
    gpus: Mapping[str, GpuPreset]
    assumptions: Mapping[str, Assumption]
    source: str
    nodes: Mapping[str, NodePreset] = field(default_factory=dict)

    def network(self, name: str) -> NetworkPreset:
        if name not in self.networks:
            known = ", ".join(self.networks)
            raise UserError(f"unknown network preset '{shown_text(name)}'; known: {known}")
        return self.networks[name]

    def gpu(self, name: str) -> GpuPreset:
        if name not in self.gpus:
            known = ", ".join(self.gpus)
            raise UserError(f"unknown GPU preset '{shown_text(name)}'; known: {known}, none")
        return self.gpus[name]

    def node(self, name: str) -> NodePreset:
        if name not in self.nodes:
            known = ", ".join(self.nodes)
            raise UserError(f"unknown node preset '{shown_text(name)}'; known: {known}")
        return self.nodes[name]

    def node_for_device(self, device_name: str) -> str | None:
        """The node preset that holds the GPU the driver calls ``device_name`` (a profile's
        measured GPU), :data:`DEFAULT_NODE_PRESET` first where it does; None where no GPU
        preset knows that name."""
        wanted = device_name.strip().casefold()
        gpus = {
            name for name, gpu in self.gpus.items()
            if wanted in (known.strip().casefold() for known in gpu.device_names)
        }  # fmt: skip
        holding = [name for name, node in self.nodes.items() if node.gpu in gpus]
        if DEFAULT_NODE_PRESET in holding:
            return DEFAULT_NODE_PRESET
        return holding[0] if holding else None

    def resolve(self, kind: str, text: str) -> Any:
        """The ``kind`` (``gpu``, ``node`` or ``network``) preset named ``text``, or read from
        the file at ``text`` (a path, or a name ending in ``.json``): one entry's fields, as
        ``pdlsim hardware show NAME`` prints them; ``name`` optional (default: the file's
        stem). A node's GPU and network must be presets of this catalogue.

        A preset's name is the preset, whatever the working directory holds: a folder or file
        called ``dgx-h100`` there must not stand in for the node (a default included), so a
        file named like a preset is read only as a path (``./dgx-h100``)."""
        section = {"gpu": self.gpus, "node": self.nodes, "network": self.networks}[kind]
        if text in section and "/" not in text and not text.endswith(".json"):
            return section[text]
        if Path(text).is_dir():
            raise UserError(f"--{_FLAGS[kind]} {text}: a directory; give a {kind} preset's name "
                            f"or a JSON file of one {kind}")  # fmt: skip
        if not (text.endswith(".json") or "/" in text or Path(text).exists()):
            return {"gpu": self.gpu, "node": self.node, "network": self.network}[kind](text)
        values = read_json(text, f"--{_FLAGS[kind]} {text}")
        if not isinstance(values, Mapping):
            raise UserError(f"--{_FLAGS[kind]} {text}: expected a JSON object of one {kind}")
        where = f"--{_FLAGS[kind]} {text}"  # the flag too, as a file it cannot read says
        entry = _made(_KINDS[kind], {"name": Path(text).stem, **values}, where)
        if kind == "node":  # its GPU and network must be known here
            try:
                self.gpu(entry.gpu)
                self.network(entry.network)
            except UserError as exc:
                raise UserError(f"--node {text}: {exc}") from None
        return replace(entry, kind=f"file {text}")

    def entry(self, name: str) -> tuple[str, dict[str, Any]]:
        """The kind of the preset ``name`` and its fields, as a file of one entry holds them."""
        for kind, section in (("gpu", self.gpus), ("node", self.nodes), ("network", self.networks)):
            if name in section:
                fields_ = asdict(section[name])
                fields_.pop("kind")
                return kind, fields_
        known = ", ".join([*self.gpus, *self.nodes, *self.networks])
        if not name.strip():
            raise UserError(f"the preset name is empty; give one of {known}")
        raise UserError(f"unknown preset '{shown_text(name)}'; known: {known}")

    def overlaid(self, doc: Any, source: str) -> Hardware:
        """This catalogue with ``doc``'s presets added or replaced and its assumptions
        replaced, field by field (an assumption may give only a new ``value``); an empty
        catalogue takes ``doc``'s assumptions whole."""
        if not isinstance(doc, Mapping):
            raise UserError(f"{source}: expected a JSON object with networks, gpus, assumptions")
        unknown = set(doc) - {"about", "networks", "gpus", "nodes", "assumptions"}
        if unknown:
            raise UserError(
                f"{source}: unknown key(s) {shown_names(unknown)}; "
                "allowed: about, networks, gpus, nodes, assumptions"
            )
        if not isinstance(doc.get("about", ""), str):  # a note for readers, never a figure
            raise UserError(
                f"{source}: about: expected a string (a note), got {shown_value(doc['about'])}"
            )
        networks = {**self.networks, **_section(doc, "networks", source, NetworkPreset)}
        gpus = {**self.gpus, **_section(doc, "gpus", source, GpuPreset)}
        nodes = {**self.nodes, **_section(doc, "nodes", source, NodePreset)}
        _one_kind_each(source, {"gpus": gpus, "nodes": nodes, "networks": networks})
        for node in nodes.values():
            if node.gpu not in gpus or node.network not in networks:
                raise UserError(
                    f"{source}: nodes.{node.name} names GPU '{node.gpu}' and network "
                    f"'{node.network}'; both must be presets ({', '.join(gpus)}; "
                    f"{', '.join(networks)})"
                )
        assumptions = dict(self.assumptions)
        for name, given in _entries(doc, "assumptions", source):
            if name not in assumptions and self.assumptions:
                raise UserError(
                    f"{source}: assumptions.{name}: no such assumption; "
                    f"known: {', '.join(assumptions)}"
                )
            old = asdict(assumptions[name]) if name in assumptions else {"name": name}
            if (
                "unit" in old
                and isinstance(given, dict)
                and given.get("unit", old["unit"]) != old["unit"]
            ):
                # the model reads the figure in its unit, whatever the file calls it
                raise UserError(
                    f"{source}: assumptions.{name}.unit: the model reads this figure as "
                    f"'{old['unit']}', got '{given['unit']}'; give the figure in that unit and "
                    "drop unit, or give that unit"
                )
            assumptions[name] = _made(Assumption, {**old, **given}, f"{source}: assumptions.{name}")
        return Hardware(networks, gpus, assumptions, f"{self.source} + {source}", nodes)


def _entries(doc: Mapping[str, Any], key: str, source: str) -> list[tuple[str, dict[str, Any]]]:
    section = doc.get(key, {})
    if not isinstance(section, Mapping):
        raise UserError(f"{source}: '{key}' must be an object of named entries")
    for name, entry in section.items():
        if not isinstance(entry, Mapping):
            raise UserError(f"{source}: {key}.{name} must be an object")
    return [(str(name), dict(entry)) for name, entry in section.items()]


def _section(doc: Mapping[str, Any], key: str, source: str, kind: type) -> dict[str, Any]:
    """The entries of ``doc[key]`` made ``kind``, each named by its key: a ``name`` field that
    says otherwise (a pasted ``pdlsim hardware show`` of another preset) is refused, as the
    catalogue would file under one name a preset that messages and reports call by another."""
    made = {}
    for name, entry in _entries(doc, key, source):
        if "name" in entry and entry["name"] != name:
            raise UserError(
                f"{source}: {key}.{shown_text(name)}.name is {shown_value(entry['name'])}: an "
                "entry is named by its key; drop name, or make it the key"
            )
        made[name] = _made(kind, {"name": name, **entry}, f"{source}: {key}.{name}")
    return made


def _one_kind_each(source: str, sections: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a name that two kinds share (a GPU called ``dgx-h100``): ``pdlsim hardware show
    NAME`` and the one-line errors name a preset by its name alone, so it must say which."""
    seen: dict[str, str] = {}
    for key, section in sections.items():
        for name in section:
            if name in seen:
                raise UserError(
                    f"{source}: '{shown_text(name)}' names one of the {seen[name]} and one of "
                    f"the {key}; give each preset a name no other kind has"
                )
            seen[name] = key


def _made(kind: type, values: dict[str, Any], where: str) -> Any:
    """``kind(**values)`` with its fields checked: each named field present, numbers finite."""
    names = {f.name for f in fields(kind)}
    required = {f.name for f in fields(kind) if f.default is MISSING}
    unknown, missing = set(values) - names, required - set(values)
    if unknown or missing:
        problem = (
            f"unknown field(s) {shown_names(unknown)}"
            if unknown
            else f"missing field(s) {', '.join(sorted(missing))}"
        )
        raise UserError(f"{where}: {problem}; fields: {', '.join(sorted(names))}")
    for f in fields(kind):
        if f.name not in values:
            continue
        value = values[f.name]
        numeric = f.type in ("float", "int")
        if f.type == "bool" and not isinstance(value, bool):
            raise UserError(f"{where}.{f.name}: expected true or false, got {shown_value(value)}")
        if numeric and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where}.{f.name}: expected a number, got {shown_value(value)}")
        if numeric and not math.isfinite(value):
            raise UserError(f"{where}.{f.name}: expected a finite number, got {shown_value(value)}")
        if f.type == "str" and not isinstance(value, str):
            raise UserError(f"{where}.{f.name}: expected a string, got {shown_value(value)}")
        if f.type == "tuple[str, ...]":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UserError(
                    f"{where}.{f.name}: expected a list of strings, got {shown_value(value)}"
                )
            values[f.name] = tuple(value)
        if f.type in ("str", "tuple[str, ...]"):
            check_text(where, f.name, value)
        if f.type == "int" and value != int(value):
            raise UserError(f"{where}.{f.name}: expected a whole number, got {shown_value(value)}")
        if f.type == "int":
            values[f.name] = int(value)
    try:
        return kind(**values)
    except UserError as exc:  # the kind's own checks, which do not know the file
        raise UserError(f"{where}: {exc}") from None


_KINDS = {"gpu": GpuPreset, "node": NodePreset, "network": NetworkPreset}
_FLAGS = {"gpu": "gpu-preset", "node": "node", "network": "network"}
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
NODE_PRESETS = HARDWARE.nodes
ASSUMPTIONS = HARDWARE.assumptions

DEFAULT_NETWORK_PRESET = "ib-hdr"
DEFAULT_GPU_PRESET = "h100-sxm"
DEFAULT_NODE_PRESET = "dgx-h100"


def network_preset(name: str) -> NetworkPreset:
    """A packaged network preset by name."""
    return HARDWARE.network(name)


def gpu_preset(name: str) -> GpuPreset:
    """A packaged GPU preset by name."""
    return HARDWARE.gpu(name)
