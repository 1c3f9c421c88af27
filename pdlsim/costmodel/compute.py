"""Compute on a calibrated profile: what :class:`pdlsim.costmodel.model.ProfileCostModel` charges a
layer's forward, backward and update (the module docstring of :mod:`pdlsim.costmodel.model` gives
the model: roofline and thread scaling, op pins, the whole-step and forward-only rows, the gather,
co-location, a layer-wise rank's part and drift).

:class:`ComputeCost` is the compute half of that class, kept apart so that each file reads as
one subject; it uses the fields the cost model declares (``compute``, ``scale``, ``pins``,
``workload``, ``colocation``, the drift and band fields and the caches).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from microbench.op_records import LABEL_BYTES, layer_bytes
from microbench.workload import LOSS_KINDS, LayerInfo
from pdlsim.costmodel.kernels import sliced_layers
from pdlsim.costmodel.uncertainty import moved
from pdlsim.sim import ConfigError
from pdlsim.sim.cost import CostHooks

__all__ = ["ComputeCost"]

STEP = ("forward", "backward", "update")  # the phases of a training step


class ComputeCost(CostHooks):
    """Layer compute times of :class:`pdlsim.costmodel.model.ProfileCostModel` (module
    docstring)."""

    compute: Any
    gpu: Any
    scale: Any
    pins: Any
    colocation: Any
    workload: str | None
    ranks_per_node: int
    inference: bool
    step_z: float
    colocation_z: float
    drift_level: float
    drift_factor: float
    gpu_compute_factor: float  # a given single-GPU step over the modelled one
    gpu_layer_s: Any  # (layer name, phase) -> seconds measured on a GPU, or None
    tensor_ranks: int  # the ranks this model's dense layers are split over (1: whole layers)
    kernels: Any  # pdlsim.costmodel.kernels.KernelCompute, where the profile has kernel tables
    description: Any  # the workload itself, where the caller gave it
    training: Any  # pdlsim.costmodel.training.Training: precision and optimizer
    assumptions: Any  # name -> costmodel.presets.Assumption: figures taken where unmeasured
    _ops_cache: dict[tuple[Any, ...], float]
    _pin_cache: dict[tuple[str, str, int, int, str], float]
    _colocation_cache: dict[tuple[str, int, int], tuple[float, Any]]

    def assumed(self, name: str) -> float:
        """The value this model takes for assumption ``name``
        (:data:`pdlsim.costmodel.presets.ASSUMPTIONS`; the band draws it in its range)."""
        return float(self.assumptions[name].value)

    def _workload_layers(self, model: str | None = None) -> tuple[LayerInfo, ...]:
        """The layers of ``model`` (default: this model's workload); none if it cannot be
        loaded (a workload file not at hand: nothing is pinned or scaled from it)."""
        from microbench.workload import load_workload

        try:
            return tuple(load_workload(model or self.workload).layers)
        except Exception:  # noqa: BLE001 - see the docstring
            return ()

    def _ops_s(
        self, model: str, batch: int, threads: int, device: str, phases: tuple[str, ...] = STEP
    ) -> float:
        """Sum of the predicted (uncorrected) ops of one training step of preset ``model``
        (``phases``: of those phases only)."""
        key = (model, batch, threads, device, phases)
        if key not in self._ops_cache:
            layers = self._workload_layers(model)
            self._ops_cache[key] = self._layers_ops_s(layers, batch, threads, device, phases)
        return self._ops_cache[key]

    def _layers_ops_s(
        self,
        layers: tuple[LayerInfo, ...],
        batch: int,
        threads: int,
        device: str,
        phases: tuple[str, ...],
    ) -> float:
        return sum(
            self._raw_compute(layer, phase, batch, threads, device)
            for layer in layers
            for phase in phases
            if phase != "update" or layer.param_count > 0
        )

    def sliced(self, ranks: int) -> Any:
        """This model pricing each layer as one of ``ranks`` ranks' slices of a layer-wise
        step (the kernel tables price the calls a rank's slices make)."""
        return replace(self, tensor_ranks=ranks)  # type: ignore[type-var]

    def _forward_ops_s(self, model: str, batch: int, threads: int, device: str) -> float:
        """The forward-only step's predicted ops (the loss is a forward)."""
        return self._ops_s(model, batch, threads, device, ("forward",))

    def step_ratio(self, batch: int, threads: int, device: str = "cpu") -> float:
        """Measured step / predicted ops for this model's workload (:class:`StepScale`); of
        the forward-only step where this model predicts one (``inference``)."""
        forward = self._forward_ops_s if self.inference else None
        return self.scale.ratio(
            self._ops_s, device, self.workload, batch, threads, self.step_z, forward
        )

    def colocation_factor(self, threads: int) -> float:
        """Slowdown of a CPU rank's compute with ``ranks_per_node`` ranks busy on its node: the
        co-location model's."""
        if self.ranks_per_node <= 1:
            return 1.0
        if self.colocation is None:
            return 1.0
        key = (self.workload or "", threads, self.ranks_per_node)
        if key not in self._colocation_cache:  # a lookup per layer call otherwise: the same
            self._colocation_cache[key] = self.colocation.factor(*key)
        value, ci = self._colocation_cache[key]
        return moved(value, ci, self.colocation_z, 1.0)

    def compute_time(
        self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str
    ) -> float:
        if device == "cpu" and self.kernels is not None:
            workload = self.description
            if workload is None:
                raise ConfigError(
                    f"the workload {self.workload!r} is needed to price its kernel calls; "
                    "give the preset's name or the path of its JSON file"
                )
            layers = sliced_layers(workload, self.tensor_ranks)
            table = self.kernels.step_table(workload, layers, batch, threads, not self.inference)
            return table.get((layer.index, phase), 0.0) * self._host_factor(threads)
        if device == "gpu" and self.gpu_layer_s is not None:
            return self.gpu_layer_s.get((layer.name, phase), 0.0)
        raw = self._raw_compute(layer, phase, batch, threads, device)
        if device == "gpu":
            if "gpu" not in self.compute.devices:
                return raw * self.gpu_compute_factor
            # the GPU steps' typical speed is in their rows; the band's draw of their drift
            return (
                raw * self.step_ratio(batch, 1, "gpu") * self.drift_level * self.drift_factor
                * self.gpu_compute_factor
            )  # fmt: skip
        seconds = raw * self.step_ratio(batch, threads)
        if phase == "forward" and layer.index == 0:
            seconds += self._gather_s(layer, batch)
        return seconds * self._host_factor(threads)

    def _host_factor(self, threads: int) -> float:
        """What a CPU rank's compute is multiplied by: co-location, the typical speed's level
        and this band sample's drift."""
        return self.colocation_factor(threads) * self.drift_level * self.drift_factor

    def gather_s(self, first: LayerInfo, batch: int, threads: int) -> float:
        """Of a CPU rank's first-layer forward (``first``), the mini-batch gather's share,
        priced as :meth:`compute_time` prices it."""
        return self._gather_s(first, batch) * self._host_factor(threads)

    def _gather_s(self, first: LayerInfo, batch: int) -> float:
        return self.scale.data_time_s(
            self.workload, batch, first.input_bytes_per_sample + LABEL_BYTES
        )

    def _raw_compute(
        self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str
    ) -> float:
        """The layer's roofline time, pinned to its measured op where the profile has one."""
        seconds = self._roofline_compute(layer, phase, batch, threads, device)
        return seconds * self._pin(layer, phase, batch, threads, device) if seconds else seconds

    def _pin(self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str) -> float:
        """Measured op / roofline of its layers (:mod:`pdlsim.costmodel.oppins`); 1 where
        unmeasured."""
        found = self.pins.op_of(device, self.workload, layer.name, layer.kind, phase)
        if found is None:
            return 1.0
        op, table_phase, members = found
        key = (op, table_phase, batch, threads, device)
        if key not in self._pin_cache:
            layers = self._workload_layers()
            group = (
                [info for info in layers if info.param_count > 0]
                if table_phase == "update"
                else [info for info in layers if info.name in members]
            )

            def roofline_s(b: int, t: int) -> float:
                return sum(self._roofline_compute(info, phase, b, t, device) for info in group)

            self._pin_cache[key] = self.pins.factor(
                device, self.workload, op, table_phase, batch, threads, roofline_s
            )
        return self._pin_cache[key]

    def _roofline_compute(
        self, layer: LayerInfo, phase: str, batch: int, threads: int, device: str
    ) -> float:
        if phase == "update":
            flops, nbytes = self.training.update_cost(layer.param_count)
            kind, label = "sgd", "update"
        elif phase in ("forward", "backward"):
            if layer.kind == "flatten":
                return 0.0
            flops = (
                layer.forward_flops_per_sample
                if phase == "forward"
                else layer.backward_flops_per_sample
            ) * batch
            # 16-bit values in mixed precision: half the bytes of each value moved
            nbytes = layer_bytes(layer, phase, batch) * self.training.value_bytes // 4
            kind = layer.kind
            label = "loss" if kind in LOSS_KINDS else phase
        else:
            raise ValueError(f"unknown phase '{phase}'")
        if device == "gpu" and "gpu" not in self.compute.devices:
            if self.gpu is None:
                raise ConfigError("GPU ranks need a GPU compute model or a GPU preset")
            g = self.gpu
            busy = max(
                flops / (self.training.peak_flops_per_s(g) * self.assumed("gpu_flops_efficiency")),
                nbytes / (g.hbm_bandwidth_bytes_per_s * self.assumed("gpu_memory_efficiency")),
            )
            return self.assumed("gpu_kernel_launch_s") + busy
        used = 1 if device == "gpu" else threads
        return float(self.compute.predict(flops, nbytes, used, device, kind, label))
