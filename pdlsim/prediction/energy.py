"""Energy of training: joules per step, per epoch and per sample from a power model.

The power model (:class:`PowerModel`) gives idle and busy watts per CPU socket and per GPU, the
node's sockets and cores, and a constant for the rest of the node. It comes from a preset
(:data:`POWER_PRESETS`, data-sheet TDPs with stated assumptions for idle), from the user
(``--cpu-watts``, ``--gpu-watts``, ``--node-other-watts``, ``--cpu-sockets``), or both.

What one node draws during one synchronous step of ``step_s`` seconds (all nodes alike):

- **CPU**: ``sockets x idle_w x step_s + (busy_w - idle_w) / cores_per_socket x busy
  core-seconds``: dynamic power is linear in busy cores (an assumption: turbo makes the first
  cores of a socket dearer than the last), capped at every core busy the whole step. Busy
  core-seconds per CPU rank: ``threads x compute_s`` while it computes, plus **one core for the
  rest of the step**: MPI waits by polling, so the rank's main thread spins through its exposed
  communication and its wait for the slowest rank. Per GPU rank: one host core the whole step
  (kernel launches, synchronisation spin-waits, MPI progress).
- **GPU**: ``idle_w x step_s + (busy_w - idle_w) x busy_s`` per GPU (that is busy_s at busy_w,
  the rest at idle_w), busy_s = the compute time less the wait for the mini-batch copy.
  Communication does not count as GPU-busy (NCCL kernels draw far below TDP).
- **Other** (memory, NICs, fans, storage, power-supply losses): ``node_other_w x step_s``; 0 in
  the presets, which do not know it.

Energy per step = nodes x the node's; per epoch = steps per epoch x per step; per sample = per
epoch / dataset samples. Busy at TDP is an upper bound for a well-fed chip: real training draws
less, so these are estimates with the presets' uncertainty, not measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from microbench.errors import UserError, shown_text

__all__ = [
    "POWER_PRESETS",
    "PowerModel",
    "StepActivity",
    "energy_for_prediction",
    "estimate_energy",
    "format_energy",
    "power_model_for",
    "power_preset",
]

CPU_POWER_PRESET = "cpu-2s"
IDLE_ASSUMPTION = "idle 30% of TDP is an assumption"
GPU_IDLE_SHARE = 0.1  # a GPU's idle draw over its board power, as nvidia-smi typically shows


@dataclass(frozen=True)
class PowerModel:
    """Idle and busy watts per CPU socket and per GPU; the node's sockets and cores."""

    cpu_idle_w_per_socket: float
    cpu_busy_w_per_socket: float
    sockets_per_node: int
    cores_per_socket: int
    gpu_idle_w: float = 0.0
    gpu_busy_w: float = 0.0
    node_other_w: float = 0.0
    name: str = "given"
    cpu_source: str = "given"
    gpu_source: str = "given"
    other_source: str = "not modelled: memory, NICs, fans, power-supply losses"

    def __post_init__(self) -> None:
        for what, idle, busy in (
            ("CPU", self.cpu_idle_w_per_socket, self.cpu_busy_w_per_socket),
            ("GPU", self.gpu_idle_w, self.gpu_busy_w),
        ):
            if not (0 <= idle <= busy < float("inf")):
                raise UserError(
                    f"power model '{self.name}': {what} watts must satisfy 0 <= idle <= busy, "
                    f"got idle {idle}, busy {busy}"
                )
        if self.sockets_per_node < 1 or self.cores_per_socket < 1:
            raise UserError(
                f"power model '{self.name}': need at least 1 socket and 1 core per socket, got "
                f"{self.sockets_per_node}x{self.cores_per_socket}"
            )
        if not 0 <= self.node_other_w < float("inf"):
            raise UserError(f"node other watts must be >= 0, got {self.node_other_w}")

    def source(self, device: str) -> str:
        """Where the figures a ``device`` ("cpu"/"gpu") run uses came from."""
        cpu = (
            f"CPU {self.sockets_per_node} x {self.cores_per_socket} cores, "
            f"{self.cpu_idle_w_per_socket:g}/{self.cpu_busy_w_per_socket:g} W idle/busy per "
            f"socket ({self.cpu_source})"
        )
        parts = [f"{self.name}: {cpu}"]
        if device == "gpu":
            parts.append(
                f"GPU {self.gpu_idle_w:g}/{self.gpu_busy_w:g} W idle/busy ({self.gpu_source})"
            )
        parts.append(f"other {self.node_other_w:g} W per node ({self.other_source})")
        return "; ".join(parts)


