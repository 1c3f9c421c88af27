"""The synchronous data-parallel training loop, the same code in every execution mode.

Per step, each rank takes its slice of the global mini-batch (rank r gets samples
[r*B, (r+1)*B) of the P x B global batch, drawn from one permutation that every rank computes
from the seed), runs forward and backward, waits at a barrier for the slowest rank, sums the
flat gradient with one in-place ``Allreduce`` and applies the same SGD update with the
learning rate divided by P (the mean gradient, without a pass to divide it).
That makes P ranks of batch B compute exactly the update one process computes with batch P x B,
up to float32 rounding: the loss curves agree, and the tests check it.

Each phase is timed on every rank and written, one JSON line per step, to the rank's records.
The barrier separates waiting for the slowest rank (``wait``) from the reduction itself
(``allreduce``); it costs one small-message latency per step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from microbench.errors import UserError
from microbench.machine import machine_metadata
from microbench.nn import SGD, Network
from microbench.records import RecordWriter
from microbench.threads import available_cores, oversubscription
from microbench.workload import Workload, load_workload
from pdlsim.data import Dataset, load_dataset
from pdlsim.train.config import TrainConfig
from pdlsim.train.device import Device, pinned_empty

PHASES = ("data", "h2d", "forward", "backward", "wait", "allreduce", "update")
SYNTHETIC_TRAIN_SAMPLES = 8192
EVAL_CHUNK = 256


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    steps: int
    loss: float  # mean training loss over the epoch's steps, all ranks
    train_accuracy: float
    test_accuracy: float
    time_s: float  # wall time of the epoch's steps on rank 0 (evaluation excluded)
    samples_per_s: float
    phase_mean_s: dict[str, float]  # mean per step, averaged over ranks


@dataclass
class TrainResult:
    config: TrainConfig
    run_dir: Path
    epochs: list[EpochResult] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)  # this rank's local mean losses


def prepare_data(config: TrainConfig, workload: Workload) -> tuple[Dataset, Dataset]:
    """The training and held-out test sets, shaped for the workload (synthetic: fresh draws)."""
    n_train = config.samples
    if n_train is None and config.data == "synthetic":
        n_train = SYNTHETIC_TRAIN_SAMPLES
    train = load_dataset(config.data, workload, n_samples=n_train, seed=config.seed, train=True)
    test = load_dataset(
        config.data, workload, n_samples=config.test_samples, seed=config.seed, train=False
    )
    return train, test


def steps_per_epoch(config: TrainConfig, n_train: int) -> int:
    """Full global batches per epoch (a last partial one is dropped so ranks stay equal)."""
    steps = n_train // config.global_batch
    if steps == 0:
        raise UserError(
            f"the global batch {config.procs} ranks x {config.batch_per_rank} = "
            f"{config.global_batch} exceeds the {n_train} training samples; "
            "use a smaller --batch or more --samples"
        )
    if config.max_steps_per_epoch is not None:
        steps = min(steps, config.max_steps_per_epoch)
    return steps


def train(
    config: TrainConfig,
    comm: Any,
    device: Device,
    run_dir: Path,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Run ``config`` on this rank; every rank of ``comm`` calls this together."""
    workload = load_workload(config.model)
    train_set, test_set = prepare_data(config, workload)
    steps = steps_per_epoch(config, len(train_set))
    rank, size, batch = comm.rank, comm.size, config.batch_per_rank

    net = Network(
        workload, seed=config.seed, init=config.init, xp=device.xp, backend=device.kernel_backend
    )
    # The allreduce leaves the SUM of the P ranks' gradients; a learning rate divided by P
    # applies their mean without another pass over the gradients (with momentum too: the
    # velocity is then P times larger and the step the same).
    opt = SGD(config.effective_lr / size, config.momentum, xp=device.xp)
    step_once = _Stepper(net, opt, comm, device, train_set, batch, pinned=config.pinned)

    ranks_per_node = comm.ranks_per_node()
    run_info = {
        **config.to_dict(),
        "workload": workload.to_dict(),
        "dataset": train_set.name,
        "train_samples": len(train_set),
        "steps_per_epoch": steps,
        "ranks": size,
        "ranks_per_node": ranks_per_node,
        "device": device.name,
        "oversubscribed": oversubscription(ranks_per_node, config.threads) is not None,
        "cores": available_cores(),
        "pid": os.getpid(),
    }
    machine = machine_metadata(comm=comm.mpi_comm, threads=config.threads)
    result = TrainResult(config=config, run_dir=run_dir)
    order = np.random.default_rng(config.seed)

    with RecordWriter(run_dir / f"rank{rank}.jsonl", machine=machine, run=run_info) as writer:
        for epoch in range(config.epochs):
            permutation = order.permutation(len(train_set))
            phase_sum = dict.fromkeys(PHASES, 0.0)
            loss_sum = correct_sum = 0.0
            epoch_start = time.perf_counter()
            for step in range(steps):
                start = step * config.global_batch + rank * batch
                loss, correct, phases = step_once(permutation[start : start + batch])
                for name, seconds in phases.items():
                    phase_sum[name] += seconds
                loss_sum += loss
                correct_sum += correct
                result.step_losses.append(loss)
                writer.write(
                    {
                        "type": "train_step",
                        "rank": rank,
                        "epoch": epoch,
                        "step": step,
                        "global_step": epoch * steps + step,
                        "batch": batch,
                        "loss": loss,
                        "correct": int(correct),
                        "step_s": sum(phases.values()),
                        "phases_s": phases,
                    }
                )
            epoch_time = time.perf_counter() - epoch_start
            test_correct, test_count = _evaluate(net, test_set, rank, size, device)
            totals = comm.sum_floats(
                [loss_sum, correct_sum, test_correct, test_count, *phase_sum.values()]
            )
            epoch_result = EpochResult(
                epoch=epoch,
                steps=steps,
                loss=totals[0] / (steps * size),
                train_accuracy=totals[1] / (steps * config.global_batch),
                test_accuracy=totals[2] / max(totals[3], 1.0),
                time_s=epoch_time,
                samples_per_s=steps * config.global_batch / epoch_time,
                phase_mean_s={
                    name: total / (steps * size)
                    for name, total in zip(PHASES, totals[4:], strict=True)
                },
            )
            result.epochs.append(epoch_result)
            writer.write({"type": "train_epoch", "rank": rank, **epoch_result.__dict__})
            if rank == 0:
                log(
                    f"epoch {epoch + 1}/{config.epochs}: loss {epoch_result.loss:.4f}, "
                    f"train accuracy {100 * epoch_result.train_accuracy:.1f}%, "
                    f"test accuracy {100 * epoch_result.test_accuracy:.1f}%, "
                    f"{epoch_time:.2f} s, {epoch_result.samples_per_s:,.0f} samples/s"
                )
    return result


