"""What a training run records about itself: its header, and the memory it used."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

from microbench.records import RecordWriter
from microbench.threads import available_cores, oversubscription
from microbench.workload import Workload
from pdlsim.train.config import TrainConfig
from pdlsim.train.data import Dataset
from pdlsim.train.device import Device

__all__ = ["StepLog", "device_pool_bytes", "peak_rss_bytes", "run_metadata", "state_parts"]


class StepLog:
    """A training loop's per-step records, held in memory and written in one go.

    One flushed line per step put a JSON encoding and a system call between every two timed
    steps: for a small network a sizeable share of its step, untimed but paid by the epoch. Held
    back, the loop spends a fraction of that between steps, and the steps themselves run a few
    percent faster: less of the step's working set is evicted between two steps (evidence:
    docs/evidence.md, "Jitter"). The loop flushes at the end of each epoch, before each
    checkpoint (a resumed run's records are whole up to it) and on leaving the ``with`` block,
    however it leaves it."""

    def __init__(self, writer: RecordWriter, warn: Callable[[str], None] | None = None) -> None:
        self.writer = writer
        self.pending: list[dict[str, Any]] = []
        self.warn = warn
        self.diverged_at: int | None = None

    def add(self, record: dict[str, Any]) -> None:
        """Hold ``record``; the first step whose loss is not finite is said once through
        ``warn``: the run diverged (its step times still stand; the writer stores the loss as
        null)."""
        loss = record.get("loss")
        if self.diverged_at is None and loss is not None and not math.isfinite(loss):
            self.diverged_at = int(record.get("global_step", 0))
            if self.warn is not None:
                self.warn(
                    f"warning: the loss is {loss} at step {self.diverged_at}: the run diverged "
                    "(lower --lr); its step times are still recorded"
                )
        self.pending.append(record)

    def flush(self) -> None:
        self.writer.write_many(self.pending)
        self.pending.clear()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.flush()


def run_metadata(
    config: TrainConfig,
    workload: Workload,
    train_set: Dataset,
    steps: int,
    comm: Any,
    device: Device,
) -> dict[str, Any]:
    """The run header every rank's records file starts with (settings, data, placement)."""
    ranks_per_node = comm.ranks_per_node()
    return {
        **config.to_dict(),
        "workload": workload.to_dict(),
        "dataset": train_set.name,
        "train_samples": len(train_set),
        "steps_per_epoch": steps,
        "ranks": comm.size,
        "ranks_per_node": ranks_per_node,
        "device": device.name,
        "oversubscribed": oversubscription(ranks_per_node, config.threads) is not None,
        "cores": available_cores(),
        "pid": os.getpid(),
        "resumed_from": None,
    }  # fmt: skip


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes (``getrusage`` ``ru_maxrss``:
    KiB on Linux, bytes on macOS). It counts everything the process touched: the data set,
    Python, numba and the MPI library as well as the model's arrays."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def device_pool_bytes(device: Device) -> int | None:
    """GPU: the bytes CuPy's default memory pool holds on this rank's device; None on the CPU
    or where the array module has no such pool. The pool keeps freed blocks for reuse, so
    unless something frees them this is its high-water mark (arrays' peak, in pool blocks)."""
    if device.kind != "gpu":
        return None
    pool = getattr(device.xp, "get_default_memory_pool", None)
    total_bytes = getattr(pool(), "total_bytes", None) if callable(pool) else None
    return int(total_bytes()) if callable(total_bytes) else None


def state_parts(net: Any, opt: Any, stepper: Any, extra_buffer_bytes: int = 0) -> dict[str, int]:
    """Bytes of the arrays training allocates, in the parts ``pdlsim predict`` reports per rank:
    weights, gradients (this rank's, a slice under model parallelism), optimizer_state (the
    momentum velocity, or Adam's two moments), activations (the training workspace at this
    batch: layer outputs, input gradients, im2col columns, pool indices, gathered activations,
    the loss gradient),
    buffers (the host batch, its pinned staging, on a GPU the batch's device copy, two of each
    with prefetch: :attr:`pdlsim.train.feed.BatchFeed.buffer_bytes`, plus
    ``extra_buffer_bytes``) and their total. Evaluation's workspaces and what the libraries
    allocate are not counted."""
    buffers = stepper.feed.buffer_bytes + extra_buffer_bytes
    parts = {
        "weights": int(net.params.nbytes),
        "gradients": int(net.grads.nbytes),
        "optimizer_state": int(sum(a.nbytes for a in opt.state.values())),
        "activations": stepper.workspace_bytes,
        "buffers": int(buffers),
    }
    parts["total"] = sum(parts.values())
    return parts
