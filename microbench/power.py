"""Measured energy, where the machine allows it: Intel RAPL counters and NVIDIA NVML.

Sources (each optional; what is missing is reported, with the reason, never guessed):

- **RAPL** (Running Average Power Limit), through the Linux powercap driver:
  ``/sys/class/powercap/intel-rapl:N[:M]/energy_uj`` is a cumulative energy counter in
  microjoules per domain, ``name`` says which (``package-N``: one CPU socket's cores, caches
  and uncore; ``dram``: its memory; ``core``/``uncore``: parts of the package; ``psys``: the
  whole platform), ``max_energy_range_uj`` is where the counter wraps to 0. AMD Zen CPUs
  appear under the same name. Since Linux 5.10 ``energy_uj`` is readable by root only (a side
  channel, CVE-2020-8694), so "permission denied" is the common answer; virtual machines and
  containers usually have no powercap tree at all.
- **NVML**, through ``pynvml`` (the ``nvidia-ml-py`` package) when it is importable: per GPU,
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded, Volta and later), else
  ``nvmlDeviceGetPowerUsage`` (mW now) integrated with the trapezoid rule between readings, which
  is only as good as the readings are frequent: call :meth:`EnergyMeter.poll` often.

Totals: ``package-*`` and ``dram`` domains and GPUs add up (DRAM is not part of the package
domain on the server parts that report it); ``core``, ``uncore`` and ``psys`` overlap them, so
they are reported but left out of :attr:`EnergyReading.total_j`.

Wrap-around: a counter read lower than before has wrapped once, ``delta = end + range - start``;
more than one wrap between readings cannot be seen, so a long measurement must poll more often
than the wrap period (range / power: ~20 minutes for a 262 kJ range at 200 W).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "RAPL_ROOT",
    "EnergyMeter",
    "EnergyReading",
    "EnergySource",
    "NvmlSource",
    "RaplSource",
    "counter_delta",
    "find_nvml",
    "find_rapl",
]

RAPL_ROOT = Path("/sys/class/powercap")
_SUMMED_RAPL = ("package", "dram")  # domain names that add up; core/uncore/psys overlap them

Clock = Callable[[], float]


class EnergySource(Protocol):
    """A set of energy domains that can be read together."""

    kind: str
    domains: tuple[str, ...]
    in_total: Mapping[str, bool]
    methods: Mapping[str, str]

    def read(self) -> dict[str, float]: ...

    def joules(
        self, before: Mapping[str, float], after: Mapping[str, float], interval_s: float
    ) -> dict[str, float]: ...

    def close(self) -> None: ...


def counter_delta(start: int, end: int, max_range: int) -> int:
    """Increase of a counter that wraps to 0 above ``max_range``, assuming at most one wrap."""
    if end >= start:
        return end - start
    if max_range <= 0:
        raise ValueError(f"counter went down ({start} -> {end}) and has no range to wrap at")
    return end + max_range - start


# ---------------------------------------------------------------------------- RAPL


@dataclass(frozen=True)
class RaplZone:
    """One RAPL domain: its ``energy_uj`` file and the range it wraps at."""

    domain: str  # "package-0", "package-0/dram", "psys"
    energy_path: Path
    max_energy_range_uj: int
    in_total: bool


class RaplSource:
    """RAPL domains read from a powercap tree (``root``: /sys/class/powercap, or a copy)."""

    kind = "rapl"

    def __init__(self, zones: Sequence[RaplZone]) -> None:
        self.zones = {z.domain: z for z in zones}
        self.domains = tuple(self.zones)
        self.in_total = {z.domain: z.in_total for z in zones}
        self.methods = dict.fromkeys(self.domains, "rapl energy counter")

    def read(self) -> dict[str, float]:
        return {d: float(int(z.energy_path.read_text())) for d, z in self.zones.items()}

    def joules(
        self, before: Mapping[str, float], after: Mapping[str, float], interval_s: float
    ) -> dict[str, float]:
        return {
            d: counter_delta(int(before[d]), int(after[d]), z.max_energy_range_uj) * 1e-6
            for d, z in self.zones.items()
        }

    def close(self) -> None:
        pass


def _zone_name(zone_dir: Path) -> str:
    return (zone_dir / "name").read_text().strip()


def find_rapl(root: Path | str = RAPL_ROOT) -> tuple[RaplSource | None, list[str]]:
    """The readable RAPL domains under ``root`` and, for what is not usable, why.

    Domain names: a top-level zone by its ``name`` (``package-0``), a sub-zone prefixed by its
    parent's (``package-0/dram``), made unique when two zones share one.
    """
    root = Path(root)
    zone_dirs = sorted(root.glob("intel-rapl:*"), key=lambda p: p.name)
    if not zone_dirs:
        why = "does not exist" if not root.exists() else "holds no intel-rapl:* zone"
        return None, [
            f"RAPL: {root} {why} (no powercap driver for this CPU, or a virtual machine or "
            "container that hides it)"
        ]
    zones, problems = [], []
    for zone_dir in zone_dirs:
        energy = zone_dir / "energy_uj"
        try:
            name = _zone_name(zone_dir)
            parent = zone_dir.name.rsplit(":", 1)[0]
            if parent.count(":") >= 1:  # a sub-zone: intel-rapl:0:2 under intel-rapl:0
                name = f"{_zone_name(root / parent)}/{name}"
            max_range = int((zone_dir / "max_energy_range_uj").read_text())
            int(energy.read_text())
        except PermissionError:
            problems.append(
                f"RAPL: {energy} is not readable: permission denied (since Linux 5.10 only root "
                "may read energy_uj; run as root, or have an administrator "
                "'chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj')"
            )
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"RAPL: cannot read {zone_dir}: {exc}")
            continue
        base = name.rsplit("/", 1)[-1]
        domain, k = name, 2
        while domain in {z.domain for z in zones}:
            domain, k = f"{name}#{k}", k + 1
        summed = base.startswith(_SUMMED_RAPL)
        zones.append(RaplZone(domain, energy, max_range, summed))
    return (RaplSource(zones) if zones else None), problems


# ---------------------------------------------------------------------------- NVML


class NvmlSource:
    """GPUs through NVML: the energy counter where supported, else power samples."""

    kind = "nvml"

    def __init__(self, nvml: Any, handles: Mapping[str, Any], counters: Mapping[str, bool]):
        self._nvml = nvml
        self._handles = dict(handles)
        self._counter = dict(counters)
        self.domains = tuple(self._handles)
        self.in_total = dict.fromkeys(self.domains, True)
        self.methods = {
            d: "nvml energy counter" if c else "nvml power samples (trapezoid)"
            for d, c in self._counter.items()
        }

    def read(self) -> dict[str, float]:
        out = {}
        for d, h in self._handles.items():
            if self._counter[d]:
                out[d] = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ
            else:
                out[d] = float(self._nvml.nvmlDeviceGetPowerUsage(h))  # mW
        return out

    def joules(
        self, before: Mapping[str, float], after: Mapping[str, float], interval_s: float
    ) -> dict[str, float]:
        out = {}
        for d in self.domains:
            if self._counter[d]:
                out[d] = (after[d] - before[d]) * 1e-3
            else:
                out[d] = 0.5 * (before[d] + after[d]) * 1e-3 * interval_s
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")


def find_nvml(nvml: Any = None) -> tuple[NvmlSource | None, list[str]]:
    """NVML's GPUs (``nvml``: the pynvml module, imported when None) and why not, if not."""
    if nvml is None:
        try:
            nvml = _import_pynvml()
        except ImportError:
            return None, ["NVML: pynvml is not installed (pip install nvidia-ml-py), or no GPU"]
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return None, [f"NVML: nvmlInit failed ({exc}): no NVIDIA driver or GPU here"]
    handles, counters, problems = {}, {}, []
    try:
        count = int(nvml.nvmlDeviceGetCount())
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            for counter, probe in (
                (True, nvml.nvmlDeviceGetTotalEnergyConsumption),
                (False, nvml.nvmlDeviceGetPowerUsage),
            ):
                try:
                    probe(handle)
                except Exception:
                    continue
                handles[f"gpu-{i}"], counters[f"gpu-{i}"] = handle, counter
                break
            else:
                problems.append(f"NVML: GPU {i} reports neither energy nor power")
    except Exception as exc:
        problems.append(f"NVML: cannot list the GPUs ({exc})")
    source = NvmlSource(nvml, handles, counters)
    if not handles:
        source.close()
        return None, problems or ["NVML: the driver reports no GPU"]
    return source, problems


