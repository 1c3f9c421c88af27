"""The discrete-event simulator (simpy): ranks computing layer by layer, bucket allreduces
playing their algorithm's steps on links, copies on copy engines, jitter, the slowest rank.

Processes are generator functions taking ``env`` (:func:`rank_process`, :func:`communicator`,
:func:`collective`); links and copy engines are small classes holding ``env``.

**Symmetry.** Ranks are statistically identical, so the simulator does not run one process per
rank (``representation="all_ranks"`` does, for checking). It runs:

* a *typical* rank, whose compute factor each step is one draw from the jitter distribution:
  its breakdown is what the prediction reports;
* the *slowest of the other P - 1 ranks*, whose factor each step is one draw of the max of
  P - 1 factors, F^-1(U^(1/(P-1))) (:func:`pdlsim.sim.cost.max_of_draws`);
* the links of one node: every node runs the same steps at the same time (flows through its
  NIC are counted in each step), so one node's intra-node link and NIC stand for all;
* without jitter, one rank: all are alike.

What is exact: every rank starts a step at the same instant (the step boundary follows a
collective, which ends everywhere at once, and the update, which is not jittered), and within
a step a rank's bucket-ready times only grow with its factor. So every bucket's allreduce
waits for the same rank, the one with the largest factor, and the whole step (T_step, every
collective's start and end) depends on the P factors only through their max. The max of the
typical factor and the slowest-of-the-others factor has exactly the law of the max of P, and
the typical rank has exactly the law of any one rank, jointly: T_step and the typical rank's
breakdown have exactly the distribution that P simulated ranks would give
(tests/test_sim_engine.py checks it step by step against ``all_ranks`` on the same draws).
What is not represented: the spread of the breakdown over ranks within one step (one typical
rank is drawn per step, so averages over steps converge to averages over ranks), and
differences between nodes (all nodes' links behave alike).
Modelling assumptions (not approximations of the shortcut): factors are independent across
ranks and steps (no persistently slow rank); the factor multiplies forward and backward, not
copies or the update (interference depends on it only through the backward work left); links
are FIFO and carry one step group at a time (a ring's 2(P-1) steps are two groups). Gaps on a
rank's track in the trace are its waiting: for a collective in progress or for the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from .cluster import Bucket, Cluster, Scenario, StepPlan, build_plan, interference_s
from .collectives import TimedStep
from .cost import CostModel, max_of_draws
from .result import Prediction, account, bucket_reports, mean_breakdown
from .trace import Timeline

__all__ = [
    "REPRESENTATIONS",
    "CopyEngine",
    "Link",
    "collective",
    "communicator",
    "rank_factors",
    "rank_process",
    "simulate",
    "simulate_factors",
]

REPRESENTATIONS = ("symmetric", "all_ranks")


class Link:
    """One link (an intra-node link or a NIC): carries one step group at a time, FIFO, so that
    collectives in flight together queue on it."""

    def __init__(self, env: simpy.Environment, name: str, timeline: Timeline | None = None):
        self.env = env
        self.name = name
        self.timeline = timeline
        self.resource = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0
        if timeline is not None:
            timeline.track(name, "links")

    def carry(self, timed: TimedStep, label: str = ""):
        with self.resource.request() as request:
            yield request
            start = self.env.now
            yield self.env.timeout(timed.duration_s)
            self.busy_s += timed.duration_s
            if self.timeline is not None:
                step = timed.step
                name = f"{label} {step.phase}".strip() + (
                    f" x{step.repeat}" if step.repeat > 1 else ""
                )
                args = {"bytes": step.nbytes, "flows": step.flows, "repeat": step.repeat}
                self.timeline.add(self.name, name, start, self.env.now, "link", args)


class CopyEngine:
    """A GPU's host-to-device copy engine: one copy at a time, beside the compute."""

    def __init__(self, env: simpy.Environment, name: str, copy_s: float, timeline=None):
        self.env = env
        self.name = name
        self.copy_s = copy_s
        self.timeline = timeline
        self.resource = simpy.Resource(env, capacity=1)
        if timeline is not None:
            timeline.track(name, "links")

    def copy(self, done: simpy.Event, step: int):
        with self.resource.request() as request:
            yield request
            start = self.env.now
            yield self.env.timeout(self.copy_s)
            if self.timeline is not None:
                self.timeline.add(self.name, f"h2d batch {step}", start, self.env.now, "copy")
        done.succeed()


