"""The one cost interface that both engines consume, and a cost model built from plain numbers.

The simulator (:mod:`pdlsim.sim.engine`) and the closed form (:mod:`pdlsim.sim.analytic`) never
look at a profile: they ask a :class:`CostModel` what a layer's forward pass costs, what an
allreduce costs and what a host-to-device copy costs. The profile-backed model answers from
fitted parameters; :class:`LinearCostModel` answers from a handful of numbers (FLOP/s,
alpha/beta/gamma per link level, copy latency and bandwidth), for tests, presets and
back-of-the-envelope questions.

A collective is asked for twice: :meth:`CostModel.collective_time` is the closed form the
analytic model adds up, :meth:`CostModel.collective_schedule` the same collective as timed steps
(:class:`pdlsim.sim.collectives.TimedStep`) that the simulator plays on its links. The contract:
the schedule's durations sum to ``collective_time``. Everything is seconds and bytes.

Beyond those four, a cost model answers the optional questions of :class:`CostHooks` (calls
timed inside real training steps, gradient compression, layer slices); a model that measured
none of them inherits the class's answers, which are what the engines assume without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from scipy import integrate, special

from microbench.workload import LayerInfo

from . import collectives
from .collectives import Step, TimedStep
from .errors import ConfigError

__all__ = [
    "CostHooks",
    "CostModel",
    "Device",
    "Direction",
    "Jitter",
    "LinearCostModel",
    "LinkCost",
    "LognormalJitter",
    "Phase",
    "Placement",
    "max_of_draws",
]

Phase = Literal["forward", "backward", "update"]
Device = Literal["cpu", "gpu"]
Direction = Literal["h2d", "d2h"]
PHASES = ("forward", "backward", "update")
DEVICES = ("cpu", "gpu")
DIRECTIONS = ("h2d", "d2h")


@dataclass(frozen=True)
class Placement:
    """Where a collective's ranks sit: ``nodes`` x ``ranks_per_node`` (node-major), and the
    algorithm to run (None: choose as MPICH does, see :mod:`pdlsim.sim.collectives`)."""

    nodes: int
    ranks_per_node: int
    algorithm: str | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(
                f"placement needs nodes >= 1 and ranks_per_node >= 1, "
                f"got {self.nodes} and {self.ranks_per_node}"
            )

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@runtime_checkable
class Jitter(Protocol):
    """Per-rank, per-step compute-time factors around 1 (1.0 = the median step)."""

    def sample(self, rng: np.random.Generator, size: Any) -> np.ndarray:
        """Independent factors, shaped ``size``."""
        ...

    def expected_max_factor(self, ranks: int) -> float:
        """E[max of ``ranks`` independent factors]; ``ranks=1`` gives the mean factor."""
        ...


class CostHooks(Protocol):
    """The optional part of the cost interface, with the engines' assumptions as defaults: a
    cost model subclasses it (inheriting the defaults) and overrides what it has measured."""

    def compression_time(
        self, method: str, nbytes: int, phase: str = "round_trip", ranks: int = 1
    ) -> float:
        """Seconds a rank spends compressing (``phase="compress"``) a float32 gradient of
        ``nbytes`` by ``method``, expanding what ``ranks`` ranks sent (``"decompress"``) or
        both (``"round_trip"``). Default: refused, a model that never timed it cannot say."""
        raise ConfigError(
            f"compression '{method}' needs a cost model that times it; "
            f"{type(self).__name__} does not"
        )

    def slice_copy_time(self, rows: int, run: int, threads: int, device: Device) -> float:
        """Seconds to copy ``rows`` runs of ``run`` contiguous float32 values into a slice of
        wider rows: an allgather's slices put together into one activation, or a concat's
        inputs. Default: 0, a model that never timed copies leaves them out."""
        return 0.0

    def native_allgather(
        self, nbytes: int, placement: Placement
    ) -> tuple[str, tuple[TimedStep, ...]] | None:
        """The model's own allgather of ``nbytes`` in total, named, as timed steps (GPU ranks:
        NCCL's); None: the engines build MPICH's from two-rank messages
        (:mod:`pdlsim.sim.messages`)."""
        return None

    def collective_name(self, op: str, nbytes: int, placement: Placement) -> str:
        """The algorithm :meth:`CostModel.collective_schedule` runs, for the reports. Default:
        MPICH's choice (:func:`pdlsim.sim.collectives.schedule`), or the placement's."""
        name, _ = collectives.schedule(
            op, float(nbytes), placement.nodes, placement.ranks_per_node, placement.algorithm
        )
        return name

    def sliced(self, ranks: int) -> CostHooks:
        """This model pricing each layer as one of ``ranks`` ranks' slices of a layer-wise
        step. Default: a slice costs what its layer's shapes say (the model itself)."""
        return self


