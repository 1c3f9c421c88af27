"""Tensor (model) parallelism of a feedforward network, layer by layer, and forward-only runs.

MPI layer-wise parallel execution of a feedforward network over P ranks that together hold one
model replica and all see the whole batch B (so the scaling is strong: the same batch as one
rank):

* **Dense layers are split by output neurons.** Each rank holds ``ceil(units / P)`` columns of
  W and b (uneven splits: the busiest rank sets the pace) and computes that slice of the
  output: the layer's FLOPs / P. The sliced layer is costed by the cost model like any layer
  (:func:`sliced_dense`); a cost model with a ``sliced(P)`` method is asked for that one (the
  kernel tables price a rank's slices as the calls that rank makes).
* After each dense layer's forward the slices are **all-gathered** (``B x units x 4`` bytes in
  total, :func:`pdlsim.sim.messages.allgather_time`) and each rank's columns copied into the
  activation (one copy per rank's slice,
  :meth:`pdlsim.sim.cost.CostHooks.slice_copy_time`), so that every rank has the whole
  activation for the next layer.
* In backward each rank has the whole output gradient, computes its weight and bias gradients
  (they stay local: no gradient allreduce) and its partial product of the input gradient; the
  input gradient is the sum of the P partial products, an **allreduce** of ``B x in_features x
  4`` bytes, before the previous layer's backward. The first layer with parameters computes no
  input gradient (nothing upstream needs it), so it has no allreduce.
* **Every other layer is replicated**: relu, flatten, softmax-cross-entropy, and the conv2d and
  maxpool2d layers of a CNN (a conv stack is not split) run whole on every rank, on the whole
  batch; their weight gradients are then identical on every rank and need no allreduce.
* The update (plain SGD) updates each rank's slice (dense) or its replica (conv).
* Communication is on the critical path: nothing overlaps a collective; each costs its
  back-to-back time.

``inference=True`` runs the forward pass only (no backward, no update, no input-gradient
allreduce); the labels are not copied. The same code with ``tensor_ranks=1`` is data-parallel
inference: every rank runs the whole forward on its own batch and nobody waits for anybody.

Timing: compute is multiplied by the rank's jitter factor (per rank and step, as in
:mod:`pdlsim.sim.engine`; the update and copies are not), every collective starts when the
slowest of the P ranks reaches it, and a step starts on every rank at once (a barrier at the
step boundary; without jitter it changes nothing). So the step is

    T_step = x + M (F + B) + sum of collectives + U

with M the largest factor of the P ranks, x the exposed mini-batch copy (GPU ranks: the whole
batch to every rank; with prefetch x = max(0, h - W), W the rest of the previous step), and a
typical rank of factor f waits (M - f)(F + B) in all. :func:`simulate_tensor` plays it in simpy
(representative ranks as in the engine: a typical one and the slowest of the other P - 1);
:func:`predict_tensor` is the closed form, equal to rounding without jitter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from microbench.workload import LayerInfo, sliced_dense

from .cluster import LABEL_BYTES_PER_SAMPLE, Cluster, ConfigError, Scenario
from .cost import CostModel, Placement, max_of_draws
from .messages import allgather_schedule
from .result import StepBreakdown, account, mean_breakdown
from .trace import Timeline

__all__ = [
    "TensorOp",
    "TensorPlan",
    "TensorPrediction",
    "build_tensor_plan",
    "check_layerwise",
    "predict_tensor",
    "simulate_tensor",
    "sliced_dense",
    "tensor_factors",
]

FLOAT_BYTES = 4


def check_layerwise(cluster: Cluster, scenario: Scenario, what: str) -> None:
    """Refuse the data-parallel what-ifs the layer-wise models do not represent."""
    if cluster.speeds is not None or cluster.straggler != 1.0:
        raise ConfigError(f"{what} assumes identical ranks; rank speeds are for data parallelism")
    if scenario.compression is not None:
        raise ConfigError(f"gradient compression is for data parallelism, not {what}")
    if scenario.sync_every != 1:
        raise ConfigError(f"local SGD (sync every k steps) is for data parallelism, not {what}")


@dataclass(frozen=True)
class TensorOp:
    """One item of a rank's step, in order: its own compute, or a collective of the P ranks."""

    kind: str  # "compute", "allgather" or "allreduce"
    layer: str
    phase: str  # "forward", "backward" or "update"
    time_s: float
    nbytes: float = 0.0
    algorithm: str = ""
    split: bool = False  # a dense layer's slice

    @property
    def collective(self) -> bool:
        return self.kind != "compute"


