"""How a job trains: its numeric precision and its optimizer, as they set compute rates, bytes
on the wire and memory per rank.

Precisions (``--precision``):

* ``fp32``: float32 everywhere, on the GPU's plain FP32 units (the data sheet's FP32 peak);
* ``tf32``: float32 values, products on the tensor cores in TF32 (its TF32 peak; GPUs from
  Ampere on);
* ``bf16``, ``fp16``: mixed precision as Megatron-LM and DeepSpeed train: 16-bit weights,
  activations and gradients (so the allreduce moves 2 bytes a parameter), float32 master
  weights in the optimizer, the tensor cores' 16-bit peak; ``fp16`` adds loss scaling (one
  pass over the gradients a step, to unscale them and check for overflow).

Memory per parameter follows the ZeRO paper's accounting (Rajbhandari et al. 2020, section
3.1): float32 training keeps 4 bytes of weights and 4 of gradients; mixed precision 2 and 2,
plus 4 of float32 master weights in the optimizer state. The optimizer adds its own state:
``sgd`` none, ``momentum`` one float32 buffer (4 bytes), ``adam`` and ``adamw`` two (8 bytes).
Mixed-precision Adam is thus 2 + 2 + 12 = 16 bytes a parameter.

The update reads and writes every parameter's state once (bytes) and does a few operations a
parameter (FLOPs): SGD ``p -= lr g``; momentum ``v = m v + g; p -= lr v``; Adam both moments, the
bias corrections (scalars) and ``p -= lr m / (sqrt(v) + eps)``; AdamW the decoupled weight decay
on top. In mixed precision the update reads the 16-bit gradient and writes the 16-bit weights
besides the float32 state.

pdlsim's own CPU trainer computes in float32 (SGD, with or without momentum, Adam, AdamW), and
the CPU kernel sweep times each update, so CPU ranks are priced for those; the 16-bit and TF32
precisions for GPU ranks, from the data sheet's peak at the precision (``peak_flops_per_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from microbench.errors import UserError

__all__ = ["OPTIMIZERS", "PRECISIONS", "Training"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")

# Float32 buffers of optimizer state per parameter, and FLOPs of one update per parameter.
_STATE_BUFFERS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
_UPDATE_FLOPS = {"sgd": 2, "momentum": 4, "adam": 12, "adamw": 14}
# The data sheet field of each precision's peak (pdlsim/costmodel/hardware.json).
_PEAK_FIELD = {
    "fp32": "fp32_flops_per_s",
    "tf32": "tf32_tensor_flops_per_s",
    "bf16": "bf16_tensor_flops_per_s",
    "fp16": "fp16_tensor_flops_per_s",
}


@dataclass(frozen=True)
class Training:
    """A job's precision and optimizer (module docstring)."""

    precision: str = "fp32"
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UserError(
                f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise UserError(
                f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}"
            )

    @property
    def mixed(self) -> bool:
        """16-bit weights, activations and gradients with float32 master weights."""
        return self.precision in ("bf16", "fp16")

    @property
    def value_bytes(self) -> int:
        """Bytes of one activation, weight or gradient value as the step computes with it."""
        return 2 if self.mixed else 4

    @property
    def is_default(self) -> bool:
        return self == Training()

    def memory_bytes(self, params: int) -> dict[str, int]:
        """Bytes of ``params`` parameters' weights, gradients and optimizer state."""
        master = 4 if self.mixed else 0
        state = master + 4 * _STATE_BUFFERS[self.optimizer]
        return {
            "weights": self.value_bytes * params,
            "gradients": self.value_bytes * params,
            "optimizer_state": state * params,
        }

    def update_cost(self, params: int) -> tuple[int, int]:
        """``(flops, bytes)`` of one optimizer step over ``params`` parameters."""
        buffers = _STATE_BUFFERS[self.optimizer]
        if self.mixed:  # float32 master and state read and written, 16-bit gradient read and
            per = 8 + 8 * buffers + 2 + 2  # 16-bit weights written
        else:  # weights and state read and written, gradient read
            per = 8 + 8 * buffers + 4
        flops = _UPDATE_FLOPS[self.optimizer] + (2 if self.precision == "fp16" else 0)
        if self.precision == "fp16":  # loss scaling: the gradients read once more
            per += 2
        return flops * params, per * params

    def peak_flops_per_s(self, gpu: Any) -> float:
        """The GPU's data-sheet peak at this precision (UserError where it has none)."""
        peak = float(getattr(gpu, _PEAK_FIELD[self.precision], 0.0) or 0.0)
        if peak <= 0:
            raise UserError(
                f"{gpu.name} has no {self.precision} tensor cores in its data sheet; "
                f"use --precision fp32"
                + ("" if self.precision == "tf32" else " or a GPU from Ampere on")
            )
        return peak

    def check_cpu(self) -> None:
        """UserError unless CPU ranks can compute this: float32 (the update's kernel is
        checked with the step's others, :func:`pdlsim.prediction.build.check_kernels_timed`)."""
        if self.precision != "fp32":
            raise UserError(
                f"CPU ranks compute in fp32 (the kernel tables are float32); --precision "
                f"{self.precision} needs GPU ranks (--gpus N)"
            )

    def source(self) -> str:
        """The provenance line: what the precision and optimizer set."""
        per = sum(self.memory_bytes(1).values())
        kind = "mixed precision, float32 master weights" if self.mixed else "float32 values"
        return (
            f"{self.precision} ({kind}; {self.value_bytes} bytes a gradient on the wire), "
            f"{self.optimizer}: {per} bytes a parameter of weights, gradients and optimizer "
            "state (ZeRO accounting)"
        )