class _Stepper:
    """One synchronous data-parallel step on this rank, timed phase by phase (:data:`PHASES`).

    Every phase ends with the device synchronised, so a phase's time is its own work."""

    def __init__(
        self,
        net: Network,
        opt: SGD,
        comm: Any,
        device: Device,
        data: Dataset,
        batch: int,
        pinned: bool,
    ) -> None:
        self.net, self.opt, self.comm, self.device, self.data = net, opt, comm, device, data
        self.x_host = np.empty((batch, *data.x.shape[1:]), dtype=np.float32)
        self.y_host = np.empty(batch, dtype=data.y.dtype)
        self.staging = None
        if device.kind == "gpu" and pinned:
            self.staging = pinned_empty(self.x_host.shape, self.x_host.dtype)

    def __call__(self, index: np.ndarray) -> tuple[float, int, dict[str, float]]:
        """Train on samples ``index``: (local mean loss, correct predictions, phase seconds)."""
        net, comm, device, sync = self.net, self.comm, self.device, self.device.synchronize
        t0 = time.perf_counter()
        np.take(self.data.x, index, axis=0, out=self.x_host)
        np.take(self.data.y, index, axis=0, out=self.y_host)
        t1 = time.perf_counter()
        x, y = device.to_device(self.x_host, self.staging), device.to_device(self.y_host)
        sync()
        t2 = time.perf_counter()
        loss, correct = net.forward(x, y)
        sync()
        t3 = time.perf_counter()
        net.backward()
        sync()
        t4 = time.perf_counter()
        t5 = t6 = t4
        if comm.size > 1:
            comm.barrier()
            t5 = time.perf_counter()
            comm.allreduce_sum_(net.grads)
            t6 = time.perf_counter()
        self.opt.step(net.params, net.grads)
        sync()
        t7 = time.perf_counter()
        seconds = np.diff([t0, t1, t2, t3, t4, t5, t6, t7])
        return loss, correct, dict(zip(PHASES, seconds.tolist(), strict=True))


def _evaluate(net: Network, test_set: Dataset, rank: int, size: int, device: Device) -> tuple:
    """Correct predictions and count on this rank's shard of the test set (rank::size)."""
    x_all, y_all = test_set.x[rank::size], test_set.y[rank::size]
    correct = 0
    for begin in range(0, len(y_all), EVAL_CHUNK):
        x = device.to_device(np.ascontiguousarray(x_all[begin : begin + EVAL_CHUNK]))
        logits = net.logits(x)
        predicted = device.xp.argmax(logits, axis=1)
        correct += int((predicted == device.to_device(y_all[begin : begin + EVAL_CHUNK])).sum())
    return float(correct), float(len(y_all))
