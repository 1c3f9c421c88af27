"""What a training run is asked to do, and the execution mode that follows from it.

Batch semantics (also in the README): ``batch_per_rank`` is B, the mini-batch each rank
computes; the global batch is P x B, and one optimizer step consumes P x B samples. The learning
rate stays as given unless ``scale_lr`` asks for the linear scaling rule (lr x P).

With ``parallel="model"`` (tensor parallelism, :mod:`microbench.nn.sliced`) the P ranks
hold one model between them and all compute the SAME mini-batch of ``batch_per_rank`` samples:
that is the global batch (strong scaling), and the learning rate is never scaled. ``inference``
times the forward pass only (loss included; no backward, no update), in either mode.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

DEVICES = ("cpu", "gpu")
PARALLEL_MODES = ("data", "model")


@dataclass(frozen=True)
class TrainConfig:
    model: str = "mlp"
    procs: int = 1
    threads: int = 1
    device: str = "cpu"
    epochs: int = 1
    batch_per_rank: int = 32
    lr: float = 0.02
    momentum: float = 0.0
    optimizer: str = "sgd"  # sgd (with momentum), adam or adamw (microbench.nn.optim)
    weight_decay: float = 0.0  # adam: L2 on the gradient; adamw: decoupled
    scale_lr: bool = False
    seed: int = 0
    data: str = "synthetic"
    samples: int | None = None  # training samples (synthetic default: pdlsim.prediction.epoch)
    test_samples: int = 1024
    max_steps_per_epoch: int | None = None
    pinned: bool = False  # GPU: stage each mini-batch through page-locked host memory
    prefetch: bool = False  # GPU, pinned: copy the next mini-batch behind this step's compute
    init: str = "he"
    checkpoint_every: int | None = None  # write a checkpoint every N optimizer steps (global)
    parallel: str = "data"  # data (replicas, batch per rank) or model (dense layers split)
    inference: bool = False  # forward pass (and loss) only: no backward, no update

    @property
    def global_batch(self) -> int:
        """Samples one optimizer step consumes: P x B, or B when the ranks share the batch."""
        if self.parallel == "model":
            return self.batch_per_rank
        return self.procs * self.batch_per_rank

    @property
    def effective_lr(self) -> float:
        return self.lr * self.procs if self.scale_lr else self.lr

    @property
    def mode(self) -> str:
        """serial, threads, mpi, hybrid, gpu or mpi+gpu."""
        if self.device == "gpu":
            return "gpu" if self.procs == 1 else "mpi+gpu"
        if self.procs == 1:
            return "serial" if self.threads == 1 else "threads"
        return "mpi" if self.threads == 1 else "hybrid"

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(mode=self.mode, global_batch=self.global_batch, effective_lr=self.effective_lr)
        return doc


def warmup_steps(n_steps: int) -> int:
    """Steps discarded at the start of a run before timing it (numba compiles, caches and
    pages fill): max(5, 10%), leaving at least one."""
    return min(max(5, math.ceil(0.1 * n_steps)), max(n_steps - 1, 0))
