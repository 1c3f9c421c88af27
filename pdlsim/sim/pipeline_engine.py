"""Pipeline parallelism played in simpy, its closed-form twin, and what a prediction reports.

:func:`simulate_pipeline` runs one process per stage of a representative pipeline: it waits for
each micro-batch's input where it needs one, computes, and hands its output to a message
process that holds the boundary's link (a ``simpy.Resource``, one message at a time) for the
transfer. :func:`predict_pipeline` computes the same steps with the recurrence of
:func:`pdlsim.sim.pipeline.pipeline_times`; without jitter the two agree to rounding.

Jitter: stage s's forward and backward are multiplied by a factor per step (the update and the
copies are not), drawn for one rank; with R > 1 data-parallel replicas in training, the factor
is the largest of R draws. A pipeline whose every stage is as slow as that stage's slowest
replica is at least as slow as the slowest real replica (the step only grows with each
factor), so with R > 1 the simulated step is an upper bound; exact for R = 1 and without
jitter. In inference the replicas never wait for each other: one draw per stage.

The breakdown is each stage rank's (:func:`pdlsim.sim.result.account`: computing = its copy
wait, forwards, backwards and update; communicating = a message it sends or receives is in
flight, or its gradient allreduce), averaged over the stages; its idle time (``sync_s``) is
the bubble plus waiting at the end of the step. The **bubble fraction** is the idle stage-time
of the pipeline phase over S x its makespan (from the step's start to the last forward or
backward): 1 - sum of forward and backward time / (S x makespan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from .cluster import Cluster, Scenario
from .cost import CostModel, max_of_draws
from .pipeline import PipelinePlan, StageTimes, build_pipeline_plan, pipeline_times
from .result import StepBreakdown, account, mean_breakdown
from .trace import Timeline

__all__ = [
    "PipelinePrediction",
    "pipeline_step",
    "predict_pipeline",
    "simulate_pipeline",
    "stage_factors",
]


@dataclass(frozen=True)
class PipelineStep:
    """One step: the mean over stages, each stage's, the bubble and the pipeline makespan."""

    breakdown: StepBreakdown
    stages: tuple[StepBreakdown, ...]
    bubble_fraction: float
    makespan_s: float


def pipeline_step(
    plan: PipelinePlan, times: list[StageTimes], start_s: float = 0.0, pace: float = 1.0
) -> PipelineStep:
    """The accounting of one step from what each stage did when (module docstring)."""
    end = max(t.end_s for t in times)
    per_stage = []
    for st, t in zip(plan.stages, times, strict=True):
        compute = [(start_s, start_s + t.exposure_s)] + [(a, b) for _, _, a, b in t.work]
        compute.append((t.end_s - st.update_s, t.end_s))
        comm = [(a, b) for _, _, a, b in t.messages]
        if t.allreduce is not None:
            comm.append(t.allreduce)
        per_stage.append(account(start_s, end, compute, comm, t.exposure_s, pace))
    makespan = max(t.flush_s for t in times) - start_s
    busy = sum(b - a for t in times for _, _, a, b in t.work)
    bubble = 1.0 - busy / (len(times) * makespan) if makespan > 0 else 0.0
    return PipelineStep(mean_breakdown(per_stage), tuple(per_stage), bubble, makespan)