def _preset(name: str, cpu: tuple, gpu: tuple | None = None) -> PowerModel:
    """A preset from (model, sockets, cores, TDP W, source) and (idle W, TDP W, source)."""
    cpu_model, sockets, cores, tdp_w, cpu_sheet = cpu
    gpu_idle, gpu_tdp, gpu_sheet = gpu or (0.0, 0.0, "no GPU")
    return PowerModel(
        cpu_idle_w_per_socket=round(0.3 * tdp_w, 6),
        cpu_busy_w_per_socket=tdp_w,
        sockets_per_node=sockets,
        cores_per_socket=cores,
        gpu_idle_w=gpu_idle,
        gpu_busy_w=gpu_tdp,
        name=name,
        cpu_source=f"{sockets} x {cpu_model}, data sheet: {cpu_sheet}; busy = TDP, "
        + IDLE_ASSUMPTION,
        gpu_source=gpu_sheet,
    )


POWER_PRESETS: dict[str, PowerModel] = {
    p.name: p
    for p in (
        _preset(
            CPU_POWER_PRESET,
            ("Intel Xeon Platinum 8380", 2, 40, 270.0, "Intel ARK: 40 cores, TDP 270 W"),
        ),
        _preset(
            "h100-sxm",
            (
                "Intel Xeon Platinum 8480C (DGX H100 host)",
                2,
                56,
                350.0,
                "NVIDIA DGX H100 data sheet: 2 x 8480C, 112 cores; Intel ARK 8480+: TDP 350 W",
            ),
            (
                70.0,
                700.0,
                "NVIDIA H100 SXM5 data sheet: max TDP 700 W; idle 70 W is an "
                "assumption (10% of TDP, what nvidia-smi typically shows)",
            ),
        ),  # fmt: skip
        _preset(
            "a100-sxm",
            (
                "AMD EPYC 7742 (DGX A100 host)",
                2,
                64,
                225.0,
                "NVIDIA DGX A100 data sheet: 2 x EPYC 7742, 128 cores; AMD: TDP 225 W",
            ),
            (
                50.0,
                400.0,
                "NVIDIA A100 80GB SXM4 data sheet: max TDP 400 W; idle 50 W is an assumption",
            ),
        ),  # fmt: skip
        _preset(
            "v100",
            (
                "Intel Xeon E5-2698 v4 (DGX-1 host)",
                2,
                20,
                135.0,
                "NVIDIA DGX-1 data sheet: 2 x E5-2698 v4; Intel ARK: 20 cores, TDP 135 W",
            ),
            (
                40.0,
                300.0,
                "NVIDIA Tesla V100 SXM2 data sheet: max 300 W; idle 40 W is an assumption",
            ),
        ),  # fmt: skip
    )
}


def power_preset(name: str) -> PowerModel:
    if name not in POWER_PRESETS:
        raise UserError(
            f"unknown power preset '{shown_text(name)}'; known: {', '.join(POWER_PRESETS)}"
        )
    return POWER_PRESETS[name]


def _namesake(gpu_preset: str | None) -> str:
    """The power preset of a GPU preset: its own name, else that of the part it is a memory
    variant of (``a100-sxm-40gb`` -> ``a100-sxm``, ``v100-16gb`` -> ``v100``: the same board
    power, 400 and 300 W), else ``h100-sxm``."""
    if gpu_preset in POWER_PRESETS:
        return gpu_preset
    parts = [p for p in POWER_PRESETS if gpu_preset and gpu_preset.startswith(p + "-")]
    return max(parts, key=len) if parts else "h100-sxm"


