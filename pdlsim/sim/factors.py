"""The compute factors of the simulated ranks: who represents whom, and their jitter draws.

With ``representation="symmetric"`` (see :mod:`pdlsim.sim.engine` for why it is exact) the rows
are: rank 0 (one draw per step: the typical rank, whose breakdown is reported), then for each
class of ranks (:mod:`pdlsim.sim.ranks`) the slowest of its ranks other than rank 0, one draw
of the max of that many factors per step. Without jitter, one row per class. With
``"all_ranks"``, one row per rank.

**Local SGD with jitter** (``sync_every = k > 1``): ranks run k steps without waiting for each
other, so what the sync step waits for is the rank whose *sum* of factors over the period (and
the interference of its last step) is largest, not the max of each step: averaging over k steps
shrinks the spread, and local SGD buys that too. The slowest row of a class is then, period by
period, the actual k draws of the one rank (of all that class's ranks, drawn) that ends its
backward last in the sync step. Exact without overlap (every bucket waits for the end of
backward) and for the last bucket; with overlap an earlier bucket could in truth wait for a
rank that lagged more before the sync step but computes faster in it, which this leaves out
(the earlier allreduces start a little early: a slight underestimate). Copies are not in the
choice (they are not jittered; an exposed copy shifts every rank of a class alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cluster import Cluster, Scenario, StepPlan, class_plans
from .cost import CostModel, Jitter, max_of_draws
from .ranks import RankLayout, rank_layout

__all__ = ["REPRESENTATIONS", "Rows", "rank_factors", "representatives"]

REPRESENTATIONS = ("symmetric", "all_ranks")


@dataclass(frozen=True, eq=False)
class Rows:
    """Factors (rows x steps), a track name and the class of each row; row 0 is rank 0."""

    factors: np.ndarray
    labels: list[str]
    classes: list[int]


def _class_label(layout: RankLayout, c: int, count: int, slowest: bool) -> str:
    cls = layout.classes[c]
    what = f"slowest of {count}" if slowest else f"{count}"
    return f"{what} ranks at speed {cls.speed:g}, batch {cls.batch}"


def _penalty(plan: StepPlan, factors: np.ndarray) -> np.ndarray:
    """Interference of a sync step for each factor (vectorised :func:`interference_s`)."""
    if not plan.overlap or not plan.communicates:
        return np.zeros_like(factors)
    collective = np.array([b.collective_s for b in plan.buckets])
    remaining = np.asarray(plan.remaining_backward_s)
    hidden = np.minimum(collective[None, :], factors[:, None] * remaining[None, :])
    return (1.0 - plan.overlap_efficiency) * hidden.sum(axis=1)


def _slowest_by_period(
    jitter: Jitter, rng: np.random.Generator, ranks: int, plan: StepPlan, lengths: np.ndarray
) -> np.ndarray:
    """Per period, the draws of the rank (of ``ranks``) that ends the sync step's backward last."""
    work_s = plan.forward_s + plan.backward_s
    out = np.empty(int(lengths.sum()))
    begin = 0
    for length in lengths:
        draws = np.asarray(jitter.sample(rng, (ranks, int(length))), dtype=float)
        ends = work_s * draws.sum(axis=1) + _penalty(plan, draws[:, -1])
        out[begin : begin + length] = draws[int(np.argmax(ends))]
        begin += length
    return out


def _periods(scenario: Scenario) -> np.ndarray:
    """Lengths of the consecutive sync periods (warm-up steps are periods of 1)."""
    k = scenario.sync_every
    return np.concatenate(
        [np.ones(scenario.warmup_iterations, int), np.full(scenario.iterations // k, k)]
    )


def representatives(
    cluster: Cluster,
    scenario: Scenario,
    cost: CostModel,
    layout: RankLayout,
    plans: Sequence[StepPlan],
    representation: str = "symmetric",
) -> Rows:
    """The rows the engine simulates (module docstring); one plan per class in ``plans``."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {', '.join(REPRESENTATIONS)}")
    n, p = scenario.total_steps, cluster.ranks
    jitter = cost.jitter if scenario.jitter else None
    rng = np.random.default_rng(scenario.seed)
    if representation == "all_ranks":
        labels = [f"rank {r}" for r in range(p)]
        classes = [int(c) for c in layout.of_rank]
        if jitter is None:
            return Rows(np.ones((p, n)), labels, classes)
        return Rows(np.asarray(jitter.sample(rng, (n, p)), float).T.copy(), labels, classes)
    hetero = layout.heterogeneous
    others = [c.count - (1 if i == 0 else 0) for i, c in enumerate(layout.classes)]
    if jitter is None:
        if not hetero:
            return Rows(np.ones((1, n)), ["rank (all ranks alike)"], [0])
        rows = [np.ones(n)] + [np.ones(n) for _ in layout.classes[1:]]
        labels = [f"rank 0 (speed {layout.classes[0].speed:g}, batch {plans[0].batch})"]
        labels += [_class_label(layout, c, others[c], False) for c in range(1, len(others))]
        return Rows(np.vstack(rows), labels, list(range(len(layout.classes))))
    rows = [np.asarray(jitter.sample(rng, n), float)]
    labels, classes = ["typical rank" if not hetero else "rank 0"], [0]
    if p == 1:
        return Rows(rows[0][None, :], ["rank 0"], [0])
    lengths = _periods(scenario)
    for c, count in enumerate(others):
        if count == 0:
            continue
        if scenario.sync_every == 1:
            rows.append(max_of_draws(jitter, rng, count, n))
        else:
            rows.append(_slowest_by_period(jitter, rng, count, plans[c], lengths))
        classes.append(c)
        labels.append(
            f"slowest of the other {count} ranks"
            if not hetero
            else _class_label(layout, c, count, True)
        )
    return Rows(np.vstack(rows), labels, classes)


def rank_factors(
    cluster: Cluster, scenario: Scenario, cost: CostModel, representation: str = "symmetric"
) -> tuple[np.ndarray, list[str]]:
    """Compute factors (representatives x steps) and track names; row 0 is the typical rank."""
    layout = rank_layout(cluster, scenario)
    rows = representatives(
        cluster, scenario, cost, layout, class_plans(cluster, scenario, cost, layout),
        representation,
    )  # fmt: skip
    return rows.factors, rows.labels
