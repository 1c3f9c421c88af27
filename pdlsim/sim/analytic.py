"""The closed-form twin of the simulator: the same steps, from the same cost interface, in formulas.

With compute factor f for a rank (1 without jitter), t0 the instant its forward pass starts,
F and b_j the forward and backward layer times, p_k the backward position after which bucket k
is complete, c_k its allreduce alone, z_k its compression and d_k its expansion (all from
:func:`pdlsim.sim.cluster.build_plan`, per class of ranks: :func:`class_plans`):

    ready_k(f)  = t0 + f (F + sum_{j <= p_k} b_j) + sum_{i < k} I_i(f) + sum_{i <= k} z_i
                                                                              (overlap on)
    ready_k(f)  = t0 + f (F + B) + sum_{i <= k} z_i                           (overlap off)
    I_i(f)      = (1 - eff) min(c_i, f * backward left after p_i)             (interference)

and the allreduces form a max-plus recurrence over buckets (one stream: each waits for the
previous; m streams: for a free one), paced by the latest rank of every class:

    s_k = max(max over ranks of ready_k, s_{k-1}, earliest free stream),    e_k = s_k + c_k

A rank whose own work ends at W expands bucket by bucket, D_k = max(D_{k-1}, e_k) + d_k from
D_{-1} = W, and updates: its step ends at D_last + U, the same instant for every rank. Steps
that do not synchronise (local SGD) end at t0 + f (F + B) + U, each rank on its own. The
mini-batch copy h (GPU ranks) delays t0: by h after the step starts, or with prefetch to the
copy's end, the copy having been issued when the previous forward began. These are evaluated
step after step (a recurrence over steps: prefetch and local SGD carry state from one step to
the next); the breakdown of rank 0 is the simulator's own accounting
(:func:`pdlsim.sim.result.account`) of rank 0's busy intervals and the collectives' spans.

Agreement with the simulator: exact (to rounding) without jitter, with one communication stream,
which is every execution mode; with several streams the simulator also models collectives in
flight together queueing on links, which this recurrence leaves out. With jitter this model
uses expected factors: E[f] for rank 0, E[max of the n ranks of a class] for the class's pace.
Exact in expectation where the step is linear in the factors (no overlap, no prefetch), an
approximation elsewhere. With local SGD the pace over a period of k steps is taken as
E[f] + (E[max of n] - E[f]) / sqrt(k) per step: the spread of a sum of k independent factors
grows as sqrt(k), not k (exact for normal factors; the simulator draws it).
"""

from __future__ import annotations

import numpy as np

from .cluster import Cluster, Scenario, StepPlan, class_plans, interference_s
from .cost import CostModel
from .ranks import RankLayout, period_lengths, rank_layout, sync_steps
from .result import Interval, Prediction, StepBreakdown, account, bucket_reports, mean_breakdown

__all__ = ["predict", "step_breakdown"]


def _own_work(plan: StepPlan, factor: float, t0: float, talks: bool) -> tuple[np.ndarray, float]:
    """(ready time of each bucket, end of the rank's own work before the collectives)."""
    compute_end = t0 + factor * (plan.forward_s + plan.backward_s)
    if not talks:
        return np.empty(0), compute_end
    compress = np.cumsum([b.compress_s for b in plan.buckets])
    if not plan.overlap:
        ready = compute_end + compress
        return ready, float(ready[-1])
    before = plan.forward_s + np.cumsum([t for _, t in plan.backward])  # after each position
    penalties = np.array([interference_s(plan, b.index, factor) for b in plan.buckets])
    earlier = np.concatenate([[0.0], np.cumsum(penalties)[:-1]])
    positions = np.array([b.closes_after for b in plan.buckets])
    ready = t0 + factor * before[positions] + earlier + compress
    return ready, compute_end + float(penalties.sum()) + float(compress[-1])


def _collective_spans(plan: StepPlan, ready: np.ndarray, streams: int) -> list[Interval]:
    """Max-plus recurrence: bucket k starts when ready, after k - 1 started, on a free stream."""
    free = [-np.inf] * streams
    spans: list[Interval] = []
    previous = -np.inf
    for k, bucket in enumerate(plan.buckets):
        slot = int(np.argmin(free))
        start = max(float(ready[k]), previous, free[slot])
        end = start + bucket.collective_s
        free[slot] = end
        previous = start
        spans.append((start, end))
    return spans