@runtime_checkable
class CostModel(CostHooks, Protocol):
    """What the engines need to know about a machine. See the module docstring."""

    jitter: Jitter | None
    overlap_efficiency: float  # fraction of a concurrent allreduce hidden by compute, in [0, 1]

    def compute_time(
        self, layer: LayerInfo, phase: Phase, batch: int, threads: int, device: Device
    ) -> float:
        """Seconds for ``phase`` of ``layer`` on a ``batch``; ``update`` is per step."""
        ...

    def collective_time(self, op: str, nbytes: int, ranks: int, placement: Placement) -> float:
        """Seconds for collective ``op`` of ``nbytes`` bytes over ``ranks`` ranks."""
        ...

    def collective_schedule(
        self, op: str, nbytes: int, ranks: int, placement: Placement
    ) -> tuple[TimedStep, ...]:
        """The same collective as timed steps whose durations sum to ``collective_time``."""
        ...

    def transfer_time(self, direction: Direction, nbytes: int, pinned: bool) -> float:
        """Seconds for a host-to-device (``h2d``) or device-to-host (``d2h``) copy."""
        ...


def max_of_draws(jitter: Jitter, rng: np.random.Generator, ranks: int, size: int) -> np.ndarray:
    """``size`` independent draws of the max of ``ranks`` factors.

    P(max <= x) = F(x)^P, so the max is F^-1(U^(1/P)) for one uniform U: exact, one uniform per
    draw. With an upper-tail quantile (``jitter.isf``) it is taken at the tail 1 - U^(1/P),
    computed without cancellation (U^(1/P) rounds to 1 for large P); with only ``jitter.ppf`` at
    U^(1/P); with neither, the max of P draws each (exact too, O(P) work per draw).
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    isf, ppf = getattr(jitter, "isf", None), getattr(jitter, "ppf", None)
    if callable(isf) or callable(ppf):
        with np.errstate(divide="ignore"):
            log_q = np.log(rng.random(size)) / ranks
        if callable(isf):
            return np.asarray(isf(-np.expm1(log_q)), dtype=float)
        return np.asarray(ppf(np.exp(log_q)), dtype=float)
    out = np.empty(size)
    chunk = max(1, 2_000_000 // ranks)
    for begin in range(0, size, chunk):
        n = min(chunk, size - begin)
        out[begin : begin + n] = np.asarray(jitter.sample(rng, (n, ranks))).max(axis=1)
    return out


@dataclass(frozen=True)
class LognormalJitter:
    """Factors exp(sigma * Z), Z standard normal: median 1, right-skewed like OS noise."""

    sigma: float

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"jitter sigma must be finite and >= 0, got {self.sigma}")

    def sample(self, rng: np.random.Generator, size: Any) -> np.ndarray:
        return np.exp(self.sigma * rng.standard_normal(size))

    def ppf(self, q: Any) -> np.ndarray:
        return np.exp(self.sigma * special.ndtri(q))

    def isf(self, tail: Any) -> np.ndarray:
        """The factor exceeded with probability ``tail``."""
        return np.exp(-self.sigma * special.ndtri(tail))

    def expected_max_factor(self, ranks: int) -> float:
        return _lognormal_expected_max(self.sigma, int(ranks))


@lru_cache(maxsize=4096)
def _lognormal_expected_max(sigma: float, ranks: int) -> float:
    """E[max of P] = integral over v in [0, 1] of F^-1(v^(1/P)) (substitute u = F(x), v = u^P)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if ranks == 1:
        return math.exp(sigma * sigma / 2.0)
    value, _ = integrate.quad(
        lambda v: math.exp(sigma * special.ndtri(v ** (1.0 / ranks))), 0.0, 1.0, limit=200
    )
    return value


