"""What a collective costs inside a training step beyond its back-to-back time.

The profile's collectives are timed back to back (warm caches, ranks arriving together); the
same op inside a step, after the layers' compute, costs more (:mod:`calibration.insitu`). Where
the profile measured a workload's calls in place (``python -m microbench insitu``), a call of
the plan is priced as

    T = T_back_to_back(op, bytes, placement) + max(0, T_in_place(batch) - T_back_to_back(op,
        bytes, the placement it was measured at))

with ``T_in_place`` interpolated in the batch: the typical in-place time, the median over the
moments the benchmark took its rounds at. At the measured placement that is the measured time;
on a larger cluster the back-to-back part follows the collective's algorithm model and the
excess, a local cost of each rank (caches, copies), is assumed not to grow with the ranks. A
band sample multiplies ``T_in_place`` by ``factor``, one of the rounds' deviations from their
point's median (:func:`pdlsim.uncertainty.insitu_draw`).
CPU ranks only (the measurements are CPU ranks'); a workload or call the profile did not
measure in place keeps its back-to-back time, and the provenance says which applies.

**The step's barrier.** ``pdlsim train`` calls one barrier per step (data parallel: before the
gradient allreduce, to tell waiting from reducing; model parallel: at the step's start). The
rank that reaches it last, after the step's compute, spends 7-20 us in it (MLP) on the
development VM where a barrier back to back takes 2 us: a third of the MLP's 2-rank wait, and
in no other term. Where the profile timed it in place (op ``barrier``, layer ``step``),
:meth:`InSituCost.barrier_s` prices it as a latency-bound allreduce of
:data:`BARRIER_PROXY_BYTES` (a barrier's rounds grow with the ranks as that allreduce's do; the
simulator has no barrier algorithm of its own) plus the in-place excess over that allreduce at
the placement measured. Unmeasured, the barrier is left out, as before profiles timed it.

A layer-wise forward-only step (parallelism ``model-inference``) takes the calls timed in the
benchmark's forward-only step, which leaves more in cache than a training step does; a profile
that did not time them prices them as the training step's calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibration.insitu import InSituModel
from microbench.insitu import MODEL_INFERENCE
from pdlsim.sim import Placement
from pdlsim.sim.messages import allgather_time

__all__ = ["BARRIER_PROXY_BYTES", "InSituCost"]

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
        self, cost: Any, parallel: str, op: str, layer: str, batch: int, nbytes: int
    ) -> float:
        """Seconds to add to the call's back-to-back time (module docstring); 0 if unmeasured."""
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
        return max(0.0, seconds - back_to_back)

    def barrier_s(
        self, cost: Any, parallel: str, batch: int, ranks: int, placement: Placement
    ) -> float:
        """The step's barrier at ``ranks`` ranks on ``placement`` (module docstring); 0 where
        the profile did not time it in place or with one rank."""
        if ranks < 2 or self._seconds(parallel, "barrier", "step", batch) is None:
            return 0.0
        proxy = cost.collective_time("allreduce", BARRIER_PROXY_BYTES, ranks, placement)
        return proxy + self.extra_s(cost, parallel, "barrier", "step", batch, 0)

    def _seconds(self, parallel: str, op: str, layer: str, batch: int) -> Any:
        """:meth:`InSituModel.seconds`; a forward-only step's call the profile did not time
        in a forward-only step takes the training step's (profiles from before it did)."""
        found = self.model.seconds(self.workload, parallel, op, layer, batch)
        if found is None and parallel == MODEL_INFERENCE:
            found = self.model.seconds(self.workload, "model", op, layer, batch)
        return found