@dataclass(frozen=True)
class PipelinePrediction:
    """A pipeline prediction (``engine``: ``"simulator"`` or ``"analytic"``), averaged over
    the measured steps; ``stages`` are each stage rank's mean breakdown."""

    engine: str
    cluster: Cluster
    scenario: Scenario
    plan: PipelinePlan
    breakdown: StepBreakdown
    steps: tuple[StepBreakdown, ...]
    stages: tuple[StepBreakdown, ...]
    bubble_fraction: float
    makespan_s: float
    timeline: Timeline | None = None

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_s

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        micro = max(plan.micro_batches)
        return {
            "engine": self.engine,
            "step_time_s": self.step_time_s,
            "breakdown": self.breakdown.to_dict(),
            "schedule": plan.schedule,
            "inference": plan.inference,
            "replicas": plan.replicas,
            "micro_batch_sizes": list(plan.micro_batches),
            "bubble_fraction": self.bubble_fraction,
            "ideal_bubble_fraction": plan.ideal_bubble_fraction,
            "pipeline_makespan_s": self.makespan_s,
            "stages": [
                {
                    "stage": st.index,
                    "layers": list(st.layers),
                    "forward_s": sum(st.forward_s),
                    "backward_s": sum(st.backward_s),
                    "update_s": st.update_s,
                    "busy_s": b.compute_s - b.h2d_exposed_s - st.update_s,
                    "idle_s": b.sync_s,
                    "send_bytes": sum(st.send_bytes),
                    "send_s": sum(st.send_s),
                    "params": st.param_count,
                    "allreduce_s": st.allreduce_s,
                    "peak_in_flight": st.peak_in_flight,
                    "activation_bytes": st.peak_in_flight * micro * st.activation_bytes_per_sample,
                    "crosses_nodes_to_next": plan.crosses_nodes[st.index]
                    if st.index < len(plan.crosses_nodes)
                    else None,
                }
                for st, b in zip(plan.stages, self.stages, strict=True)
            ],
        }


def stage_factors(plan: PipelinePlan, scenario: Scenario, cost: CostModel) -> np.ndarray:
    """Compute factors, stages x steps (module docstring); ones without jitter."""
    n, stages = scenario.total_steps, len(plan.stages)
    jitter = cost.jitter if scenario.jitter else None
    if jitter is None:
        return np.ones((stages, n))
    rng = np.random.default_rng(scenario.seed)
    replicas = 1 if plan.inference else plan.replicas
    rows = [
        np.asarray(jitter.sample(rng, n), float)
        if replicas == 1
        else max_of_draws(jitter, rng, replicas, n)
        for _ in range(stages)
    ]
    return np.vstack(rows)


def _exposures(plan: PipelinePlan, scenario: Scenario, step: int, last: list[float]) -> list[float]:
    """Each stage's copy wait: the whole copy, or with prefetch what the previous step (from
    that stage's start on) did not hide."""
    copies = [st.h2d_s for st in plan.stages]
    if step == 0 or not scenario.prefetch:
        return copies
    return [max(0.0, h - w) for h, w in zip(copies, last, strict=True)]


def _finish(engine, cluster, scenario, plan, measured, timeline=None) -> PipelinePrediction:
    per_stage = tuple(
        mean_breakdown([m.stages[s] for m in measured]) for s in range(len(plan.stages))
    )
    return PipelinePrediction(
        engine=engine,
        cluster=cluster,
        scenario=scenario,
        plan=plan,
        breakdown=mean_breakdown([m.breakdown for m in measured]),
        steps=tuple(m.breakdown for m in measured),
        stages=per_stage,
        bubble_fraction=float(np.mean([m.bubble_fraction for m in measured])),
        makespan_s=float(np.mean([m.makespan_s for m in measured])),
        timeline=timeline,
    )


def predict_pipeline(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    stages: int,
    microbatches: int,
    schedule: str = "1f1b",
    inference: bool = False,
) -> PipelinePrediction:
    """The closed form: every step by the recurrence, with the expected factors under jitter
    (E[f], or E[max of R] with replicas; an approximation: the makespan is not linear)."""
    plan = build_pipeline_plan(cluster, scenario, cost, stages, microbatches, schedule, inference)
    factor = 1.0
    jitter = cost.jitter if scenario.jitter else None
    if jitter is not None:
        factor = float(jitter.expected_max_factor(1 if inference else plan.replicas))
    factors = [factor] * stages
    measured, last = [], [0.0] * stages
    for i in range(scenario.total_steps):
        exposures = _exposures(plan, scenario, i, last)
        times = pipeline_times(plan, factors, exposures)
        step = pipeline_step(plan, times, 0.0, factor)
        last = [step.breakdown.step_s - e for e in exposures]
        if i >= scenario.warmup_iterations:
            measured.append(step)
    return _finish("analytic", cluster, scenario, plan, measured)


