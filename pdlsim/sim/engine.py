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
(tests/sim/test_engine.py checks it step by step against ``all_ranks`` on the same draws).
What is not represented: the spread of the breakdown over ranks within one step (one typical
rank is drawn per step, so averages over steps converge to averages over ranks), and
differences between nodes (all nodes' links behave alike).
Modelling assumptions (not approximations of the shortcut): factors are independent across
ranks and steps (no persistently slow rank); the factor multiplies forward and backward, not
copies or the update (interference depends on it only through the backward work left); links
are FIFO and carry one step group at a time (a ring's 2(P-1) steps are two groups). Gaps on a
rank's track in the trace are its waiting: for a collective in progress or for the slowest.

**What-ifs.** Ranks of different speeds or batches (:mod:`pdlsim.sim.ranks`) fall into classes
that run alike; each class gets its own plan and its own slowest representative, so the
argument above holds class by class, and the max over classes is simulated, not assumed (with
no jitter, one row per class). Local SGD: steps that do not synchronise are compute only and
each representative runs them at its own pace; the rows are then chosen per sync period
(:mod:`pdlsim.sim.factors`). Compression: the rank compresses a bucket before marking it ready
and expands each bucket after its collective, in bucket order, before the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from .cluster import Bucket, Cluster, Scenario, StepPlan, class_plans, interference_s
from .cost import CostModel
from .factors import REPRESENTATIONS, rank_factors, representatives
from .links import CopyEngine, Link
from .ranks import rank_layout, sync_steps
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


@dataclass
class _Run:
    """State shared by the processes of one simulation."""

    env: simpy.Environment
    plans: list[StepPlan]  # per row
    sync: np.ndarray  # per step: whether it allreduces
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
    """One representative rank: copy, forward, backward (compressing and launching buckets),
    wait, expand, update; steps that do not synchronise are copy, forward, backward, update."""
    plan, timeline, typical = run.plans[rep], run.timeline, rep == 0
    engine = CopyEngine(env, f"{track} copy engine", plan.h2d_s, timeline) if run.gpu else None
    copies = [env.event() for _ in range(run.steps)] if run.gpu else []
    if engine is not None and run.prefetch:
        env.process(engine.copy(copies[0], 0))

    def busy(name: str, start: float, category: str) -> None:
        if typical:
            run.compute[-1].append((start, env.now))
        if timeline is not None:
            timeline.add(track, name, start, env.now, category)

    def compress(k: int):
        if plan.buckets[k].compress_s > 0:
            t0 = env.now
            yield env.timeout(plan.buckets[k].compress_s)
            busy(f"compress bucket {k}", t0, "compress")

    forward, backward = _passes(plan, by_layer=timeline is not None)
    for i in range(run.steps):
        f = float(factors[i])
        talks = bool(run.sync[i]) and plan.communicates
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
        for name, t in forward:
            if t > 0:
                t0 = env.now
                yield env.timeout(f * t)
                busy(f"forward {name}", t0, "forward")
        for name, t, k in backward:
            if t > 0:
                t0 = env.now
                yield env.timeout(f * t)
                busy(f"backward {name}", t0, "backward")
            if k is not None and talks and plan.overlap:
                yield from compress(k)
                run.ready[rep][i][k].succeed()
                penalty = interference_s(plan, k, f)
                if penalty > 0:
                    t0 = env.now
                    yield env.timeout(penalty)
                    busy(f"interference bucket {k}", t0, "interference")
        if talks:
            if not plan.overlap:
                for k, event in enumerate(run.ready[rep][i]):
                    yield from compress(k)
                    event.succeed()
            for k, bucket in enumerate(plan.buckets):
                yield run.done[i][k]
                if bucket.decompress_s > 0:
                    t0 = env.now
                    yield env.timeout(bucket.decompress_s)
                    busy(f"decompress bucket {k}", t0, "decompress")
        if plan.update_s > 0:
            t0 = env.now
            yield env.timeout(plan.update_s)
            busy("update", t0, "update")
    if typical:
        run.step_start.append(env.now)


def _passes(
    plan: StepPlan, by_layer: bool
) -> tuple[list[tuple[str, float]], list[tuple[str, float, int | None]]]:
    """The forward pass as (name, seconds) spans and the backward as (name, seconds, bucket
    closed at its end or None): layer by layer for a timeline, else the layers between two
    bucket closes as one span, since nothing else waits on them (a step of a large network is
    hundreds of simulator events fewer)."""
    backward = [(name, t, k) for (name, t), k in zip(plan.backward, plan.closes, strict=True)]
    if by_layer:
        return list(plan.forward), backward
    merged: list[tuple[str, float, int | None]] = []
    run_s = 0.0
    for _, t, k in backward:
        run_s += t
        if k is not None:
            merged.append(("layers", run_s, k))
            run_s = 0.0
    if run_s > 0:
        merged.append(("layers", run_s, None))
    return [("layers", plan.forward_s)], merged


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
        if not run.sync[i]:
            continue
        for bucket in run.plans[0].buckets:
            events = [run.ready[rep][i][bucket.index] for rep in range(run.reps)]
            yield events[0] if len(events) == 1 else simpy.AllOf(env, events)
            request = run.stream.request()
            yield request
            env.process(collective(env, run, i, bucket, request))


def simulate_factors(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    factors: np.ndarray,
    labels: list[str] | None = None,
    trace: bool = False,
    row_classes: Sequence[int] | None = None,
) -> Prediction:
    """Simulate with the given compute factors, one row per simulated rank (row 0 reported).

    ``row_classes``: the class of ranks (:func:`pdlsim.sim.ranks.rank_layout`) each row runs
    as; by default rank r's class when there is a row per rank, else rank 0's (all ranks alike
    only)."""
    layout = rank_layout(cluster, scenario)
    factors = np.atleast_2d(np.asarray(factors, dtype=float))
    if row_classes is None:
        if factors.shape[0] == cluster.ranks:
            row_classes = [int(c) for c in layout.of_rank]
        elif len(layout.classes) == 1:
            row_classes = [0] * factors.shape[0]
        else:
            raise ValueError("ranks differ in speed or batch: say each row's class (row_classes)")
    plans = class_plans(cluster, scenario, cost, layout)
    return _simulate(cluster, scenario, plans, factors, labels, list(row_classes), trace)


def _simulate(
    cluster: Cluster,
    scenario: Scenario,
    class_plan: tuple[StepPlan, ...],
    factors: np.ndarray,
    labels: list[str] | None,
    row_classes: list[int],
    trace: bool,
) -> Prediction:
    reps, steps = factors.shape
    if steps != scenario.total_steps:
        raise ValueError(f"factors cover {steps} steps, the scenario {scenario.total_steps}")
    if len(row_classes) != reps:
        raise ValueError(f"{len(row_classes)} row classes for {reps} rows")
    plans = [class_plan[c] for c in row_classes]
    labels = labels or [f"rank {r}" for r in range(reps)]
    env = simpy.Environment()
    timeline = Timeline() if trace else None
    links = {
        "intra": Link(env, "node 0 intra-node link", timeline),
        "inter": Link(env, "node 0 NIC", timeline),
    }
    run = _Run(
        env=env,
        plans=plans,
        sync=sync_steps(scenario),
        steps=steps,
        prefetch=scenario.prefetch,
        gpu=cluster.device == "gpu",
        links=links,
        stream=simpy.Resource(env, capacity=scenario.comm_streams),
        reps=reps,
        timeline=timeline,
    )
    k = len(plans[0].buckets)
    run.ready = [[[env.event() for _ in range(k)] for _ in range(steps)] for _ in range(reps)]
    run.done = [[env.event() for _ in range(k)] for _ in range(steps)]
    run.spans = [[] for _ in range(steps)]
    for rep in range(reps):
        if timeline is not None:
            timeline.track(labels[rep], "ranks")
        env.process(rank_process(env, run, rep, factors[rep], labels[rep]))
    if plans[0].communicates:
        if timeline is not None:
            timeline.track("collectives (all ranks)", "links")
        env.process(communicator(env, run))
    env.run()

    speeds = np.array([p.speed for p in plans])
    pace = (factors / speeds[:, None]).max(axis=0)
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
        buckets=bucket_reports(plans[0]),
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
    layout = rank_layout(cluster, scenario)
    plans = class_plans(cluster, scenario, cost, layout)
    rows = representatives(cluster, scenario, cost, layout, plans, representation)
    return _simulate(cluster, scenario, plans, rows.factors, rows.labels, rows.classes, trace)
