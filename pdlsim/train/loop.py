"""The synchronous data-parallel training loop, the same code in every execution mode.

Per step, each rank takes its slice of the global mini-batch (rank r gets samples
[r*B, (r+1)*B) of the P x B global batch, drawn from one permutation that every rank computes
from the seed), runs forward and backward, waits at a barrier for the slowest rank, sums the
flat gradient with one in-place ``Allreduce`` and applies the same SGD update with the
learning rate divided by P (the mean gradient, without a pass to divide it).
That makes P ranks of batch B compute exactly the update one process computes with batch P x B,
up to float32 rounding: the loss curves agree, and the tests check it.

Each phase is timed on every rank and written, one JSON line per step, to the rank's records
(held in memory until the epoch ends or a checkpoint is taken: :class:`~pdlsim.train.runinfo
.StepLog`, so that no system call falls between two timed steps).
The barrier separates waiting for the slowest rank (``wait``) from the reduction itself
(``allreduce``); it costs one small-message latency per step.
With ``config.inference`` a step is the data, the copy and the forward (loss included)
only: no backward, barrier, allreduce or update (those phases read 0), so ranks never wait for
one another. Model parallelism has its own loop (:mod:`pdlsim.train.model_loop`).

Each epoch also records every rank's peak resident memory (and, on a GPU, CuPy's pool) and the
bytes of the model's own arrays, to set beside ``pdlsim predict``'s memory per rank. With
``checkpoint_every`` the run can be stopped and resumed (:mod:`pdlsim.train.checkpoint`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from microbench.machine import machine_metadata
from microbench.nn import SGD, Adam, Network, make_optimizer
from microbench.records import RecordWriter
from microbench.workload import load_workload
from pdlsim.train.checkpoint import records_path, restore, save_checkpoint
from pdlsim.train.config import TrainConfig
from pdlsim.train.data import Dataset
from pdlsim.train.device import Device
from pdlsim.train.epoch import prepare_data, steps_per_epoch
from pdlsim.train.feed import BatchFeed, step_indices
from pdlsim.train.runinfo import (
    StepLog,
    device_pool_bytes,
    peak_rss_bytes,
    run_metadata,
    state_parts,
)

PHASES = ("data", "h2d", "forward", "backward", "wait", "allreduce", "update")
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
    peak_rss_bytes_max: int  # peak resident memory so far of the rank that used the most
    device_pool_bytes_max: int | None  # GPU: bytes CuPy's memory pool holds, fullest rank
    model_state_bytes: dict[str, int]  # the arrays training allocates (model_state_bytes())


@dataclass
class TrainResult:
    config: TrainConfig
    run_dir: Path
    epochs: list[EpochResult] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)  # this rank's local mean losses
    step_phases_s: list[dict[str, float]] = field(default_factory=list)  # this rank's, per step
    last_checkpoint: Path | None = None  # the newest checkpoint this rank wrote (rank 0)


@dataclass
class _EpochSums:
    """An epoch's running sums on this rank; after a resume, rank 0 starts from the
    checkpoint's sums over all ranks (so the epoch's totals come out whole)."""

    loss: float = 0.0
    correct: float = 0.0
    phases_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    elapsed_s: float = 0.0  # rank 0's epoch time before the resume

    @classmethod
    def carried(cls, doc: dict[str, Any] | None) -> _EpochSums:
        if doc is None:
            return cls()
        phases = {name: float(doc["phases_s"][name]) for name in PHASES}
        return cls(float(doc["loss"]), float(doc["correct"]), phases, float(doc["elapsed_s"]))

    def values(self) -> list[float]:
        return [self.loss, self.correct, *self.phases_s.values()]


def train(
    config: TrainConfig,
    comm: Any,
    device: Device,
    run_dir: Path,
    log: Callable[[str], None] = print,
    resume: Path | None = None,
) -> TrainResult:
    """Run ``config`` on this rank; every rank of ``comm`` calls this together.

    ``resume``: a checkpoint to continue from (every rank reads it; its records then go to new
    ``rankR.resumeK.jsonl`` files). With ``config.checkpoint_every`` N, rank 0 writes a
    checkpoint after every N-th optimizer step and after the last epoch."""
    workload = load_workload(config.model)
    train_set, test_set = prepare_data(config, workload)
    steps = steps_per_epoch(config, len(train_set))
    labels = train_set.labels_per_sample  # accuracy counts tokens where each has a label
    rank, size, batch = comm.rank, comm.size, config.batch_per_rank

    net = Network(workload, seed=config.seed, init=config.init, xp=device.xp,
                  backend=device.kernel_backend, stream=rank)  # fmt: skip
    # The allreduce leaves the SUM of the P ranks' gradients; SGD's learning rate divided by P
    # applies their mean without another pass over the gradients (with momentum too: the
    # velocity is then P times larger and the step the same); Adam scales them as it reads.
    opt = make_optimizer(config.optimizer, config.effective_lr, config.momentum,
                         config.weight_decay, size, xp=device.xp)  # fmt: skip
    feed = BatchFeed(train_set, batch, device, config.pinned, config.prefetch)
    step_once = _Stepper(net, opt, comm, device, feed, inference=config.inference)
    order = np.random.default_rng(config.seed)  # the data order: one permutation per epoch
    result = TrainResult(config=config, run_dir=run_dir)
    first_epoch, first_step, carried, resumed_from = 0, 0, None, None
    if resume is not None:
        ckpt = restore(resume, config, workload.to_dict(), net, opt, order, steps, PHASES)
        resumed_from = {"checkpoint": ckpt.path.name, "global_step": ckpt.global_step}
        result.epochs = [EpochResult(**doc) for doc in ckpt.header["epochs"]]
        first_epoch, first_step = ckpt.epoch, ckpt.step
        carried = ckpt.header["epoch_sums"] if rank == 0 else None
        if rank == 0 and first_epoch >= config.epochs:
            log(f"nothing left to train: {ckpt.path} ends epoch {first_epoch}; give more --epochs")
        elif rank == 0:
            where = f"step {first_step} of epoch" if first_step else "the start of epoch"
            log(
                f"resuming from {ckpt.path}: {ckpt.global_step} steps done, at {where} "
                f"{first_epoch + 1}"
            )
    if first_epoch >= config.epochs:
        return result

    run_info = run_metadata(config, workload, train_set, steps, comm, device)
    run_info["resumed_from"] = resumed_from
    machine = machine_metadata(comm=comm.mpi_comm, threads=config.threads)
    records = records_path(run_dir, rank, resumed=resume is not None)

    with (
        RecordWriter(records, machine=machine, run=run_info, nonfinite="null") as writer,
        StepLog(writer, log if rank == 0 else None) as step_log,
    ):

        def checkpoint(epoch: int, step: int, rng_state: dict, sums: dict[str, Any]) -> None:
            header = {
                "config": config.to_dict(),
                "workload": workload.to_dict(),
                "position": {"epoch": epoch, "step": step, "global_step": epoch * steps + step},
                "rng_state": rng_state,
                "epoch_sums": sums,
                "epochs": [asdict(e) for e in result.epochs],
            }
            step_log.flush()
            if rank == 0:
                start = time.perf_counter()
                path = save_checkpoint(run_dir, header, net.params, opt.state, net.state)
                result.last_checkpoint = path
                record = {"type": "checkpoint", "rank": rank, **header["position"]}
                record.update(file=path.name, bytes=path.stat().st_size)
                writer.write({**record, "write_s": time.perf_counter() - start})

        every = config.checkpoint_every
        for epoch in range(first_epoch, config.epochs):
            rng_state = order.bit_generator.state  # before this epoch's permutation
            permutation = order.permutation(len(train_set))
            sums = _EpochSums.carried(carried if epoch == first_epoch else None)
            epoch_start = time.perf_counter()
            for step in range(first_step if epoch == first_epoch else 0, steps):
                stride, offset = config.global_batch, rank * batch
                samples = step_indices(permutation, step, steps, stride, offset, batch)
                loss, correct, phases = step_once(*samples)
                for name, seconds in phases.items():
                    sums.phases_s[name] += seconds
                sums.loss += loss
                sums.correct += correct
                result.step_losses.append(loss)
                result.step_phases_s.append(phases)
                step_log.add(
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
                if every and (epoch * steps + step + 1) % every == 0 and step + 1 < steps:
                    total = comm.sum_floats(sums.values())  # every rank, for rank 0's file
                    elapsed_s = sums.elapsed_s + time.perf_counter() - epoch_start
                    partial = {"loss": total[0], "correct": total[1], "elapsed_s": elapsed_s}
                    partial["phases_s"] = dict(zip(PHASES, total[2:], strict=True))
                    checkpoint(epoch, step + 1, rng_state, partial)
            epoch_time = sums.elapsed_s + time.perf_counter() - epoch_start
            step_log.flush()
            test_correct, test_count = _evaluate(net, test_set, rank, size, device)
            rss_bytes, pool_bytes = peak_rss_bytes(), device_pool_bytes(device)
            per_rank = np.zeros(2 * size)  # each rank fills its slot: the sum gathers them
            per_rank[[rank, size + rank]] = rss_bytes, pool_bytes or 0
            totals = comm.sum_floats([*sums.values(), test_correct, test_count, *per_rank])
            n = 2 + len(PHASES)
            epoch_result = EpochResult(
                epoch=epoch,
                steps=steps,
                loss=totals[0] / (steps * size),
                train_accuracy=totals[1] / (steps * config.global_batch * labels),
                test_accuracy=totals[n] / max(totals[n + 1], 1.0),
                time_s=epoch_time,
                samples_per_s=steps * config.global_batch / epoch_time,
                phase_mean_s={
                    name: total / (steps * size)
                    for name, total in zip(PHASES, totals[2:n], strict=True)
                },
                peak_rss_bytes_max=int(max(totals[n + 2 : n + 2 + size])),
                device_pool_bytes_max=None if pool_bytes is None else int(max(totals[-size:])),
                model_state_bytes=model_state_bytes(net, opt, step_once),
            )
            result.epochs.append(epoch_result)
            writer.write(
                {
                    "type": "train_epoch",
                    "rank": rank,
                    **epoch_result.__dict__,
                    "peak_rss_bytes": rss_bytes,
                    "device_pool_bytes": pool_bytes,
                }
            )
            if rank == 0:
                log(
                    f"epoch {epoch + 1}/{config.epochs}: loss {epoch_result.loss:.4f}, "
                    f"train accuracy {100 * epoch_result.train_accuracy:.1f}%, "
                    f"test accuracy {100 * epoch_result.test_accuracy:.1f}%, "
                    f"{epoch_time:.2f} s, {epoch_result.samples_per_s:,.0f} samples/s"
                )
            last = epoch == config.epochs - 1
            if every and ((epoch + 1) * steps % every == 0 or last):
                checkpoint(epoch + 1, 0, order.bit_generator.state, asdict(_EpochSums()))
    return result


def model_state_bytes(net: Network, opt: SGD | Adam, stepper: _Stepper) -> dict[str, int]:
    """:func:`pdlsim.train.runinfo.state_parts` of a data-parallel rank: with MPI on a GPU the
    allreduce also goes through a host copy of the gradients."""
    gpu_mpi = stepper.device.kind == "gpu" and stepper.comm.size > 1
    return state_parts(net, opt, stepper, net.grads.nbytes if gpu_mpi else 0)


class _Stepper:
    """One synchronous data-parallel step on this rank, timed phase by phase (:data:`PHASES`).

    Every phase ends with the device synchronised, so a phase's time is its own work."""

    def __init__(
        self,
        net: Network,
        opt: SGD | Adam,
        comm: Any,
        device: Device,
        feed: BatchFeed,
        inference: bool = False,
    ) -> None:
        self.net, self.opt, self.comm, self.device, self.feed = net, opt, comm, device, feed
        self.inference = inference  # forward (and loss) only: no backward, exchange or update
        batch = feed.batch
        # The training workspace, allocated now rather than in the first forward, while it
        # holds only its own arrays (forward adds references to its input).
        self.workspace_bytes = net.workspace_bytes(batch)

    def __call__(
        self, index: np.ndarray, next_index: np.ndarray | None = None
    ) -> tuple[float, int, dict[str, float]]:
        """Train on samples ``index`` (``next_index``: the next step's, for prefetch): (local
        mean loss, correct predictions, phase seconds)."""
        net, comm, sync = self.net, self.comm, self.device.synchronize
        t0 = time.perf_counter()
        self.feed.gather(index, next_index)
        t1 = time.perf_counter()
        x, y = self.feed.to_device()
        sync()
        t2 = time.perf_counter()
        loss, correct = net.forward(x, y)
        sync()
        t3 = time.perf_counter()
        if self.inference:
            seconds = np.diff([t0, t1, t2, t3, t3, t3, t3, t3])
            return loss, correct, dict(zip(PHASES, seconds.tolist(), strict=True))
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
        predicted = device.xp.argmax(logits, axis=-1)  # per sample, or per token
        correct += int((predicted == device.to_device(y_all[begin : begin + EVAL_CHUNK])).sum())
    return float(correct), float(y_all.size)
