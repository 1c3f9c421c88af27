"""What a collective costs inside a training step beyond its back-to-back time.

The profile's collectives are timed back to back (warm caches, ranks arriving together); the
same op inside a step, after the layers' compute, costs more (:mod:`calibration.insitu`). Where
the profile measured a workload's calls in place (``python -m microbench insitu``), a call of
the plan is priced as

    T = T_back_to_back(op, bytes, placement) + T_in_place(batch) - T_back_to_back(op, bytes,
        the placement it was measured at)

with ``T_in_place`` interpolated in the batch: the typical in-place time, the median over the
moments the benchmark took its rounds at. At the measured placement that is the measured time;
on a larger cluster the back-to-back part follows the collective's algorithm model and the
excess, a local cost of each rank (caches, copies), is assumed not to grow with the ranks. A
band sample multiplies ``T_in_place`` by ``factor``, one of the rounds' deviations from their
point's median (:func:`pdlsim.costmodel.uncertainty.insitu_draw`).

The excess may be negative: a call can run faster inside the step than back to back, the step
having left its buffers in cache (evidence: docs/evidence.md, "Collectives in place"). A saving
is fixed seconds, like an excess, but never a larger share of the call than it was where
measured: T is at least ``T_back_to_back(placement) x T_in_place / T_back_to_back(measured)``,
so a placement whose back-to-back time is smaller (one rank per node over a fast network) keeps
a positive cost. CPU ranks only (the measurements are CPU ranks'); a workload or call the
profile did not measure in place keeps its back-to-back time, and the provenance says which
applies.

**The step's barrier.** ``pdlsim train`` calls one barrier per step (data parallel: before the
gradient allreduce, to tell waiting from reducing; model parallel: at the step's start). The
rank that reaches it last, after the step's compute, spends several times a back-to-back
barrier's latency in it: for a small network a sizeable share of the ranks' wait, and in no
other term (evidence: docs/evidence.md, "Barrier"). Where the profile timed it in place (op
``barrier``, layer ``step``), :meth:`InSituCost.barrier_s` prices it as a latency-bound
allreduce of :data:`BARRIER_PROXY_BYTES` (a barrier's rounds grow with the ranks as that
allreduce's do; the simulator has no barrier algorithm of its own) plus the in-place excess over
that allreduce at the placement measured. A profile that did not time it in place leaves the
barrier out.

A layer-wise forward-only step (parallelism ``model-inference``) takes the calls timed in the
benchmark's forward-only step, which leaves more in cache than a training step does; a profile
that did not time them prices them as the training step's calls.

**The step's skew** (:func:`in_place_sync`). The jitter model's sync (T_sync: the slowest rank's
compute over the typical one's) is sized by the jitter benchmark's ranks, which time the step
alone between barriers. The ranks of a training step, with its collectives between steps, skew
less: the trainer waits a fraction of what the jitter model and the simulator's draws from the
fitted family say, about what ``microbench insitu``'s own barrier, in the same step as training,
waits (evidence: docs/evidence.md, "Skew in place"). Where the profile timed the ranks' compute
with the barrier, the sync at the ranks measured is the barrier's mean wait over that compute
(:meth:`calibration.insitu.InSituModel.wait_fraction`, per parallelism, pooled over the batches
measured), and the distribution keeps its shape for more ranks
(:meth:`calibration.jitter.JitterModel.with_sync`).

**The update in place** (:meth:`InSituCost.update_s`). Data parallel, the ranks update their
parameters together right after the allreduce, on what the reduction just wrote: a small
network's update there can take noticeably longer than its serial update, while a large
network's, memory-bound either way, barely changes (evidence: docs/evidence.md, "Update in
place"). Where the profile timed the update in place, a data-parallel step with two or more
ranks prices it as its share of the compute before the barrier
(:meth:`calibration.insitu.InSituModel.update_fraction`: update and compute timed in the same
steps) times the step's forward and backward, the gather left out as the benchmark has none;
else as the layers' update times.

**Co-location in place** (:func:`in_place_colocation`). Two ranks on a node slow each other's
compute; the co-location model measures it with the jitter benchmark's steps, which have no
collective between them. Inside the data-parallel step, with the allreduce and the barrier
between steps, the slowdown differs from that and varies with the batch (evidence:
docs/evidence.md, "Co-location"). Where the profile timed rank 0's compute alone beside the step
in place, a prediction of that step (data parallel, layer-wise or its forward pass) at the ranks
per node and thread count measured takes that step's factor instead, interpolated in the batch
(held outside the measured batches); other placements and thread counts keep the co-location
model's. A band sample keeps the factor as measured (the rounds' spread of it is not drawn).

**A slice's share** (:func:`in_place_share`). A layer-wise rank computes its slices of the dense
layers and the rest whole; the roofline prices a half-width dense layer at about half the whole
one, but small GEMMs do not scale so: a rank's part of a small network's step can take a share
of the whole network's that differs from the share its ops predict (evidence: docs/evidence.md,
"A layer-wise rank's slice share"). Where the profile timed both alone, round by round, a
layer-wise prediction multiplies its rank's compute by the measured share over the predicted one
(:meth:`pdlsim.costmodel.compute.ComputeCost.slice_factor`), at the thread count measured, for any
number of ranks (measured at two, held at others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibration.insitu import InSituModel
from calibration.jitter import JitterModel
from microbench.insitu import MODEL_INFERENCE
from pdlsim.sim import Placement
from pdlsim.sim.messages import allgather_time

__all__ = [
    "BARRIER_PROXY_BYTES",
    "InSituCost",
    "in_place_colocation",
    "in_place_share",
    "in_place_sync",
    "sync_parallelism",
]

BARRIER_PROXY_BYTES = 4  # one float32: the allreduce whose latency stands in for a barrier's


@dataclass(frozen=True)
class InSituCost:
    """The profile's in-place calls of one workload, for :class:`ProfileCostModel`."""

    model: InSituModel
    workload: str
    factor: float = 1.0  # this band sample's draw of the machine's moment (module docstring)

    @classmethod
    def from_profile_model(
        cls, model: InSituModel | None, workload: str | None, device: str
    ) -> tuple[InSituCost | None, str]:
        """The pricing (None where it does not apply) and a provenance line."""
        if model is None:
            return None, "not measured: collectives as timed back to back"
        if device != "cpu":
            return None, "measured on CPU ranks only: GPU collectives as timed back to back"
        kinds = ("data", "model", MODEL_INFERENCE)
        found = [c for p in kinds for c in model.calls(workload or "", p)]
        if workload is None or not found:
            measured = sorted({p.workload for p in model.points_})
            return None, (
                f"not measured for {workload or 'this workload'} (only "
                f"{', '.join(measured) or 'none'}): collectives as timed back to back"
            )
        ranks = max(p.ranks for p in found)
        batches = sorted({p.batch for p in found})
        return cls(model, workload), (
            f"profile: {len(found)} calls of {workload} measured in place at {ranks} ranks, "
            f"batch {', '.join(map(str, batches))}; their excess over back to back added"
        )

    def extra_s(
        self,
        cost: Any,
        parallel: str,
        op: str,
        layer: str,
        batch: int,
        nbytes: int,
        back_to_back_s: float | None = None,
    ) -> float:
        """Seconds to add to the call's back-to-back time, negative for a saving (module
        docstring); 0 if unmeasured. ``back_to_back_s``: the call's back-to-back time at the
        placement priced, which bounds a saving (None: the placement measured)."""
        found = self._seconds(parallel, op, layer, batch)
        if found is None:
            return 0.0
        seconds, point = found
        seconds *= self.factor
        at = Placement(max(1, point.ranks // point.ranks_per_node), point.ranks_per_node)
        if op == "allgather":
            back_to_back = allgather_time(cost, nbytes, at)
        elif op == "barrier":
            back_to_back = cost.collective_time("allreduce", BARRIER_PROXY_BYTES, point.ranks, at)
        else:
            back_to_back = cost.collective_time(op, nbytes, point.ranks, at)
        excess = seconds - back_to_back
        if excess >= 0 or back_to_back_s is None or back_to_back <= 0:
            return excess
        return max(excess, (seconds / back_to_back - 1.0) * back_to_back_s)

    def barrier_s(
        self, cost: Any, parallel: str, batch: int, ranks: int, placement: Placement
    ) -> float:
        """The step's barrier at ``ranks`` ranks on ``placement`` (module docstring); 0 where
        the profile did not time it in place or with one rank."""
        if ranks < 2 or self._seconds(parallel, "barrier", "step", batch) is None:
            return 0.0
        proxy = cost.collective_time("allreduce", BARRIER_PROXY_BYTES, ranks, placement)
        return proxy + self.extra_s(cost, parallel, "barrier", "step", batch, 0, proxy)

    def update_s(self, parallel: str, batch: int, compute_s: float) -> float | None:
        """Seconds of the update after the step's collectives, given the rank's forward and
        backward ``compute_s`` (gather excluded); None where the profile did not time it in
        place (module docstring)."""
        found = self.model.update_fraction(self.workload, parallel, batch)
        return None if found is None else found[0] * compute_s

    def _seconds(self, parallel: str, op: str, layer: str, batch: int) -> Any:
        """:meth:`InSituModel.seconds`; a forward-only step's call the profile did not time
        in a forward-only step takes the training step's (profiles from before it did)."""
        found = self.model.seconds(self.workload, parallel, op, layer, batch)
        if found is None and parallel == MODEL_INFERENCE:
            found = self.model.seconds(self.workload, "model", op, layer, batch)
        return found


def sync_parallelism(parallel: str, inference: bool) -> str | None:
    """The in-place step whose barrier sizes the sync of a ``parallel`` (``inference``)
    prediction; None where no rank waits for another (data-parallel inference) or none was
    timed (pipelines)."""
    if parallel == "data":
        return None if inference else "data"
    if parallel == "model":
        return MODEL_INFERENCE if inference else "model"
    return None


def in_place_sync(
    jitter: JitterModel,
    insitu: InSituModel | None,
    workload: str | None,
    parallel: str | None,
    batch: int | None,
) -> tuple[JitterModel, str | None]:
    """``jitter`` with its sync at the ranks measured in place set to the step barrier's
    measured wait there (module docstring), and a provenance note; unchanged, with None,
    where the profile did not time that step's compute and barrier."""
    if insitu is None or workload is None or parallel is None or batch is None:
        return jitter, None
    found = insitu.wait_fraction(workload, parallel, batch)
    if found is None:
        return jitter, None
    fraction, point = found
    sized = jitter.with_sync(point.ranks, fraction)
    return sized, (
        f"sync at {point.ranks} ranks sized to the {parallel} step's barrier wait in place, "
        f"{100 * fraction:.2f}% of its compute pooled over the batches measured (the jitter "
        f"benchmark's {100 * float(jitter.sync_fraction(point.ranks)):.2f}%)"
    )


def in_place_colocation(
    insitu: InSituModel | None, workload: str | None, parallel: str | None, ranks_per_node: int
) -> tuple[tuple[tuple[int, float], ...], int, str | None]:
    """The co-location factors of the ``parallel`` step measured in place
    (:meth:`calibration.insitu.InSituModel.colocations`), as (batch, factor) points, the
    thread count they were measured at and a provenance note; none (``()``, 1, None) where the
    profile did not time the compute alone or measured another number of ranks per node."""
    if insitu is None or workload is None or parallel is None:
        return (), 1, None
    found = insitu.colocations(workload, parallel)
    if not found or found[0].ranks_per_node != ranks_per_node:
        return (), 1, None
    points = tuple((p.batch, float(p.colocation)) for p in found)
    shown = ", ".join(f"x{factor:.3f} at batch {batch}" for batch, factor in points)
    note = (
        f"profile (the {parallel} step in place at {ranks_per_node} ranks per node, its "
        f"compute over rank 0's alone, round by round): {shown}"
    )
    return points, found[0].threads, note


def in_place_share(
    insitu: InSituModel | None, workload: str | None, parallel: str | None
) -> tuple[tuple[tuple[int, float], ...], int, int, str | None]:
    """Rank 0's share of the whole network's compute in the ``parallel`` layer-wise step, both
    timed alone (:meth:`calibration.insitu.InSituModel.shares`), as (batch, share) points, the
    ranks and thread count they were measured at and a provenance note; none (``()``, 1, 1,
    None) where the profile did not time them."""
    if insitu is None or workload is None or parallel is None:
        return (), 1, 1, None
    found = insitu.shares(workload, parallel)
    if not found:
        return (), 1, 1, None
    points = tuple((p.batch, float(p.share)) for p in found)
    shown = ", ".join(f"{share:.3f} at batch {batch}" for batch, share in points)
    note = (
        f"profile (rank 0's part of the {parallel} step over the whole network's, both alone "
        f"at {found[0].ranks} ranks, round by round): {shown}"
    )
    return points, found[0].ranks, found[0].threads, note
