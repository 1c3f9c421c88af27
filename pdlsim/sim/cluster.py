"""What is simulated: a cluster, a training scenario, and the per-step plan both engines play.

:func:`build_plan` asks the cost model, once, everything a step needs: per-layer forward and
backward times, the gradient buckets and the time of each bucket's collective (and its steps),
the update and the host-to-device copy. The simulator and the closed form both start from this
plan, so they cannot disagree on inputs, only on how they combine them.

The model of one data-parallel step (per rank):

* GPU ranks copy their mini-batch (inputs, float32, and int64 labels) to the device: before the
  forward pass, or prefetched (issued on a copy engine when the previous step's forward starts,
  so that it hides behind that step's work).
* Forward layer by layer; backward layer by layer in reverse, stopping at the first layer with
  parameters (nothing upstream needs a gradient, as in the real network).
* Gradients are grouped into buckets in backward order, PyTorch DDP style: a layer's gradient
  joins the open bucket, which closes once it holds ``bucket_bytes`` or more. A bucket's
  allreduce may start once its last gradient is ready on every rank (overlap on) or once
  backward has finished (overlap off).
* Interference: an allreduce launched while backward still has work left hides only
  ``overlap_efficiency`` of itself behind it; the rest, (1 - efficiency) x min(allreduce,
  remaining backward), is charged to the rank's compute right after the launch (IMB-NBC's
  overlap definition, the one the interference benchmark measures).
* The update (SGD, per step, not jittered) runs once the last bucket's allreduce is done: the
  layers' update times.

What-ifs (all off by default):

* **Compression** (``Scenario.compression``, :mod:`pdlsim.sim.compression`): each bucket is
  compressed by the rank once it is ready (compute, before its collective: on the bucket's
  critical path), travels as fewer bytes (fp16: an allreduce of half; top-k: an allgather of
  the kept pairs) and is expanded by the rank after its collective, bucket by bucket, before
  the update. Neither is jittered nor scaled by speed (a per-byte cost, common to all ranks).
* **Local SGD** (``sync_every = k``): the allreduce runs on every k-th step; the others are
  compute and update only, and ranks run them without waiting for each other, so the slowest
  rank's lead or lag accumulates over the period and is paid at the sync step.
* **Gradient accumulation** (``accumulation = k``, not a what-if: how the job trains): an
  optimizer step runs k micro-batches of ``batch_per_rank``; the first k - 1 are forward and
  backward alone (with their copies unless prefetched), played as one block ahead of the
  last, whose backward the buckets' allreduces overlap as without accumulation: one
  allreduce per optimizer step, not per micro-batch.
* **Heterogeneous ranks** (``Cluster.speeds``, ``Cluster.straggler``, ``Scenario.balance``):
  see :mod:`pdlsim.sim.ranks`; :func:`class_plans` gives each class of ranks its own plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from microbench.argtypes import check_integer, check_number, check_numbers
from microbench.workload import Workload
from pdlsim.costmodel.training import Training

from .collectives import TimedStep
from .compression import parse_compression, wire
from .cost import DEVICES, CostModel, Device, Placement
from .errors import ConfigError
from .ranks import BALANCES, RankLayout, rank_layout

__all__ = [
    "DDP_BUCKET_BYTES",
    "LABEL_BYTES_PER_SAMPLE",
    "Bucket",
    "Cluster",
    "ConfigError",
    "Scenario",
    "StepPlan",
    "build_plan",
    "class_plans",
    "interference_s",
]

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's bucket_cap_mb default
LABEL_BYTES_PER_SAMPLE = 8  # int64 class index


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``ranks_per_node`` ranks (one per GPU, or MPI processes), each running
    ``threads_per_rank`` threads on a ``device`` of kind ``"cpu"`` or ``"gpu"``.

    ``speeds``: one relative speed per rank (node-major; 1.0 = the cost model's device, 0.5 =
    twice as slow), None when all ranks are alike (:mod:`pdlsim.sim.ranks`). ``straggler``:
    how many times slower than its speed the last rank computes, a rank no one can tell in
    advance (a busy node's slowest process), so a proportional split does not plan for it."""

    nodes: int
    ranks_per_node: int = 1
    threads_per_rank: int = 1
    device: Device = "cpu"
    speeds: tuple[float, ...] | None = None
    straggler: float = 1.0

    def __post_init__(self) -> None:
        counts = {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
                  "threads_per_rank": self.threads_per_rank}  # fmt: skip
        for name, value in counts.items():  # a script's "2", 2.5 or numpy int: one line
            object.__setattr__(self, name, check_integer(name, value))
        if self.speeds is not None:
            object.__setattr__(self, "speeds", check_numbers("speeds", self.speeds))
        if self.nodes < 1:
            raise ConfigError(f"a cluster needs at least 1 node, got {self.nodes}")
        if self.ranks_per_node < 1:
            raise ConfigError(
                f"need at least 1 rank (GPU or process) per node, got {self.ranks_per_node}"
            )
        if self.threads_per_rank < 1:
            raise ConfigError(f"need at least 1 thread per rank, got {self.threads_per_rank}")
        if not isinstance(self.device, str) or self.device not in DEVICES:
            raise ConfigError(f"device must be 'cpu' or 'gpu', got {self.device!r}")
        if self.speeds is not None:
            if len(self.speeds) != self.ranks:
                raise ConfigError(
                    f"speeds give {len(self.speeds)} ranks, the cluster has {self.ranks}"
                )
            bad = [s for s in self.speeds if not (s > 0 and math.isfinite(s))]
            if bad:
                raise ConfigError(f"rank speeds must be finite and > 0, got {bad[0]}")
        straggler = check_number("straggler", self.straggler)
        if not (math.isfinite(straggler) and straggler >= 1.0):
            raise ConfigError(f"a straggler is finite and at least 1 (times slower), got "
                              f"{straggler!r}")  # fmt: skip
        object.__setattr__(self, "straggler", float(straggler))

    @classmethod
    def gpus(cls, nodes: int, gpus_per_node: int) -> Cluster:
        return cls(nodes, check_integer("gpus_per_node", gpus_per_node), 1, "gpu")

    @classmethod
    def cpus(cls, nodes: int, procs_per_node: int = 1, threads: int = 1) -> Cluster:
        procs = check_integer("procs_per_node", procs_per_node)
        return cls(nodes, procs, check_integer("threads", threads), "cpu")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def mode(self) -> str:
        """The execution mode in the words of the reports: serial, threads, MPI, hybrid, GPU."""
        if self.device == "gpu":
            return "gpu" if self.ranks == 1 else "mpi+gpu"
        if self.ranks == 1:
            return "serial" if self.threads_per_rank == 1 else "threads"
        return "mpi" if self.threads_per_rank == 1 else "hybrid"

    def placement(self, algorithm: str | None = None) -> Placement:
        return Placement(self.nodes, self.ranks_per_node, algorithm)


