"""The simulator's cost interface answered from a calibrated profile (plus presets where needed).

:class:`ProfileCostModel` implements :class:`pdlsim.sim.CostModel`:

* **Compute.** A layer's FLOPs and bytes (:func:`microbench.op_records.layer_bytes`, the same
  byte estimate the compute benchmark records) at the batch go through the profile's fitted
  roofline of its op class (``dense:forward``, ``conv2d:backward``, ``softmax_cross_entropy:loss``,
  ``sgd:update``; pooled where a class was not measured) and thread-scaling law. A flatten is a
  view and costs nothing. GPU ranks use the profile's GPU curves when it has them, else the GPU
  preset's data-sheet roofline: FLOPs / (FP32 non-tensor peak x ``gpu_flops_efficiency``)
  or bytes / (HBM x ``gpu_memory_efficiency``), whichever is longer, plus a kernel launch
  (``gpu_kernel_launch_s``). These three are **assumptions**
  (:data:`pdlsim.costmodel.presets.ASSUMPTIONS`, from ``pdlsim/costmodel/hardware.json``), each
  with a range the band draws it in.
* **Collectives.** The simulator's algorithm steps (:func:`pdlsim.sim.collectives.schedule`),
  each timed on its level's :class:`~pdlsim.sim.LinkCost`, so the schedule sums to
  ``collective_time`` by construction. CPU ranks inside a node: the profile's allreduce alpha and
  beta of the size regime the message falls in (the fitted beta absorbs the reduction, so no
  gamma). Across nodes: the network (a preset or given numbers), or the profile's fitted
  inter-node parameters when it has them and no network is given; the receiver reduces at a
  third of its memory bandwidth (two reads, one write per byte). GPU ranks on a described node
  (``node``): NCCL's algorithms on its fabric and NICs (:mod:`pdlsim.sim.nccl`), one timed step
  per collective; without one, NVLink at half the preset's bidirectional figure per direction
  and ``nvlink_latency_s`` assumed, reducing at a third of the preset's HBM bandwidth.
* **Allgather.** CPU ranks take the profile's own allgather fit (its regimes' algorithm and
  ``a, b``, from the allgather's own benchmark) where the profile measured one and the
  placement stays in one node or the fit has inter-node parameters. The two-rank messages on
  the allreduce's links (:mod:`pdlsim.sim.messages`) are left for the rest: on a shared-memory
  node they price a small gather at the allreduce's per-step latency, several times below
  what a gather costs (evidence: docs/evidence.md, "Allgather").
* **Whole-step correction.** Ops timed one at a time do not add up to the same ops run back to
  back as one training step (caches, allocator state, per-call overheads). Where the profile's
  compute table holds whole-step rows (phase ``step``, per model, batch and threads, measured
  by the compute microbenchmark), every op's time is multiplied by measured step / sum of the
  predicted ops of that step, for the ``workload`` this model is built for, interpolated in the
  batch (:class:`pdlsim.costmodel.stepscale.StepScale`). No step rows: no correction.
* **Mini-batch gather.** CPU ranks gather each mini-batch before the step (``np.take`` of the
  rows, as ``pdlsim train`` does): the profile's measured ``data`` rows, added to the first
  layer's forward, so that T_compute is what the training loop's data + forward + backward +
  update phases add up to.
* **Co-location.** CPU ranks sharing a node slow each other down (memory bandwidth, caches):
  compute is multiplied by the profile's measured co-location factor at ``ranks_per_node``
  (:mod:`calibration.colocation`; beyond the largest measured ranks per node, carried by the
  node-fill slowdown where the profile measured it, else held).
* **Drift.** The same step measured at several moments of the calibration
  (:mod:`calibration.drift`) gives the machine's typical speed and the spread around it. CPU
  compute is divided by exp(the compute stage's log-offset from typical), so a prediction
  describes the typical speed rather than the moment the op table was measured (per measured
  step, its whole-step row; without rows, all compute); the band (:meth:`perturbed`) scales it
  by one of the measured log-deviations per sample. GPU ranks on a profile that timed the GPU
  do the same with the GPU steps' own moments and deviations (a small network's GPU step is
  the host launching kernels, and drifts with the host); from a data sheet they have none.
* **Copies.** The profile's transfer model, else the preset's PCIe per-direction rate times
  ``pinned_efficiency`` or ``pageable_efficiency`` plus ``copy_latency_s`` (assumed).
* **Jitter.** The profile's :class:`calibration.jitter.JitterModel` behind the simulator's
  ``Jitter`` protocol (:class:`ProfileJitter`), for CPU ranks; GPU ranks draw none (it is the
  host's, and no GPU jitter is measured).
* **Overlap efficiency.** The profile's measured hidden fraction of an allreduce of the bucket
  size behind computation, thread method (a communication thread, as in the hybrid trainer;
  ``nbc`` if only that was measured). GPU ranks on a described node: the assumption
  ``nccl_overlap_efficiency`` (NCCL's own stream beside backward), drawn in its range.

:meth:`ProfileCostModel.perturbed` draws every fitted parameter from a normal distribution
centred on the fitted value whose 95% interval has the width of the fitted interval
(sigma = width / 3.92), clipped at 0 (rates and efficiencies at 1% of the fitted value, so that
nothing divides by zero; the overlap efficiency at 1); the measured whole-step times and the
co-location factor move by one normal draw each within their intervals. Data-sheet figures
and assumptions are not perturbed: they have no interval.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from calibration.algorithms import CollectiveModel
from calibration.collective_regimes import CollectiveRegime, regime_indices
from calibration.colocation import ColocationModel
from calibration.compression import CompressionModel
from calibration.compute import ComputeModel
from calibration.overlap import OverlapModel
from calibration.profile import Profile
from calibration.stats import Interval
from calibration.transfer import TransferModel
from microbench.errors import UserError
from microbench.workload import Workload, load_workload
from pdlsim.costmodel import node_sharing
from pdlsim.costmodel.compute import ComputeCost
from pdlsim.costmodel.corrections import CORRECTIONS
from pdlsim.costmodel.gpu_fabric import efficiencies, fabric_of
from pdlsim.costmodel.kernels import TERMS, KernelCompute
from pdlsim.costmodel.node_sharing import Straggler, colocation_source, node_straggler
from pdlsim.costmodel.oppins import OpPins
from pdlsim.costmodel.presets import (
    ASSUMPTIONS,
    Assumption,
    GpuPreset,
    NetworkPreset,
    NodePreset,
)
from pdlsim.costmodel.profile_links import fitted_inter, intra_regimes, link_op, overlap_interval
from pdlsim.costmodel.stepscale import StepRow, StepScale
from pdlsim.costmodel.training import Training
from pdlsim.costmodel.uncertainty import ProfileJitter, perturbed_cost
from pdlsim.sim import ConfigError, LinkCost, Placement, Step, TimedStep, collectives
from pdlsim.sim.nccl import ALGORITHMS as NCCL_ALGORITHMS
from pdlsim.sim.nccl import NCCL_OPS, Estimate, estimate

__all__ = [
    "ProfileCostModel",
    "ProfileJitter",
]


@dataclass(frozen=True, eq=False)
class ProfileCostModel(ComputeCost):
    """The sim's ``CostModel`` from a profile (see the module docstring). Build with
    :meth:`from_profile`; ``device`` is the kind of the ranks the collectives run between.
    Compute is priced by :class:`pdlsim.costmodel.compute.ComputeCost`."""

    compute: ComputeModel
    intra_regimes: tuple[CollectiveRegime, ...]
    inter: LinkCost | None
    inter_source: str
    transfer: TransferModel | None
    gpu: GpuPreset | None
    device: str
    cpu_memory_bandwidth_bytes_per_s: float
    jitter: ProfileJitter | None
    overlap_efficiency: float
    overlap_interval: Interval | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    workload: str | None = None  # the preset the whole-step rows are looked up for
    ranks_per_node: int = 1
    scale: StepScale = field(default_factory=StepScale)
    colocation: ColocationModel | None = None
    step_z: float = 0.0  # standard deviations the measured steps are moved by (the band)
    colocation_z: float = 0.0
    drift_sigma: float = 0.0  # the profile's run-to-run drift of a step's median (lognormal)
    drift_log_deviations: tuple[float, ...] = ()  # the speeds it saw, log(moment / typical)
    drift_level: float = 1.0  # without whole-step rows: exp(-the compute stage's log offset)
    drift_factor: float = 1.0  # this band sample's draw of the deviations
    gpu_compute_factor: float = 1.0  # GPU compute x: a given single-GPU step (--step-time/--mfu)
    gpu_layer_s: Mapping[tuple[str, str], float] | None = None  # measured (--layer-times)
    tensor_ranks: int = 1  # set by sliced(): a layer-wise plan's slices
    _ops_cache: dict[tuple[Any, ...], float] = field(default_factory=dict, repr=False)
    compression: CompressionModel | None = None  # the profile's, when it measured compression
    pins: OpPins = field(default_factory=OpPins)  # the workload's ops as measured one by one
    inference: bool = False  # predicts forward-only steps: their rows scale compute
    _pin_cache: dict[tuple[str, str, int, int, str], float] = field(
        default_factory=dict, repr=False
    )
    # (workload, threads, ranks per node) -> the co-location model's (factor, interval): the
    # band's draws move it by colocation_z, so every draw may share it
    _colocation_cache: dict[tuple[str, int, int], tuple[float, Any]] = field(
        default_factory=dict, repr=False
    )
    kernels: KernelCompute | None = None  # CPU compute from the profile's kernel tables
    corrections: frozenset[str] = frozenset(CORRECTIONS)
    description: Workload | None = None  # the workload itself, where given
    assumptions: Mapping[str, Assumption] = field(default_factory=lambda: dict(ASSUMPTIONS))
    training: Training = field(default_factory=Training)  # precision and optimizer
    node: NodePreset | None = None  # GPU ranks: the node their collectives run in (NCCL)
    network: NetworkPreset | None = None  # the NICs' network (its figures: ``inter``)
    allgather_fit: CollectiveModel | None = None  # CPU ranks: the profile's measured allgather
    straggler: Straggler | None = None  # CPU ranks above the measured ranks per node
    pace: node_sharing.CollectivePace | None = None  # CPU collectives above their ranks

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        network: NetworkPreset | None = None,
        gpu: GpuPreset | None = None,
        device: str = "cpu",
        bucket_bytes: int = 25 * 2**20,
        workload: str | None = None,
        ranks_per_node: int = 1,
        inference: bool = False,
        corrections: frozenset[str] = frozenset(CORRECTIONS),
        description: Workload | None = None,
        assumptions: Mapping[str, Assumption] | None = None,
        training: Training | None = None,
        node: NodePreset | None = None,
    ) -> ProfileCostModel:
        """The cost model of ``workload`` from ``profile``; ``corrections``: the named corrections
        (:data:`pdlsim.costmodel.corrections.CORRECTIONS`) switched on; ``description``: the
        workload itself (default: loaded by the name ``workload``); ``assumptions``: the figures
        taken where nothing measured says (default: the packaged
        :data:`pdlsim.costmodel.presets.ASSUMPTIONS`)."""
        compute = profile.model("compute")
        kernels = None
        if profile.models.get("kernels") and device == "cpu":
            kernels = KernelCompute(
                profile.model("kernels"),
                frozenset(corrections) & frozenset(TERMS),
                optimizer=(training or Training()).optimizer,
            )
            if description is None and workload:  # a file not at hand: compute_time says so
                with contextlib.suppress(UserError):
                    description = load_workload(workload)
        regimes = intra_regimes(profile)
        cpu_curves = [r for (d, _), r in sorted(compute.curves_.items()) if d == "cpu"]
        mem_bw = cpu_curves[0].bandwidth_bytes_per_s if cpu_curves else 10e9
        reduce_bw = (gpu.hbm_bandwidth_bytes_per_s if device == "gpu" and gpu else mem_bw) / 3
        prov = {
            "compute": "profile",
            "intra-node links": f"profile ({link_op(profile)} alpha/beta)",
        }
        inter, source = None, "none"
        fitted = fitted_inter(profile)
        if network is not None:
            inter = LinkCost(network.latency_s, network.bandwidth_bytes_per_s, reduce_bw)
            source = f"{network.name} ({network.kind}: {network.source})"
        elif fitted is not None:
            inter = LinkCost.from_alpha_beta(fitted.a_s, max(fitted.b_s_per_byte, 1e-15))
            source = "profile (fitted inter-node)"
        prov["inter-node links"] = source
        has_gpu_compute = "gpu" in compute.devices
        if device == "gpu":
            if not has_gpu_compute and gpu is None:
                raise ConfigError(
                    "GPU ranks need a GPU model: the profile has none and no GPU preset is given"
                )
            prov["compute"] = (
                "profile (gpu: pdlsim's own trainer; another framework's job: --step-time)"
                if has_gpu_compute
                else f"{gpu.name} data sheet"
            )
            if node is not None:
                prov["intra-node links"] = f"{node.name} {node.fabric} data sheet"
                prov["collectives"] = (
                    "NCCL's algorithms and protocols (pdlsim/sim/nccl.json) on the data sheets, "
                    "efficiencies assumed"
                )
            elif gpu is not None:
                prov["intra-node links"] = f"{gpu.name} NVLink data sheet"
        transfer = profile.model("transfer")
        if device == "gpu":
            prov["copies"] = "profile" if transfer else f"{gpu.name} PCIe data sheet"
        overlap: OverlapModel = profile.model("overlap")
        method = "thread" if "thread" in overlap.methods else "nbc"
        hidden = overlap.hidden_fraction(bucket_bytes, method)
        efficiency = float(np.clip(1.0 if hidden is None else hidden, 0.0, 1.0))
        overlap_ci = overlap_interval(overlap, bucket_bytes, method)
        prov["overlap"] = f"profile ({method} method, {bucket_bytes} B)"
        assumed = dict(ASSUMPTIONS if assumptions is None else assumptions)
        if device == "gpu" and node is not None:  # NCCL on its own stream, not the host's MPI
            nccl = assumed["nccl_overlap_efficiency"]
            efficiency, overlap_ci = nccl.value, Interval(nccl.low, nccl.high)
            prov["overlap"] = f"assumed: NCCL's stream beside backward hides {nccl.value:g}"
        jitter_model = profile.model("jitter") if profile.models.get("jitter") else None
        jitter = None
        if device == "gpu":
            prov["jitter"] = "none: GPU ranks (the profile's jitter is its host's)"
        elif jitter_model is not None:
            prov["jitter"] = "profile (every measured workload's steps pooled)"
            jitter = ProfileJitter(jitter_model)
        scale = StepScale.from_table(getattr(compute, "table_", []))
        compute_device = "gpu" if device == "gpu" and has_gpu_compute else "cpu"
        colocation = profile.model("colocation") if profile.models.get("colocation") else None
        straggler = pace = None
        if device == "cpu" and "stragglers" in corrections:
            straggler = node_straggler(colocation, ranks_per_node)
        if device == "cpu" and "pace" in corrections:
            pace = node_sharing.collective_pace(colocation, ranks_per_node, profile)
        if "colocation" not in corrections:
            colocation = None
        if device == "cpu" and ranks_per_node > 1:
            prov["co-location"] = colocation_source(colocation, workload or "", ranks_per_node)
        drift = profile.model("drift") if profile.models.get("drift") else None
        # the drift of the steps this prediction computes with: the host's, or the GPU steps'
        # where the profile timed the GPU (calibration.drift); a data sheet's GPU has none
        drifting = drift is not None and compute_device == device
        drift_sigma = drift.sigma_ if drifting and device == "cpu" else 0.0
        deviations = tuple(map(float, drift.log_deviations(device))) if drifting else ()
        level, levels = 1.0, {}
        if drifting:
            levels = {
                r: drift.step_level(r.model, r.batch, r.threads, r.device)
                for r in scale.steps
                if r.device == device
            }
        if levels:
            scale = scale.rescaled(lambda r: levels.get(r, 1.0))
            scale = scale.with_sigma(
                lambda r: _typical_sigma_s(drift, r) if r.device == device else None
            )
            scale = scale.with_forward(
                lambda r: drift.forward_fraction(r.model, r.batch, r.threads, r.device)
            )
        elif drifting and device == "cpu":
            level = float(np.exp(-drift.compute_log_offset_))
        if deviations:
            low, high = np.exp(np.quantile(deviations, [0.1, 0.9]))
            steps = "GPU steps" if device == "gpu" else "steps"
            prov["drift"] = (
                f"profile: {len(deviations)} moments of the same {steps}; measured compute "
                f"x{min(levels.values(), default=level):.3f}.."
                f"x{max(levels.values(), default=level):.3f} to the typical speed, band "
                f"x{low:.2f}..x{high:.2f} (P10..P90 of the moments)"
            )
        if kernels is not None:
            level = 1.0  # the kernel tables are the machine as swept: no step to rescale to
            terms = ", ".join(sorted(kernels.terms)) or "none"
            prov["compute"] = f"profile kernel tables (terms: {terms})"
        elif scale and (device == "cpu" or has_gpu_compute):
            prov["compute"] += "; " + scale.source(compute_device, workload, inference)
        return cls(
            compute, regimes, inter, source, transfer, gpu, device, mem_bw, jitter, efficiency,
            overlap_ci, prov, workload, ranks_per_node,
            scale, colocation, compression=profile.model("compression"), drift_sigma=drift_sigma,
            drift_log_deviations=deviations, drift_level=level,
            pins=OpPins.from_table(getattr(compute, "table_", [])), inference=inference,
            kernels=kernels, corrections=frozenset(corrections), description=description,
            assumptions=assumed,
            training=training or Training(), node=node if device == "gpu" else None,
            network=network,
            allgather_fit=(
                profile.model("collectives").models_.get("allgather") if device == "cpu" else None
            ),
            straggler=straggler, pace=pace,
        )  # fmt: skip

    # ------------------------------------------------------------------------ collectives
    def _regime(self, nbytes: float) -> CollectiveRegime:
        return self.intra_regimes[int(regime_indices(self.intra_regimes, nbytes))]

    def links(self, nbytes: float) -> dict[str, LinkCost]:
        """The link of each level for a collective of ``nbytes`` (the intra regime's size).
        GPU ranks in a described node: a GPU's port into its fabric at the fabric's ring
        efficiency (what one GPU moves to another, as point-to-point messages do)."""
        if self.device == "gpu" and self.node is not None:
            n = self.node
            reduce_bw = self.gpu.hbm_bandwidth_bytes_per_s / 3 if self.gpu else math.inf
            moved = n.gpu_link_bytes_per_s * self.assumed(f"{n.fabric}_ring_efficiency")
            intra = LinkCost(self.assumed("nvlink_latency_s"), moved, reduce_bw)
        elif self.device == "gpu" and self.gpu is not None:
            g = self.gpu
            intra = LinkCost(
                self.assumed("nvlink_latency_s"),
                g.nvlink_bytes_per_s / 2,
                g.hbm_bandwidth_bytes_per_s / 3,
            )
        else:
            regime = self._regime(nbytes)
            intra = LinkCost.from_alpha_beta(regime.a_s, max(regime.b_s_per_byte, 1e-15))
        out = {"intra": intra}
        if self.inter is not None:
            out["inter"] = self.inter
        return out

    def _nccl(self, op: str, nbytes: int, placement: Placement) -> Estimate | None:
        """GPU ranks in a described node: the collective as NCCL runs it
        (:mod:`pdlsim.sim.nccl`); None where it does not apply (CPU ranks, an op or a forced
        algorithm NCCL does not have)."""
        if self.node is None or op not in NCCL_OPS:
            return None
        if placement.algorithm is not None and placement.algorithm not in NCCL_ALGORITHMS:
            return None
        if placement.nodes > 1 and self.inter is None:
            raise ConfigError("GPU ranks on several nodes need a network (--network NAME)")
        network = self.network or NetworkPreset("none", 0.0, 1.0, "one node")
        if self.inter is not None:  # the figures a what-if or --inter-bw may have changed
            network = replace(
                network,
                latency_s=self.inter.latency_s,
                bandwidth_bytes_per_s=self.inter.bandwidth_bytes_per_s,
            )
        fabric = fabric_of(self.node, network, placement.nodes, placement.ranks_per_node)
        try:
            return estimate(op, nbytes, fabric, efficiencies(self.assumptions),
                            placement.algorithm)  # fmt: skip
        except ValueError as exc:
            raise ConfigError(f"--algorithm: {exc}") from None

    def _nccl_schedule(
        self, op: str, nbytes: int, placement: Placement
    ) -> tuple[str, tuple[TimedStep, ...]] | None:
        """:meth:`_nccl`'s collective named and as one timed step (none if it moves nothing)."""
        found = self._nccl(op, nbytes, placement)
        if found is None:
            return None
        name = f"nccl {found.label}"
        if found.time_s == 0.0:
            return name, ()
        level = "inter" if placement.nodes > 1 else "intra"
        return name, (TimedStep(Step(float(nbytes), level, phase=name), found.time_s),)

    def slice_copy_time(self, rows: int, run: int, threads: int, device: str) -> float:
        """CPU ranks with kernel tables: the ``copy_runs`` table's price; else 0 (no copy was
        timed)."""
        if self.kernels is None or device != "cpu":
            return 0.0
        return self.kernels.copy_s(rows, run, threads)

    def native_allgather(
        self, nbytes: int, placement: Placement
    ) -> tuple[str, tuple[TimedStep, ...]] | None:
        """GPU ranks in a described node gather as NCCL does, CPU ranks as the profile's
        allgather fit says (module docstring), each as one timed step; None else."""
        scheduled = self._nccl_schedule("allgather", nbytes, placement)
        if scheduled is not None:
            return scheduled
        fit = self.allgather_fit
        if fit is None or placement.ranks < 2:
            return None
        spans = placement.nodes > 1
        if spans and fit.inter_node is None and all(r.inter is None for r in fit.regimes_):
            return None
        if nbytes <= 0:
            return "allgather", ()
        block = nbytes / placement.ranks  # the benchmark's size: each rank's block
        seconds = float(fit.predict(block, placement.ranks, placement.ranks_per_node))
        name = f"allgather (measured: {fit.regime_for(block).algorithm})"
        level = "inter" if spans else "intra"
        step = TimedStep(Step(float(nbytes), level, phase=name), seconds)
        return name, node_sharing.paced((step,), self.pace, placement.ranks_per_node)

    def collective_name(self, op: str, nbytes: int, placement: Placement) -> str:
        scheduled = self._nccl_schedule(op, nbytes, placement)
        if scheduled is None:
            return super().collective_name(op, nbytes, placement)
        return scheduled[0]

    def collective_schedule(
        self, op: str, nbytes: int, ranks: int, placement: Placement
    ) -> tuple[TimedStep, ...]:
        if ranks != placement.ranks:
            raise ValueError(f"ranks {ranks} != placement's {placement.ranks}")
        scheduled = self._nccl_schedule(op, nbytes, placement)
        if scheduled is not None:
            return scheduled[1]
        _, steps = collectives.schedule(
            op, float(nbytes), placement.nodes, placement.ranks_per_node, placement.algorithm
        )
        links = self.links(nbytes)
        if any(s.level == "inter" for s in steps) and "inter" not in links:
            raise ConfigError(
                "the profile was measured on one node: give a network for the links between "
                "nodes (--network NAME or --inter-bw/--inter-lat)"
            )
        timed = tuple(TimedStep(s, links[s.level].step_time_s(s)) for s in steps)
        return node_sharing.paced(timed, self.pace, placement.ranks_per_node)

    def collective_time(self, op: str, nbytes: int, ranks: int, placement: Placement) -> float:
        return collectives.total_time_s(self.collective_schedule(op, nbytes, ranks, placement))

    # ----------------------------------------------------------------------------- copies
    def transfer_time(self, direction: str, nbytes: int, pinned: bool) -> float:
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"unknown copy direction '{direction}'")
        if nbytes <= 0:
            return 0.0
        if self.transfer is not None:
            try:
                return float(self.transfer.predict(direction, nbytes, pinned))
            except KeyError:
                pass
        if self.gpu is None:
            raise ConfigError("no transfer model in the profile and no GPU preset for copies")
        share = self.assumed("pinned_efficiency" if pinned else "pageable_efficiency")
        return self.assumed("copy_latency_s") + nbytes / (self.gpu.pcie_bytes_per_s * share)

    # ------------------------------------------------------------------------ uncertainty
    def perturbed(
        self, rng: np.random.Generator, stratum: tuple[int, int] | None = None
    ) -> ProfileCostModel:
        """A model with every fitted parameter drawn in its interval (module docstring);
        ``stratum`` (i, K): its drift from stratum i of K (``uncertainty.drift_draw``)."""
        return perturbed_cost(self, rng, stratum)

    # ------------------------------------------------------------------------ compression
    def compression_time(
        self, method: str, nbytes: int, phase: str = "round_trip", ranks: int = 1
    ) -> float:
        """Seconds a rank spends compressing (``phase="compress"``) a float32 gradient of
        ``nbytes`` by ``method`` (fp16, topk:F), expanding what ``ranks`` ranks sent
        (``"decompress"``) or both (``"round_trip"``): the profile's compression model on CPU
        ranks (ConfigError without one), a memory-bound data-sheet estimate on GPU ranks
        (:func:`pdlsim.costmodel.compression.compression_seconds`)."""
        from pdlsim.costmodel.compression import compression_seconds

        hbm = None
        if self.device == "gpu" and self.gpu is not None:
            hbm = self.gpu.hbm_bandwidth_bytes_per_s * self.assumed("gpu_memory_efficiency")
        return compression_seconds(
            self.compression, method, nbytes, phase, ranks, hbm, self.assumed("gpu_kernel_launch_s")
        )


def _typical_sigma_s(drift: Any, row: StepRow) -> float | None:
    """Seconds of the row's typical-time uncertainty (:meth:`DriftModel.typical_log_sigma`)."""
    sigma = drift.typical_log_sigma(row.model, row.batch, row.threads, row.device)
    return None if sigma is None else row.time_s * sigma
