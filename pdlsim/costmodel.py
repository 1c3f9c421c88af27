"""The simulator's cost interface answered from a calibrated profile (plus presets where needed).

:class:`ProfileCostModel` implements :class:`pdlsim.sim.CostModel`:

* **Compute.** A layer's FLOPs and bytes (:func:`microbench.network_ops.layer_bytes`, the same
  byte estimate the compute benchmark records) at the batch go through the profile's fitted
  roofline of its op class (``dense:forward``, ``conv2d:backward``, ``softmax_cross_entropy:loss``,
  ``sgd:update``; pooled where a class was not measured) and thread-scaling law. A flatten is a
  view and costs nothing. GPU ranks use the profile's GPU curves when it has them, else the GPU
  preset's data-sheet roofline: FLOPs / (FP32 non-tensor peak x :data:`GPU_FLOPS_EFFICIENCY`)
  or bytes / (HBM x :data:`GPU_MEMORY_EFFICIENCY`), whichever is longer, plus a kernel launch
  (:data:`GPU_KERNEL_LAUNCH_S`). These three are **assumptions**, not data-sheet figures.
* **Collectives.** The simulator's algorithm steps (:func:`pdlsim.sim.collectives.schedule`),
  each timed on its level's :class:`~pdlsim.sim.LinkCost`, so the schedule sums to
  ``collective_time`` by construction. CPU ranks inside a node: the profile's allreduce alpha and
  beta of the size regime the message falls in (the fitted beta absorbs the reduction, so no
  gamma). GPU ranks inside a node: NVLink, half the preset's bidirectional figure per direction,
  :data:`NVLINK_LATENCY_S` assumed. Across nodes: the network (a preset or given numbers), or the
  profile's fitted inter-node parameters when it has them and no network is given; the receiver
  reduces at a third of its memory bandwidth (two reads, one write per byte): the profile's
  triad bandwidth for CPU ranks, the preset's HBM for GPU ranks.
* **Whole-step correction.** Ops timed one at a time add up to less than the same ops run back
  to back as one training step (caches and allocator state differ). Where the profile's compute
  table holds whole-step rows (phase ``step``, per model, batch and threads, measured by the
  compute microbenchmark), the compute time is multiplied by the median, per thread count, of
  measured step / sum of this model's predicted ops for that step (:meth:`step_ratios`; the
  nearest measured thread count below otherwise). No step rows: no correction.
* **Copies.** The profile's transfer model, else the preset's PCIe per-direction rate times
  :data:`PINNED_EFFICIENCY` or :data:`PAGEABLE_EFFICIENCY` plus :data:`COPY_LATENCY_S` (assumed).
* **Jitter.** The profile's :class:`calibration.jitter.JitterModel` behind the simulator's
  ``Jitter`` protocol (:class:`ProfileJitter`).
* **Overlap efficiency.** The profile's measured hidden fraction of an allreduce of the bucket
  size behind computation, thread method (a communication thread, as in the hybrid trainer;
  ``nbc`` if only that was measured). It was measured on the host; GPU ranks use it as well.

:meth:`ProfileCostModel.perturbed` draws every fitted parameter from a normal distribution
centred on the fitted value whose 95% interval has the width of the fitted interval
(sigma = width / 3.92), clipped at 0 (rates and efficiencies at 1% of the fitted value, so that
nothing divides by zero; the overlap efficiency at 1). Data-sheet figures and assumptions are
not perturbed: they have no interval.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from calibration.collective_regimes import CollectiveRegime
from calibration.compute import ComputeModel
from calibration.jitter import FAMILIES, JitterModel
from calibration.overlap import OverlapModel
from calibration.profile import Profile
from calibration.roofline import SCALARS, Roofline
from calibration.stats import Interval
from calibration.transfer import TransferModel
from microbench.network_ops import layer_bytes, update_cost
from microbench.workload import LayerInfo
from pdlsim.presets import GpuPreset, NetworkPreset
from pdlsim.sim import ConfigError, LinkCost, Placement, TimedStep, collectives

__all__ = [
    "COPY_LATENCY_S",
    "GPU_FLOPS_EFFICIENCY",
    "GPU_KERNEL_LAUNCH_S",
    "GPU_MEMORY_EFFICIENCY",
    "NVLINK_LATENCY_S",
    "PAGEABLE_EFFICIENCY",
    "PINNED_EFFICIENCY",
    "ProfileCostModel",
    "ProfileJitter",
]

# Assumptions used with data-sheet presets (documented above; not measured, not data sheet).
GPU_FLOPS_EFFICIENCY = 0.5  # of FP32 non-tensor peak reached by a training layer's kernels
GPU_MEMORY_EFFICIENCY = 0.8  # of HBM bandwidth reached by a memory-bound kernel
GPU_KERNEL_LAUNCH_S = 5e-6  # per layer per phase
NVLINK_LATENCY_S = 2e-6
COPY_LATENCY_S = 10e-6
PINNED_EFFICIENCY = 0.8  # of the PCIe per-direction rate
PAGEABLE_EFFICIENCY = 0.4  # staged through a pinned driver buffer
_Z95 = 1.959963984540054
_COLLECTIVE_OPS = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "pingpong")


def _draw(rng: np.random.Generator, value: float, ci: Interval | None, floor: float = 0.0):
    if ci is None or not ci.high > ci.low:
        return value
    return max(float(rng.normal(value, (ci.high - ci.low) / (2 * _Z95))), floor)


@dataclass(frozen=True, eq=False)
class ProfileJitter:
    """A fitted :class:`JitterModel` as the simulator's ``Jitter`` (plus ``ppf``/``isf``, so the
    slowest of P is drawn exactly from the fitted family)."""

    model: JitterModel

    def _dist(self) -> Any:
        dist, fixed, names = FAMILIES[self.model.family_]
        p = self.model.params_
        if self.model.family_ == "normal":
            return dist(loc=p["loc"], scale=p["scale"])
        return dist(p[names[0]], loc=fixed["floc"], scale=p["scale"])

    def sample(self, rng: np.random.Generator, size: Any) -> np.ndarray:
        return np.asarray(self.model.sample(rng, size), dtype=float)

    def ppf(self, q: Any) -> np.ndarray:
        return self._dist().ppf(q)

    def isf(self, tail: Any) -> np.ndarray:
        return self._dist().isf(tail)

    def expected_max_factor(self, ranks: int) -> float:
        return float(self.model.expected_max_factor(int(ranks)))

    def perturbed(self, rng: np.random.Generator) -> ProfileJitter:
        """Family parameters drawn in their intervals; the empirical atoms follow by quantile."""
        new = copy.copy(self.model)
        new.params_ = {
            k: _draw(rng, v, self.model.intervals_.get(k), 0.01 * abs(v))
            for k, v in self.model.params_.items()
        }
        old_cdf = self._dist().cdf(self.model.atoms_)
        moved = ProfileJitter(new)._dist().ppf(np.clip(old_cdf, 1e-12, 1 - 1e-12))
        new.atoms_ = np.sort(np.asarray(moved, dtype=float))
        return ProfileJitter(new)


def _intra_regimes(profile: Profile) -> tuple[CollectiveRegime, ...]:
    models = profile.model("collectives").models_
    op = next((o for o in _COLLECTIVE_OPS if o in models), None) or next(iter(models))
    return tuple(models[op].regimes_)


def _overlap_interval(model: OverlapModel, nbytes: int, method: str) -> Interval | None:
    points = [p for p in model.points_ if p.method == method and "overlap_fraction" in p.intervals]
    if not points:
        return None
    size = min({p.bytes for p in points}, key=lambda b: abs(np.log(max(b, 1) / max(nbytes, 1))))
    near = [p.intervals["overlap_fraction"] for p in points if p.bytes == size]
    return Interval(
        float(np.median([i.low for i in near])), float(np.median([i.high for i in near]))
    )


@dataclass(frozen=True, eq=False)
class ProfileCostModel:
    """The sim's ``CostModel`` from a profile (see the module docstring). Build with
    :meth:`from_profile`; ``device`` is the kind of the ranks the collectives run between."""

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
    step_ratio: dict[tuple[str, int], float] = field(default_factory=dict)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        network: NetworkPreset | None = None,
        gpu: GpuPreset | None = None,
        device: str = "cpu",
        bucket_bytes: int = 25 * 2**20,
    ) -> ProfileCostModel:
        compute = profile.model("compute")
        regimes = _intra_regimes(profile)
        cpu_curves = [r for (d, _), r in sorted(compute.curves_.items()) if d == "cpu"]
        mem_bw = cpu_curves[0].bandwidth_bytes_per_s if cpu_curves else 10e9
        reduce_bw = (gpu.hbm_bandwidth_bytes_per_s if device == "gpu" and gpu else mem_bw) / 3
        prov = {"compute": "profile", "intra-node links": "profile (allreduce alpha/beta)"}
        inter, source = None, "none"
        fitted = next((r.inter for r in regimes if r.inter is not None), None)
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
            prov["compute"] = "profile (gpu)" if has_gpu_compute else f"{gpu.name} data sheet"
            if gpu is not None:
                prov["intra-node links"] = f"{gpu.name} NVLink data sheet"
        transfer = profile.model("transfer")
        if device == "gpu":
            prov["copies"] = "profile" if transfer else f"{gpu.name} PCIe data sheet"
        overlap: OverlapModel = profile.model("overlap")
        method = "thread" if "thread" in overlap.methods else "nbc"
        hidden = overlap.hidden_fraction(bucket_bytes, method)
        efficiency = float(np.clip(1.0 if hidden is None else hidden, 0.0, 1.0))
        prov["overlap"] = f"profile ({method} method, {bucket_bytes} B)"
        jitter_doc = profile.models.get("jitter")
        jitter = ProfileJitter(profile.model("jitter")) if jitter_doc else None
        model = cls(
            compute, regimes, inter, source, transfer, gpu, device, mem_bw, jitter, efficiency,
            _overlap_interval(overlap, bucket_bytes, method), prov,
        )  # fmt: skip
        ratios = model.step_ratios()
        if ratios:
            prov["compute"] += " x whole-step/sum-of-ops " + ", ".join(
                f"{d} T{t} {r:.3f}" for (d, t), r in sorted(ratios.items())
            )
        return replace(model, step_ratio=ratios)

    def step_ratios(self) -> dict[tuple[str, int], float]:
        """Median over the profile's whole-step rows of measured step / sum of predicted ops,
        per (device, threads); rows of a model that is not a preset workload are skipped."""
        from microbench.workload import load_workload

        found: dict[tuple[str, int], list[float]] = {}
        for e in getattr(self.compute, "table_", []):
            if e.phase != "step" or e.device not in self.compute.devices:
                continue
            try:
                layers = load_workload(e.model).layers
            except Exception:  # noqa: BLE001 - a workload file not at hand: no ratio from it
                continue
            ops = sum(
                self._raw_compute(layer, phase, e.batch, e.threads, e.device)
                for layer in layers
                for phase in ("forward", "backward", "update")
                if phase != "update" or layer.param_count > 0
            )
            if ops > 0:
                found.setdefault((e.device, e.threads), []).append(e.time_s / ops)
        return {k: float(np.median(v)) for k, v in found.items()}

    def _step_factor(self, device: str, threads: int) -> float:
        have = [t for d, t in self.step_ratio if d == device]
        if not have:
            return 1.0
        below = [t for t in have if t <= threads]
        return self.step_ratio[(device, max(below) if below else min(have))]

    # ---------------------------------------------------------------------------- compute
    def compute_time(
        self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str
    ) -> float:
        raw = self._raw_compute(layer, phase, batch, threads, device)
        if device == "gpu" and "gpu" not in self.compute.devices:
            return raw
        return raw * self._step_factor(device, 1 if device == "gpu" else threads)

    def _raw_compute(
        self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str
    ) -> float:
        if phase == "update":
            flops, nbytes = update_cost(layer.param_count, 0.0)
            kind, label = "sgd", "update"
        elif phase in ("forward", "backward"):
            if layer.kind == "flatten":
                return 0.0
            flops = (
                layer.forward_flops_per_sample
                if phase == "forward"
                else layer.backward_flops_per_sample
            ) * batch
            nbytes = layer_bytes(layer, phase, batch)
            kind = layer.kind
            label = "loss" if kind == "softmax_cross_entropy" else phase
        else:
            raise ValueError(f"unknown phase '{phase}'")
        if device == "gpu" and "gpu" not in self.compute.devices:
            if self.gpu is None:
                raise ConfigError("GPU ranks need a GPU compute model or a GPU preset")
            g = self.gpu
            busy = max(
                flops / (g.fp32_flops_per_s * GPU_FLOPS_EFFICIENCY),
                nbytes / (g.hbm_bandwidth_bytes_per_s * GPU_MEMORY_EFFICIENCY),
            )
            return GPU_KERNEL_LAUNCH_S + busy
        used = 1 if device == "gpu" else threads
        return float(self.compute.predict(flops, nbytes, used, device, kind, label))

    # ------------------------------------------------------------------------ collectives
    def _regime(self, nbytes: float) -> CollectiveRegime:
        r = self.intra_regimes
        switches = [np.sqrt(a.max_bytes * b.min_bytes) for a, b in zip(r[:-1], r[1:], strict=True)]
        return r[int(np.searchsorted(switches, nbytes, side="right"))]

    def links(self, nbytes: float) -> dict[str, LinkCost]:
        """The link of each level for a collective of ``nbytes`` (the intra regime's size)."""
        if self.device == "gpu" and self.gpu is not None:
            g = self.gpu
            intra = LinkCost(
                NVLINK_LATENCY_S, g.nvlink_bytes_per_s / 2, g.hbm_bandwidth_bytes_per_s / 3
            )
        else:
            regime = self._regime(nbytes)
            intra = LinkCost.from_alpha_beta(regime.a_s, max(regime.b_s_per_byte, 1e-15))
        out = {"intra": intra}
        if self.inter is not None:
            out["inter"] = self.inter
        return out

    def collective_schedule(
        self, op: str, nbytes: int, ranks: int, placement: Placement
    ) -> tuple[TimedStep, ...]:
        if ranks != placement.ranks:
            raise ValueError(f"ranks {ranks} != placement's {placement.ranks}")
        _, steps = collectives.schedule(
            op, float(nbytes), placement.nodes, placement.ranks_per_node, placement.algorithm
        )
        links = self.links(nbytes)
        if any(s.level == "inter" for s in steps) and "inter" not in links:
            raise ConfigError(
                "the profile was measured on one node: give a network for the links between "
                "nodes (--network NAME or --inter-bw/--inter-lat)"
            )
        return tuple(TimedStep(s, links[s.level].step_time_s(s)) for s in steps)

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
        share = PINNED_EFFICIENCY if pinned else PAGEABLE_EFFICIENCY
        return COPY_LATENCY_S + nbytes / (self.gpu.pcie_bytes_per_s * share)

    # ------------------------------------------------------------------------ uncertainty
    def perturbed(self, rng: np.random.Generator) -> ProfileCostModel:
        """A model with every fitted parameter drawn in its interval (module docstring)."""
        compute = copy.copy(self.compute)
        compute.curves_ = {}
        for key, roof in self.compute.curves_.items():
            found = self.compute.intervals_.get(key, {})
            scalars = {k: Interval.from_dict(v) for k, v in found.get("scalars", {}).items()}
            values = {}
            for k in SCALARS:
                value = getattr(roof, k)
                floor = 0.0 if k == "overhead_s" else 0.01 * value
                values[k] = _draw(rng, value, scalars.get(k), floor)
            classes = {}
            for name, (e, h) in roof.classes.items():
                ci = found.get("classes", {}).get(name, {})
                e_ci, h_ci = (
                    Interval.from_dict(ci[k]) if k in ci else None
                    for k in ("efficiency_max", "half_efficiency_flops")
                )
                classes[name] = (_draw(rng, e, e_ci, 0.01 * e), _draw(rng, h, h_ci))
            compute.curves_[key] = Roofline(**values, classes=classes)
        regimes = tuple(
            replace(
                r,
                a_s=_draw(rng, r.a_s, r.intervals.get("a_s")),
                b_s_per_byte=_draw(rng, r.b_s_per_byte, r.intervals.get("b_s_per_byte")),
            )
            for r in self.intra_regimes
        )
        transfer = None
        if self.transfer is not None:
            transfer = copy.copy(self.transfer)
            transfer.curves_ = {}
            for key, curve in self.transfer.curves_.items():
                new = copy.copy(curve)
                new.regimes_ = [
                    replace(
                        r,
                        alpha_s=_draw(rng, r.alpha_s, r.alpha_ci),
                        beta_s_per_byte=_draw(rng, r.beta_s_per_byte, r.beta_ci),
                    )
                    for r in curve.regimes_
                ]
                transfer.curves_[key] = new
        efficiency = min(1.0, _draw(rng, self.overlap_efficiency, self.overlap_interval))
        jitter = None if self.jitter is None else self.jitter.perturbed(rng)
        return replace(
            self,
            compute=compute,
            intra_regimes=regimes,
            transfer=transfer,
            jitter=jitter,
            overlap_efficiency=efficiency,
        )