@dataclass
class _Run:
    """State shared by the processes of one simulation."""

    env: simpy.Environment
    plan: StepPlan
    steps: int
    prefetch: bool
    gpu: bool
    links: dict[str, Link]
    stream: simpy.Resource
    reps: int
    timeline: Timeline | None
    ready: list[list[list[simpy.Event]]] = field(default_factory=list)  # [rep][step][bucket]
    done: list[list[simpy.Event]] = field(default_factory=list)  # [step][bucket]
    spans: list[list[tuple[float, float]]] = field(default_factory=list)  # [step]
    step_start: list[float] = field(default_factory=list)  # typical rank, steps + 1 entries
    compute: list[list[tuple[float, float]]] = field(default_factory=list)  # typical rank
    exposed: list[float] = field(default_factory=list)  # typical rank's copy wait per step


def rank_process(env: simpy.Environment, run: _Run, rep: int, factors: np.ndarray, track: str):
    """One representative rank: copy, forward, backward (launching buckets), wait, update."""
    plan, timeline, typical = run.plan, run.timeline, rep == 0
    engine = CopyEngine(env, f"{track} copy engine", plan.h2d_s, timeline) if run.gpu else None
    copies = [env.event() for _ in range(run.steps)] if run.gpu else []
    if engine is not None and run.prefetch:
        env.process(engine.copy(copies[0], 0))

    def busy(name: str, start: float, category: str) -> None:
        if typical:
            run.compute[-1].append((start, env.now))
        if timeline is not None:
            timeline.add(track, name, start, env.now, category)

    for i in range(run.steps):
        f = float(factors[i])
        start = env.now
        if typical:
            run.step_start.append(start)
            run.compute.append([])
        if engine is not None:
            if run.prefetch:
                yield copies[i]
            else:
                yield env.process(engine.copy(copies[i], i))
            if typical:
                run.exposed.append(env.now - start)
            busy("wait for h2d copy", start, "h2d")
            if run.prefetch and i + 1 < run.steps:
                env.process(engine.copy(copies[i + 1], i + 1))
        elif typical:
            run.exposed.append(0.0)
        for name, t in plan.forward:
            if t > 0:
                t0 = env.now
                yield env.timeout(f * t)
                busy(f"forward {name}", t0, "forward")
        for position, (name, t) in enumerate(plan.backward):
            if t > 0:
                t0 = env.now
                yield env.timeout(f * t)
                busy(f"backward {name}", t0, "backward")
            k = plan.closes[position]
            if k is not None and plan.communicates and plan.overlap:
                run.ready[rep][i][k].succeed()
                penalty = interference_s(plan, k, f)
                if penalty > 0:
                    t0 = env.now
                    yield env.timeout(penalty)
                    busy(f"interference bucket {k}", t0, "interference")
        if plan.communicates:
            if not plan.overlap:
                for event in run.ready[rep][i]:
                    event.succeed()
            yield simpy.AllOf(env, run.done[i])
        if plan.update_s > 0:
            t0 = env.now
            yield env.timeout(plan.update_s)
            busy("update", t0, "update")
    if typical:
        run.step_start.append(env.now)


def collective(env: simpy.Environment, run: _Run, step: int, bucket: Bucket, request: Any):
    """One bucket's allreduce: its algorithm's steps, in order, each on its link."""
    start = env.now
    label = f"b{bucket.index}"
    for timed in bucket.schedule:
        yield from run.links[timed.step.level].carry(timed, label)
    run.stream.release(request)
    run.spans[step].append((start, env.now))
    if run.timeline is not None:
        args = {
            "bucket": bucket.index,
            "bytes": bucket.nbytes,
            "layers": list(bucket.layers),
            "step": step,
        }
        name = f"allreduce bucket {bucket.index} ({bucket.algorithm})"
        run.timeline.add("collectives (all ranks)", name, start, env.now, "allreduce", args)
    run.done[step][bucket.index].succeed()