def power_model_for(
    gpus: int = 0,
    gpu_preset: str | None = None,
    power_preset_name: str | None = None,
    cpu_watts: tuple[float, float] | None = None,
    gpu_watts: tuple[float, float] | None = None,
    node_other_watts: float | None = None,
    cpu_sockets: tuple[int, int] | None = None,
    board_power_w: float = 0.0,
) -> PowerModel:
    """The preset (by name; else the GPU preset's namesake node for GPU runs, ``cpu-2s`` for
    CPU runs, ``h100-sxm``'s host for a GPU with no power preset), then the user's overrides.
    ``board_power_w``, the GPU's data-sheet power where its description gives it, sets the GPU's
    busy watts when no preset was named: a GPU without a power preset of its own draws its own
    board power, not the fallback host's GPU's."""
    named = power_preset_name is not None
    if power_preset_name is None:
        power_preset_name = _namesake(gpu_preset) if gpus > 0 else CPU_POWER_PRESET
    model = power_preset(power_preset_name)
    if gpus > 0 and not named and board_power_w > 0 and board_power_w != model.gpu_busy_w:
        model = replace(
            model,
            name=f"{model.name} host, {gpu_preset} GPU",
            gpu_idle_w=GPU_IDLE_SHARE * board_power_w,
            gpu_busy_w=board_power_w,
            gpu_source=f"{gpu_preset}: data-sheet board power {board_power_w:g} W (its GPU "
            f"description); idle {GPU_IDLE_SHARE:.0%} of it is an assumption",
        )
    given: dict[str, Any] = {}
    if cpu_watts is not None:
        given.update(cpu_idle_w_per_socket=cpu_watts[0], cpu_busy_w_per_socket=cpu_watts[1])
        given["cpu_source"] = "given: --cpu-watts"
    if cpu_sockets is not None:
        given.update(sockets_per_node=cpu_sockets[0], cores_per_socket=cpu_sockets[1])
        cpu_source = given.get("cpu_source", model.cpu_source)
        given["cpu_source"] = cpu_source + "; sockets x cores given: --cpu-sockets"
    if gpu_watts is not None:
        given.update(gpu_idle_w=gpu_watts[0], gpu_busy_w=gpu_watts[1])
        given["gpu_source"] = "given: --gpu-watts"
    if node_other_watts is not None:
        given.update(node_other_w=node_other_watts, other_source="given: --node-other-watts")
    if given:
        given["name"] = f"{model.name} with given figures"
    return replace(model, **given)


@dataclass(frozen=True)
class StepActivity:
    """What one node's devices do during one synchronous step (every node alike).

    ``compute_s``: per rank, the time it computes; ``gpu_busy_s``: per GPU, the time its GPU
    computes (``compute_s`` when None).
    """

    step_s: float
    compute_s: float
    nodes: int
    ranks_per_node: int
    threads_per_rank: int
    device: str  # "cpu" or "gpu"
    gpu_busy_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.step_s > 0 and 0 <= self.compute_s <= self.step_s * (1 + 1e-9)):
            raise ValueError(
                f"need step_s > 0 and 0 <= compute_s <= step_s, got {self.step_s}, {self.compute_s}"
            )
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {self.device!r}")
        if min(self.nodes, self.ranks_per_node, self.threads_per_rank) < 1:
            raise ValueError("nodes, ranks per node and threads per rank must be >= 1")

    @classmethod
    def from_phases(
        cls,
        phases_s: Mapping[str, float],
        step_s: float,
        ranks_per_node: int,
        threads_per_rank: int = 1,
        device: str = "cpu",
        nodes: int = 1,
    ) -> StepActivity:
        """From measured per-phase seconds (``pdlsim train``: data, h2d, forward, backward,
        wait, allreduce, update): forward + backward + update compute, the rest does not."""
        compute = sum(phases_s.get(p, 0.0) for p in ("forward", "backward", "update"))
        return cls(step_s, min(compute, step_s), nodes, ranks_per_node, threads_per_rank, device)