@dataclass(frozen=True)
class Scenario:
    """How the workload is trained: batch per rank, buckets, overlap, copies, how long, jitter.

    ``comm_streams``: how many bucket allreduces may be in flight at once. 1 (default) is one
    communication stream, as PyTorch DDP on NCCL: buckets run one after another, and the
    closed form is exact. More is nonblocking collectives progressing together (an
    ``MPI_Iallreduce`` per bucket): their steps then queue on shared links, which only the
    simulator models. ``warmup_iterations`` are simulated first and left out of the averages
    (the first step has no previous step to prefetch behind).

    What-ifs: ``compression`` (None, ``"fp16"``, ``"topk:F"``), ``sync_every`` (local SGD:
    allreduce every k-th step; ``iterations`` is rounded up to a multiple of it, so that the
    averages cover whole periods) and ``balance`` (``"static"`` or ``"proportional"`` batch
    split over ranks of different speeds); see the module docstring."""

    workload: Workload
    batch_per_rank: int
    bucket_bytes: int = DDP_BUCKET_BYTES
    overlap: bool = False
    prefetch: bool = False
    pinned: bool = True
    iterations: int = 100
    warmup_iterations: int = 1
    seed: int = 0
    jitter: bool = True
    algorithm: str | None = None
    comm_streams: int = 1
    compression: str | None = None
    sync_every: int = 1
    balance: str = "static"
    training: Training = field(default_factory=Training)  # precision and optimizer
    accumulation: int = 1  # micro-batches per optimizer step (gradient accumulation)

    def __post_init__(self) -> None:
        if self.batch_per_rank < 1:
            raise ConfigError(f"batch per rank must be >= 1, got {self.batch_per_rank}")
        if self.accumulation < 1:
            raise ConfigError(f"gradient accumulation must be >= 1 micro-batch, got "
                              f"{self.accumulation}")  # fmt: skip
        if self.bucket_bytes < 1:
            raise ConfigError(f"bucket size must be >= 1 byte, got {self.bucket_bytes}")
        if self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1, got {self.iterations}")
        if self.warmup_iterations < 0:
            raise ConfigError(f"warm-up iterations must be >= 0, got {self.warmup_iterations}")
        if self.comm_streams < 1:
            raise ConfigError(f"comm_streams must be >= 1, got {self.comm_streams}")
        parse_compression(self.compression)
        if isinstance(self.sync_every, bool) or int(self.sync_every) != self.sync_every:
            raise ConfigError(f"sync_every must be a whole number of steps, got {self.sync_every}")
        if self.sync_every < 1:
            raise ConfigError(f"sync_every must be >= 1, got {self.sync_every}")
        if self.balance not in BALANCES:
            raise ConfigError(f"balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        periods = -(-self.iterations // self.sync_every)
        object.__setattr__(self, "iterations", periods * self.sync_every)

    @property
    def total_steps(self) -> int:
        return self.warmup_iterations + self.iterations


@dataclass(frozen=True)
class Bucket:
    """Gradients allreduced together; ``closes_after`` is the backward position (0 = the last
    layer) after which its last gradient is ready."""

    index: int
    layers: tuple[str, ...]
    nbytes: int
    closes_after: int
    algorithm: str
    collective_s: float
    schedule: tuple[TimedStep, ...]
    wire_bytes: int = 0  # what each rank sends (nbytes uncompressed; 0 on one rank)
    compress_s: float = 0.0  # the rank's compute before the collective
    decompress_s: float = 0.0  # and after it


@dataclass(frozen=True)
class StepPlan:
    """Everything one step costs, asked of the cost model once (see :func:`build_plan`)."""

    forward: tuple[tuple[str, float], ...]  # (layer, seconds), forward order
    backward: tuple[tuple[str, float], ...]  # (layer, seconds), backward order
    closes: tuple[int | None, ...]  # per backward position: bucket closed after it, or None
    remaining_backward_s: tuple[float, ...]  # per bucket: backward work left after it closes
    buckets: tuple[Bucket, ...]
    update_s: float
    h2d_s: float  # 0 on CPU ranks
    ranks: int
    overlap: bool
    overlap_efficiency: float
    speed: float = 1.0  # the ranks' speed: forward and backward times are already divided by it
    batch: int = 0  # the ranks' batch (samples per step)

    @property
    def communicates(self) -> bool:
        return self.ranks > 1 and bool(self.buckets)

    @property
    def forward_s(self) -> float:
        return sum(t for _, t in self.forward)

    @property
    def backward_s(self) -> float:
        return sum(t for _, t in self.backward)


def build_plan(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    batch: int | None = None,
    speed: float = 1.0,
    buckets: tuple[Bucket, ...] | None = None,
) -> StepPlan:
    """Per-layer times, buckets with their collectives, the update and the copy of one step.

    ``batch`` and ``speed``: of a class of ranks (default: ``scenario.batch_per_rank``, 1);
    forward and backward times are divided by ``speed``. ``buckets``: reuse another plan's
    (they depend on the gradients only, not on the batch)."""
    layers = scenario.workload.layers
    batch = scenario.batch_per_rank if batch is None else batch
    threads, device = cluster.threads_per_rank, cluster.device
    params = [i for i, info in enumerate(layers) if info.param_count > 0]
    if not params:
        raise ConfigError(f"workload '{scenario.workload.name}' has no layer with parameters")
    forward = tuple(
        (info.name, cost.compute_time(info, "forward", batch, threads, device) / speed)
        for info in layers
    )
    order = list(range(len(layers) - 1, params[0] - 1, -1))
    backward = tuple(
        (layers[i].name, cost.compute_time(layers[i], "backward", batch, threads, device) / speed)
        for i in order
    )
    update_s = sum(cost.compute_time(layers[i], "update", batch, threads, device) for i in params)
    if buckets is None:
        buckets = _buckets(cluster, scenario, cost, order, params[0])
    closes: list[int | None] = [None] * len(order)
    for bucket in buckets:
        closes[bucket.closes_after] = bucket.index
    remaining = tuple(sum(t for _, t in backward[bucket.closes_after + 1 :]) for bucket in buckets)
    h2d_s = 0.0
    if device == "gpu":
        per_sample = layers[0].input_bytes_per_sample + LABEL_BYTES_PER_SAMPLE
        h2d_s = cost.transfer_time("h2d", batch * per_sample, scenario.pinned)
    k = scenario.accumulation
    if k > 1:  # the micro-batches before the last: compute (and copies) alone, no collective
        earlier = sum(t for _, t in forward) + sum(t for _, t in backward)
        earlier += 0.0 if scenario.prefetch else h2d_s
        forward = ((f"micro-batches 1-{k - 1} (accumulated)", (k - 1) * earlier), *forward)
    efficiency = float(cost.overlap_efficiency)
    if not 0.0 <= efficiency <= 1.0:
        raise ConfigError(
            f"the cost model's overlap_efficiency must be in [0, 1], got {efficiency}"
        )
    return StepPlan(
        forward=forward,
        backward=backward,
        closes=tuple(closes),
        remaining_backward_s=remaining,
        buckets=tuple(buckets),
        update_s=update_s,
        h2d_s=h2d_s,
        ranks=cluster.ranks,
        overlap=scenario.overlap,
        overlap_efficiency=efficiency,
        speed=speed,
        batch=batch,
    )


def _buckets(
    cluster: Cluster, scenario: Scenario, cost: CostModel, order: list[int], first_param: int
) -> tuple[Bucket, ...]:
    """Gradients grouped in backward order, DDP style, each with its (compressed) collective."""
    layers = scenario.workload.layers
    groups: list[tuple[list[str], int, int]] = []  # (layers, bytes, closes_after)
    open_layers: list[str] = []
    open_bytes = 0
    for position, i in enumerate(order):
        if layers[i].param_count == 0:
            continue
        open_layers.append(layers[i].name)
        open_bytes += layers[i].param_count * scenario.training.value_bytes
        if open_bytes >= scenario.bucket_bytes or i == first_param:
            groups.append((open_layers, open_bytes, position))
            open_layers, open_bytes = [], 0
    buckets = []
    for index, (names, nbytes, position) in enumerate(groups):
        w = wire(
            cost,
            scenario.compression,
            nbytes,
            cluster.nodes,
            cluster.ranks_per_node,
            scenario.algorithm,
        )
        buckets.append(
            Bucket(
                index=index,
                layers=tuple(names),
                nbytes=nbytes,
                closes_after=position,
                algorithm=w.algorithm,
                collective_s=w.collective_s,
                schedule=w.schedule,
                wire_bytes=w.wire_bytes,
                compress_s=w.compress_s,
                decompress_s=w.decompress_s,
            )
        )
    return tuple(buckets)


def class_plans(
    cluster: Cluster, scenario: Scenario, cost: CostModel, layout: RankLayout | None = None
) -> tuple[StepPlan, ...]:
    """One plan per class of ranks (:func:`pdlsim.sim.ranks.rank_layout`), rank 0's first; the
    buckets are shared."""
    layout = layout or rank_layout(cluster, scenario)
    first = layout.classes[0]
    plans = [build_plan(cluster, scenario, cost, first.batch, first.speed)]
    for c in layout.classes[1:]:
        plans.append(build_plan(cluster, scenario, cost, c.batch, c.speed, plans[0].buckets))
    return tuple(plans)


def interference_s(plan: StepPlan, bucket: int, factor: float) -> float:
    """Compute time an allreduce launched during backward costs the launching rank."""
    if not plan.overlap or not plan.communicates:
        return 0.0
    hidden_at_most = min(
        plan.buckets[bucket].collective_s, factor * plan.remaining_backward_s[bucket]
    )
    return (1.0 - plan.overlap_efficiency) * hidden_at_most