@dataclass(frozen=True)
class TensorPlan:
    """Everything one step costs, asked of the cost model once (module docstring)."""

    ops: tuple[TensorOp, ...]
    tensor_ranks: int
    h2d_s: float
    inference: bool
    slices: tuple[tuple[str, int, int], ...]  # (dense layer, units, units on the busiest rank)

    @property
    def jittered_s(self) -> float:
        """Forward and backward compute (what the jitter factor multiplies)."""
        return sum(o.time_s for o in self.ops if o.kind == "compute" and o.phase != "update")

    @property
    def update_s(self) -> float:
        return sum(o.time_s for o in self.ops if o.phase == "update")

    @property
    def collectives(self) -> tuple[TensorOp, ...]:
        return tuple(o for o in self.ops if o.collective)

    def comm_s(self, kind: str | None = None) -> float:
        return sum(o.time_s for o in self.collectives if kind is None or o.kind == kind)

    def comm_bytes(self, kind: str) -> float:
        return sum(o.nbytes for o in self.collectives if o.kind == kind)


def _group_placement(cluster: Cluster, ranks: int, algorithm: str | None) -> Placement:
    if ranks == cluster.ranks:
        return cluster.placement(algorithm)
    if ranks == 1:
        return Placement(1, 1, algorithm)
    raise ConfigError(f"tensor parallelism over {ranks} of {cluster.ranks} ranks is not modelled")


def _slice_widths(units: int, parts: int) -> list[tuple[int, int]]:
    """The widths of :func:`~microbench.workload.split_columns`' non-empty slices, each with how
    many ranks hold one that wide: at most two, however many ranks (a list of a million slices
    per layer would take longer than the simulation)."""
    base, extra = divmod(units, parts)
    return [(w, n) for w, n in ((base + 1, extra), (base, parts - extra)) if w > 0 and n > 0]


def build_tensor_plan(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    inference: bool = False,
    tensor_ranks: int | None = None,
) -> TensorPlan:
    """The ops of one step over ``tensor_ranks`` ranks (all of the cluster's by default)."""
    p = cluster.ranks if tensor_ranks is None else tensor_ranks
    check_layerwise(cluster, scenario, "inference" if p == 1 else "model parallelism")
    placement = _group_placement(cluster, p, scenario.algorithm)
    batch, threads, device = scenario.batch_per_rank, cluster.threads_per_rank, cluster.device
    if p > 1:  # a cost model may price a slice apart (its share)
        cost = cost.sliced(p)
    layers = scenario.workload.layers
    params = [i for i, info in enumerate(layers) if info.param_count > 0]
    if not params:
        raise ConfigError(f"workload '{scenario.workload.name}' has no layer with parameters")
    local: list[LayerInfo] = []
    slices = []
    for info in layers:
        if info.kind == "dense" and p > 1:
            units = info.output_shape[0]
            share = math.ceil(units / p)
            slices.append((info.name, units, share))
            local.append(sliced_dense(info, share))
        else:
            local.append(info)

    def compute(i: int, phase: str) -> TensorOp:
        seconds = cost.compute_time(local[i], phase, batch, threads, device)
        return TensorOp("compute", layers[i].name, phase, seconds, split=local[i] is not layers[i])

    ops: list[TensorOp] = []
    for i, info in enumerate(layers):
        ops.append(compute(i, "forward"))
        if local[i] is not info:
            nbytes = float(batch * info.output_shape[0] * FLOAT_BYTES)
            name, timed = allgather_schedule(cost, nbytes, placement)
            seconds = sum(t.duration_s for t in timed) + sum(
                count * cost.slice_copy_time(batch, width, threads, device)
                for width, count in _slice_widths(info.output_shape[0], p)
            )
            ops.append(TensorOp("allgather", info.name, "forward", seconds, nbytes, name))
    if not inference:
        for i in range(len(layers) - 1, params[0] - 1, -1):
            ops.append(compute(i, "backward"))
            if local[i] is not layers[i] and layers[i].needs_input_grad:
                nbytes = float(batch * layers[i].input_shape[0] * FLOAT_BYTES)
                seconds = cost.collective_time("allreduce", int(nbytes), p, placement)
                name = cost.collective_name("allreduce", int(nbytes), placement)
                ops.append(TensorOp("allreduce", layers[i].name, "backward", seconds, nbytes, name))
        ops += [compute(i, "update") for i in params]
    h2d_s = 0.0
    if device == "gpu":
        per_sample = layers[0].input_bytes_per_sample + (0 if inference else LABEL_BYTES_PER_SAMPLE)
        h2d_s = cost.transfer_time("h2d", batch * per_sample, scenario.pinned)
    return TensorPlan(tuple(ops), p, h2d_s, inference, tuple(slices))