def estimate_energy(
    activity: StepActivity,
    power: PowerModel,
    steps_per_epoch: float,
    dataset_samples: int,
) -> dict[str, Any]:
    """Joules per step (all nodes), per epoch and per sample; the node's average watts; the
    split by part (per node and step); the power model and its source. See the module
    docstring for the model."""
    a, p = activity, power
    step = a.step_s
    cores = p.sockets_per_node * p.cores_per_socket
    if a.device == "cpu":
        per_rank = a.threads_per_rank * a.compute_s + (step - a.compute_s)
        gpus, gpu_busy_s = 0, 0.0
    else:
        per_rank = step
        gpus, gpu_busy_s = a.ranks_per_node, a.compute_s if a.gpu_busy_s is None else a.gpu_busy_s
    busy_core_s = min(a.ranks_per_node * per_rank, cores * step)
    dynamic_w_per_core = (p.cpu_busy_w_per_socket - p.cpu_idle_w_per_socket) / p.cores_per_socket
    cpu_j = p.sockets_per_node * p.cpu_idle_w_per_socket * step + dynamic_w_per_core * busy_core_s
    gpu_j = gpus * (p.gpu_idle_w * step + (p.gpu_busy_w - p.gpu_idle_w) * gpu_busy_s)
    other_j = p.node_other_w * step
    node_j = cpu_j + gpu_j + other_j
    epoch_j = steps_per_epoch * a.nodes * node_j
    return {
        "joules_per_step": a.nodes * node_j,
        "joules_per_epoch": epoch_j,
        "joules_per_sample": epoch_j / dataset_samples,
        "average_watts_per_node": node_j / step,
        "node_joules_per_step": {"cpu": cpu_j, "gpu": gpu_j, "other": other_j},
        "busy_core_seconds_per_step": busy_core_s,
        "gpu_busy_s_per_step": gpu_busy_s,
        "steps_per_epoch": steps_per_epoch,
        "dataset_samples": dataset_samples,
        "power_model": asdict(p),
        "source": p.source(a.device),
    }


def energy_for_prediction(cfg: Any, out: Mapping[str, Any], gpu: Any = None) -> dict[str, Any]:
    """:func:`estimate_energy` of a ``pdlsim predict`` result ``out`` of config ``cfg``, whose
    GPU ranks ran on ``gpu`` (the :class:`GpuPreset` the prediction resolved; None: the
    profile's measured GPU, no data sheet)."""
    gpus = getattr(cfg, "gpus", 0)
    gpu_name = getattr(cfg, "gpu_preset", None)
    board_power_w = 0.0
    if gpus and gpu is not None:
        gpu_name = gpu_name or gpu.name  # the node's GPU when none was named
        board_power_w = gpu.board_power_w
    model = power_model_for(
        gpus,
        gpu_name,
        getattr(cfg, "power_preset", None),
        getattr(cfg, "cpu_watts", None),
        getattr(cfg, "gpu_watts", None),
        getattr(cfg, "node_other_watts", None),
        getattr(cfg, "cpu_sockets", None),
        board_power_w,
    )
    step = out["step_time_s"]
    utilisation = out.get("gpu_utilization")
    activity = StepActivity(
        step_s=step,
        compute_s=min(out["breakdown"]["compute_s"], step),
        nodes=cfg.nodes,
        ranks_per_node=gpus if gpus > 0 else cfg.procs_per_node,
        threads_per_rank=1 if gpus > 0 else cfg.threads,
        device="gpu" if gpus > 0 else "cpu",
        gpu_busy_s=utilisation * step if gpus > 0 and utilisation is not None else None,
    )
    steps = out["epoch_time_s"] / step
    return estimate_energy(activity, model, steps, out["dataset_samples"])


def format_energy(energy: Mapping[str, Any]) -> str:
    """One line: J/step (all nodes), kJ/epoch, mJ/sample, average W per node, the model."""
    return (
        f"energy           {energy['joules_per_step']:.4g} J/step, "
        f"{energy['joules_per_epoch'] / 1e3:.4g} kJ/epoch, "
        f"{energy['joules_per_sample'] * 1e3:.4g} mJ/sample, "
        f"{energy['average_watts_per_node']:.0f} W/node (power model: "
        f"{energy['power_model']['name']}; estimate, see sources)"
    )