def communicator(env: simpy.Environment, run: _Run):
    """Starts each bucket's allreduce once every rank has it ready and a stream is free."""
    for i in range(run.steps):
        for bucket in run.plan.buckets:
            events = [run.ready[rep][i][bucket.index] for rep in range(run.reps)]
            yield events[0] if len(events) == 1 else simpy.AllOf(env, events)
            request = run.stream.request()
            yield request
            env.process(collective(env, run, i, bucket, request))


def rank_factors(
    cluster: Cluster, scenario: Scenario, cost: CostModel, representation: str = "symmetric"
) -> tuple[np.ndarray, list[str]]:
    """Compute factors (representatives x steps) and track names; row 0 is the typical rank."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {', '.join(REPRESENTATIONS)}")
    n, p = scenario.total_steps, cluster.ranks
    jitter = cost.jitter if scenario.jitter else None
    rng = np.random.default_rng(scenario.seed)
    if representation == "all_ranks":
        if jitter is None:
            return np.ones((p, n)), [f"rank {r}" for r in range(p)]
        return np.asarray(jitter.sample(rng, (n, p)), float).T.copy(), [
            f"rank {r}" for r in range(p)
        ]
    if jitter is None:
        return np.ones((1, n)), ["rank (all ranks alike)"]
    typical = np.asarray(jitter.sample(rng, n), float)
    if p == 1:
        return typical[None, :], ["rank 0"]
    slowest = max_of_draws(jitter, rng, p - 1, n)
    return np.vstack([typical, slowest]), [
        "typical rank",
        f"slowest of the other {p - 1} ranks",
    ]


def simulate_factors(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    factors: np.ndarray,
    labels: list[str] | None = None,
    trace: bool = False,
) -> Prediction:
    """Simulate with the given compute factors, one row per simulated rank (row 0 reported)."""
    plan = build_plan(cluster, scenario, cost)
    factors = np.atleast_2d(np.asarray(factors, dtype=float))
    reps, steps = factors.shape
    if steps != scenario.total_steps:
        raise ValueError(f"factors cover {steps} steps, the scenario {scenario.total_steps}")
    labels = labels or [f"rank {r}" for r in range(reps)]
    env = simpy.Environment()
    timeline = Timeline() if trace else None
    links = {
        "intra": Link(env, "node 0 intra-node link", timeline),
        "inter": Link(env, "node 0 NIC", timeline),
    }
    run = _Run(
        env=env,
        plan=plan,
        steps=steps,
        prefetch=scenario.prefetch,
        gpu=cluster.device == "gpu",
        links=links,
        stream=simpy.Resource(env, capacity=scenario.comm_streams),
        reps=reps,
        timeline=timeline,
    )
    k = len(plan.buckets)
    run.ready = [[[env.event() for _ in range(k)] for _ in range(steps)] for _ in range(reps)]
    run.done = [[env.event() for _ in range(k)] for _ in range(steps)]
    run.spans = [[] for _ in range(steps)]
    for rep in range(reps):
        if timeline is not None:
            timeline.track(labels[rep], "ranks")
        env.process(rank_process(env, run, rep, factors[rep], labels[rep]))
    if plan.communicates:
        if timeline is not None:
            timeline.track("collectives (all ranks)", "links")
        env.process(communicator(env, run))
    env.run()

    pace = factors.max(axis=0)
    measured = range(scenario.warmup_iterations, steps)
    per_step = tuple(
        account(
            run.step_start[i],
            run.step_start[i + 1],
            run.compute[i],
            run.spans[i],
            run.exposed[i],
            float(pace[i]),
        )
        for i in measured
    )
    return Prediction(
        engine="simulator",
        cluster=cluster,
        scenario=scenario,
        breakdown=mean_breakdown(per_step),
        steps=per_step,
        buckets=bucket_reports(plan),
        timeline=timeline,
    )


def simulate(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    trace: bool = False,
    representation: str = "symmetric",
) -> Prediction:
    """Simulate ``scenario`` on ``cluster``: the mean step, its breakdown, each step, a timeline.

    ``representation="symmetric"`` (default) simulates representative ranks (module docstring);
    ``"all_ranks"`` one process per rank, for checking the shortcut (slow for many ranks)."""
    factors, labels = rank_factors(cluster, scenario, cost, representation)
    return simulate_factors(cluster, scenario, cost, factors, labels, trace)
