"""The closed-form twin of the simulator: the same step, from the same cost interface, in formulas.

With compute factor f for a rank (1 without jitter), t0 the instant its forward pass starts,
F and b_j the forward and backward layer times, p_k the backward position after which bucket k
is complete and c_k its allreduce alone (all from :func:`pdlsim.sim.cluster.build_plan`):

    ready_k(f)  = t0 + f (F + sum_{j <= p_k} b_j) + sum_{i < k} I_i(f)        (overlap on)
    ready_k(f)  = t0 + f (F + B) + 0                                          (overlap off)
    I_i(f)      = (1 - eff) min(c_i, f * backward left after p_i)             (interference)

and the allreduces form a max-plus recurrence over buckets (one stream: each waits for the
previous; m streams: for a free one), paced by the slowest rank's factor M:

    s_k = max(ready_k(M), s_{k-1}, earliest free stream),    e_k = s_k + c_k

The step ends after the last allreduce and the update U: E = max(e_last, end of M's backward)
+ U. The mini-batch copy h (GPU ranks) delays t0 by x = h, or with prefetch by
x = max(0, h - W) where W is the step from t0 on (the copy was issued when the previous
forward began); the very first step always waits the full copy. The breakdown follows the same
definitions as the simulator (:mod:`pdlsim.sim.result`) in closed form, for a rank of factor f:
compute = x + f (F + B) + sum I_i(f) + U; comm = the union of [s_k, e_k); overlap = the part of
it before that rank's backward ends; sync = (e_last - backward end) - (comm - overlap).

Agreement with the simulator: exact (to rounding) without jitter, with one communication stream,
which is every execution mode; with several streams the simulator also models collectives in
flight together queueing on links, which this recurrence leaves out. With jitter this model
uses the expected factors (M = E[max of P], a typical rank E[f]): exact in expectation where
the step is linear in the factors (no overlap, no prefetch), an approximation elsewhere.
"""

from __future__ import annotations

import numpy as np

from .cluster import Cluster, Scenario, StepPlan, build_plan, interference_s
from .cost import CostModel
from .result import Prediction, StepBreakdown, bucket_reports, mean_breakdown

__all__ = ["predict", "step_breakdown"]


def _backward_timeline(plan: StepPlan, factor: float, t0: float) -> tuple[np.ndarray, float, float]:
    """(ready time of each bucket, end of backward, interference) for a rank starting at t0."""
    buckets = plan.buckets
    before = plan.forward_s + np.cumsum([t for _, t in plan.backward])  # after each position
    if not plan.communicates or not plan.overlap:
        end = t0 + factor * (plan.forward_s + plan.backward_s)
        return np.full(len(buckets), end), end, 0.0
    penalties = np.array([interference_s(plan, b.index, factor) for b in buckets])
    earlier = np.concatenate([[0.0], np.cumsum(penalties)[:-1]])
    positions = np.array([b.closes_after for b in buckets])
    ready = t0 + factor * before[positions] + earlier
    total_penalty = float(penalties.sum())
    end = t0 + factor * (plan.forward_s + plan.backward_s) + total_penalty
    return ready, end, total_penalty


def _collective_spans(plan: StepPlan, ready: np.ndarray, streams: int) -> list[tuple[float, float]]:
    """Max-plus recurrence: bucket k starts when ready, after k - 1 started, on a free stream."""
    free = [-np.inf] * streams
    spans: list[tuple[float, float]] = []
    previous = -np.inf
    for k, bucket in enumerate(plan.buckets):
        slot = int(np.argmin(free))
        start = max(float(ready[k]), previous, free[slot])
        end = start + bucket.collective_s
        free[slot] = end
        previous = start
        spans.append((start, end))
    return spans


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        elif b > a:
            merged.append((a, b))
    return merged


def step_breakdown(
    plan: StepPlan, typical: float, pace: float, exposed_s: float, streams: int = 1
) -> StepBreakdown:
    """One step, starting at 0, of a rank of factor ``typical`` when the slowest has ``pace``."""
    t0 = exposed_s
    ready_pace, end_pace, _ = _backward_timeline(plan, pace, t0)
    ready_typ, end_typ, penalty_typ = _backward_timeline(plan, typical, t0)
    compute = exposed_s + typical * (plan.forward_s + plan.backward_s) + penalty_typ + plan.update_s
    if not plan.communicates:
        end = end_typ + plan.update_s
        return StepBreakdown(end, compute, 0.0, 0.0, 0.0, exposed_s, pace)
    spans = _union(_collective_spans(plan, ready_pace, streams))
    last = max(b for _, b in spans)
    comm = sum(b - a for a, b in spans)
    overlap = sum(max(0.0, min(b, end_typ) - a) for a, b in spans)
    sync = (last - end_typ) - (comm - overlap)
    end = max(last, end_pace) + plan.update_s
    return StepBreakdown(end, compute, comm, sync, overlap, exposed_s, pace)


def predict(cluster: Cluster, scenario: Scenario, cost: CostModel) -> Prediction:
    """The closed-form prediction, shaped like :func:`pdlsim.sim.engine.simulate`'s."""
    plan = build_plan(cluster, scenario, cost)
    typical = pace = 1.0
    jitter = cost.jitter if scenario.jitter else None
    if jitter is not None:
        typical = float(jitter.expected_max_factor(1))
        pace = float(jitter.expected_max_factor(cluster.ranks))
    streams = scenario.comm_streams
    copy = plan.h2d_s
    first = step_breakdown(plan, typical, pace, copy, streams)
    if scenario.prefetch and copy > 0:
        work = step_breakdown(plan, typical, pace, 0.0, streams).step_s  # W: t0 to step end
        steady = step_breakdown(plan, typical, pace, max(0.0, copy - work), streams)
    else:
        steady = first
    steps = tuple(
        first if i == 0 else steady for i in range(scenario.warmup_iterations, scenario.total_steps)
    )
    return Prediction(
        engine="analytic",
        cluster=cluster,
        scenario=scenario,
        breakdown=mean_breakdown(steps),
        steps=steps,
        buckets=bucket_reports(plan),
    )