@dataclass(frozen=True)
class TensorPrediction:
    """A prediction of the layer-wise model (``engine``: ``"simulator"`` or ``"analytic"``);
    the breakdown is a typical rank's, as in :class:`pdlsim.sim.Prediction`."""

    engine: str
    cluster: Cluster
    scenario: Scenario
    plan: TensorPlan
    breakdown: StepBreakdown
    steps: tuple[StepBreakdown, ...]
    timeline: Timeline | None = None

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_s

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "engine": self.engine,
            "step_time_s": self.step_time_s,
            "breakdown": self.breakdown.to_dict(),
            "tensor_ranks": plan.tensor_ranks,
            "inference": plan.inference,
            "compute_s": plan.jittered_s + plan.update_s,
            "allgather_s": plan.comm_s("allgather"),
            "allreduce_s": plan.comm_s("allreduce"),
            "allgather_bytes": plan.comm_bytes("allgather"),
            "allreduce_bytes": plan.comm_bytes("allreduce"),
            "split_layers": [
                {"layer": name, "units": units, "units_per_rank": share}
                for name, units, share in plan.slices
            ],
            "collectives": [
                {
                    "op": o.kind,
                    "layer": o.layer,
                    "nbytes": o.nbytes,
                    "algorithm": o.algorithm,
                    "time_s": o.time_s,
                }
                for o in plan.collectives
            ],
        }


def _exposure(plan: TensorPlan, scenario: Scenario, step: int, previous_work_s: float) -> float:
    if step == 0 or not scenario.prefetch:
        return plan.h2d_s
    return max(0.0, plan.h2d_s - previous_work_s)


def _rank(env, plan, factor, exposure, arrive, done, busy):
    """One representative rank's step: copy, then its ops; at a collective it arrives and
    waits for the collective to end."""
    if exposure > 0:
        t0 = env.now
        yield env.timeout(exposure)
        busy("wait for h2d copy", t0, "h2d")
    k = 0
    for op in plan.ops:
        if op.collective:
            arrive[k].succeed()
            yield done[k]
            k += 1
        elif op.time_s > 0:
            t0 = env.now
            yield env.timeout(op.time_s if op.phase == "update" else factor * op.time_s)
            busy(f"{op.phase} {op.layer}" + (" (slice)" if op.split else ""), t0, op.phase)


def _communicator(env, plan, arrive, done, spans, timeline):
    """Starts each collective when every representative rank has arrived at it."""
    for k, op in enumerate(plan.collectives):
        yield simpy.AllOf(env, [row[k] for row in arrive])
        start = env.now
        yield env.timeout(op.time_s)
        spans.append((start, env.now))
        if timeline is not None:
            args = {"bytes": op.nbytes, "algorithm": op.algorithm}
            label = f"{op.kind} {op.layer} ({op.algorithm})"
            timeline.add("collectives (all ranks)", label, start, env.now, op.kind, args)
        done[k].succeed()


