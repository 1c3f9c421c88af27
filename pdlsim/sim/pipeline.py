"""Pipeline parallelism: the plan (stages, micro-batches, schedules) and its closed-form timing.

The model (GPipe, Huang et al. 2019; 1F1B as in PipeDream-Flush, Narayanan et al. 2021):

* The layers are split into S **contiguous stages**, balanced by predicted compute: the split
  minimises the largest stage time per step (its forward and backward over all micro-batches
  plus its update; the most even such split: :func:`partition`). Communication is not part of
  the balance.
* The batch B of a pipeline is split into M **micro-batches** (sizes differ by at most one).
* Stage s forwards micro-batch m once it has m's activation from stage s - 1, and sends its
  output (``micro-batch x output features x 4`` bytes) to stage s + 1; backward runs the other
  way with the gradient of that activation (a stage whose layers all precede the first layer
  with parameters has no backward, and gets no gradient). A send is one point-to-point message
  (:func:`pdlsim.sim.messages.message_time`), non-blocking for the sender; each direction of
  each stage boundary carries one message at a time, first come first served.
* **Schedules** (the order each stage runs its work): GPipe runs all M forwards, then all M
  backwards; 1F1B runs min(S - 1 - s, M) warm-up forwards on stage s, then alternates one
  forward and one backward, then the remaining backwards. Both flush: a step ends with every
  micro-batch's backward done. Peak micro-batches in flight (activations kept) on stage s:
  M for GPipe, min(S - s, M) for 1F1B. Inference runs the forwards only.
* **Data x pipeline**: R = ranks / S replicas of the pipeline, rank ``r * S + s`` running stage
  s of replica r (node-major ranks). After the flush each stage's gradients are allreduced
  across its R replicas (timed alone on idle links, nothing overlapped), then the stage updates.
  S must divide the ranks per node or be a multiple of it, so that every replica sits alike.
* GPU ranks: stage 0 copies the inputs of the whole batch to its device before its first
  forward, the last stage the labels (with prefetch, a copy issued a step ahead shows only
  where it is longer than the previous step, as in data parallelism).
* A step starts on every rank at once (the flush and the update make it nearly so).

:func:`pipeline_times` computes one step in closed form: a max-plus recurrence over each
stage's ordered work (start = the later of the stage being free and the input having arrived;
a message starts when sent and its link is free). :mod:`pdlsim.sim.pipeline_engine` plays the
same step in simpy; without jitter the two agree to rounding. With equal stages and free
communication both give the textbook makespan (M + S - 1)(t_f + t_b) and bubble fraction
(S - 1) / (M + S - 1) for either schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cluster import LABEL_BYTES_PER_SAMPLE, Cluster, ConfigError, Scenario
from .cost import CostModel, Placement
from .messages import message_time
from .tensor import check_layerwise

__all__ = [
    "SCHEDULES",
    "PipelinePlan",
    "StagePlan",
    "StageTimes",
    "build_pipeline_plan",
    "micro_batch_sizes",
    "partition",
    "peak_in_flight",
    "pipeline_layout",
    "pipeline_times",
    "stage_order",
]

SCHEDULES = ("gpipe", "1f1b")
Op = tuple[str, int]  # ("F" or "B", micro-batch)


def micro_batch_sizes(batch: int, microbatches: int) -> tuple[int, ...]:
    """``batch`` split into ``microbatches`` parts differing by at most one (larger first)."""
    if not 1 <= microbatches <= batch:
        raise ConfigError(
            f"micro-batches must be between 1 and the batch {batch}, got {microbatches}"
        )
    base, extra = divmod(batch, microbatches)
    return tuple(base + (1 if m < extra else 0) for m in range(microbatches))


def partition(costs: Sequence[float], stages: int) -> tuple[int, ...]:
    """The first layer of each of ``stages`` contiguous non-empty stages: the split that
    minimises the largest stage sum of ``costs``, and among those the sum of squared stage
    sums (the most even). Exact: two dynamic programmes over (stages, layers)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ConfigError(f"cannot split {n} layers into {stages} stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])

    def best_split(score, combine) -> tuple[np.ndarray, np.ndarray]:
        best = np.full((stages + 1, n + 1), np.inf)
        cut = np.zeros((stages + 1, n + 1), dtype=int)
        best[0, 0] = 0.0
        for k in range(1, stages + 1):
            for j in range(k, n - (stages - k) + 1):
                for i in range(k - 1, j):
                    value = combine(best[k - 1, i], score(prefix[j] - prefix[i]))
                    if value < best[k, j]:
                        best[k, j], cut[k, j] = value, i
        return best, cut

    largest, _ = best_split(lambda seg: seg, max)
    limit = largest[stages, n] * (1 + 1e-12)
    _, cut = best_split(lambda seg: seg * seg if seg <= limit else np.inf, lambda a, b: a + b)
    starts = []
    j = n
    for k in range(stages, 0, -1):
        j = int(cut[k, j])
        starts.append(j)
    return tuple(reversed(starts))


def stage_order(
    schedule: str, stage: int, stages: int, microbatches: int, backward: bool = True
) -> tuple[Op, ...]:
    """The order in which ``stage`` runs its forwards (F) and backwards (B) of one step."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule '{schedule}'; known: {', '.join(SCHEDULES)}")
    forwards = [("F", m) for m in range(microbatches)]
    if not backward:
        return tuple(forwards)
    backwards = [("B", m) for m in range(microbatches)]
    if schedule == "gpipe":
        return tuple(forwards + backwards)
    warm = min(stages - 1 - stage, microbatches)
    order = forwards[:warm]
    for m in range(microbatches - warm):
        order += [forwards[warm + m], backwards[m]]
    return tuple(order + backwards[microbatches - warm :])


def peak_in_flight(order: Sequence[Op]) -> int:
    """Most micro-batches forwarded and not yet backwarded at once (1 for forward only)."""
    if all(kind == "F" for kind, _ in order):
        return 1 if order else 0
    level = peak = 0
    for kind, _ in order:
        level += 1 if kind == "F" else -1
        peak = max(peak, level)
    return peak


def pipeline_layout(cluster: Cluster, stages: int) -> tuple[int, tuple[bool, ...], Placement]:
    """(replicas, whether each stage boundary crosses nodes, one stage's replica group)."""
    ranks, per_node = cluster.ranks, cluster.ranks_per_node
    if ranks % stages:
        raise ConfigError(
            f"pipeline stages ({stages}) must divide the ranks ({ranks}): "
            "each data-parallel replica is one whole pipeline"
        )
    replicas = ranks // stages
    if replicas > 1 and per_node % stages and stages % per_node:
        raise ConfigError(
            f"pipeline stages ({stages}) must divide the ranks per node ({per_node}) or be a "
            "multiple of it, so that every replica of the pipeline sits alike on the nodes"
        )
    crosses = tuple(s // per_node != (s + 1) // per_node for s in range(stages - 1))
    if per_node % stages == 0:  # whole pipelines inside a node: a stage's replicas on every node
        group = Placement(cluster.nodes, per_node // stages)
    else:  # a pipeline spans stages / per_node nodes: a stage's replicas on distinct nodes
        group = Placement(replicas, 1)
    return replicas, crosses, group


@dataclass(frozen=True)
class StagePlan:
    """One stage's layers and what its work costs, per micro-batch where it varies."""

    index: int
    layers: tuple[str, ...]
    first_layer: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]  # empty when the stage has no backward
    update_s: float
    send_bytes: tuple[float, ...]  # activation to the next stage (empty for the last stage)
    send_s: tuple[float, ...]
    grad_send_s: tuple[float, ...]  # gradient to the previous stage (empty if not needed)
    param_count: int
    allreduce_s: float
    h2d_s: float
    activation_bytes_per_sample: int  # kept for backward: the stage's input and outputs
    order: tuple[Op, ...]

    @property
    def busy_s(self) -> float:
        return sum(self.forward_s) + sum(self.backward_s)

    @property
    def peak_in_flight(self) -> int:
        return peak_in_flight(self.order)


@dataclass(frozen=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    micro_batches: tuple[int, ...]
    schedule: str
    inference: bool
    replicas: int
    crosses_nodes: tuple[bool, ...]

    @property
    def ideal_bubble_fraction(self) -> float:
        """(S - 1) / (M + S - 1): the bubble of equal stages with free communication."""
        s, m = len(self.stages), len(self.micro_batches)
        return (s - 1) / (m + s - 1)


def build_pipeline_plan(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    stages: int,
    microbatches: int,
    schedule: str = "1f1b",
    inference: bool = False,
) -> PipelinePlan:
    """Stages, their costs and their schedules (module docstring); the batch is per replica."""
    check_layerwise(cluster, scenario, "pipeline parallelism")
    layers = scenario.workload.layers
    if stages > len(layers):
        raise ConfigError(
            f"{stages} pipeline stages but workload '{scenario.workload.name}' has only "
            f"{len(layers)} layers"
        )
    sizes = micro_batch_sizes(scenario.batch_per_rank, microbatches)
    replicas, crosses, group = pipeline_layout(cluster, stages)
    threads, device = cluster.threads_per_rank, cluster.device
    params = [i for i, info in enumerate(layers) if info.param_count > 0]
    if not params:
        raise ConfigError(f"workload '{scenario.workload.name}' has no layer with parameters")
    first_param = params[0]
    memo: dict[tuple[int, str, int], float] = {}

    def time(i: int, phase: str, batch: int) -> float:
        key = (i, phase, batch)
        if key not in memo:
            memo[key] = cost.compute_time(layers[i], phase, batch, threads, device)
        return memo[key]

    def layer_cost(i: int) -> float:
        total = sum(time(i, "forward", b) for b in sizes)
        if not inference and i >= first_param:
            total += sum(time(i, "backward", b) for b in sizes)
            total += time(i, "update", sizes[0]) if layers[i].param_count else 0.0
        return total

    starts = partition([layer_cost(i) for i in range(len(layers))], stages)
    bounds = list(zip(starts, (*starts[1:], len(layers)), strict=True))
    has_backward = [not inference and stop - 1 >= first_param for _, stop in bounds]
    plans = []
    for s, (begin, stop) in enumerate(bounds):
        idx = range(begin, stop)
        out_per_sample = layers[stop - 1].activation_bytes_per_sample
        send_bytes = tuple(float(b * out_per_sample) for b in sizes) if s < stages - 1 else ()
        send_s = tuple(message_time(cost, n, crosses[s]) for n in send_bytes)
        grad_send_s = ()
        if s > 0 and has_backward[s - 1]:
            grad_bytes = [b * layers[begin - 1].activation_bytes_per_sample for b in sizes]
            grad_send_s = tuple(message_time(cost, n, crosses[s - 1]) for n in grad_bytes)
        backward_s = ()
        if has_backward[s]:
            backward_s = tuple(
                sum(time(i, "backward", b) for i in idx if i >= first_param) for b in sizes
            )
        param_layers = [i for i in idx if layers[i].param_count > 0]
        param_count = sum(layers[i].param_count for i in param_layers)
        update_s = allreduce_s = 0.0
        if not inference:
            update_s = sum(time(i, "update", sizes[0]) for i in param_layers)
            if replicas > 1 and param_count:
                group_alg = Placement(group.nodes, group.ranks_per_node, scenario.algorithm)
                allreduce_s = cost.collective_time(
                    "allreduce", 4 * param_count, replicas, group_alg
                )
        copy_bytes = 0
        if device == "gpu":
            if s == 0:
                copy_bytes += scenario.batch_per_rank * layers[0].input_bytes_per_sample
            if s == stages - 1 and not inference:
                copy_bytes += scenario.batch_per_rank * LABEL_BYTES_PER_SAMPLE
        h2d_s = cost.transfer_time("h2d", copy_bytes, scenario.pinned) if copy_bytes else 0.0
        kept = sum(layers[i].activation_bytes_per_sample for i in idx)
        if s > 0:
            kept += layers[begin].input_bytes_per_sample
        plans.append(
            StagePlan(
                index=s,
                layers=tuple(layers[i].name for i in idx),
                first_layer=begin,
                forward_s=tuple(sum(time(i, "forward", b) for i in idx) for b in sizes),
                backward_s=backward_s,
                update_s=update_s,
                send_bytes=send_bytes,
                send_s=send_s,
                grad_send_s=grad_send_s,
                param_count=param_count,
                allreduce_s=allreduce_s,
                h2d_s=h2d_s,
                activation_bytes_per_sample=kept,
                order=stage_order(schedule, s, stages, microbatches, has_backward[s]),
            )
        )
    return PipelinePlan(tuple(plans), sizes, schedule, inference, replicas, crosses)


@dataclass
class StageTimes:
    """What one stage did in one step (seconds on the step's clock)."""

    exposure_s: float = 0.0  # waiting for its mini-batch copy, from the step's start
    work: list[tuple[str, int, float, float]] = field(default_factory=list)  # (F|B, m, start, end)
    messages: list[tuple[str, int, float, float]] = field(default_factory=list)  # sent or received
    flush_s: float = 0.0  # its last forward or backward ends
    allreduce: tuple[float, float] | None = None
    end_s: float = 0.0


def pipeline_times(
    plan: PipelinePlan, factors: Sequence[float], exposures: Sequence[float]
) -> list[StageTimes]:
    """One step in closed form: the max-plus recurrence of the module docstring. ``factors``
    multiply each stage's forward and backward; ``exposures`` delay each stage's start."""
    stages = plan.stages
    n = len(stages)
    times = [StageTimes(exposure_s=float(exposures[s])) for s in range(n)]
    free = [float(exposures[s]) for s in range(n)]
    arrived: list[dict[tuple[str, int], float]] = [{} for _ in range(n)]
    link_free = {}
    position = [0] * n
    remaining = sum(len(st.order) for st in stages)
    while remaining:
        progress = False
        for s, st in enumerate(stages):
            while position[s] < len(st.order):
                kind, m = st.order[position[s]]
                needs_input = (kind == "F" and s > 0) or (kind == "B" and s < n - 1)
                if needs_input and (kind, m) not in arrived[s]:
                    break
                start = max(free[s], arrived[s].get((kind, m), 0.0))
                seconds = st.forward_s[m] if kind == "F" else st.backward_s[m]
                end = start + factors[s] * seconds
                free[s] = end
                times[s].work.append((kind, m, start, end))
                target = s + 1 if kind == "F" else s - 1
                send = st.send_s if kind == "F" else st.grad_send_s
                if 0 <= target < n and send:
                    link = (s, target)
                    begin = max(end, link_free.get(link, -math.inf))
                    done = begin + send[m]
                    link_free[link] = done
                    arrived[target][(kind, m)] = done
                    label = f"{'activation' if kind == 'F' else 'gradient'} {s}->{target}"
                    times[s].messages.append((label, m, begin, done))
                    times[target].messages.append((label, m, begin, done))
                position[s] += 1
                remaining -= 1
                progress = True
        if not progress:
            raise RuntimeError("pipeline schedule deadlocked (a bug: valid orders cannot)")
    for s, st in enumerate(stages):
        t = times[s]
        t.flush_s = free[s]
        clock = t.flush_s
        if st.allreduce_s > 0:
            t.allreduce = (clock, clock + st.allreduce_s)
            clock += st.allreduce_s
        t.end_s = clock + st.update_s
    return times