@dataclass(frozen=True)
class LinkCost:
    """One link level: latency (alpha), bandwidth (1/beta), reduction throughput (1/gamma)."""

    latency_s: float
    bandwidth_bytes_per_s: float
    reduce_bandwidth_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_bytes_per_s <= 0:
            raise ValueError(
                f"a link needs latency_s >= 0 and bandwidth_bytes_per_s > 0, "
                f"got {self.latency_s} and {self.bandwidth_bytes_per_s}"
            )
        if self.reduce_bandwidth_bytes_per_s <= 0:
            raise ValueError("reduce_bandwidth_bytes_per_s must be > 0")

    @classmethod
    def from_alpha_beta(
        cls, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0
    ) -> LinkCost:
        reduce_bw = math.inf if gamma_s_per_byte == 0 else 1.0 / gamma_s_per_byte
        return cls(alpha_s, 1.0 / beta_s_per_byte, reduce_bw)

    def step_time_s(self, step: Step) -> float:
        """alpha + flows * nbytes * beta + reduce_bytes * gamma: the NIC's bandwidth is shared."""
        time = self.latency_s + step.flows * step.nbytes / self.bandwidth_bytes_per_s
        if step.reduce_bytes:
            time += step.reduce_bytes / self.reduce_bandwidth_bytes_per_s
        return time


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} '{value}'; known: {', '.join(allowed)}")


@dataclass(frozen=True)
class LinearCostModel(CostHooks):
    """A cost model from plain numbers.

    Compute: FLOPs / rate + a per-kernel overhead; a layer with no FLOPs (flatten) is free. CPU
    rate for t threads: ``cpu_flops_per_s`` (one thread) times Amdahl's speedup with
    ``cpu_serial_fraction``. The SGD update costs 2 FLOPs per parameter. Collectives: the
    algorithm's steps timed per link level (:meth:`LinkCost.step_time_s`). Copies: latency +
    bytes / bandwidth, pinned or pageable.
    """

    cpu_flops_per_s: float
    cpu_serial_fraction: float
    cpu_layer_overhead_s: float
    gpu_flops_per_s: float
    gpu_kernel_latency_s: float
    intra: LinkCost
    inter: LinkCost
    transfer_latency_s: float
    pinned_bandwidth_bytes_per_s: float
    pageable_bandwidth_bytes_per_s: float
    jitter: Jitter | None = None
    overlap_efficiency: float = 1.0

    def __post_init__(self) -> None:
        rates = (
            self.cpu_flops_per_s,
            self.gpu_flops_per_s,
            self.pinned_bandwidth_bytes_per_s,
            self.pageable_bandwidth_bytes_per_s,
        )
        if min(rates) <= 0:
            raise ValueError("FLOP rates and copy bandwidths must be > 0")
        if not 0.0 <= self.cpu_serial_fraction <= 1.0:
            raise ValueError(
                f"cpu_serial_fraction must be in [0, 1], got {self.cpu_serial_fraction}"
            )
        if not 0.0 <= self.overlap_efficiency <= 1.0:
            raise ValueError(f"overlap_efficiency must be in [0, 1], got {self.overlap_efficiency}")
        if min(self.cpu_layer_overhead_s, self.gpu_kernel_latency_s, self.transfer_latency_s) < 0:
            raise ValueError("overheads and latencies must be >= 0")

    def compute_time(
        self, layer: LayerInfo, phase: Phase, batch: int, threads: int, device: Device
    ) -> float:
        _check(phase, PHASES, "phase")
        _check(device, DEVICES, "device")
        if phase == "forward":
            flops = layer.forward_flops_per_sample * batch
        elif phase == "backward":
            flops = layer.backward_flops_per_sample * batch
        else:
            flops = 2 * layer.param_count
        if flops == 0:
            return 0.0
        if device == "gpu":
            return self.gpu_kernel_latency_s + flops / self.gpu_flops_per_s
        s = self.cpu_serial_fraction
        speedup = 1.0 / (s + (1.0 - s) / max(1, threads))
        return self.cpu_layer_overhead_s + flops / (self.cpu_flops_per_s * speedup)

    def collective_schedule(
        self, op: str, nbytes: int, ranks: int, placement: Placement
    ) -> tuple[TimedStep, ...]:
        if ranks != placement.ranks:
            raise ValueError(f"ranks {ranks} != placement's {placement.ranks}")
        _, steps = collectives.schedule(
            op, float(nbytes), placement.nodes, placement.ranks_per_node, placement.algorithm
        )
        links = {"intra": self.intra, "inter": self.inter}
        return tuple(TimedStep(step, links[step.level].step_time_s(step)) for step in steps)

    def collective_time(self, op: str, nbytes: int, ranks: int, placement: Placement) -> float:
        return collectives.total_time_s(self.collective_schedule(op, nbytes, ranks, placement))

    def transfer_time(self, direction: Direction, nbytes: int, pinned: bool) -> float:
        _check(direction, DIRECTIONS, "copy direction")
        if nbytes <= 0:
            return 0.0
        bandwidth = (
            self.pinned_bandwidth_bytes_per_s if pinned else self.pageable_bandwidth_bytes_per_s
        )
        return self.transfer_latency_s + nbytes / bandwidth