def tensor_factors(scenario: Scenario, cost: CostModel, ranks: int) -> tuple[np.ndarray, list[str]]:
    """Compute factors (rows x steps) of the representative ranks, as the data-parallel engine
    draws them: row 0 a typical rank, row 1 the slowest of the other ranks - 1 (one draw of the
    max per step); without jitter one row of ones."""
    n = scenario.total_steps
    jitter = cost.jitter if scenario.jitter else None
    if jitter is None:
        return np.ones((1, n)), ["rank (all ranks alike)"]
    rng = np.random.default_rng(scenario.seed)
    typical = np.asarray(jitter.sample(rng, n), dtype=float)
    if ranks == 1:
        return typical[None, :], ["rank 0"]
    slowest = max_of_draws(jitter, rng, ranks - 1, n)
    return np.vstack([typical, slowest]), ["typical rank", f"slowest of the other {ranks - 1}"]


def simulate_tensor(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    inference: bool = False,
    tensor_ranks: int | None = None,
    trace: bool = False,
) -> TensorPrediction:
    """Simulate the layer-wise model in simpy (module docstring); one step after another."""
    plan = build_tensor_plan(cluster, scenario, cost, inference, tensor_ranks)
    factors, labels = tensor_factors(scenario, cost, plan.tensor_ranks)
    env = simpy.Environment()
    timeline = Timeline() if trace else None
    if timeline is not None:
        for label in labels:
            timeline.track(label, "ranks")
        if plan.collectives:
            timeline.track("collectives (all ranks)", "links")
    measured: list[StepBreakdown] = []

    def driver():
        work = 0.0
        for i in range(scenario.total_steps):
            exposure = _exposure(plan, scenario, i, work)
            start = env.now
            n = len(plan.collectives)
            arrive = [[env.event() for _ in range(n)] for _ in labels]
            done = [env.event() for _ in range(n)]
            spans: list[tuple[float, float]] = []
            compute: list[tuple[float, float]] = []
            ranks = []
            for rep, label in enumerate(labels):

                def busy(name, t0, category, rep=rep, label=label, compute=compute, step=i):
                    if rep == 0:
                        compute.append((t0, env.now))
                    if timeline is not None:
                        timeline.add(label, name, t0, env.now, category, {"step": step})

                f = float(factors[rep, i])
                ranks.append(env.process(_rank(env, plan, f, exposure, arrive[rep], done, busy)))
            if n:
                env.process(_communicator(env, plan, arrive, done, spans, timeline))
            yield simpy.AllOf(env, ranks)
            pace = float(factors[:, i].max())
            if i >= scenario.warmup_iterations:
                measured.append(account(start, env.now, compute, spans, exposure, pace))
            work = env.now - start - exposure

    env.process(driver())
    env.run()
    return TensorPrediction(
        "simulator", cluster, scenario, plan, mean_breakdown(measured), tuple(measured), timeline
    )


def predict_tensor(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    inference: bool = False,
    tensor_ranks: int | None = None,
) -> TensorPrediction:
    """The closed form (module docstring); with jitter, expected factors as in the analytic
    model of data parallelism (exact in expectation: the step is linear in the factors)."""
    plan = build_tensor_plan(cluster, scenario, cost, inference, tensor_ranks)
    typical = pace = 1.0
    jitter = cost.jitter if scenario.jitter else None
    if jitter is not None:
        typical = float(jitter.expected_max_factor(1))
        pace = float(jitter.expected_max_factor(plan.tensor_ranks))
    j, u, c = plan.jittered_s, plan.update_s, plan.comm_s()
    work = pace * j + c + u

    def step(exposure: float) -> StepBreakdown:
        compute = exposure + typical * j + u
        return StepBreakdown(exposure + work, compute, c, (pace - typical) * j, 0.0, exposure, pace)

    steps = tuple(
        step(_exposure(plan, scenario, i, work))
        for i in range(scenario.warmup_iterations, scenario.total_steps)
    )
    return TensorPrediction("analytic", cluster, scenario, plan, mean_breakdown(steps), steps)