class _Run:
    """State of one simulated step: links, arrival events, what each stage did."""

    def __init__(self, env: simpy.Environment, plan: PipelinePlan, links: dict, timeline, step):
        self.env, self.plan, self.links, self.timeline, self.step = env, plan, links, timeline, step
        self.arrived = [{(kind, m): env.event() for kind, m in st.order} for st in plan.stages]
        self.times = [StageTimes() for _ in plan.stages]

    def mark(self, track: str, name: str, start: float, category: str, m: int = -1) -> None:
        if self.timeline is not None:
            args = {"step": self.step} | ({"micro_batch": m} if m >= 0 else {})
            self.timeline.add(track, name, start, self.env.now, category, args)


def _message(run: _Run, source: int, target: int, kind: str, m: int, seconds: float):
    """One point-to-point message on the boundary's link in its direction."""
    env = run.env
    with run.links[(source, target)].request() as request:
        yield request
        begin = env.now
        yield env.timeout(seconds)
    label = f"{'activation' if kind == 'F' else 'gradient'} {source}->{target}"
    for s in (source, target):
        run.times[s].messages.append((label, m, begin, env.now))
    run.mark(f"link stage {source} -> {target}", f"{label} mb {m}", begin, "p2p", m)
    run.arrived[target][(kind, m)].succeed()


def _stage(run: _Run, s: int, factor: float, exposure: float):
    """Stage s of the representative pipeline: copy wait, its ordered work, allreduce, update."""
    env, st, t = run.env, run.plan.stages[s], run.times[s]
    last = len(run.plan.stages) - 1
    track = f"stage {s}"
    start = env.now
    t.exposure_s = exposure
    if exposure > 0:
        yield env.timeout(exposure)
        run.mark(track, "wait for h2d copy", start, "h2d")
    for kind, m in st.order:
        if (kind == "F" and s > 0) or (kind == "B" and s < last):
            yield run.arrived[s][(kind, m)]
        begin = env.now
        yield env.timeout(factor * (st.forward_s[m] if kind == "F" else st.backward_s[m]))
        t.work.append((kind, m, begin, env.now))
        run.mark(track, f"{'forward' if kind == 'F' else 'backward'} mb {m}", begin, kind, m)
        target, send = (s + 1, st.send_s) if kind == "F" else (s - 1, st.grad_send_s)
        if 0 <= target <= last and send:
            env.process(_message(run, s, target, kind, m, send[m]))
    t.flush_s = env.now
    if st.allreduce_s > 0:
        begin = env.now
        yield env.timeout(st.allreduce_s)
        t.allreduce = (begin, env.now)
        run.mark(track, "gradient allreduce", begin, "allreduce")
    if st.update_s > 0:
        begin = env.now
        yield env.timeout(st.update_s)
        run.mark(track, "update", begin, "update")
    t.end_s = env.now


def simulate_pipeline(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    stages: int,
    microbatches: int,
    schedule: str = "1f1b",
    inference: bool = False,
    trace: bool = False,
) -> PipelinePrediction:
    """Simulate ``scenario`` (batch per pipeline replica) on ``stages`` stages (module docs)."""
    plan = build_pipeline_plan(cluster, scenario, cost, stages, microbatches, schedule, inference)
    factors = stage_factors(plan, scenario, cost)
    env = simpy.Environment()
    timeline = Timeline() if trace else None
    links = {}
    for s in range(stages - 1):
        for pair in ((s, s + 1), (s + 1, s)):
            links[pair] = simpy.Resource(env, capacity=1)
            if timeline is not None:
                timeline.track(f"link stage {pair[0]} -> {pair[1]}", "links")
    if timeline is not None:
        for s in range(stages):
            timeline.track(f"stage {s}", "ranks")
    measured = []

    def driver():
        last = [0.0] * stages
        for i in range(scenario.total_steps):
            exposures = _exposures(plan, scenario, i, last)
            run = _Run(env, plan, links, timeline, i)
            start = env.now
            procs = [
                env.process(_stage(run, s, float(factors[s, i]), exposures[s]))
                for s in range(stages)
            ]
            yield simpy.AllOf(env, procs)
            step = pipeline_step(plan, run.times, start, float(factors[:, i].max()))
            last = [step.breakdown.step_s - e for e in exposures]
            if i >= scenario.warmup_iterations:
                measured.append(step)

    env.process(driver())
    env.run()
    return _finish("simulator", cluster, scenario, plan, measured, timeline)