def _expand(plan: StepPlan, own_end: float, spans: list[Interval]) -> tuple[float, list[Interval]]:
    """End of the expansions after the collectives (D_last), and their intervals."""
    done, busy = own_end, []
    for bucket, (_, end) in zip(plan.buckets, spans, strict=True):
        start = max(done, end)
        done = start + bucket.decompress_s
        if bucket.decompress_s > 0:
            busy.append((start, done))
    return done, busy


def _step(
    plans: list[StepPlan],
    factors: np.ndarray,
    starts: np.ndarray,
    t0s: np.ndarray,
    talks: bool,
    streams: int,
) -> tuple[np.ndarray, StepBreakdown]:
    """One step of every row (rank 0 first): the next step's starts and rank 0's breakdown."""
    rows = zip(plans, factors, t0s, strict=True)
    work = [_own_work(p, float(f), float(t), talks) for p, f, t in rows]
    spans: list[Interval] = []
    if talks:
        spans = _collective_spans(plans[0], np.max([r for r, _ in work], axis=0), streams)
    ends, busy0 = np.empty(len(plans)), []
    for row, (plan, (_, own_end)) in enumerate(zip(plans, work, strict=True)):
        done, expanding = _expand(plan, own_end, spans) if talks else (own_end, [])
        ends[row] = done + plan.update_s
        if row == 0:
            busy0 = [(float(starts[0]), own_end), *expanding, (done, float(ends[0]))]
    pace = float(np.max(factors / np.array([p.speed for p in plans])))
    exposed = float(t0s[0] - starts[0])
    return ends, account(float(starts[0]), float(ends[0]), busy0, spans, exposed, pace)


def step_breakdown(
    plan: StepPlan, typical: float, pace: float, exposed_s: float, streams: int = 1
) -> StepBreakdown:
    """One synchronising step, from 0, of a rank of factor ``typical`` when the slowest has
    ``pace``, both starting their forward pass at ``exposed_s``."""
    talks = plan.communicates
    factors = np.array([typical, pace])
    starts, t0s = np.zeros(2), np.full(2, exposed_s)
    return _step([plan, plan], factors, starts, t0s, talks, streams)[1]


def _row_factors(
    cluster: Cluster, scenario: Scenario, cost: CostModel, layout: RankLayout
) -> np.ndarray:
    """Expected factors, rows x steps: rank 0, then the pace of each class (module docstring)."""
    rows = 1 + len(layout.classes)
    jitter = cost.jitter if scenario.jitter else None
    if jitter is None:
        return np.ones((rows, scenario.total_steps))
    mean = float(jitter.expected_max_factor(1))
    spread = 1.0 / np.sqrt(period_lengths(scenario))
    out = [np.full(scenario.total_steps, mean)]
    for c in layout.classes:
        excess = float(jitter.expected_max_factor(c.count)) - mean
        out.append(mean + excess * spread)
    return np.vstack(out)


def predict(cluster: Cluster, scenario: Scenario, cost: CostModel) -> Prediction:
    """The closed-form prediction, shaped like :func:`pdlsim.sim.engine.simulate`'s."""
    layout = rank_layout(cluster, scenario)
    plans = class_plans(cluster, scenario, cost, layout)
    rows = [plans[0], *plans]
    factors = _row_factors(cluster, scenario, cost, layout)
    copies = np.array([p.h2d_s for p in rows]) if cluster.device == "gpu" else np.zeros(len(rows))
    sync = sync_steps(scenario)
    starts = np.zeros(len(rows))
    copy_ready = copies.copy()  # the first copy is issued at 0
    steps = []
    for i in range(scenario.total_steps):
        if scenario.prefetch:
            t0s = np.maximum(starts, copy_ready)
            copy_ready = t0s + copies  # the next copy, issued as this forward begins
        else:
            t0s = starts + copies
        talks = bool(sync[i]) and plans[0].communicates
        ends, breakdown = _step(rows, factors[:, i], starts, t0s, talks, scenario.comm_streams)
        if i >= scenario.warmup_iterations:
            steps.append(breakdown)
        starts = ends
    return Prediction(
        engine="analytic",
        cluster=cluster,
        scenario=scenario,
        breakdown=mean_breakdown(steps),
        steps=tuple(steps),
        buckets=bucket_reports(plans[0]),
    )