# ---------------------------------------------------------------------------- the meter


@dataclass(frozen=True)
class EnergyReading:
    """Joules per domain over ``elapsed_s`` seconds; ``in_total[d]``: whether d adds up."""

    elapsed_s: float
    joules: dict[str, float]
    in_total: dict[str, bool] = field(default_factory=dict)

    @property
    def total_j(self) -> float:
        return sum(j for d, j in self.joules.items() if self.in_total.get(d, False))

    @property
    def watts(self) -> dict[str, float]:
        return {d: j / self.elapsed_s for d, j in self.joules.items()} if self.elapsed_s else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "elapsed_s": self.elapsed_s,
            "joules": dict(self.joules),
            "in_total": dict(self.in_total),
            "total_j": self.total_j,
        }


class EnergyMeter:
    """Reads every source at :meth:`start`, :meth:`poll` and :meth:`stop`; sums the joules.

    ``with EnergyMeter.open() as meter: work()`` leaves the reading in ``meter.reading``. With
    no readable source the meter still works (empty readings); ``available`` is False and
    ``problems`` says why. Poll more often than the counters wrap (see the module docstring)
    and, for GPUs without an energy counter, often enough for the power samples to integrate.
    """

    def __init__(
        self,
        sources: Sequence[EnergySource],
        problems: Sequence[str] = (),
        clock: Clock = time.perf_counter,
    ) -> None:
        self.sources = list(sources)
        self.problems = list(problems)
        self.clock = clock
        self.reading: EnergyReading | None = None
        self._last: list[dict[str, float]] | None = None
        self._t_start = self._t_last = 0.0
        self._sum: dict[str, float] = {}

    @classmethod
    def open(
        cls, rapl_root: Path | str = RAPL_ROOT, nvml: Any = None, use_nvml: bool = True
    ) -> EnergyMeter:
        """A meter on what this machine lets us read (RAPL under ``rapl_root``, NVML)."""
        rapl, problems = find_rapl(rapl_root)
        sources: list[EnergySource] = [rapl] if rapl is not None else []
        if use_nvml:
            gpu, gpu_problems = find_nvml(nvml)
            problems += gpu_problems
            if gpu is not None:
                sources.append(gpu)
        return cls(sources, problems)

    @property
    def available(self) -> bool:
        return bool(self.sources)

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(d for s in self.sources for d in s.domains)

    @property
    def in_total(self) -> dict[str, bool]:
        return {d: t for s in self.sources for d, t in s.in_total.items()}

    @property
    def methods(self) -> dict[str, str]:
        return {d: m for s in self.sources for d, m in s.methods.items()}

    def start(self) -> None:
        self._t_start = self._t_last = self.clock()
        self._last = [s.read() for s in self.sources]
        self._sum = dict.fromkeys(self.domains, 0.0)
        self.reading = None

    def poll(self) -> EnergyReading:
        """The joules since the previous read (start or poll), added to the running sum."""
        if self._last is None:
            raise RuntimeError("EnergyMeter.poll before start")
        now = self.clock()
        current = [s.read() for s in self.sources]
        joules: dict[str, float] = {}
        for source, before, after in zip(self.sources, self._last, current, strict=True):
            joules.update(source.joules(before, after, now - self._t_last))
        for d, j in joules.items():
            self._sum[d] += j
        interval = EnergyReading(now - self._t_last, joules, self.in_total)
        self._last, self._t_last = current, now
        return interval

    def stop(self) -> EnergyReading:
        """Poll once more; the joules from :meth:`start` to now."""
        self.poll()
        self._last = None
        self.reading = EnergyReading(self._t_last - self._t_start, dict(self._sum), self.in_total)
        return self.reading

    def close(self) -> None:
        for source in self.sources:
            source.close()

    def __enter__(self) -> EnergyMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._last is not None:
            self.stop()

    def explain(self) -> str:
        """One paragraph on what is (not) readable, for a user."""
        if self.available:
            return "energy counters: " + ", ".join(f"{d} ({m})" for d, m in self.methods.items())
        return "no readable energy counters: " + "; ".join(self.problems)
