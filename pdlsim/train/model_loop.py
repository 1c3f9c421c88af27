"""The model-parallel training loop: P ranks, one model split between them, one shared batch.

Every rank takes the SAME mini-batch each step (samples ``[s*B, (s+1)*B)`` of the epoch's
permutation, which every rank draws from the seed): B is the global batch, one optimizer step
consumes B samples, exactly as a serial run with batch B does, and the learning rate is the one
given (nothing is averaged: each rank's gradients are those of its own slice). The network is
:class:`microbench.nn.sliced.SlicedNetwork`.

Phases per step (:data:`MODEL_PHASES`, one JSON line per step and rank like the data-parallel
loop's, so ``pdlsim validate`` reads them alike): ``data`` (gather the batch), ``h2d`` (to the
GPU), ``wait`` (a barrier at the step start: all ranks begin the forward together, as the model
assumes, so that skew from the step before is not charged to the first collective),
``forward`` (local compute and the loss), ``allgather`` (the activations' gathers, inside the
forward), ``backward`` (local), ``allreduce`` (the input gradients' sums, inside the backward),
``update``. With ``inference`` the step ends after the forward.

Evaluation runs the whole test set through the split network on every rank together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from microbench.machine import machine_metadata
from microbench.nn import SGD, Adam, make_optimizer
from microbench.nn.sliced import SlicedNetwork
from microbench.records import RecordWriter
from microbench.workload import load_workload
from pdlsim.train.checkpoint import records_path
from pdlsim.train.config import TrainConfig
from pdlsim.train.data import Dataset
from pdlsim.train.device import Device
from pdlsim.train.epoch import model_steps_per_epoch, prepare_data
from pdlsim.train.feed import BatchFeed, step_indices
from pdlsim.train.loop import (
    EVAL_CHUNK,
    EpochResult,
    TrainResult,
)
from pdlsim.train.runinfo import (
    StepLog,
    device_pool_bytes,
    peak_rss_bytes,
    run_metadata,
    state_parts,
)

MODEL_PHASES = (
    "data", "h2d", "wait", "forward", "allgather", "backward", "allreduce", "update",
)  # fmt: skip
BATCH_NOTE = (
    "model parallelism: every rank computes the same mini-batch (the global batch); dense "
    "layers' output neurons are split over the ranks"
)


class _Stepper:
    """One model-parallel step on this rank, timed phase by phase (:data:`MODEL_PHASES`)."""

    def __init__(
        self, net: SlicedNetwork, opt: SGD | Adam, comm: Any, device: Device, feed: BatchFeed,
        inference: bool,
    ) -> None:  # fmt: skip
        self.net, self.opt, self.comm, self.device, self.feed = net, opt, comm, device, feed
        self.inference = inference
        batch = feed.batch
        self.workspace_bytes = net.workspace_bytes(batch, training=not inference)

    def __call__(
        self, index: np.ndarray, next_index: np.ndarray | None = None
    ) -> tuple[float, int, dict[str, float]]:
        net, sync = self.net, self.device.synchronize
        t0 = time.perf_counter()
        self.feed.gather(index, next_index)
        t1 = time.perf_counter()
        x, y = self.feed.to_device()
        sync()
        t2 = time.perf_counter()
        if self.comm.size > 1:
            self.comm.barrier()
        t3 = time.perf_counter()
        net.comm_s.update(allgather=0.0, allreduce=0.0)
        loss, correct = net.forward(x, y, training=not self.inference)
        sync()
        t4 = t5 = t6 = time.perf_counter()
        if not self.inference:
            net.backward()
            sync()
            t5 = time.perf_counter()
            self.opt.step(net.params, net.grads)
            sync()
            t6 = time.perf_counter()
        gathers, sums = net.comm_s["allgather"], net.comm_s["allreduce"]
        seconds = [t1 - t0, t2 - t1, t3 - t2, t4 - t3 - gathers, gathers]
        seconds += [t5 - t4 - sums, sums, t6 - t5]
        return loss, correct, dict(zip(MODEL_PHASES, seconds, strict=True))


def train_model_parallel(
    config: TrainConfig,
    comm: Any,
    device: Device,
    run_dir: Path,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Run ``config`` (``parallel == "model"``) on this rank; every rank of ``comm`` calls it."""
    workload = load_workload(config.model)
    train_set, test_set = prepare_data(config, workload)
    steps = model_steps_per_epoch(config, len(train_set))
    rank, size, batch = comm.rank, comm.size, config.batch_per_rank
    net = SlicedNetwork(
        workload, comm, config.seed, config.init, device.xp, device.kernel_backend,
        device.synchronize,
    )  # fmt: skip
    opt = make_optimizer(config.optimizer, config.lr, config.momentum, config.weight_decay,
                         xp=device.xp)  # fmt: skip
    feed = BatchFeed(train_set, batch, device, config.pinned, config.prefetch)
    step_once = _Stepper(net, opt, comm, device, feed, config.inference)
    order = np.random.default_rng(config.seed)
    result = TrainResult(config=config, run_dir=run_dir)
    run_info = run_metadata(config, workload, train_set, steps, comm, device)
    run_info.update(batch_semantics=BATCH_NOTE, split_layers=net.split_layers())
    machine = machine_metadata(comm=comm.mpi_comm, threads=config.threads)
    records = records_path(run_dir, rank, False)
    writer = RecordWriter(records, machine=machine, run=run_info, nonfinite="null")
    with writer as out, StepLog(out, log if rank == 0 else None) as step_log:
        for epoch in range(config.epochs):
            permutation = order.permutation(len(train_set))
            loss_sum = correct_sum = 0.0
            phase_sums = dict.fromkeys(MODEL_PHASES, 0.0)
            epoch_start = time.perf_counter()
            for step in range(steps):
                samples = step_indices(permutation, step, steps, batch, 0, batch)
                loss, correct, phases = step_once(*samples)
                for name, seconds in phases.items():
                    phase_sums[name] += seconds
                loss_sum += loss
                correct_sum += correct
                result.step_losses.append(loss)
                result.step_phases_s.append(phases)
                step_log.add(
                    {
                        "type": "train_step", "rank": rank, "epoch": epoch, "step": step,
                        "global_step": epoch * steps + step, "batch": batch, "loss": loss,
                        "correct": int(correct), "step_s": sum(phases.values()),
                        "phases_s": phases,
                    }
                )  # fmt: skip
            epoch_time = time.perf_counter() - epoch_start
            step_log.flush()
            test_correct, test_count = _evaluate(net, test_set, device)
            rss_bytes, pool_bytes = peak_rss_bytes(), device_pool_bytes(device)
            per_rank = np.zeros(2 * size)
            per_rank[[rank, size + rank]] = rss_bytes, pool_bytes or 0
            # Loss and accuracy are the same on every rank; the sum over ranks / size says so
            # without trusting one rank, and carries the phases and memory in the same call.
            totals = comm.sum_floats(
                [loss_sum, correct_sum, test_correct, test_count, *phase_sums.values(), *per_rank]
            )
            n = 4 + len(MODEL_PHASES)
            epoch_result = EpochResult(
                epoch=epoch,
                steps=steps,
                loss=totals[0] / (steps * size),
                train_accuracy=totals[1] / (steps * batch * size),
                test_accuracy=totals[2] / max(totals[3], 1.0),
                time_s=epoch_time,
                samples_per_s=steps * batch / epoch_time,
                phase_mean_s={
                    name: total / (steps * size)
                    for name, total in zip(MODEL_PHASES, totals[4:n], strict=True)
                },
                peak_rss_bytes_max=int(max(totals[n : n + size])),
                device_pool_bytes_max=None if pool_bytes is None else int(max(totals[-size:])),
                model_state_bytes=state_parts(net, opt, step_once),
            )
            result.epochs.append(epoch_result)
            out.write(
                {
                    "type": "train_epoch", "rank": rank, **epoch_result.__dict__,
                    "peak_rss_bytes": rss_bytes, "device_pool_bytes": pool_bytes,
                }
            )  # fmt: skip
            if rank == 0:
                log(
                    f"epoch {epoch + 1}/{config.epochs}: loss {epoch_result.loss:.4f}, "
                    f"train accuracy {100 * epoch_result.train_accuracy:.1f}%, "
                    f"test accuracy {100 * epoch_result.test_accuracy:.1f}%, "
                    f"{epoch_time:.2f} s, {epoch_result.samples_per_s:,.0f} samples/s"
                )
    return result


def _evaluate(net: SlicedNetwork, test_set: Dataset, device: Device) -> tuple[float, float]:
    """Correct predictions and count over the whole test set (every rank runs all of it)."""
    correct = 0
    for begin in range(0, len(test_set.y), EVAL_CHUNK):
        x = device.to_device(np.ascontiguousarray(test_set.x[begin : begin + EVAL_CHUNK]))
        predicted = device.xp.argmax(net.logits(x), axis=1)
        correct += int(
            (predicted == device.to_device(test_set.y[begin : begin + EVAL_CHUNK])).sum()
        )
    return float(correct), float(len(test_set.y))
